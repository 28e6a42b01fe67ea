// The structured attention masks of the FlashAttention kernels (FlashAttentionParams::window,
// doc_start) as block ranges, shared by every kernel (mma.sync and wgmma, forward and backward):
// query i of a sequence sees key j iff lo(i) ≤ j ≤ i, lo(i) = max(doc_start[i], i − window + 1)
// (each term only when its mask is on; the masks are causal only). lo never decreases along a
// sequence, so for a tile of queries [i0, i1) and keys [j0, j1) (both within T):
//   - the tile is wholly masked iff j1 − 1 < lo(i0) or j0 > i1 − 1: never loaded, the loops'
//     bounds exclude it (key_tiles, query_tiles below);
//   - it needs no mask at all iff lo(i1 − 1) ≤ j0 and j1 − 1 ≤ i0 (needs_mask);
//   - otherwise it is a boundary tile, masked element by element (excluded).
// Without a mask (window 0 or ≥ T, doc_start null) the launchers run each kernel's unmasked
// instantiation (kMasked = false, with_mask below): its SeqMask is the constant "off" one
// (seq_mask_if), every function above folds to the causal rule at compile time, and the kernel's
// instructions and results are those without the feature.
#pragma once
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/flash_attention/flash.h"

namespace tg::cuda::flash {

// One sequence's mask: its row of doc_start ((T,) int32 in device memory, or null) and the window
// (0: none; a window ≥ T excludes nothing and is taken as none).
struct SeqMask {
  const int32_t* doc;
  int window;
  int T;
  bool on;  // a structured mask (doc or window) applies

  // The first key query i sees (0 without a mask). i is clamped to T − 1: rows past T (a tile's
  // padding) are never stored, and their doc_start entry does not exist.
  __host__ __device__ __forceinline__ int lo(int i) const {
    if (!on) return 0;
    i = row(i);
    return lo_given(i, doc ? int(doc[i]) : 0);
  }
  // lo in two steps, for a kernel that loads doc_start's entries apart from their use: i clamped
  // as lo clamps it, and lo(i) of a clamped i given d = doc_start[i] (0 without documents).
  __host__ __device__ __forceinline__ int row(int i) const { return i < T - 1 ? i : T - 1; }
  __host__ __device__ __forceinline__ int lo_given(int i, int d) const {
    return window > 0 && i - window + 1 > d ? i - window + 1 : d;
  }
  // One past the last query that sees key k (k < T): the first i > k with lo(i) > k, T if none —
  // a binary search over the non-decreasing lo (the window alone: min(k + window, T)).
  __host__ __device__ __forceinline__ int query_end(int k) const {
    if (!on) return T;
    int a = k + 1, b = T;  // lo(a − 1) ≤ k (lo(k) ≤ k always); find the first i in [a, b) with lo(i) > k
    if (!doc) return k + window < T ? k + window : T;
    if (window > 0 && k + window < b) b = k + window;
    while (a < b) {
      const int m = a + (b - a) / 2;
      if (lo(m) > k) b = m; else a = m + 1;
    }
    return a;
  }

  // The key tiles of Bc keys a query tile [q0, q0 + rows) sees, causal: [first, end).
  struct Range {
    int first, end;
  };
  __host__ __device__ __forceinline__ Range key_tiles(int q0, int rows, int Bc) const {
    const int q_last = (q0 + rows < T ? q0 + rows : T) - 1;
    return {lo(q0) / Bc, q_last / Bc + 1};
  }
  // The query tiles of Br queries that a key tile [k0, k0 + keys) is seen by, causal: [first, end).
  __host__ __device__ __forceinline__ Range query_tiles(int k0, int keys, int Br) const {
    const int k_last = (k0 + keys < T ? k0 + keys : T) - 1;
    return {k0 / Br, (query_end(k_last) + Br - 1) / Br};
  }
  // Whether queries [q0, q_last] against keys [k0, k0 + keys) need the structured mask's
  // elementwise test: some key lies before the last query's first visible key. (The causal rule
  // and the end of the sequence are each kernel's own test, as without a mask.)
  __host__ __device__ __forceinline__ bool needs_mask(int q_last, int k0) const { return on && lo(q_last) > k0; }
  // Element (query q, key k) is excluded by the structured mask (not by causality nor by T).
  __host__ __device__ __forceinline__ bool excluded(int q, int k) const { return on && k < lo(q); }
};

// A warp's 16 query rows [row0, row0 + 16) of one sequence as the accumulator fragments hold
// them (tile.cuh: this lane's rows g and g + 8 of the 16): their first visible keys, and the last
// row's, which decides whether a key tile from k0 on needs the elementwise test. Without a mask
// every lo is 0, so needs_mask is never true.
struct ItemMask {
  bool on;
  int lo_last;
  int lo_g, lo_g8;  // rows g and g + 8
  __host__ __device__ __forceinline__ bool needs_mask(int k0) const { return on && lo_last > k0; }
  // Key k excluded from the row r (0 ≤ r < 16, r mod 8 = g) by the structured mask.
  __host__ __device__ __forceinline__ bool excluded(int r, int k) const { return k < ((r & 8) ? lo_g8 : lo_g); }
};
// Besides, lo_q0 = lo(q0) of the item's first query (q0 ≤ row0), which places the item's first key
// tile. The four doc_start entries are loaded together, one round trip to memory: one after the
// other, each load's branch waiting on the one before, they made the masked dQ kernel's items
// start later (docs/kernels.md §2.4, "An item's start").
__host__ __device__ __forceinline__ ItemMask item_mask(const SeqMask& m, int q0, int row0, int lane, int& lo_q0) {
  lo_q0 = 0;
  if (!m.on) return {false, 0, 0, 0};
  const int g = row0 + (lane >> 2);
  const int r[4] = {m.row(q0), m.row(row0 + 15), m.row(g), m.row(g + 8)};
  int d[4] = {0, 0, 0, 0};
  if (m.doc)
    for (int k = 0; k < 4; ++k) d[k] = int(m.doc[r[k]]);
  lo_q0 = m.lo_given(r[0], d[0]);
  return {true, m.lo_given(r[1], d[1]), m.lo_given(r[2], d[2]), m.lo_given(r[3], d[3])};
}

// The mask of sequence b of T tokens under doc_start (B, T) and window (FlashAttentionParams').
__host__ __device__ __forceinline__ SeqMask seq_mask(const int32_t* doc_start, int64_t window, int T, int b) {
  const int w = window > 0 && window < T ? int(window) : 0;
  const int32_t* doc = doc_start ? doc_start + int64_t(b) * T : nullptr;
  return {doc, w, T, doc != nullptr || w > 0};
}
__host__ __device__ __forceinline__ SeqMask seq_mask(const FlashAttentionParams& p, int b) {
  return seq_mask(p.doc_start, p.window, int(p.T), b);
}
// The mask a kernel instantiation sees: sequence b's with kMasked, else the constant "off" one
// (every test on it folds away).
template <bool kMasked>
__host__ __device__ __forceinline__ SeqMask seq_mask_if(const int32_t* doc_start, int64_t window, int T, int b) {
  if constexpr (kMasked) return seq_mask(doc_start, window, T, b);
  else return SeqMask{nullptr, 0, T, false};
}
template <bool kMasked>
__host__ __device__ __forceinline__ SeqMask seq_mask_if(const FlashAttentionParams& p, int b) {
  return seq_mask_if<kMasked>(p.doc_start, p.window, int(p.T), b);
}

// Launchers: whether p has a structured mask that excludes anything beyond causality's (a window
// ≥ T excludes nothing), and f(std::bool_constant<that>{}), so that each kernel is launched as its
// masked or its unmasked instantiation.
inline bool has_mask(const FlashAttentionParams& p) { return p.doc_start != nullptr || (p.window > 0 && p.window < p.T); }
template <class F>
void with_mask(const FlashAttentionParams& p, F&& f) {
  if (has_mask(p))
    f(std::true_type{});
  else
    f(std::false_type{});
}

}  // namespace tg::cuda::flash
