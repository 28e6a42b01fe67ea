// CPU GEMM through OpenBLAS (row-major cblas), for float and double.
#pragma once
#include <cblas.h>

#include <omp.h>

#include <cstdint>

extern "C" void openblas_set_num_threads(int);

namespace tg::cpu {

// OpenBLAS's own thread pool and OpenMP's spin against each other on a small machine, so
// tilegrad runs OpenBLAS single-threaded and splits large products over OpenMP threads itself
// (each thread takes a band of rows of C): one pool, no oversubscription.
inline void single_threaded_blas() {
  static const bool once = [] { openblas_set_num_threads(1); return true; }();
  (void)once;
}

// The rows of C are cut into bands of kBandRows (the last may be shorter) and the bands are
// shared among the OpenMP threads; the band of op(A) starting at row r is A + r·lda when A is
// not transposed and A + r when it is. The cut depends on the shape only, never on the number
// of threads: each band is the same BLAS call on any thread count, so the product is bitwise
// the same on 1 thread and on 16 (OpenBLAS picks kernels by shape, and a row of C computed in a
// band of another height may round differently).
constexpr int64_t kBandRows = 64;

template <typename T, typename Gemm>
void gemm_row_bands(bool trans_a, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, T* C,
                    int64_t ldc, Gemm&& band) {
  single_threaded_blas();
  if (M * N * K < (int64_t(1) << 18) || M <= kBandRows) {
    band(int64_t(0), M);
    return;
  }
  const int64_t bands = (M + kBandRows - 1) / kBandRows;
#pragma omp parallel for schedule(static) if (omp_get_max_threads() > 1)
  for (int64_t b = 0; b < bands; ++b) {
    const int64_t begin = b * kBandRows, end = begin + kBandRows < M ? begin + kBandRows : M;
    band(begin, end);
  }
}

// C (M, N) = alpha · op(A) · op(B) + beta · C, row-major; op(A) is (M, K), op(B) is (K, N).
inline void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc) {
  gemm_row_bands(trans_a, M, N, K, A, lda, C, ldc, [&](int64_t r0, int64_t r1) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                int(r1 - r0), int(N), int(K), alpha, trans_a ? A + r0 : A + r0 * lda, int(lda), B, int(ldb),
                beta, C + r0 * ldc, int(ldc));
  });
}
inline void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha,
                 const double* A, int64_t lda, const double* B, int64_t ldb, double beta, double* C,
                 int64_t ldc) {
  gemm_row_bands(trans_a, M, N, K, A, lda, C, ldc, [&](int64_t r0, int64_t r1) {
    cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                int(r1 - r0), int(N), int(K), alpha, trans_a ? A + r0 : A + r0 * lda, int(lda), B, int(ldb),
                beta, C + r0 * ldc, int(ldc));
  });
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
