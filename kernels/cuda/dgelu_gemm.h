// The MLP backward's GELU-derivative GEMM as one Hopper kernel of tilegrad's own: the product, the
// multiplication by GELU's derivative (kept by the forward, elementwise.h's
// gelu_forward_keep_derivative) and the bias gradient's column sums in one pass
// (kernels/cuda/dgelu_gemm_sm90a.cu).
#pragma once
#include "kernels/cuda/stream.h"

#include <cstddef>
#include <cstdint>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// Whether dgelu_gemm_sm90 runs (M, N, K) on the current device (sm_90: H100/H200; M > 0,
// N % 256 == 0, K % 64 == 0), pointers' alignment aside.
bool dgelu_gemm_sm90_takes(int64_t M, int64_t N, int64_t K);

// C (M, N) = g ⊙ (A (M, K) · B (K, N)): A, B and C row-major bf16 and packed (A's leading
// dimension K; B's and C's N), g (M, N) the IEEE fp16 bits of GELU's derivative at the
// pre-activation, as gelu_forward_keep_derivative writes them; the product accumulated in fp32,
// multiplied by g and rounded once to bf16. With dbias != null also dbias (N) = Σ_rows C, the
// stored bf16 values added in fp32 in a fixed order (bitwise reproducible), through `partial`
// (dgelu_gemm_partial_floats(M, N) floats). C must not overlap g. Returns false, having run
// nothing, unless dgelu_gemm_sm90_takes(M, N, K) and every pointer is 16-byte aligned.
bool dgelu_gemm_sm90(int64_t M, int64_t N, int64_t K, const tg::bf16* A, const tg::bf16* B, const uint16_t* g,
                     tg::bf16* C, tg::bf16* dbias, float* partial, cudaStream_t stream);

// Floats of dgelu_gemm_sm90's `partial`: a row of column sums per 64 rows of C (M rounded up to 256).
size_t dgelu_gemm_partial_floats(int64_t M, int64_t N);

}  // namespace tg::cuda
