// Fused FlashAttention on tensor cores (bf16 in, fp32 accumulation): the CUDA twin of
// kernels/cpu/flash_attention.h, with the same lse convention (natural log of the scaled scores).
#pragma once
#include "kernels/cuda/stream.h"

#include <cstddef>
#include <cstdint>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// Layout of q, k, v, o, dout, dq, dk, dv: (B, T, H, D) contiguous (a (B, T, C) tensor viewed as
// (B, T, H, C/H)); lse: (B, H, T) float, lse = max + log(sum) of each row of scale · q kᵀ [masked],
// in natural-log units exactly as cpu::flash_attention_forward defines it.
struct FlashAttentionParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  bf16* o;
  float* lse;  // forward: written; backward: read
  // Backward (ignored by the forward).
  const bf16* dout;
  bf16* dq;
  bf16* dk;
  bf16* dv;
  void* workspace;  // flash_attention_backward_workspace_bytes(B, T, H, D) bytes, 16-byte aligned
  int64_t B, T, H, D;
  float scale;  // applied to q kᵀ; usually 1/sqrt(D)
  bool causal;  // key index > query index is excluded
};

// Head dims with a compiled kernel. Other D must take the composite fallback (with a warning).
bool flash_attention_supported(int64_t D);  // D ∈ {64, 128}

// Writes o and lse. Requires a supported D, 16-byte aligned q, k, v, o, and T < 2^31.
void flash_attention_forward(const FlashAttentionParams& p, cudaStream_t stream);

// Scratch the backward needs: delta = rowsum(dO ∘ O), (B, H, T) floats.
size_t flash_attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t D);

// dq, dk, dv are overwritten (bf16), given the forward's o and lse. Deterministic: no atomics,
// every reduction in a fixed order, so two calls give bitwise equal gradients.
void flash_attention_backward(const FlashAttentionParams& p, cudaStream_t stream);

}  // namespace tg::cuda
