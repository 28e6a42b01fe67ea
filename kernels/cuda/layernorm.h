// CUDA LayerNorm: the twin of kernels/cpu/layernorm.h, with fp32 statistics and fixed-order
// (bitwise reproducible) reductions.
#pragma once
#include "kernels/cuda/stream.h"

#include <cstddef>
#include <cstdint>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// T is float or tg::bf16; the statistics are fp32. Every launcher runs on `stream` and throws
// std::invalid_argument on a broken precondition.

// x, out (N, C); weight, bias (C) (bias may be null); mean, rstd (N) fp32 out. One warp per row.
template <typename T>
void layernorm_forward(const T* x, const T* weight, const T* bias, T* out, float* mean, float* rstd, int64_t N,
                       int64_t C, float eps, cudaStream_t stream);

// sum = a + b (rounded to T), then out = LayerNorm(sum) as layernorm_forward computes it, in one
// pass over the rows (a residual add and the LayerNorm that reads its result). a, b, sum, out
// (N, C); sum may not alias a or b. Bitwise equal to add_forward followed by layernorm_forward.
// b_bias (C), when not null, is added to b's rows first (b + b_bias rounded to T, as add_forward
// over rows computes it): the bias of the projection whose output b is.
template <typename T>
void add_layernorm_forward(const T* a, const T* b, const T* b_bias, T* sum, const T* weight, const T* bias, T* out,
                           float* mean, float* rstd, int64_t N, int64_t C, float eps, cudaStream_t stream);

// Floats of scratch layernorm_backward needs for (N, C): fp32 partial sums of dweight, dbias and
// dx, one row of C per row-block.
size_t layernorm_backward_scratch_floats(int64_t N, int64_t C);

// dx (N, C), dweight (C) and dbias (C, may be null) are overwritten. mean, rstd (N) are the
// forward's. dx_add (N, C), when not null, is added into dx as it is written (another consumer's
// gradient of x, e.g. the residual stream's: one pass fewer than adding it afterwards); it may
// not alias dx. scratch holds layernorm_backward_scratch_floats(N, C) floats. Row blocks produce
// per-channel partials that a second kernel adds in block order: bitwise reproducible.
// dx_colsum (C), when not null, is overwritten with Σ_rows dx (the fp32 values before dx is
// rounded to T, summed in the same fixed order): the gradient of a bias added into x, when dx is
// x's whole gradient (ops::add_layernorm). Requires C ≤ 7168 (the per-warp accumulators live in
// shared memory).
template <typename T>
void layernorm_backward(const T* x, const T* weight, const float* mean, const float* rstd, const T* dout,
                        const T* dx_add, T* dx, T* dweight, T* dbias, T* dx_colsum, int64_t N, int64_t C,
                        float* scratch, cudaStream_t stream);

}  // namespace tg::cuda
