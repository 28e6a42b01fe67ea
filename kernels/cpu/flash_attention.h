// CPU FlashAttention forward/backward: tiled, O(T) memory, the specification the CUDA kernel follows.
#pragma once

#include <cstdint>

namespace tg::cpu {

// Layout of q, k, v, o, dout, dq, dk, dv: (B, T, H, D) contiguous — token-major with heads
// interleaved, i.e. a (B, T, C) tensor viewed as (B, T, H, C/H). lse: (B, H, T), in T's precision
// (the softmax statistics are kept in T: float for float, double for double).
//
// Structured masks (causal only): query i of row b sees key j iff lo(b, i) ≤ j ≤ i, with
// lo(b, i) = max(doc_start[b·T + i], i − window + 1) (a term is absent when its mask is off).
// lo never decreases along a row (document starts and window starts both move forward), so a
// query tile [q0, q1) can see key tiles from the one holding lo(q0) to the diagonal: tiles
// before that are skipped, tiles with every key in [lo(q1 − 1), q0] run without any mask logic,
// and only the tiles across a boundary mask element by element.
struct AttentionShape {
  int64_t B, T, H, D;
  bool causal;   // key index > query index is excluded
  double scale;  // applied to Q Kᵀ; usually 1/sqrt(D)
  int64_t window = 0;                 // sliding window: keys j > i − window; 0: no window
  const int32_t* doc_start = nullptr;  // (B, T): first position of each token's document; null: none
  bool masked() const { return window > 0 || doc_start != nullptr; }
};

// The most tokens any document of a (B, T) doc_start array holds: a document's last token t has
// t − doc_start + 1 of them up to itself.
inline int64_t longest_document(const int32_t* doc_start, int64_t B, int64_t T) {
  int64_t longest = 0;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t len = t - doc_start[b * T + t] + 1;
      if (len > longest) longest = len;
    }
  return longest;
}

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
