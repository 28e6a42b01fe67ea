// GEMM on the GPU through cuBLASLt: row-major, batched, fp32 or bf16 with fp32 accumulation, optional bias/GELU
// epilogue; and the GELU-derivative GEMM of an MLP's backward (gemm_dgelu).
#pragma once
#include "kernels/cuda/stream.h"

#include <cstddef>
#include <cstdint>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// What happens to alpha·op(A)·op(B) + beta·C before it is stored in C:
//   none       C = alpha·op(A)op(B) + beta·C
//   bias       C = alpha·op(A)op(B) + beta·C + bias            (bias (N,) broadcast over the M rows)
//   gelu_bias  C = gelu_tanh(alpha·op(A)op(B) + beta·C + bias)
// The same bias vector is used for every matrix of a batch. cuBLASLt fuses the epilogue when it
// has a kernel for the case (bias 16-byte aligned, see gemm.cu); otherwise a small kernel applies
// it after a plain GEMM, with the same result up to rounding of the intermediate in T.
enum class Epilogue { none, bias, gelu_bias };

// Row-major: C (M, N) = epilogue(alpha · op(A) · op(B) + beta · C).
//   op(A) is (M, K): A is stored (M, K), or (K, M) when trans_a.
//   op(B) is (K, N): B is stored (K, N), or (N, K) when trans_b.
//   lda/ldb/ldc are the row-major leading dimensions (elements between rows) of the stored
//   matrices, so lda ≥ (trans_a ? M : K), ldb ≥ (trans_b ? K : N), ldc ≥ N.
// batch independent products, matrix i at A + i·stride_a, B + i·stride_b, C + i·stride_c (element
// strides; ignored when batch == 1).
// T = float: fp32 inputs, fp32 compute (CUBLAS_COMPUTE_32F: no TF32, so it matches the CPU closely).
// T = tg::bf16: bf16 inputs and output, fp32 accumulation and fp32 alpha/beta.
// beta == 0 never reads C (C may hold NaN). bias (N,) has type T and may be null only for
// Epilogue::none. Runs on `stream` on the current device; bitwise deterministic for a given
// shape, alignment and device.
// Threading: host state (handle, plan cache) is guarded by a mutex, but the per-device workspace is
// shared, so GEMMs on one device must not run concurrently on different streams.
template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, float beta, T* C, int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b,
          int64_t stride_c, Epilogue epilogue, const T* bias, cudaStream_t stream);

// The same GEMM with bf16 A and B but C (M, N) kept in fp32 (no epilogue, one matrix): for a
// product summed over several calls with beta = 1, rounded to bf16 once at the end rather than
// after every call (the chunked LM head's weight gradient, added chunk by chunk).
void gemm_accumulate_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const tg::bf16* A,
                         int64_t lda, const tg::bf16* B, int64_t ldb, float beta, float* C, int64_t ldc,
                         cudaStream_t stream);

// C (M, N) = gelu'(pre) ⊙ (A (M, K) · B (K, N)), all row-major bf16, fp32 accumulation, through
// cuBLASLt's DGELU epilogue (pre (M, N) the saved pre-activation, ld N), and with dbias != null
// dbias (N) = Σ_rows C through DGELU_BGRAD. Returns false, having run nothing, when cuBLASLt has
// no algorithm for it (the caller then runs a plain GEMM and its own kernel).
//   lda ≥ K, ldb ≥ N; C is packed (ld N), written without being read, and must not overlap pre.
//   It also returns false, without asking cuBLASLt, for an empty product (M, N or K zero) and
//   where cuBLASLt's rules for the epilogue's operands do not hold: N a multiple of 8 (pre's
//   leading dimension), pre and dbias 16-byte aligned. A refusal is cached with the plan, so a
//   shape pays for it once. gelu' is GELU's tanh form's derivative (see gemm.cu). Bitwise
//   deterministic for a given shape, alignment and device; the same threading rules as gemm.
bool gemm_dgelu(int64_t M, int64_t N, int64_t K, const tg::bf16* A, int64_t lda, const tg::bf16* B, int64_t ldb,
                const tg::bf16* pre, tg::bf16* C, tg::bf16* dbias, cudaStream_t stream);

// Bytes of cuBLASLt workspace each device holds once it has run a GEMM (allocated on first use and
// kept for the life of the process), for the caller's memory accounting.
size_t gemm_workspace_bytes();

}  // namespace tg::cuda
