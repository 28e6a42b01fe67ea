// The work-item scheduler of the persistent sm_90a attention kernels (docs/kernels.md §5.3): a
// block takes item blockIdx.x first, then claims the next ones from a counter in global memory;
// the claimed item reaches the roles that need it through an item slot in shared memory; items
// are numbered heaviest first when causal (in groups of heads), head-major when not.
#pragma once

#include "kernels/cuda/flash_attention/sm90_ptx.cuh"

namespace tg::cuda::flash::sm90 {

// A persistent grid's dynamic item counter (two words in global memory, zero at launch): the
// calling block's next work item is gridDim.x + the count of items claimed so far
// (claim_item); a block that has run out calls release_items once, and the last of them
// zeroes both words, so the next launch on the stream finds them zero again.
__device__ __forceinline__ int claim_item(unsigned* counter) { return int(gridDim.x + atomicAdd(counter, 1u)); }
__device__ __forceinline__ void release_items(unsigned* counter) {
  if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {  // every block is past its last claim
    atomicExch(counter, 0u);
    atomicExch(counter + 1, 0u);
  }
}
// The item slot of such a block: the producer writes (item, next claimed item) before the
// mbarrier arrival that publishes the item's own tiles; after waiting on that barrier a warp's
// lane 0 reads it and broadcasts it, so that the thread that later releases the tiles (and with
// them the slot) is the one that read it (the ordering compute-sanitizer's racecheck follows).
// A kernel may put more of an item in its slot after these two, read the same way
// (read_slot_pair).
__device__ __forceinline__ int2 read_slot_pair(const int* slot, int i, int lane) {
  int v[2] = {0, 0};
  if (lane == 0) v[0] = slot[i], v[1] = slot[i + 1];
  return {__shfl_sync(0xffffffffu, v[0], 0), __shfl_sync(0xffffffffu, v[1], 0)};
}
struct ItemSlot {
  int item, next;
};
__device__ __forceinline__ ItemSlot read_item_slot(const int* slot, int lane) {
  const int2 v = read_slot_pair(slot, 0, lane);
  return {v.x, v.y};
}

// ── Work items of the persistent kernels ──
// Item w of H · B · n_tiles, in one of two orders (blocks claim items in increasing w):
//   causal — heaviest first within groups of heads: the (head, batch) pairs hb = b·H + h in
//     groups of G consecutive ones, group after group; within a group head fastest, then the
//     tile, heaviest first — reversed (last tile first) when the heaviest tiles are the last ones
//     (heaviest_last: the forward's and the dQ pass's query tiles; the dK/dV pass's key blocks are
//     heaviest first as they are). G is the fewest heads whose tiles fill kCausalGroupWaves waves
//     of the grid, so that the blocks running at once share few heads — each streamed K/V (Q/dO)
//     tile, and the atomic mode's dQ rows, are reused while in L2 —, and a group's last, lightest
//     items still overlap the next group's heaviest (the dynamic scheduler keeps the order
//     whatever the items' lengths; only the last group's tail is not filled, and it is its
//     lightest items). With every head in one group the blocks running at once at T 4k would
//     work on 128 different heads. The groups pay in the deterministic kernels and the d 64
//     atomic one; the d 128 atomic kernel runs slower grouped and keeps one group (8 waves kept
//     of 2, 4 and 8, which measured alike, as the safer tail; docs/kernels.md §5.3).
//   non-causal — every item equally long, so head-major: tile w % n_tiles, head (w / n_tiles) % H,
//     batch w / (n_tiles · H). The blocks running at once then work on few heads, and each K/V (or
//     Q/dO) tile they stream is read by many of them while it is in L2 (docs/kernels.md §5.3:
//     1.05–1.11× the tile-major order).
// row0: the tile's first row.
struct ItemTile {
  int h, b, row0;
};
constexpr int kCausalGroupWaves = 8;
// The causal order, with groups of at least group_items items (all heads in one group if ≤ 0).
__device__ __forceinline__ ItemTile causal_item_tile(int w, int H, int B, int n_tiles, int rows, bool heaviest_last,
                                                     int group_items) {
  const int HB = H * B;
  const int G = group_items > 0 ? min(HB, max(1, (group_items + n_tiles - 1) / n_tiles)) : HB;
  const int per_group = G * n_tiles, group = w / per_group, r = w - group * per_group;
  const int group_heads = min(G, HB - group * G);  // the last group may have fewer
  const int z = r / group_heads, hb = group * G + r % group_heads;
  return {hb % H, hb / H, (heaviest_last ? n_tiles - 1 - z : z) * rows};
}
// grouped = false: every head in one group (the d 128 atomic dK/dV kernel's order, see
// dkdv_atomic_d128 in sm90_shapes.h).
__device__ __forceinline__ ItemTile item_tile(int w, int H, int B, int n_tiles, int rows, bool causal,
                                              bool heaviest_last, bool grouped = true) {
  if (!causal) return {(w / n_tiles) % H, w / (n_tiles * H), (w % n_tiles) * rows};
  return causal_item_tile(w, H, B, n_tiles, rows, heaviest_last, grouped ? kCausalGroupWaves * int(gridDim.x) : 0);
}
}  // namespace tg::cuda::flash::sm90
