// The MLP backward's GELU-derivative GEMM as one Hopper kernel of tilegrad's own: the product, GELU's
// derivative and the bias gradient's column sums in one pass (kernels/cuda/dgelu_gemm_sm90a.cu).
#pragma once
#include "kernels/cuda/stream.h"

#include <cstddef>
#include <cstdint>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// C (M, N) = gelu'(pre) ⊙ (A (M, K) · B (K, N)), all row-major bf16 and packed (A's leading
// dimension K; B's, pre's and C's N), the product accumulated in fp32 and multiplied by gelu'
// (GPT-2's tanh form, kernels/cuda/gelu.cuh) before the one rounding to bf16; with dbias != null
// also dbias (N) = Σ_rows C, the stored bf16 values added in fp32 in a fixed order (bitwise
// reproducible), through `partial` (dgelu_gemm_partial_floats(M, N) floats). C must not overlap
// pre. Returns false, having run nothing, unless the device is sm_90 (H100/H200), M > 0,
// N % 256 == 0, K % 64 == 0 and K > 0, and every pointer is 16-byte aligned: the caller then runs
// another path (cuBLASLt's DGELU epilogue, gemm_dgelu).
bool dgelu_gemm_sm90(int64_t M, int64_t N, int64_t K, const tg::bf16* A, const tg::bf16* B, const tg::bf16* pre,
                     tg::bf16* C, tg::bf16* dbias, float* partial, cudaStream_t stream);

// Floats of dgelu_gemm_sm90's `partial`: a row of column sums per 64 rows of C (M rounded up to
// 256).
size_t dgelu_gemm_partial_floats(int64_t M, int64_t N);

}  // namespace tg::cuda
