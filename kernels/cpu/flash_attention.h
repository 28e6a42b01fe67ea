// CPU FlashAttention forward/backward: tiled, O(T) memory, the specification the CUDA kernel follows.
#pragma once

#include <cstdint>

namespace tg::cpu {

// Layout of q, k, v, o, dout, dq, dk, dv: (B, T, H, D) contiguous — token-major with heads
// interleaved, i.e. a (B, T, C) tensor viewed as (B, T, H, C/H). lse: (B, H, T), in T's precision
// (the softmax statistics are kept in T: float for float, double for double).
struct AttentionShape {
  int64_t B, T, H, D;
  bool causal;   // key index > query index is excluded
  double scale;  // applied to Q Kᵀ; usually 1/sqrt(D)
};

// Computes o = softmax(scale · q kᵀ [masked]) v and lse = log-sum-exp of each row of the scaled,
// masked scores (what the backward needs to recompute P without storing it).
template <typename T>
void flash_attention_forward(const T* q,  // (B, T, H, D)
                             const T* k,  // (B, T, H, D)
                             const T* v,  // (B, T, H, D)
                             T* o,        // (B, T, H, D) out
                             T* lse,      // (B, H, T) out
                             const AttentionShape& s);

// Gradients of the forward above, given its saved o and lse. dq, dk, dv are overwritten.
template <typename T>
void flash_attention_backward(const T* q,     // (B, T, H, D)
                              const T* k,     // (B, T, H, D)
                              const T* v,     // (B, T, H, D)
                              const T* o,     // (B, T, H, D) forward output
                              const T* lse,   // (B, H, T) forward log-sum-exp
                              const T* dout,  // (B, T, H, D)
                              T* dq,          // (B, T, H, D) out
                              T* dk,          // (B, T, H, D) out
                              T* dv,          // (B, T, H, D) out
                              const AttentionShape& s);

}  // namespace tg::cpu
