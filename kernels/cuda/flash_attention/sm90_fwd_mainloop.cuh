// The sm_90a forward's consumer main loop (flash_fwd_sm90a.cu): one consumer warpgroup's 64 query
// rows of an item against its K/V tiles, in the order of the CPU reference
// (kernels/cpu/flash_attention.cpp): per key tile j, S = Q K_jᵀ; the online softmax step (the
// running row max m and sum l, the scores' exponentials P, O rescaled by the max's change); O +=
// P V_j. On Hopper the three run pipelined across tiles and consumers: a consumer's turn issues S
// of tile j with P_{j−1} V_{j−1}, and tile j's softmax runs while the second product does; the
// turns pass around the ring of consumer warpgroups (named barriers), so that one warpgroup's
// softmax runs under the others' products. The item's last tile runs through one function,
// templated on the keys its products span (last_turn): the tile narrowed to where T ends
// (kTailBc), or causal, the first consumer's half of the diagonal tile (kHalfDiagonal).
//
// Every product's key count is a constant at its call, so that each call inlines one product: a
// wgmma issued conditionally inside a loop makes ptxas serialise them all.
#pragma once
#include <cstdint>

#include "kernels/cuda/flash_attention/mask.cuh"
#include "kernels/cuda/flash_attention/sm90_pipeline.cuh"
#include "kernels/cuda/flash_attention/sm90_ptx.cuh"
#include "kernels/cuda/flash_attention/tile.cuh"
#include "kernels/cuda/flash_attention/wgmma.cuh"

namespace tg::cuda::flash {

// The first N / 8 rows of a fragment array of S columns (N of them) / the first N / 16 k-steps of
// its A fragments: the products over an item's last, part-filled K/V tile (kTailBc).
template <int N, int R>
__device__ __forceinline__ float (&first_cols(float (&s)[R][4]))[N / 8][4] {
  static_assert(N / 8 <= R, "within the array");
  return reinterpret_cast<float (&)[N / 8][4]>(s);
}
template <int N, int R>
__device__ __forceinline__ const uint32_t (&first_k_steps(const uint32_t (&a)[R][4]))[N / 16][4] {
  static_assert(N / 16 <= R, "within the array");
  return reinterpret_cast<const uint32_t (&)[N / 16][4]>(a);
}

// One consumer warpgroup's view of the block (Tr: FwdSm90aTraits): the K/V stream, its Q rows
// (in shared memory, or with kQInRegisters as A fragments in qf), its place in the ring of turns.
template <class Tr>
struct FwdConsumer {
  static constexpr int Bc = Tr::kBc, NS = Tr::kStages, C = Tr::kConsumers, Dh = Tr::kHeadDim;
  const sm90::KvStream& kv;
  const unsigned char* sK;
  const unsigned char* sV;
  const unsigned char* sQw;  // the warpgroup's rows of Q, in each panel
  const uint32_t (&qf)[Tr::kQInRegisters ? Dh / 16 : 1][4];
  int c, my_turn, next_turn;
  float scale2;  // scale · log₂e

  // S = Q K_gᵀ over the first N keys of the stream's tile g, into the first N columns of s.
  template <int N, int R>
  __device__ __forceinline__ void issue_s(float (&s)[R][4], int g) const {
    const int st = g % NS;
    sm90::mbarrier_wait(&kv.k_full[st], uint32_t(g / NS) & 1);
    const unsigned char* Kj = sK + st * Tr::kTileKV;
    sm90::wgmma_fence();
    if constexpr (Tr::kQInRegisters)
      sm90::wgmma_abt_rs<Dh, N>(first_cols<N>(s), qf, Kj, Tr::kPanelKV);
    else
      sm90::wgmma_abt_ss<Dh, N>(first_cols<N>(s), sQw, Tr::kPanelQ, Kj, Tr::kPanelKV);
    sm90::wgmma_commit();
  }
  // O += P V_g over the first N keys of the stream's tile g (P: the first N / 16 k-steps of p).
  template <int N, int K>
  __device__ __forceinline__ void issue_pv(float (&o)[Dh / 8][4], const uint32_t (&p)[K][4], int g) const {
    const int st = g % NS;
    sm90::mbarrier_wait(&kv.v_full[st], uint32_t(g / NS) & 1);
    sm90::wgmma_fence();
    sm90::wgmma_ab_rs<Dh, N>(o, first_k_steps<N>(p), sV + st * Tr::kTileKV, Tr::kPanelKV);
    sm90::wgmma_commit();
  }
  // This warp is done reading a stage (its wgmma has retired).
  __device__ __forceinline__ static void release(uint64_t* bar) { sm90::mbarrier_arrive_warp(bar); }
};

// One item of one consumer: its rows' running max m and sum l, the O accumulator, the S tile and
// the P fragments of the tile before (pf), and where the item lies in the stream and the ring.
template <class Tr>
struct FwdItemLoop {
  static constexpr int Bc = Tr::kBc, NS = Tr::kStages, C = Tr::kConsumers, Dh = Tr::kHeadDim;
  const FwdConsumer<Tr>& cs;
  uint64_t* q_empty;
  int seq;   // the stream position of the item's first tile
  int n_kb;  // the item's tiles
  int n_need;  // the tiles this consumer multiplies (n_kb but with kSkipIdle)
  bool last_item;
  int T;
  bool causal;
  int kb0;        // the item's first K/V tile (structured masks; 0 without)
  ItemMask mask;  // this warp's rows' first visible keys (mask.cuh)
  int row0, lane;  // this warp's first query row
  float (&o)[Dh / 8][4];
  float (&m)[2];
  float (&l)[2];
  float (&s)[Bc / 8][4];
  uint32_t (&pf)[Bc / 16][4];

  // The turn passes on unless this is the ring's very last one (the last consumer's last tile of
  // the block's last item: consumer 0 has taken all of its turns).
  __device__ __forceinline__ void hand_on(int j) const {
    if (cs.c != C - 1 || j + 1 < n_kb || !last_item) sm90::named_barrier_arrive(cs.next_turn, 256);
  }
  // The online softmax step over tile j's W keys in s (W = Bc, or 64 over the half diagonal):
  // masked where the tile reaches past T or crosses the diagonal (kDiagonal: always, causal) or,
  // with a structured mask, reaches before the warp's last row's first visible key; the new row
  // max (alpha: the factor of the old), the exponentials and their row sums (sum).
  template <int W, bool kDiagonal = false>
  __device__ __forceinline__ void softmax(float (&sw)[W / 8][4], int j, float (&alpha)[2], float (&sum)[2]) {
    const int k0 = (kb0 + j) * Bc;
    const int t = T;
    if (mask.needs_mask(k0)) {
      const ItemMask mk = mask;
      const int r0 = row0;
      mask_tile<W>(sw, row0, k0, lane, [=](int q, int k) { return k >= t || k > q || mk.excluded(q - r0, k); });
    } else if constexpr (kDiagonal) {
      mask_tile<W>(sw, row0, k0, lane, [=](int q, int k) { return k >= t || k > q; });
    } else {
      const bool c_ = causal;
      if (k0 + W > T || (causal && k0 + W - 1 > row0))
        mask_tile<W>(sw, row0, k0, lane, [=](int q, int k) { return k >= t || (c_ && k > q); });
    }
    update_row_max_raw<W>(m, alpha, sw, cs.scale2);
    exp2_rows_raw<W>(sw, m, sum, cs.scale2);
  }
  // Turn 0: S of tile 0, its softmax and P. Q is released with the consumer's last S: the next
  // item's Q then loads under this one's tail.
  __device__ __forceinline__ void first_turn() {
    sm90::named_barrier_sync(cs.my_turn, 256);
    cs.template issue_s<Bc>(s, seq);
    hand_on(0);
    sm90::wgmma_wait<0>();
    cs.release(&cs.kv.k_empty[seq % NS]);
    if (n_need == 1) cs.release(q_empty);
    float alpha[2], sum[2];
    softmax<Bc>(s, 0, alpha, sum);
    rescale_accumulate<Dh>(o, l, alpha, sum);
    acc_to_a<Bc>(pf, s);
  }
  // Turn j ≥ 1 over the first N keys of tile j: S_j into sj (W = 8R ≥ N columns) issued with
  // P_{j−1} V_{j−1}, then tile j's softmax over sj's W columns (keys past T masked), O rescaled
  // once P_{j−1} V_{j−1} has landed, and P_j into pj.
  template <int N, bool kDiagonal = false, int R>
  __device__ __forceinline__ void turn(float (&sj)[R][4], uint32_t (&pj)[R / 2][4], int j) {
    constexpr int W = 8 * R;
    sm90::named_barrier_sync(cs.my_turn, 256);
    cs.template issue_s<N>(sj, seq + j);
    cs.template issue_pv<Bc>(o, pf, seq + j - 1);
    hand_on(j);
    sm90::wgmma_wait<1>();  // S of tile j has landed; P_{j−1} V_{j−1} may still run
    cs.release(&cs.kv.k_empty[(seq + j) % NS]);
    if (j + 1 == n_need) cs.release(q_empty);
    float alpha[2], sum[2];
    softmax<W, kDiagonal>(sj, j, alpha, sum);
    sm90::wgmma_wait<0>();  // P_{j−1} V_{j−1} has landed: O may be rescaled and pf rewritten
    cs.release(&cs.kv.v_empty[(seq + j - 1) % NS]);
    rescale_accumulate<Dh>(o, l, alpha, sum);
    acc_to_a<W>(pj, sj);
  }
  // The item's last tile j (j ≥ 1) over its first N keys — the tile's turn, then O += P_j V_j
  // over those keys: N = kTailBc, T's last tile narrowed (sj, pj: the item's s, pf), or, causal,
  // N = 64 with kDiagonal, the first consumer's half of the diagonal tile (sj, pj of their own:
  // as a prefix of s and pf ptxas serialised the wgmmas).
  template <int N, bool kDiagonal = false, int R>
  __device__ __forceinline__ void last_turn(float (&sj)[R][4], uint32_t (&pj)[R / 2][4], int j) {
    turn<N, kDiagonal>(sj, pj, j);
    cs.template issue_pv<N>(o, pj, seq + j);
  }
  // Every tile this consumer's rows need, then the last product retired.
  __device__ __forceinline__ void run() {
    first_turn();
    constexpr int Bt = Tr::kTailBc;
    if constexpr (Tr::kHalfDiagonal) {
      // Causal: the first consumer's last tile (the item's diagonal one, its rows q0..q0+63)
      // over its first 64 keys, when it is not also the item's first.
      const bool half = causal && cs.c == 0 && n_need >= 2;
      for (int j = 1; j < n_need - (half ? 1 : 0); ++j) turn<Bc>(s, pf, j);
      if (half) {
        float sh[8][4];
        uint32_t ph[4][4];
        last_turn<64, true>(sh, ph, n_need - 1);
      } else {
        cs.template issue_pv<Bc>(o, pf, seq + n_need - 1);
      }
    } else if constexpr (Bt == Bc) {
      for (int j = 1; j < n_need; ++j) turn<Bc>(s, pf, j);
      cs.template issue_pv<Bc>(o, pf, seq + n_need - 1);
    } else {  // (n_kb ≥ 2: fwd_last_tile_keys)
      for (int j = 1; j + 1 < n_need; ++j) turn<Bc>(s, pf, j);
      last_turn<Bt>(s, pf, n_need - 1);
    }
    sm90::wgmma_wait<0>();
    cs.release(&cs.kv.v_empty[(seq + n_need - 1) % NS]);
  }
};

}  // namespace tg::cuda::flash
