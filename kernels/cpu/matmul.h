// CPU GEMM through OpenBLAS (row-major cblas), for float and double.
#pragma once
#include <cblas.h>

#include <cstdint>

namespace tg::cpu {

// C (M, N) = alpha · op(A) · op(B) + beta · C, row-major; op(A) is (M, K), op(B) is (K, N).
inline void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}
inline void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                 const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
                 int64_t ldc) {
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

// Batched: `batch` independent products with the given element strides between matrices.
template <typename T>
void gemm_batched(bool trans_a, bool trans_b, int64_t batch, int64_t M, int64_t N, int64_t K,
                  const T* A, int64_t stride_a, const T* B, int64_t stride_b, T beta, T* C,
                  int64_t stride_c) {
  int64_t lda = trans_a ? M : K, ldb = trans_b ? K : N;
  for (int64_t i = 0; i < batch; ++i)
    gemm(trans_a, trans_b, M, N, K, T(1), A + i * stride_a, lda, B + i * stride_b, ldb, beta,
         C + i * stride_c, N);
}

}  // namespace tg::cpu
