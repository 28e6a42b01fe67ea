// CUDA layout kernels: dims-1/2 swap of a 4-D tensor, last-dim slice and its inverse, the naive
// attention's causal mask, and rotary position embedding. Twins of kernels/cpu/permute.h and rope.h.
#pragma once
#include "kernels/cuda/stream.h"

#include <cstdint>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// T is float or tg::bf16. Copies are bit-exact; rope computes in fp32. Every launcher runs on
// `stream` and throws std::invalid_argument on a broken precondition.

// x (A, M, N, D) → out (A, N, M, D), e.g. (B, T, H, D) ↔ (B, H, T, D).
template <typename T>
void swap_dims12(const T* x, T* out, int64_t A, int64_t M, int64_t N, int64_t D, cudaStream_t stream);

// out (rows, len) = x (rows, cols)[:, start:start+len]. Requires 0 ≤ start, start + len ≤ cols.
template <typename T>
void slice_last(const T* x, T* out, int64_t rows, int64_t cols, int64_t start, int64_t len, cudaStream_t stream);

// dx (rows, cols)[:, start:start+len] = d (rows, len); the rest of dx is left untouched.
template <typename T>
void unslice_last(const T* d, T* dx, int64_t rows, int64_t cols, int64_t start, int64_t len, cudaStream_t stream);

// Scores s (batch, Tq, Tk) → out: key j > query i gets `fill` (−INFINITY in the forward, 0 for
// the backward's gradient), everything else is copied. out may equal s (in place).
template <typename T>
void causal_mask(const T* s, T* out, int64_t batch, int64_t Tq, int64_t Tk, float fill, cudaStream_t stream);

// RoPE on x, out (B, T, H, D), rotate-half pairing (i, i + D/2): pair i of token t turns by angle
// (t + pos_offset) · base^(−2i/D); direction = +1 forward, −1 the inverse (backward). Like the
// CPU, the frequency and angle are computed in double and cos/sin rounded to fp32, so the
// rotation coefficients agree with the CPU's float path to an ulp. Requires D even; out may equal x.
template <typename T>
void rope_apply(const T* x, T* out, int64_t B, int64_t T_, int64_t H, int64_t D, double base, int64_t pos_offset,
                int direction, cudaStream_t stream);

}  // namespace tg::cuda
