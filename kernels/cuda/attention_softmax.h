// The softmax of the materialised attention, fused with its scale and causal mask: the GPU
// twin of cpu::attention_softmax_forward/backward in kernels/cpu/softmax.h.
#pragma once
#include <cstdint>

#include "kernels/cuda/stream.h"
#include "src/tensor/dtype.h"

namespace tg::cuda {

// p (batch, T, T) = softmax over the last dim of scale · s, with keys j > i removed when causal.
template <typename T>
void attention_softmax_forward(const T* s, T* p, int64_t batch, int64_t Tn, float scale, bool causal,
                               cudaStream_t stream);
// ds = scale · p ∘ (dp − rowsum(dp ∘ p)); masked entries have p = 0 and so ds = 0.
template <typename T>
void attention_softmax_backward(const T* p, const T* dp, T* ds, int64_t batch, int64_t Tn, float scale,
                                cudaStream_t stream);

}  // namespace tg::cuda
