// The sm_90a backward's dK/dV consumer main loop (flash_bwd_sm90a.cu), shared by the deterministic
// kernel and the atomic-dQ one (Tr::kFormDq): a consumer warpgroup owns 64 keys of an item's key
// block and, per streamed query tile j, recomputes the scores from the forward's log-sum-exp as
// the CPU reference does (kernels/cpu/flash_attention.cpp): Sᵀ = K Qᵀ and dPᵀ = V dOᵀ, Pᵀ =
// exp2(Sᵀ·scale₂ − lse₂) masked where the tile crosses the causal diagonal or T, dV += Pᵀ dO,
// dSᵀ = Pᵀ ∘ (dPᵀ − delta), dK += dSᵀ Q — one set of per-tile operations that the three loops
// (products retired in turn; pipelined, dK_{j−1} issued with Sᵀ_j, dPᵀ_j; and the atomic kernel's,
// which also forms dQ = dS K and stages it for the bulk reductions) run in their orders. Causal
// block skipping: an item's query tiles start at the tile of its first key and (structured masks)
// end at the tile of the last query that sees its last key (query_tiles); with kSkipIdle a
// consumer takes the tiles wholly before its own keys as turns without products.
#pragma once
#include <cstdint>

#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/flash_attention/mask.cuh"
#include "kernels/cuda/flash_attention/sm90_epilogue.cuh"
#include "kernels/cuda/flash_attention/sm90_pipeline.cuh"
#include "kernels/cuda/flash_attention/sm90_ptx.cuh"
#include "kernels/cuda/flash_attention/sm90_scheduler.cuh"
#include "kernels/cuda/flash_attention/tile.cuh"
#include "kernels/cuda/flash_attention/wgmma.cuh"

namespace tg::cuda::flash {

// The dK/dV kernel's block in shared memory, as flash_bwd_dkdv_sm90a_ws_kernel lays it out: its
// own K_j, V_j; the Q/dO stages and their statistics (lse, delta, and with a structured mask sLo,
// the first key each stage's last query sees); the staging tiles of dK and dV (kStoreByTma) or of
// dSᵀ and dQ (kFormDq); the mbarriers and the item slots.
struct DkdvSmem {
  unsigned char *sK, *sV, *sQ, *sdO, *sStage, *sdSt;
  float *sDq, *sL, *sDelta;
  int* sLo;
  sm90::KvStream qdo;
  uint64_t *own_full, *own_empty, *ds_full, *ds_empty, *dq_full, *dq_empty;
  int* s_item;
  long long* s_dq;
};

// The dK/dV kernel's item slot holds the item's query tiles [first, end) after the item and the
// next (s_item[2], s_item[3]; the producer's query_tiles): read as read_item_slot reads the item.
__device__ __forceinline__ SeqMask::Range read_query_range(const int* slot, int lane) {
  const int2 v = sm90::read_slot_pair(slot, 2, lane);
  return {v.x, v.y};
}

// Consumer warpgroup wg (≥ 1) of the dK/dV kernel (Tr: DkdvWsSm90aTraits), over the items of its
// block until the last: item_of(w) work item w's key block, head and batch (the kernel's order);
// each item's query tiles from its slot.
template <class Tr, bool kMasked, class Maps, class ItemOf>
__device__ __forceinline__ void dkdv_consumer(const FlashAttentionParams& p, const Maps& maps, const DkdvSmem& sm, int T,
                                              int H, bool causal, int n_items, ItemOf item_of, float* dq_accum,
                                              int accum_rows, int tid, int wg) {
  constexpr int D = Tr::kD, Bc = Tr::kBc, Br = Tr::kBr, NS = Tr::kStages, C = Tr::kConsumers;
  constexpr int Dh = Tr::kHeadDim;  // Sᵀ, dPᵀ sum over the head's columns; dK, dV are that wide
  constexpr int NDs = Tr::kDsBuffers, NSt = Tr::kDqStaging;
  unsigned char *sK = sm.sK, *sV = sm.sV, *sQ = sm.sQ, *sdO = sm.sdO, *sStage = sm.sStage, *sdSt = sm.sdSt;
  float *sDq = sm.sDq, *sL = sm.sL, *sDelta = sm.sDelta;
  const int* sLo = sm.sLo;
  const sm90::KvStream& qdo = sm.qdo;
  uint64_t *own_full = sm.own_full, *own_empty = sm.own_empty, *ds_full = sm.ds_full, *ds_empty = sm.ds_empty;
  uint64_t *dq_full = sm.dq_full, *dq_empty = sm.dq_empty;
  int* s_item = sm.s_item;
  long long* s_dq = sm.s_dq;
  sm90::setmaxnreg_inc<Tr::kConsumerRegs>();
  const int c = wg - 1, warp = (tid % 128) / 32, lane = tid & 31;
  // (The scale, the warpgroup's rows of K and V and the item's parity are recomputed where used:
  // at d 128 the pipelined loop has no registers to spare for them.)
  const int my_turn = 1 + c, next_turn = 1 + (c + 1) % C;
  if (Tr::kPingPong && c == C - 1) sm90::named_barrier_arrive(1, 256);  // consumer 0 takes the first turn
  int seq = 0;  // as the producer's
  // kOwnInRegisters: this warp's rows of K_j and V_j as A fragments, loaded per item.
  uint32_t kf[Tr::kOwnInRegisters ? Dh / 16 : 1][4], vf[Tr::kOwnInRegisters ? Dh / 16 : 1][4];

  for (int it = 0, last_item = 0; !last_item; ++it) {
  sm90::mbarrier_wait(own_full, uint32_t(it) & 1);  // K_j, V_j and the item slot
  if constexpr (Tr::kOwnInRegisters) {
    sm90::load_a_frags_swizzled<Dh>(kf, sK, Tr::kPanelOwn, 64 * c + 16 * warp, lane);
    sm90::load_a_frags_swizzled<Dh>(vf, sV, Tr::kPanelOwn, 64 * c + 16 * warp, lane);
  }
  const sm90::ItemSlot slot = sm90::read_item_slot(s_item, lane);
  last_item = slot.next >= n_items;  // the ring's very last turn hands on to no one
  const sm90::ItemTile item = item_of(slot.item);
  const SeqMask::Range queries = read_query_range(s_item, lane);
  const int i_begin = queries.first, n_tiles = queries.end - queries.first;  // ≥ 1
  const int key0 = item.row0 + 64 * c + 16 * warp;  // this warp's first key
  if constexpr (Tr::kReleaseOwnEarly) {  // K_j, V_j are in kf, vf and the item in `item`
    sm90::mbarrier_arrive_warp(own_empty);
  }
  float dk[Dh / 8][4], dv[Dh / 8][4];  // (16, Dh) per warp: the warpgroup's (64, Dh) accumulators
  zero(dk);
  zero(dv);

  float s[Br / 8][4], dp[Br / 8][4];
  uint32_t pf[Br / 16][4], dsf[Br / 16][4];
  auto stage = [&](int j) { return (seq + j) % NS; };
  auto turn_begin = [&] {
    if constexpr (Tr::kPingPong) sm90::named_barrier_sync(my_turn, 256);
  };
  auto turn_end = [&](int j) {
    if constexpr (Tr::kPingPong)
      if (c != C - 1 || j + 1 < n_tiles || !last_item) sm90::named_barrier_arrive(next_turn, 256);
  };
  auto issue_s_dp = [&](int j) {  // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ of tile j, one commit group
    const int st = stage(j);
    sm90::mbarrier_wait(&qdo.k_full[st], uint32_t((seq + j) / NS) & 1);
    sm90::mbarrier_wait(&qdo.v_full[st], uint32_t((seq + j) / NS) & 1);
    sm90::wgmma_fence();
    if constexpr (Tr::kOwnInRegisters) {
      sm90::wgmma_abt_rs<Dh, Br>(s, kf, sQ + st * Tr::kTileStream, Tr::kPanelStream);
      sm90::wgmma_abt_rs<Dh, Br>(dp, vf, sdO + st * Tr::kTileStream, Tr::kPanelStream);
    } else {
      const int own_row = 64 * c * sm90::kSwizzleRowBytes;  // the warpgroup's rows, in each panel
      sm90::wgmma_abt_ss<Dh, Br>(s, sK + own_row, Tr::kPanelOwn, sQ + st * Tr::kTileStream, Tr::kPanelStream);
      sm90::wgmma_abt_ss<Dh, Br>(dp, sV + own_row, Tr::kPanelOwn, sdO + st * Tr::kTileStream, Tr::kPanelStream);
    }
    sm90::wgmma_commit();
  };
  auto issue_dk = [&](int j) {  // dK += dSᵀ_j Q_j
    sm90::wgmma_fence();
    sm90::wgmma_ab_rs<Dh, Br>(dk, dsf, sQ + stage(j) * Tr::kTileStream, Tr::kPanelStream);
    sm90::wgmma_commit();
  };
  // Pᵀ = exp(S·scale − lse) into pf, then dV += Pᵀ dO issued.
  auto p_and_dv = [&](int j) {
    const int st = stage(j), q0 = (i_begin + j) * Br;
    exp2_scaled_minus_col<Br>(s, p.scale * kLog2e, sL + st * Br, lane);
    // Structured masks: the tile's last query's first visible key (staged with the statistics)
    // after this warp's first key. The item's batch row: from `item` where it is kept
    // (kReleaseOwnEarly: the slot may already hold the next item), else read again from the slot
    // (stable until own_empty, not kept in registers across the loop).
    if (kMasked && sLo[st] > key0) {  // uniform per warp; masked entries exactly 0
      const SeqMask mask = seq_mask_if<kMasked>(p, Tr::kReleaseOwnEarly ? item.b : item_of(s_item[0]).b);
      mask_tile<Br>(s, key0, q0, lane, [=](int k, int q) { return q >= T || k > q || mask.excluded(q, k); }, 0.0f);
    } else if (q0 + Br > T || (causal && key0 + kRowsPerWarp - 1 > q0))  // uniform per warp; masked entries exactly 0
      mask_tile<Br>(s, key0, q0, lane, [=](int k, int q) { return q >= T || (causal && k > q); }, 0.0f);
    acc_to_a<Br>(pf, s);
    sm90::wgmma_fence();
    sm90::wgmma_ab_rs<Dh, Br>(dv, pf, sdO + st * Tr::kTileStream, Tr::kPanelStream);
    sm90::wgmma_commit();
  };
  auto ds = [&](int j) {  // dSᵀ = Pᵀ ∘ (dPᵀ − delta), without the scale, into dsf
    softmax_grad_col_bf16p<Br>(dp, pf, sDelta + stage(j) * Br, lane);
    acc_to_a<Br>(dsf, dp);
  };
  auto release = [&](int j) {  // this warp is done with tile j's Q_i, dO_i and their statistics
    sm90::mbarrier_arrive(&qdo.k_empty[stage(j)]);  // every thread: its statistics loads
    sm90::mbarrier_arrive_warp(&qdo.v_empty[stage(j)]);
  };
  // Tile j's Sᵀ, dPᵀ in this consumer's turn, waited for; then Pᵀ with dV's product issued, and
  // dSᵀ into dsf.
  auto s_dp_then_p_ds = [&](int j) {
    turn_begin();
    issue_s_dp(j);
    turn_end(j);
    sm90::wgmma_wait<0>();
    p_and_dv(j);
    ds(j);
  };

  // With kSkipIdle only the query tiles this consumer's keys need: none when they all lie past T
  // (a head's last, part-filled key block) and, causal, only those from the tile of its first key
  // on (the block's earlier tiles serve its other consumers' keys: with two consumers of 64 keys
  // and 64-query tiles, the second one's first tile is wholly masked). It takes the others first,
  // as turns without products, each releasing its stage once the stage's loads have landed (so
  // that they count towards this use). The pipelined loop multiplies at least the item's last tile.
  int j_first = 0;
  if constexpr (Tr::kSkipIdle) {
    const int kr0 = item.row0 + 64 * c;
    j_first = kr0 >= T ? n_tiles : causal ? max(0, min(n_tiles, kr0 / Br - i_begin)) : 0;
    if constexpr (Tr::kPipelined) j_first = min(j_first, n_tiles - 1);
    for (int j = 0; j < j_first; ++j) {
      turn_begin();
      sm90::mbarrier_wait(&qdo.k_full[stage(j)], uint32_t((seq + j) / NS) & 1);
      sm90::mbarrier_wait(&qdo.v_full[stage(j)], uint32_t((seq + j) / NS) & 1);
      turn_end(j);
      release(j);
    }
  }
  if constexpr (!Tr::kFormDq && !Tr::kPipelined) {  // tile j's four products, retired in turn
    for (int j = j_first; j < n_tiles; ++j) {
      s_dp_then_p_ds(j);
      issue_dk(j);
      sm90::wgmma_wait<0>();  // dV_j has read pf, dK_j dsf and Q_j
      release(j);
    }
  } else if constexpr (!Tr::kFormDq) {
    // Each turn issues Sᵀ_j, dPᵀ_j and dK += dSᵀ_{j−1} Q_{j−1}, so that dK's product runs while
    // this consumer exponentiates; every product is retired within the iteration that issues it
    // (none in flight across the loop's back edge), as in the dQ kernel.
    s_dp_then_p_ds(j_first);
    sm90::wgmma_wait<0>();  // dV of the first tile has read pf
    for (int j = j_first + 1; j < n_tiles; ++j) {
      turn_begin();
      issue_s_dp(j);
      issue_dk(j - 1);
      turn_end(j);
      sm90::wgmma_wait<1>();  // Sᵀ_j, dPᵀ_j have landed; dK_{j−1} may still run
      p_and_dv(j);
      sm90::wgmma_wait<1>();  // dK_{j−1} has read dsf and Q_{j−1}; dV_j may still run
      release(j - 1);
      ds(j);
      sm90::wgmma_wait<0>();  // dV_j has read pf
    }
    issue_dk(n_tiles - 1);
    sm90::wgmma_wait<0>();
    release(n_tiles - 1);
  } else {
    // FormDq: tile j's dQ product needs both consumers' dSᵀ_j, so it is issued a tile later —
    // with dK_{j+1}, once the other consumer has long written its half — and staged for the
    // reduction when it has retired, at the end of that iteration (staged under the next Sᵀ, dPᵀ
    // instead, the registers overflowed). The consumers may then run up to a tile apart instead
    // of meeting at every tile. g, the block's tile count (seq + j), picks the dSᵀ buffer
    // (g % NDs), the staging tile (g % NSt) and their phases; with kDqByTurns, the consumer that
    // forms tile g's dQ (g % 2).
    // dq: (64 queries, the kDqCols columns of dQ this consumer forms), declared where it is
    // used: the wgmma's accumulator operands are read-write, so one declared outside the loop
    // stays live across it (32 registers more at the loop's peak; ptxas then spilled 440 bytes).
    const int dq_col0 = Tr::kDqByTurns ? 0 : Tr::kDqCols * c;  // the first dQ column this consumer forms
    // dQ of the block's tile g = dS K_j over its Bc keys (SS, A read transposed).
    auto issue_dq = [&](float (&dq)[Tr::kDqCols / 8][4], int g) {
      const int buf = g % NDs;
      sm90::mbarrier_wait(&ds_full[buf], uint32_t(g / NDs) & 1);  // both consumers' dSᵀ rows
      const uint64_t desc_ds = sm90::opaque_u64(sm90::mn_major_descriptor(sdSt + buf * Tr::kTileDs, Tr::kTileDs));
      const uint64_t desc_k =
          sm90::opaque_u64(sm90::mn_major_descriptor(sK + dq_col0 / 64 * Tr::kPanelOwn, Tr::kPanelOwn));
      sm90::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < Bc / 16; ++kk)  // a k-step of 16 keys is 16 rows of both tiles, 2048 bytes
        sm90::wgmma_m64n64k16_ss<1, 1>(sm90::flat(dq), desc_ds + kk * 2048 / 16, desc_k + kk * 2048 / 16, kk > 0);
      sm90::wgmma_commit();
    };
    // Tile g (the item's tile j)'s dQ product has retired: its dSᵀ buffer is free, and dq goes to
    // its staging tile once the reduction of that tile's last use has read it, in the dq_accum
    // layout: row r at sDq + r·D, the column pair (col, col + 1) at ((col & ~7) ^ 8·(r % 8)) +
    // (col & 7) (dq_accum_offset); both of a lane's rows are lane / 4 mod 8, so one XOR term
    // serves all its stores, which hit distinct banks.
    auto stage_dq = [&](const float (&dq)[Tr::kDqCols / 8][4], int g, int j) {
      const int k = g % NSt;
      sm90::mbarrier_arrive_warp(&ds_empty[g % NDs]);
      if (g >= NSt) sm90::mbarrier_wait(&dq_empty[k], uint32_t(g / NSt - 1) & 1);
      float* rows = sDq + k * (Tr::kTileDq / 4) + (16 * warp + (lane >> 2)) * D + frag_col(lane, 0, 0);
      const uint32_t chunk_xor = sm90::opaque_u32((lane >> 2) * 8);
#pragma unroll
      for (int e = 0; e < 2; ++e)
#pragma unroll
        for (int nt = 0; nt < Tr::kDqCols / 8; ++nt)
          *reinterpret_cast<float2*>(rows + 8 * e * D + ((dq_col0 + 8 * nt) ^ chunk_xor)) =
              make_float2(dq[nt][2 * e], dq[nt][2 * e + 1]);
      if ((Tr::kDqByTurns || c == 0) && warp == 0 && lane == 0) {  // the destination, for the reducing thread
        const sm90::ItemTile at = item_of(s_item[0]);
        s_dq[2 * k] = ((int64_t(at.b) * H + at.h) * accum_rows + int64_t(s_item[2] + j) * Br) * D;
        s_dq[2 * k + 1] = last_item && j + 1 == n_tiles;
      }
      sm90::fence_async_shared();  // st.shared, read by the bulk copy engine
      sm90::mbarrier_arrive_warp(&dq_full[k]);
    };
    // Tile j's four products (dK's issued), its dSᵀ rows published.
    auto tile_products = [&](int j) {
      const int g = seq + j, buf = g % NDs;
      s_dp_then_p_ds(j);
      // This warp's 16 dSᵀ rows into their buffer, once the dQ product of its last use has read it.
      if (g >= NDs) sm90::mbarrier_wait(&ds_empty[buf], uint32_t(g / NDs - 1) & 1);
      sm90::store_a_frags_swizzled(sdSt + buf * Tr::kTileDs + 64 * c * sm90::kSwizzleRowBytes, dsf, 16 * warp, lane);
      sm90::fence_async_shared();  // st.shared, read by the other warps' wgmma
      issue_dk(j);
      sm90::mbarrier_arrive_warp(&ds_full[buf]);
    };
    // Iteration j ≥ 1: tile j's products, and tile j − 1's dQ product with them (a tile later).
    auto tile_with_dq = [&](int j) {
      tile_products(j);
      float dq[Tr::kDqCols / 8][4];
      issue_dq(dq, seq + j - 1);
      sm90::wgmma_wait<0>();  // dV_j, dK_j and dQ_{j−1}
      release(j);
      stage_dq(dq, seq + j - 1, j - 1);
    };
    auto last_dq = [&] {  // the item's last tile's dQ product, after its loop
      float dq[Tr::kDqCols / 8][4];
      issue_dq(dq, seq + n_tiles - 1);
      sm90::wgmma_wait<0>();
      stage_dq(dq, seq + n_tiles - 1, n_tiles - 1);
    };
    // The first tile alone, and no conditional wgmma inside a loop: ptxas would serialise them.
    tile_products(0);
    sm90::wgmma_wait<0>();
    release(0);
    if constexpr (!Tr::kDqByTurns) {
      for (int j = 1; j < n_tiles; ++j) tile_with_dq(j);
      last_dq();
    } else {
      // This consumer forms the dQ of the block's tiles g with g % 2 = c: iteration j (which
      // issues tile j − 1's) every second one. The loop runs pairs of iterations, the first with
      // this consumer's dQ product; an iteration without one before it if the item's first
      // tile is the other consumer's.
      auto tile_without_dq = [&](int j) {
        tile_products(j);
        sm90::wgmma_wait<0>();
        release(j);
      };
      const auto forms = [&](int g) { return (g & 1) == c; };
      int j = 1;
      if (j < n_tiles && !forms(seq + j - 1)) tile_without_dq(j++);
      for (; j + 1 < n_tiles; j += 2) {
        tile_with_dq(j);
        tile_without_dq(j + 1);
      }
      if (j < n_tiles) tile_with_dq(j);  // (j − 1 is this consumer's tile)
      if (forms(seq + n_tiles - 1)) last_dq();
    }
  }

  // Every product of the item has retired: K_j, V_j (and the item slot) may take the next
  // item's, unless released at the start. The item read again first, so that it is not kept
  // from the top (at d 128 the loop has no registers to spare).
  sm90::ItemTile out = item;
  if constexpr (!Tr::kReleaseOwnEarly) {
    const sm90::ItemSlot done = sm90::read_item_slot(s_item, lane);
    sm90::mbarrier_arrive_warp(own_empty);
    out = item_of(done.item);
  }
  seq += n_tiles;

  // dK = scale · Σ dSᵀ Q: the softmax scale applied once, in fp32.
  if constexpr (Tr::kStoreByTma) {
    unsigned char* st_dk = sStage + 2 * c * Tr::kTileStage;
    unsigned char* st_dv = st_dk + Tr::kTileStage;
    const float fk[2] = {p.scale, p.scale}, fv[2] = {1.0f, 1.0f};
    const int key0 = out.row0 + 64 * c;
    sm90::store_staged_by_tma(
        sm90::kStagingBarrier + c, tid % 128 == 0, key0 < T,
        [&] {
          sm90::store_acc_swizzled<Dh>(st_dk, 64 * sm90::kSwizzleRowBytes, dk, fk, 16 * warp, lane);
          sm90::store_acc_swizzled<Dh>(st_dv, 64 * sm90::kSwizzleRowBytes, dv, fv, 16 * warp, lane);
        },
        [&] {
          sm90::tma_store_tile<Tr::kPanels>(&maps.dk, out.h, key0, out.b, st_dk);
          sm90::tma_store_tile<Tr::kPanels>(&maps.dv, out.h, key0, out.b, st_dv);
        });
  } else {
    const int64_t bt = int64_t(out.b) * T;
    tg::bf16* dK = p.dk + bt * p.dk_row_stride + out.h * p.D;
    tg::bf16* dV = p.dv + bt * p.dv_row_stride + out.h * p.D;
    const float fk[2] = {p.scale, p.scale}, fv[2] = {1.0f, 1.0f};
    const int key_row = out.row0 + 64 * c + 16 * warp;
    store_rows<Dh>(dK, int(p.dk_row_stride), dk, fk, key_row, T, lane);
    store_rows<Dh>(dV, int(p.dv_row_stride), dv, fv, key_row, T, lane);
  }
  }
  if constexpr (Tr::kStoreByTma)
    if (tid % 128 == 0) sm90::bulk_wait<0>();  // the last stores done before the block exits
}

// The dQ kernel's block in shared memory, as flash_bwd_dq_sm90a_kernel lays it out: its own Q, dO
// tiles (kQBuffers pairs), the K/V stages, the dQ staging tiles (kStoreByTma), the mbarriers — Q's
// full and empty ones per buffer (q_full_of, q_empty_of) — and the item slots.
template <class QFullOf, class QEmptyOf>
struct DqSmem {
  unsigned char *sQ, *sdO, *sK, *sV, *sStage;
  sm90::KvStream kv;
  QFullOf q_full_of;
  QEmptyOf q_empty_of;
  int* s_item;
};

// Consumer warpgroup wg (≥ 1) of the dQ kernel (Tr: DqSm90aTraits), over the items of its block
// until the last: per key tile j of its 64 query rows, S = Q K_jᵀ and dP = dO V_jᵀ, P =
// exp2(S·scale₂ − lse₂) recomputed from the forward's log-sum-exp and masked, dS = P ∘ (dP −
// delta), dQ += dS K_j (summed over j in a fixed order: deterministic); keys_of(item) the key
// tiles [first, end) an item's query tile sees (causal and structured-mask block skipping), and
// with kSkipIdle a consumer takes the tiles past its own rows' diagonal as turns without products.
template <class Tr, bool kMasked, class Maps, class Smem, class KeysOf>
__device__ __forceinline__ void dq_consumer(const FlashAttentionParams& p, const float* __restrict__ delta, const Maps& maps,
                                            const Smem& sm, int T, int H, int B, bool causal, int n_qb, int n_items,
                                            KeysOf keys_of, int tid, int wg) {
  constexpr int Br = Tr::kBr, Bc = Tr::kBc, NS = Tr::kStages, C = Tr::kConsumers, QB = Tr::kQBuffers;
  constexpr int Dh = Tr::kHeadDim;  // S, dP sum over the head's columns; dQ = dS K is that wide
  unsigned char *sQ = sm.sQ, *sdO = sm.sdO, *sK = sm.sK, *sV = sm.sV, *sStage = sm.sStage;
  const sm90::KvStream& kv = sm.kv;
  const auto q_full_of = sm.q_full_of;
  const auto q_empty_of = sm.q_empty_of;
  int* s_item = sm.s_item;
  sm90::setmaxnreg_inc<Tr::kConsumerRegs>();
  const int c = wg - 1, warp = (tid % 128) / 32, lane = tid & 31;
  const float scale_log2 = p.scale * kLog2e;
  const unsigned char* sQw = sQ + 64 * c * sm90::kSwizzleRowBytes;  // the warpgroup's rows, in each panel
  const unsigned char* sdOw = sdO + 64 * c * sm90::kSwizzleRowBytes;  // (of the item's buffer: + qb · 2 · kTileQ)
  int q_off = 0;  // the item's buffer: its byte offset
  const int my_turn = 1 + c, next_turn = 1 + (c + 1) % C;  // as in the forward
  auto release = [&](uint64_t* bar) {  // this warp is done reading a stage (its wgmma has retired)
    sm90::mbarrier_arrive_warp(bar);
  };
  int seq = 0;  // as the producer's
  // S = Q K_jᵀ and dP = dO V_jᵀ, (64 queries, Bc keys) per warpgroup, one commit group.
  auto issue_s_dp = [&](float (&s)[Bc / 8][4], float (&dp)[Bc / 8][4], int j) {
    const int st = (seq + j) % NS;
    const uint32_t phase = uint32_t((seq + j) / NS) & 1;
    sm90::mbarrier_wait(&kv.k_full[st], phase);
    sm90::mbarrier_wait(&kv.v_full[st], phase);
    sm90::wgmma_fence();
    sm90::wgmma_abt_ss<Dh, Bc>(s, sQw + q_off, Tr::kPanelQ, sK + st * Tr::kTileKV, Tr::kPanelKV);
    sm90::wgmma_abt_ss<Dh, Bc>(dp, sdOw + q_off, Tr::kPanelQ, sV + st * Tr::kTileKV, Tr::kPanelKV);
    sm90::wgmma_commit();
  };
  auto issue_dq = [&](float (&dq)[Dh / 8][4], const uint32_t (&dsf)[Bc / 16][4], int j) {  // dQ += dS K_j
    sm90::wgmma_fence();
    sm90::wgmma_ab_rs<Dh, Bc>(dq, dsf, sK + ((seq + j) % NS) * Tr::kTileKV, Tr::kPanelKV);
    sm90::wgmma_commit();
  };
  if (c == C - 1) sm90::named_barrier_arrive(1, 256);  // consumer 0 takes the first turn

  for (int it = 0, last_item = 0; !last_item; ++it) {
    const int qb = it % QB;
    sm90::mbarrier_wait(q_full_of(qb), uint32_t(it / QB) & 1);  // Q, dO and the item slot
    uint64_t* const q_empty_b = q_empty_of(qb);
    q_off = qb * 2 * Tr::kTileQ;
    const sm90::ItemSlot slot = sm90::read_item_slot(s_item + 2 * qb, lane);
    last_item = slot.next >= n_items;  // the ring's very last turn hands on to no one
    const sm90::ItemTile item = sm90::item_tile(slot.item, H, B, n_qb, Br, causal, true);
    // With a structured mask, the item's first key (lo_q0) and this warp's rows' (ItemMask), their
    // doc_start entries loaded together; without, the constant "off" mask.
    int lo_q0 = 0;
    ItemMask mask{false, 0, 0, 0};
    if constexpr (kMasked) mask = item_mask(seq_mask(p, item.b), item.row0, item.row0 + 64 * c + 16 * warp, lane, lo_q0);
    const SeqMask::Range keys = keys_of(item, lo_q0);
    const int kb0 = keys.first, n_kb = keys.end - keys.first;
    const int row0 = item.row0 + 64 * c + 16 * warp;  // this warp's first query row
    // This lane's rows g and g+8: lse (log2 units) and delta, 0 past T (those rows are never stored).
    float lse2[2], dlt[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = row0 + (lane >> 2) + 8 * i;
      const int64_t at = (int64_t(item.b) * H + item.h) * T + row;
      lse2[i] = row < T ? p.lse[at] * kLog2e : 0.0f;
      dlt[i] = row < T ? delta[at] : 0.0f;
    }
    // P = exp2(S·scale₂ − lse₂), masked to 0; dS = P ∘ (dP − delta) (unscaled) into dp, in fp32.
    auto grad = [&](float (&s)[Bc / 8][4], float (&dp)[Bc / 8][4], int j) {
      const int k0 = (kb0 + j) * Bc;
      exp2_scaled_minus_row<Bc>(s, scale_log2, lse2);
      if (mask.needs_mask(k0)) {  // structured masks: a tile reaching before the warp's last row's first key
        const ItemMask mk = mask;
        const int r0 = row0;
        mask_tile<Bc>(s, row0, k0, lane, [=](int q, int k) { return k >= T || k > q || mk.excluded(q - r0, k); }, 0.0f);
      } else if (k0 + Bc > T || (causal && k0 + Bc - 1 > row0)) {  // uniform per warp
        mask_tile<Bc>(s, row0, k0, lane, [=](int q, int k) { return k >= T || (causal && k > q); }, 0.0f);
      }
      softmax_grad_row<Bc>(dp, s, dlt);
    };

    float dq[Dh / 8][4];  // (16, Dh) per warp: the warpgroup's (64, Dh) accumulator
    zero(dq);
    float s[Bc / 8][4], dp[Bc / 8][4];
    uint32_t dsf[Bc / 16][4];

    // The key tiles this consumer's rows need: all n_kb, or with kSkipIdle none when its rows all
    // lie past T (a head's last, part-filled query block) and, causal, only those up to its last
    // row's diagonal (the block's later tiles serve its other consumers' rows). It takes the
    // others as turns without products (after its loop).
    int n_need = n_kb;
    if constexpr (Tr::kSkipIdle) {
      const int r0 = item.row0 + 64 * c, r1 = min(r0 + 63, T - 1);
      n_need = r0 >= T ? 0 : causal ? min(n_kb, r1 / Bc + 1 - kb0) : n_kb;
      if constexpr (Tr::kPipelined) n_need = max(n_need, 1);
    }
    if constexpr (!Tr::kPipelined) {
      // Turn j < n_need: S, dP of tile j; then dQ += dS_j K_j, retired before the next turn. Q and
      // dO are released with the last S, dP; with kSkipIdle the other tiles follow as turns
      // without products.
      for (int j = 0; j < n_need; ++j) {
        sm90::named_barrier_sync(my_turn, 256);
        issue_s_dp(s, dp, j);
        if (c != C - 1 || j + 1 < n_kb || !last_item) sm90::named_barrier_arrive(next_turn, 256);
        sm90::wgmma_wait<0>();
        release(&kv.v_empty[(seq + j) % NS]);
        if (j + 1 == n_need) release(q_empty_b);
        grad(s, dp, j);
        acc_to_a<Bc>(dsf, dp);
        issue_dq(dq, dsf, j);
        sm90::wgmma_wait<0>();
        release(&kv.k_empty[(seq + j) % NS]);
      }
      if constexpr (Tr::kSkipIdle) {
        if (n_need == 0) release(q_empty_b);
        sm90::idle_turns<NS>(kv, seq, n_need, n_kb, my_turn, next_turn, c != C - 1 || !last_item);
      }
    } else {
      // Turn 0: S, dP of tile 0. Turn j: S, dP of tile j and dQ += dS_{j−1} K_{j−1}. Q and dO are
      // released once the consumer's last S, dP have landed: the next item's load under this one's
      // tail. (Over the n_need tiles its rows need; n_need = n_kb but with kSkipIdle.)
      sm90::named_barrier_sync(my_turn, 256);
      issue_s_dp(s, dp, 0);
      if (c != C - 1 || n_kb > 1 || !last_item) sm90::named_barrier_arrive(next_turn, 256);
      sm90::wgmma_wait<0>();
      release(&kv.v_empty[seq % NS]);  // V_0 is done with; K_0 waits for its dQ product
      if (n_need == 1) release(q_empty_b);
      grad(s, dp, 0);
      acc_to_a<Bc>(dsf, dp);
      for (int j = 1; j < n_need; ++j) {
        sm90::named_barrier_sync(my_turn, 256);
        issue_s_dp(s, dp, j);
        issue_dq(dq, dsf, j - 1);
        if (c != C - 1 || j + 1 < n_kb || !last_item) sm90::named_barrier_arrive(next_turn, 256);
        sm90::wgmma_wait<1>();  // S, dP of tile j have landed; dS_{j−1} K_{j−1} may still run
        release(&kv.v_empty[(seq + j) % NS]);
        if (j + 1 == n_need) release(q_empty_b);
        grad(s, dp, j);
        sm90::wgmma_wait<0>();  // dS_{j−1} K_{j−1} has read dsf: it may be rewritten, K_{j−1} released
        release(&kv.k_empty[(seq + j - 1) % NS]);
        acc_to_a<Bc>(dsf, dp);
      }
      issue_dq(dq, dsf, n_need - 1);
      sm90::wgmma_wait<0>();
      release(&kv.k_empty[(seq + n_need - 1) % NS]);
      if constexpr (Tr::kSkipIdle)
        sm90::idle_turns<NS>(kv, seq, n_need, n_kb, my_turn, next_turn, c != C - 1 || !last_item);
    }
    seq += n_kb;

    const float fq[2] = {p.scale, p.scale};
    if constexpr (Tr::kStoreByTma) {
      sm90::store_tile_by_tma<Dh, Tr::kPanels>(c, tid % 128 == 0, sStage + c * Tr::kTileStage, dq, fq, &maps.dq, item.h,
                                               item.row0 + 64 * c, item.b, T, warp, lane);
    } else {
      tg::bf16* dQ = p.dq + int64_t(item.b) * T * p.dq_row_stride + item.h * p.D;
      store_rows<Dh>(dQ, int(p.dq_row_stride), dq, fq, row0, T, lane);
    }
  }
  if constexpr (Tr::kStoreByTma)
    if (tid % 128 == 0) sm90::bulk_wait<0>();  // the last stores done before the block exits
}

}  // namespace tg::cuda::flash
