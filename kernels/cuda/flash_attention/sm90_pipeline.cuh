// The producer/consumer pipeline of the warp-specialised sm_90a attention kernels (docs/kernels.md
// §5.1): the producer thread streams tile pairs through mbarrier-guarded stage buffers by TMA;
// consumers wait on a stage's "full" barriers and release it through its "empty" ones.
#pragma once

#include "kernels/cuda/flash_attention/sm90_ptx.cuh"

namespace tg::cuda::flash::sm90 {

// ── The producer of the warp-specialised kernels ──
// A stream of tile pairs through NS stage buffers — K/V tiles in the forward and the dQ kernel,
// Q/dO tiles in the dK/dV kernel (the fields keep the K/V names): the j-th pair (tiles first + j),
// Rows rows of Panels swizzled 64-column panels each, is the stream's pair seq0 + j (a persistent
// block's stream runs on across its work items) and goes to stage (seq0 + j) % NS once the consumers
// have released the pair that stage held (its "empty" barriers' phase ((seq0 + j) / NS − 1) & 1), and
// completes the stage's "full" barriers with its bytes. Tiles past the sequence's end are
// zero-filled.
struct KvStream {
  unsigned char* sK;
  unsigned char* sV;
  uint64_t* k_full;
  uint64_t* k_empty;
  uint64_t* v_full;
  uint64_t* v_empty;
};
// The mbarriers of a warp-specialised block, at `at` (8-byte aligned, after the tiles): *own_full
// for the block's own tiles, then per stage K full, K empty, V full, V empty (8·(1 + 4·NS) bytes).
// With init (one thread), initialises them: full ones for one arrival (the producer's, with the
// bytes; K's also for k_full_extra more, from producer threads that stage something beside the
// tile), empty ones for consumer_warps (K's for k_empty_count instead where that is not 0: where
// consumer threads release what they read with plain loads each, see flash_bwd_sm90a.cu); a
// block barrier must follow before anyone uses them.
template <int NS>
__device__ __forceinline__ KvStream kv_stream_barriers(unsigned char* at, unsigned char* sK, unsigned char* sV,
                                                       uint64_t** own_full, int consumer_warps, bool init,
                                                       int k_full_extra = 0, int k_empty_count = 0) {
  uint64_t* bars = reinterpret_cast<uint64_t*>(at);
  *own_full = bars;
  const KvStream kv{sK, sV, bars + 1, bars + 1 + NS, bars + 1 + 2 * NS, bars + 1 + 3 * NS};
  if (init) {
    mbarrier_init(bars, 1);
    for (int st = 0; st < NS; ++st) {
      mbarrier_init(&kv.k_full[st], 1 + k_full_extra);
      mbarrier_init(&kv.v_full[st], 1);
      mbarrier_init(&kv.k_empty[st], k_empty_count ? k_empty_count : consumer_warps);
      mbarrier_init(&kv.v_empty[st], consumer_warps);
    }
    fence_barrier_init();
  }
  return kv;
}
template <int Panels, int Rows, int NS>
__device__ __forceinline__ void produce_kv(const KvStream& s, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                           int head, int b, int n_tiles, int first = 0, int seq0 = 0) {
  constexpr int kPanel = Rows * kSwizzleRowBytes, kTile = Panels * kPanel;
  for (int j = 0; j < n_tiles; ++j) {
    const int st = (seq0 + j) % NS;
    const uint32_t use = uint32_t((seq0 + j) / NS);  // the stage's use count: its barriers' phase
    if (use > 0) mbarrier_wait(&s.k_empty[st], (use - 1) & 1);
    mbarrier_arrive_expect_tx(&s.k_full[st], kTile);
    for (int pn = 0; pn < Panels; ++pn)
      tma_load_4d(s.sK + st * kTile + pn * kPanel, k_map, 64 * pn, head, (first + j) * Rows, b, &s.k_full[st]);
    if (use > 0) mbarrier_wait(&s.v_empty[st], (use - 1) & 1);
    mbarrier_arrive_expect_tx(&s.v_full[st], kTile);
    for (int pn = 0; pn < Panels; ++pn)
      tma_load_4d(s.sV + st * kTile + pn * kPanel, v_map, 64 * pn, head, (first + j) * Rows, b, &s.v_full[st]);
  }
}
// A consumer's turns on tiles j_from … n_kb − 1 of an item without products (kSkipIdle: none of
// those tiles reaches its rows): each still takes its turn on the ring and releases the stage's K
// and V once their loads have landed (so that the releases count towards this use of the stage),
// which keeps the ring and the K/V stream going. hand_on_last: whether the item's last turn hands
// on (all but the ring's very last turn do). seq: the item's first tile's place in the stream.
template <int NS>
__device__ __forceinline__ void idle_turns(const KvStream& kv, int seq, int j_from, int n_kb, int my_turn,
                                           int next_turn, bool hand_on_last) {
  for (int j = j_from; j < n_kb; ++j) {
    const int st = (seq + j) % NS;
    const uint32_t phase = uint32_t((seq + j) / NS) & 1;
    named_barrier_sync(my_turn, 256);
    mbarrier_wait(&kv.k_full[st], phase);
    mbarrier_wait(&kv.v_full[st], phase);
    if (j + 1 < n_kb || hand_on_last) named_barrier_arrive(next_turn, 256);
    mbarrier_arrive_warp(&kv.k_empty[st]);
    mbarrier_arrive_warp(&kv.v_empty[st]);
  }
}
// Rows [row0, row0 + rows) of a tensor as Panels panels (panel_bytes apart) on one barrier.
template <int Panels>
__device__ __forceinline__ void produce_tile(unsigned char* dst, int panel_bytes, const CUtensorMap* map, int head,
                                             int row0, int b, uint64_t* full) {
  for (int pn = 0; pn < Panels; ++pn) tma_load_4d(dst + pn * panel_bytes, map, 64 * pn, head, row0, b, full);
}
}  // namespace tg::cuda::flash::sm90
