// CUDA softmax and fused softmax–cross-entropy: twins of kernels/cpu/softmax.h, with fp32
// reductions and losses in a fixed (bitwise reproducible) order.
#pragma once
#include "kernels/cuda/stream.h"

#include <cstddef>
#include <cstdint>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// T is float or tg::bf16; reductions and losses are fp32. Every launcher runs on `stream` and
// throws std::invalid_argument on a broken precondition.

// x, out (N, C): softmax over the last dimension. Rows that are entirely −inf give zeros.
template <typename T>
void softmax_forward(const T* x, T* out, int64_t N, int64_t C, cudaStream_t stream);

// dx = y ∘ (dy − rowsum(dy ∘ y)); y, dy, dx (N, C).
template <typename T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t N, int64_t C, cudaStream_t stream);

// logits (N, V), targets (N). Writes lse (N), row_loss (N) = lse − logit[target] (0 where target ==
// ignore_index; NaN where the target is outside [0, V), so a bad target is loud instead of an
// out-of-bounds read), loss_out (1) = Σ row_loss / count (0 when count = 0) and count_out (1) =
// rows not ignored. When dlogits (N, V) is not null it also gets the gradient of the mean loss,
// (softmax(logits) − onehot(target)) / count, zeros on ignored rows — written in the same pass
// over the logits (the backward then only rescales it). All pointers are device memory: no host
// synchronisation. One block per row (online max/sum in one pass over V); the mean adds the
// rows in a fixed order in one block.
template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, float* lse, float* row_loss, float* loss_out,
                           int32_t* count_out, T* dlogits, int64_t N, int64_t V, int32_t ignore_index,
                           cudaStream_t stream);

// cross_entropy_forward in its three stages, for a loss whose logits are made a chunk of rows at
// a time (ops::linear_cross_entropy): count the rows not ignored over all N targets, then the rows
// kernel on each chunk (logits, targets, lse, row_loss and dlogits all start at the chunk's first
// row; `count` is the whole batch's, so each chunk's dlogits is already the mean's gradient), then
// the mean over all N row losses. dlogits may be null (no gradient).
void cross_entropy_count(const int32_t* targets, int64_t N, int32_t ignore_index, int32_t* count_out,
                         cudaStream_t stream);
template <typename T>
void cross_entropy_rows(const T* logits, const int32_t* targets, float* lse, float* row_loss, const int32_t* count,
                        T* dlogits, int64_t rows, int64_t V, int32_t ignore_index, cudaStream_t stream);
void cross_entropy_mean(const float* row_loss, int64_t N, const int32_t* count, float* loss_out, cudaStream_t stream);

// dlogits (n) *= dloss (1 float, device memory): turns the forward's gradient into the one for an
// upstream gradient dloss. Costs nothing measurable when dloss is 1 (the kernel returns at once).
template <typename T>
void cross_entropy_backward(const float* dloss, T* dlogits, int64_t n, cudaStream_t stream);

}  // namespace tg::cuda
