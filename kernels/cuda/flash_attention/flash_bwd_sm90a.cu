// FlashAttention backward on Hopper's warpgroup MMA (sm_90a; built for that architecture alone,
// see CMakeLists.txt): flash_bwd.cu's deterministic algorithm — delta = rowsum(dO ∘ O), then dK/dV
// parallel over key blocks and dQ parallel over query blocks, each recomputing P = exp(S·scale −
// lse) from the forward's lse, no atomics — with every product on wgmma (wgmma.cuh). Each
// warpgroup owns 64 rows of the block's on-chip tensors and every product is one of the two forms
// the forward uses:
//   Sᵀ = K Qᵀ, dPᵀ = V dOᵀ, S = Q Kᵀ, dP = dO Vᵀ   both operands K-major in smem (SS);
//   dV += Pᵀ dO, dK += dSᵀ Q, dQ += dS K           A from registers (the accumulator repacked,
//                                                  as the layouts coincide), B MN-major (RS).
// Tiles are 128-byte swizzled 64-column panels. Both deterministic kernels are warp-specialised
// as the forward is (flash_fwd_sm90a.cu): a producer thread on the tensor copy engine streams the
// tiles of the other side through mbarrier-guarded stages, consumer warpgroups take turns at the
// tensor cores (named barriers). FlashDq::kAtomic (opt-in) runs the dK/dV kernel alone where it
// is the faster (sm90a_runs_atomic_dq: d 128 from T = 16384, d 64 non-causal from 4096),
// forming dQ too and adding it into an fp32 buffer with the bulk copy engine's reductions: 5
// products per tile pair.
#include <cuda_runtime.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/flash_attention/kernel_traits.cuh"
#include "kernels/cuda/flash_attention/launch.cuh"
#include "kernels/cuda/flash_attention/mask.cuh"
#include "kernels/cuda/flash_attention/sm90_bwd_mainloop.cuh"
#include "kernels/cuda/flash_attention/sm90_epilogue.cuh"
#include "kernels/cuda/flash_attention/sm90_pipeline.cuh"
#include "kernels/cuda/flash_attention/sm90_ptx.cuh"
#include "kernels/cuda/flash_attention/sm90_scheduler.cuh"
#include "kernels/cuda/flash_attention/sm90_shapes.h"
#include "kernels/cuda/flash_attention/tile.cuh"
#include "kernels/cuda/flash_attention/wgmma.cuh"
#include "kernels/cuda/tma.h"

namespace tg::cuda {

// ───────────────────────────── kernels ─────────────────────────────

namespace flash {

// ── dQ, warp-specialised (the forward's structure: flash_fwd_sm90a.cu) ──
// A producer thread loads the block's Q and dO tiles once and streams K_j, V_j tiles of Bc keys
// with the tensor copy engine through Stages stage buffers (sm90_pipeline.cuh: produce_kv); Consumers
// warpgroups of 64 query rows each take turns at the tensor cores (named barriers), and each
// overlaps tile j's products S = Q K_jᵀ, dP = dO V_jᵀ with dQ += dS_{j−1} K_{j−1}, so one tile's
// elementwise work (P, dS) runs under the next tile's products and under the other consumers'
// (kPipelined; d 64's three-consumer shape issues and retires each tile's products in turn).
// dQ still sums over j in a fixed order: deterministic.
// Shape: a dQ shape of sm90_shapes.h (DqShape's fields); the traits derive the sizes.
template <class Shape>
struct DqSm90aTraits {
  using S = Shape;
  static constexpr int Consumers = S::consumers, Stages = S::stages, QBuffers = S::q_buffers;
  // Q and dO in QBuffers buffers: with one, an item's Q/dO tiles load only once the consumers have
  // issued the item before's last S and dP, so the load has that item's last grad, dQ product and
  // epilogue to land in; with two, item i + 1's tiles load into the other buffer as soon as the
  // producer has issued item i's K/V tiles. Each buffer has its own full and empty barriers and
  // item slot.
  static constexpr int kQBuffers = QBuffers;
  // dQ of an item staged in shared memory (per consumer, its 64 rows) and written by the tensor
  // copy engine (tma_store_4d), as the dK/dV kernel's dK and dV.
  static constexpr bool kStoreByTma = S::store_by_tma;
  static constexpr bool kDqKernel = true;  // (bwd_tma_maps: its output map is dQ's)
  // A consumer multiplies only the key tiles its own rows need: none when they all lie past T (a
  // head's last, part-filled block), and when causal those up to its last row's diagonal; it
  // takes the block's other tiles as turns without products (the pipelined loop multiplies at
  // least the item's first tile).
  static constexpr bool kSkipIdle = S::skip_idle;
  static constexpr int kD = tile_dim<S>();
  // The head's columns (≤ kD): head dim 96 runs the d 128 tiles, which the tensor maps zero-fill
  // past column 96; the products that sum over the head's columns stop there (their k-steps
  // over the padding would add zeros), and those whose N is the head's columns run N = 96
  // (their columns past it would be zeros).
  static constexpr int kHeadDim = S::head_dim;
  static constexpr int kConsumers = Consumers;
  static constexpr int kThreads = 128 * (Consumers + 1);  // warpgroup 0 is the producer
  static constexpr int kBr = 64 * Consumers;              // query rows per block
  static constexpr int kBc = S::key_tile;                 // keys per streamed tile
  static constexpr int kStages = Stages;
  // dQ += dS_{j−1} K_{j−1} issued with tile j's S, dP (false: each tile's three products issued
  // and retired in turn, dS's fragments no longer live beside the next tile's S and dP).
  static constexpr bool kPipelined = S::pipelined;
  static constexpr int kPanels = kD / 64;
  static constexpr int kPanelQ = kBr * sm90::kSwizzleRowBytes, kPanelKV = kBc * sm90::kSwizzleRowBytes;
  static constexpr int kTileQ = kPanels * kPanelQ, kTileKV = kPanels * kPanelKV;  // bytes
  static constexpr int kProducerRegs = Consumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = Consumers == 2 ? 240 : 160;
  static constexpr int kBarrierBytes = 8 * (3 * QBuffers + 4 * kStages);  // and the item slots
  // kStoreByTma: per consumer a dQ staging tile of 64 rows (kPanels panels).
  static constexpr int kTileStage = kPanels * 64 * sm90::kSwizzleRowBytes;
  static constexpr int kStageBytes = kStoreByTma ? Consumers * kTileStage : 0;
  // Q and dO, K and V in kStages stages each, the staging tiles, the barriers, swizzle-atom slack.
  static constexpr size_t kSmemBytes =
      size_t(2 * QBuffers * kTileQ + 2 * kStages * kTileKV + kStageBytes + kBarrierBytes + sm90::kSwizzleAtomBytes);
  static_assert(kD == 64 || kD == 128, "head dims 64 and 128");
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= kD && kHeadDim > kD - 64, "the head fills the tile's last panel in part");
  static_assert(kBc == 64 || kBc == 96 || kBc == 128, "S and dP are m64n64, m64n96 or m64n128 products per warpgroup");
  static_assert(QBuffers == 1 || QBuffers == 2, "one or two Q/dO buffers (the kernel selects between two barrier pairs)");
  static_assert(Consumers == 2 || Consumers == 3, "the register split is written for 2 or 3 consumers");
  static_assert(sm90::fits_launch_registers(kThreads, kProducerRegs, Consumers, kConsumerRegs),
                "the hand-over must fit the registers the block is launched with (sm90_ptx.cuh, setmaxnreg)");
  static_assert(kSmemBytes <= 227 * 1024, "one block's shared memory");
};
// Block shapes: sm90_shapes.h's dQ table (DqTable), each shape's reason beside it and its
// measurements in docs/kernels.md §4.2.

// The tensor maps of both backward kernels (tma.h): q, dout in boxes of Tr::kBr rows, k, v of
// Tr::kBc (the dQ kernel streams K/V tiles under its own Q/dO, the dK/dV kernel the reverse).
struct BwdTmaMaps {
  CUtensorMap q, dout, k, v;
  CUtensorMap dk, dv;  // the dK/dV kernel's outputs in boxes of 64 rows (Tr::kStoreByTma only)
  CUtensorMap dq;      // the dQ kernel's, likewise
};
template <class Tr>
BwdTmaMaps bwd_tma_maps(const FlashAttentionParams& p) {  // p's row strides resolved
  const uint64_t head_dim = uint64_t(p.D), heads = uint64_t(p.H), T = uint64_t(p.T), B = uint64_t(p.B);
  const uint64_t ldq = uint64_t(p.q_row_stride), lddo = uint64_t(p.do_row_stride);
  const uint64_t ldk = uint64_t(p.k_row_stride), ldv = uint64_t(p.v_row_stride);
  BwdTmaMaps maps{make_bf16_head_tensor_map(p.q, head_dim, heads, T, B, ldq, T * ldq, Tr::kBr),
                  make_bf16_head_tensor_map(p.dout, head_dim, heads, T, B, lddo, T * lddo, Tr::kBr),
                  make_bf16_head_tensor_map(p.k, head_dim, heads, T, B, ldk, T * ldk, Tr::kBc),
                  make_bf16_head_tensor_map(p.v, head_dim, heads, T, B, ldv, T * ldv, Tr::kBc),
                  {},
                  {},
                  {}};
  if constexpr (Tr::kStoreByTma && Tr::kDqKernel) {
    const uint64_t lddq = uint64_t(p.dq_row_stride);
    maps.dq = make_bf16_head_tensor_map(p.dq, head_dim, heads, T, B, lddq, T * lddq, 64);
  } else if constexpr (Tr::kStoreByTma) {
    const uint64_t lddk = uint64_t(p.dk_row_stride), lddv = uint64_t(p.dv_row_stride);
    maps.dk = make_bf16_head_tensor_map(p.dk, head_dim, heads, T, B, lddk, T * lddk, 64);
    maps.dv = make_bf16_head_tensor_map(p.dv, head_dim, heads, T, B, lddv, T * lddv, 64);
  }
  return maps;
}

template <class Tr, bool kMasked = false>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_bwd_dq_sm90a_kernel(const FlashAttentionParams p, const float* __restrict__ delta,
                                 const __grid_constant__ BwdTmaMaps maps, unsigned* item_counter) {
  constexpr int Br = Tr::kBr, Bc = Tr::kBc, NS = Tr::kStages, C = Tr::kConsumers;
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int QB = Tr::kQBuffers;
  unsigned char* sQ = sm90::align_to_swizzle_atom(smem);  // (buffer) Q, dO tile pairs of 2 · kTileQ bytes
  unsigned char* sdO = sQ + Tr::kTileQ;
  unsigned char* sK = sQ + QB * 2 * Tr::kTileQ;  // (stage) tiles of Tr::kTileKV bytes
  unsigned char* sV = sK + NS * Tr::kTileKV;
  unsigned char* sStage = sV + NS * Tr::kTileKV;  // kStoreByTma: (consumer) dQ staging tiles

  const int T = int(p.T), H = int(p.H), B = int(p.B);
  const bool causal = p.causal;
  const int tid = threadIdx.x, wg = sm90::warpgroup_index();
  // Work items (query tile, head, batch), heaviest first when causal (sm90::item_tile); this
  // block's first is blockIdx.x, the next ones claimed from item_counter, as in the forward.
  const int n_qb = (T + Br - 1) / Br, n_items = H * B * n_qb;
  // The key tiles an item's query tile sees: causal, up to the diagonal and (structured masks,
  // mask.cuh) from the one holding lo_q0, its first row's first visible key (0 without a mask).
  auto keys_of = [=](const sm90::ItemTile& item, int lo_q0) -> SeqMask::Range {
    const int q_last = min(item.row0 + Br, T) - 1;
    if (!causal) return {0, (T + Bc - 1) / Bc};
    return {lo_q0 / Bc, q_last / Bc + 1};
  };

  // The mbarriers, after the tiles: the own tiles' (q_full), then the K/V stream's, whose empty
  // ones count one arrival per consumer warp, then the own tiles' empty one (likewise).
  uint64_t* q_full;
  const sm90::KvStream kv = sm90::kv_stream_barriers<NS>(sStage + Tr::kStageBytes, sK, sV, &q_full, 4 * C, tid == 0);
  uint64_t* q_empty = kv.v_empty + NS;
  // With two buffers: buffer 1's full and empty barriers after buffer 0's empty one.
  // (Selected, not indexed: an array of the pointers would live in local memory.)
  auto q_full_of = [=](int qb) { return qb == 0 ? q_full : q_empty + 1; };
  auto q_empty_of = [=](int qb) { return qb == 0 ? q_empty : q_empty + 2; };
  int* s_item = reinterpret_cast<int*>(q_empty + 1 + 2 * (QB - 1));  // (buffer) item slots (sm90::read_item_slot), Q's lifetime
  if (tid == 0) {
    sm90::mbarrier_init(q_empty, 4 * C);
    if constexpr (QB == 2) {
      sm90::mbarrier_init(q_full_of(1), 1);
      sm90::mbarrier_init(q_empty_of(1), 4 * C);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    sm90::setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) {
      int seq = 0;  // the K/V stream's position at the item's first tile
      int w = int(blockIdx.x), next = sm90::claim_item(item_counter);
      for (int it = 0; w < n_items; ++it) {
        const sm90::ItemTile item = sm90::item_tile(w, H, B, n_qb, Br, causal, true);
        const SeqMask::Range keys = keys_of(item, seq_mask_if<kMasked>(p, item.b).lo(item.row0));
        const int n_kb = keys.end - keys.first;
        const int qb = it % QB, use = it / QB;
        if (use > 0) sm90::mbarrier_wait(q_empty_of(qb), uint32_t(use - 1) & 1);
        s_item[2 * qb] = w;
        s_item[2 * qb + 1] = next;
        uint64_t* full = q_full_of(qb);
        sm90::mbarrier_arrive_expect_tx(full, 2 * Tr::kTileQ);  // release: the slot before the consumers' reads
        sm90::produce_tile<Tr::kPanels>(sQ + qb * 2 * Tr::kTileQ, Tr::kPanelQ, &maps.q, item.h, item.row0, item.b, full);
        sm90::produce_tile<Tr::kPanels>(sdO + qb * 2 * Tr::kTileQ, Tr::kPanelQ, &maps.dout, item.h, item.row0, item.b, full);
        sm90::produce_kv<Tr::kPanels, Bc, NS>(kv, &maps.k, &maps.v, item.h, item.b, n_kb, keys.first, seq);
        seq += n_kb;
        w = next;
        if (w < n_items) next = sm90::claim_item(item_counter);
      }
      sm90::release_items(item_counter);
      // Launched to overlap the dK/dV kernel (launch_dq_sm90a_with): the block stays until that
      // kernel has completed, so that this one's completion implies it.
      sm90::wait_previous_grid();
    }
    return;
  }

  const DqSmem<decltype(q_full_of), decltype(q_empty_of)> sm{sQ, sdO, sK, sV, sStage, kv, q_full_of, q_empty_of, s_item};
  dq_consumer<Tr, kMasked>(p, delta, maps, sm, T, H, B, causal, n_qb, n_items, keys_of, tid, wg);
}

// ── dK/dV, warp-specialised ──
// The producer loads the block's K_j, V_j once and streams Q_i, dO_i tiles of Br_ queries (64) by
// TMA through Stages stage buffers
// (produce_kv, the Q/dO pair in the K/V roles); a second producer warp stages each tile's lse and
// delta (Br_ floats each, plain loads: TMA would need T % 4 = 0)
// and counts itself into the Q barrier. Consumer warpgroups own 64 keys each and run the
// transposed products per tile: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (SS), dV += Pᵀ dO and dK += dSᵀ Q
// (register A, Q and dO MN-major); with PingPong they take turns to issue, as the forward does.
// Q_i, dO_i are released once dK and dV have read them. The deterministic kernel is pipelined
// (kPipelined; not d 64's three-consumer one, dkdv_d64_long_* in sm90_shapes.h):
// dK's product for one tile runs while the next tile is exponentiated.
//
// FormDq (FlashDq::kAtomic): the block also forms dQ_i = dS K_j over its Bc keys, 5 products per
// tile pair instead of the 7 of the deterministic pair. Each consumer writes its dSᵀ rows to a
// swizzled tile (kDsBuffers buffers, ds_full / ds_empty mbarriers), then — a tile later, issued
// with the next tile's dK product — computes dQ over all Bc keys (SS, A read transposed): at d
// 128 each consumer the columns [64c, 64c + 64) of every tile, at d 64 one consumer all 64
// columns of every second tile (kDqByTurns) — and stages them in fp32 in a (Br, D) tile in the
// dq_accum layout (dq_accum_offset); the producer's third warp adds each staged tile into
// dq_accum with one bulk reduction (dq_full / dq_empty) while the consumers go on — unordered
// across blocks.
// Shape: a dK/dV shape of sm90_shapes.h (DkdvShape's fields); the traits derive the sizes.
template <class Shape>
struct DkdvWsSm90aTraits {
  using S = Shape;
  static constexpr int Consumers = S::consumers, Stages = S::stages;
  static constexpr bool FormDq = S::form_dq, StoreByTma = S::store_by_tma;
  // dK and dV of an item staged in shared memory (per consumer, its 64 rows of each) and written
  // by the tensor copy engine (tma_store_4d), so the consumers go on to the next item at once
  // rather than issuing 2·Dh/4 four-byte global stores per thread.
  static constexpr bool kStoreByTma = StoreByTma;
  static constexpr bool kDqKernel = false;
  // A consumer multiplies only the query tiles its own keys need: none when they all lie past T
  // (a head's last, part-filled block), and when causal those from the tile of its first key on;
  // it takes the block's other tiles as turns without products (both deterministic loops; the
  // pipelined one multiplies at least the item's last tile).
  static constexpr bool kSkipIdle = S::skip_idle;
  static constexpr int kD = tile_dim<S>();
  // The head's columns (≤ kD): head dim 96 runs the d 128 tiles, which the tensor maps zero-fill
  // past column 96; the products that sum over the head's columns stop there (their k-steps
  // over the padding would add zeros), and those whose N is the head's columns run N = 96
  // (their columns past it would be zeros).
  static constexpr int kHeadDim = S::head_dim;
  // Sᵀ = K Qᵀ, dPᵀ = V dOᵀ with the warpgroup's K and V rows loaded once per item as A fragments
  // (RS) rather than read from shared memory at every tile (SS): half the shared-memory traffic of
  // those two products; 2·D/4 registers more per thread.
  static constexpr bool kOwnInRegisters = S::own_in_registers;
  // With K and V in registers for the whole item (and no dQ product, which reads K from shared
  // memory), their tiles and the item slot are released as soon as they are loaded: the next
  // item's K_j, V_j, first Q/dO tiles and statistics then load under this item's tiles instead
  // of after its last product, when the whole block would wait for them.
  static constexpr bool kReleaseOwnEarly = kOwnInRegisters && !FormDq;
  static constexpr int kConsumers = Consumers;
  static constexpr int kThreads = 128 * (Consumers + 1);  // warpgroup 0 is the producer
  static constexpr int kBc = 64 * Consumers;              // keys per block
  static constexpr int kBr = S::query_tile;               // queries per streamed tile
  static constexpr int kStages = Stages;
  static constexpr bool kPingPong = S::ping_pong;
  static constexpr bool kFormDq = FormDq;
  static constexpr int kPanels = kD / 64;
  static constexpr int kPanelOwn = kBc * sm90::kSwizzleRowBytes, kPanelStream = kBr * sm90::kSwizzleRowBytes;
  static constexpr int kTileOwn = kPanels * kPanelOwn, kTileStream = kPanels * kPanelStream;  // bytes
  // 24 + 2 × 240 for the deterministic kernel, whose pipelined loop holds Sᵀ, dPᵀ of one tile
  // with dSᵀ of the one before beside dK and dV (at 232, d 128 spills and ptxas serialises the
  // wgmmas); 40 + 2 × 232 with FormDq, whose producer has a third busy warp. 32 + 2 × 240 would
  // exceed the launch allocation, and setmaxnreg.inc would wait forever (sm90_ptx.cuh).
  static constexpr int kProducerRegs = Consumers == 2 ? (FormDq ? 40 : 24) : 32;
  static constexpr int kConsumerRegs = Consumers == 2 ? (FormDq ? 232 : 240) : 160;
  // Per stage: lse and delta of the tile's queries, and (structured masks) the first key its last
  // query sees, padded to 8 bytes for the mbarriers after them.
  static constexpr int kLoBytes = (kStages + 1) / 2 * 8;
  static constexpr int kStatsBytes = 2 * kStages * kBr * int(sizeof(float)) + kLoBytes;
  // FormDq at d 128: each consumer forms 64 of the tile's dQ columns (m64n64 over the Bc keys).
  // At d 64 (kDqByTurns), where that split would leave m64n32 products, which read more shared
  // memory per FLOP than the tensor cores' operand bandwidth allows, one consumer forms the whole
  // tile's dQ (m64n64 over Bc keys, twice the FLOPs of its other products), consumer g % 2 for
  // the block's tile g: each does one such product every second tile.
  static constexpr bool kDqByTurns = FormDq && kD == 64;
  static constexpr int kDqCols = kDqByTurns ? kD : kD / Consumers;  // columns one consumer forms
  // FormDq: dSᵀ tiles (Bc keys × Br queries, one swizzled panel each) and fp32 dQ staging tiles.
  // kDqByTurns: a staging tile per consumer. With one, shared, a consumer staging tile g waits
  // for the reduction of tile g − 1 (the other consumer's) to have read it, but its own last wait
  // there was for tile g − 3's: the reduction of its own tile g − 2 may still be pending, and an
  // mbarrier wait tells phases apart by parity only, so it would pass, one phase short. Each
  // consumer waiting on its own staging tile sees every phase of it. Two dSᵀ buffers, at d 64 as
  // at d 128: both consumers store into, and wait on, every use of every buffer, so neither can
  // be two phases behind one. (Four buffers measured the same as two at d 64 and cost 32 KB
  // more: docs/kernels.md §9.)
  static constexpr int kDsBuffers = 2;
  // Causal items in groups of heads (sm90::item_tile's grouped): every kernel but the d 128
  // atomic one (dkdv_atomic_d128, sm90_shapes.h).
  static constexpr bool kGroupedItems = S::grouped_items;
  // The deterministic kernel's dK product for tile j − 1 issued with tile j's Sᵀ, dPᵀ (false: each
  // tile's four products issued and retired in turn, 16 registers fewer at the loop's peak).
  static constexpr bool kPipelined = S::pipelined;
  static constexpr int kDqStaging = kDqByTurns ? 2 : 1;
  static constexpr int kTileDs = kBc * sm90::kSwizzleRowBytes;
  static constexpr int kTileDq = kBr * kD * int(sizeof(float));
  static constexpr int kDqBytes = FormDq ? kDsBuffers * kTileDs + kDqStaging * kTileDq : 0;
  // The mbarriers (FormDq's: ds_full, ds_empty per buffer, dq_full, dq_empty per staging tile),
  // then the item slot (4 ints: the item, the next, its query tiles' range) and FormDq's
  // reduction slots (2 int64s per staging tile).
  static constexpr int kDqBarriers = FormDq ? 2 * kDsBuffers + 2 * kDqStaging : 0;
  static constexpr int kBarrierBytes = 8 * (2 + 4 * kStages + kDqBarriers) + 16 + (FormDq ? 16 * kDqStaging : 0);
  // kStoreByTma: per consumer a dK and a dV staging tile of 64 rows (kPanels panels).
  static constexpr int kTileStage = kPanels * 64 * sm90::kSwizzleRowBytes;
  static constexpr int kStageBytes = StoreByTma ? 2 * Consumers * kTileStage : 0;
  static constexpr size_t kSmemBytes = size_t(2 * kTileOwn + 2 * kStages * kTileStream + kStageBytes + kDqBytes +
                                              kStatsBytes + kBarrierBytes + sm90::kSwizzleAtomBytes);
  static_assert(!StoreByTma || !FormDq, "staged stores: the deterministic kernel");
  static_assert(kD == 64 || kD == 128, "head dims 64 and 128");
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= kD && kHeadDim > kD - 64, "the head fills the tile's last panel in part");
  static_assert(!FormDq || kHeadDim == kD, "FormDq's dQ accumulator rows are the tile's width");
  static_assert(kBr == 64 || kBr == 96 || kBr == 128, "Sᵀ and dPᵀ are m64n64, m64n96 or m64n128 products per warpgroup");
  static_assert(Consumers == 2 || Consumers == 3, "the register split is written for 2 or 3 consumers");
  static_assert(sm90::fits_launch_registers(kThreads, kProducerRegs, Consumers, kConsumerRegs),
                "the hand-over must fit the registers the block is launched with (sm90_ptx.cuh, setmaxnreg)");
  static_assert(kSmemBytes <= 227 * 1024, "one block's shared memory");
  static_assert(!FormDq || (kDqCols == 64 && kBr == 64 && Consumers == 2), "FormDq: m64n64 dQ products");
  static_assert(!kSkipIdle || !FormDq, "skipping tiles: the deterministic loops");
};

// Block shapes: sm90_shapes.h's dK/dV tables (DkdvTable, DkdvAtomicTable), each shape's reason
// beside it and its measurements in docs/kernels.md §4.2. The head dims with an atomic kernel:
template <int D> constexpr bool kSm90aAtomicDq = D == 128 || D == 64;

template <class Tr, bool kMasked = false>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_bwd_dkdv_sm90a_ws_kernel(const FlashAttentionParams p, const float* __restrict__ delta,
                                   float* __restrict__ dq_accum, int accum_rows,
                                   const __grid_constant__ BwdTmaMaps maps, unsigned* item_counter) {
  constexpr int Bc = Tr::kBc, Br = Tr::kBr, NS = Tr::kStages, C = Tr::kConsumers;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* sK = sm90::align_to_swizzle_atom(smem);
  unsigned char* sV = sK + Tr::kTileOwn;
  unsigned char* sQ = sV + Tr::kTileOwn;  // (stage) tiles of kTileStream bytes
  unsigned char* sdO = sQ + NS * Tr::kTileStream;
  unsigned char* sStage = sdO + NS * Tr::kTileStream;  // kStoreByTma: (consumer, dK | dV) staging tiles
  unsigned char* sdSt = sStage + Tr::kStageBytes;      // FormDq: (kDsBuffers) dSᵀ tiles of kTileDs bytes
  float* sDq = reinterpret_cast<float*>(sdSt + Tr::kDsBuffers * Tr::kTileDs);  // FormDq: (kDqStaging, Br, D) fp32
  float* sL = reinterpret_cast<float*>(sdSt + Tr::kDqBytes);  // (stage, Br) lse
  float* sDelta = sL + NS * Br;                                                      // (stage, Br) delta
  int* sLo = reinterpret_cast<int*>(sDelta + NS * Br);  // (stage) the first key the tile's last query sees

  // The dQ kernel that follows may take each SM this block leaves (launch_dq_sm90a_with).
  sm90::launch_dependents();
  const int T = int(p.T), H = int(p.H), B = int(p.B);
  const bool causal = p.causal;
  const int tid = threadIdx.x, wg = sm90::warpgroup_index();
  // Work items (key block, head, batch), causal: the low key blocks first (they see the most
  // queries); non-causal: head-major (sm90::item_tile). This block's first is blockIdx.x, the
  // next ones claimed from item_counter by the producer thread, which publishes each in the item
  // slot with K_j, V_j (own_full).
  const int n_kb = (T + Bc - 1) / Bc, n_items = H * B * n_kb;
  const int n_qb = (T + Br - 1) / Br;
  // The query tiles [first, end) an item's key block is seen by. Causal: those ending before its
  // first key only see keys in their future, never visited; with a structured mask (mask.cuh)
  // neither are those past the last query that sees its last key — with documents a binary
  // search over doc_start, so the producer alone runs it, ahead of the item, and passes the range
  // on in the item slot (read_query_range).
  const int32_t* doc_start = p.doc_start;
  const int64_t window = p.window;
  auto query_tiles = [=](const sm90::ItemTile& item) -> SeqMask::Range {
    if (!causal) return {0, n_qb};
    const SeqMask mask = seq_mask_if<kMasked>(doc_start, window, T, item.b);
    return {item.row0 / Br, mask.on ? mask.query_tiles(item.row0, Bc, Br).end : n_qb};
  };
  // Item w's key block, head and batch, in the kernel's order (Tr::kGroupedItems).
  auto item_of = [=](int w) { return sm90::item_tile(w, H, B, n_kb, Bc, causal, false, Tr::kGroupedItems); };

  // The mbarriers, after the statistics: K/V's (own_full), then the Q/dO stream's; Q's full
  // barriers also count the 32 lanes of the warp that stages lse and delta, and Q's empty ones
  // every consumer thread (each releases its own plain loads of the statistics: one arrival per
  // warp after __syncwarp orders them as well, but compute-sanitizer's racecheck follows the
  // ordering only from the threads that arrive, and reported the stage's reuse as a race).
  // Then K/V's empty one (every consumer warp arrives, and the statistics warp once it has read
  // the item slot, which shares K/V's lifetime), then FormDq's: ds_full[kDsBuffers] (every
  // consumer warp), ds_empty[kDsBuffers] and dq_full[kDqStaging] (the warps of the consumers
  // that form dQ: both at d 128, the tile's one with kDqByTurns), dq_empty[kDqStaging] (the
  // reducing thread).
  uint64_t* own_full;
  const sm90::KvStream qdo = sm90::kv_stream_barriers<NS>(reinterpret_cast<unsigned char*>(sLo) + Tr::kLoBytes, sQ, sdO,
                                                          &own_full, 4 * C, tid == 0, 32, 128 * C);
  uint64_t* own_empty = qdo.v_empty + NS;
  if (tid == 0) sm90::mbarrier_init(own_empty, 4 * C + 1);
  constexpr int NDs = Tr::kDsBuffers, NSt = Tr::kDqStaging;
  uint64_t* ds_full = own_empty + 1;
  uint64_t* ds_empty = ds_full + NDs;
  uint64_t* dq_full = ds_empty + NDs;
  uint64_t* dq_empty = dq_full + NSt;
  int* s_item = reinterpret_cast<int*>(ds_full + Tr::kDqBarriers);  // K_j, V_j's lifetime
  // FormDq: per staging tile, the staged dQ tile's destination in dq_accum (elements) and whether
  // it is the block's last, written with the tile by one consumer thread, read by the reducing
  // thread (which cannot go by the item slot: with one-tile items it may lag the producer by more
  // than an item).
  long long* s_dq = reinterpret_cast<long long*>(s_item + 4);
  if constexpr (Tr::kFormDq) {
    if (tid == 0) {
      constexpr int dq_warps = Tr::kDqByTurns ? 4 : 4 * C;
      for (int k = 0; k < NDs; ++k) {
        sm90::mbarrier_init(&ds_full[k], 4 * C);
        sm90::mbarrier_init(&ds_empty[k], dq_warps);
      }
      for (int k = 0; k < NSt; ++k) {
        sm90::mbarrier_init(&dq_full[k], dq_warps);
        sm90::mbarrier_init(&dq_empty[k], 1);
      }
      sm90::fence_barrier_init();
    }
  } else {
    if (tid == 0) sm90::fence_barrier_init();
  }
  __syncthreads();

  // seq: the Q/dO stream's position at an item's first tile, counted alike by every role (the
  // stages, and FormDq's dSᵀ buffers and staging tile, go by it).
  if (wg == 0) {
    sm90::setmaxnreg_dec<Tr::kProducerRegs>();
    const int warp = tid / 32, lane = tid & 31;
    if (tid == 0) {  // per item, K_j, V_j once the last item's are done with, then its Q/dO tiles
      int w = int(blockIdx.x), next = sm90::claim_item(item_counter);
      for (int it = 0, seq = 0; w < n_items; ++it) {
        const sm90::ItemTile item = item_of(w);
        const SeqMask::Range queries = query_tiles(item);
        if (it > 0) sm90::mbarrier_wait(own_empty, uint32_t(it - 1) & 1);
        s_item[0] = w;
        s_item[1] = next;
        s_item[2] = queries.first;
        s_item[3] = queries.end;
        sm90::mbarrier_arrive_expect_tx(own_full, 2 * Tr::kTileOwn);  // release: the slot before its reads
        sm90::produce_tile<Tr::kPanels>(sK, Tr::kPanelOwn, &maps.k, item.h, item.row0, item.b, own_full);
        sm90::produce_tile<Tr::kPanels>(sV, Tr::kPanelOwn, &maps.v, item.h, item.row0, item.b, own_full);
        sm90::produce_kv<Tr::kPanels, Br, NS>(qdo, &maps.q, &maps.dout, item.h, item.b, queries.end - queries.first,
                                              queries.first, seq);
        seq += queries.end - queries.first;
        w = next;
        if (w < n_items) next = sm90::claim_item(item_counter);
      }
      sm90::release_items(item_counter);
    } else if (warp == 1) {
      // lse and delta of each query tile into its stage, Br / 32 of its rows per lane (0 past T:
      // those queries are masked), and with a structured mask the first key the tile's last query
      // sees, so that the consumers decide which tiles need the elementwise mask without a load
      // from doc_start per tile. The item and its query tiles from its slot: the consumers cannot
      // finish an item (and the producer overwrite its slot) before this warp has staged all its
      // tiles.
      for (int it = 0, seq = 0, last_item = 0; !last_item; ++it) {
        sm90::mbarrier_wait(own_full, uint32_t(it) & 1);
        const sm90::ItemSlot slot = sm90::read_item_slot(s_item, lane);
        const SeqMask::Range queries = read_query_range(s_item, lane);
        sm90::mbarrier_arrive_warp(own_empty);  // the slot is read
        last_item = slot.next >= n_items;
        const sm90::ItemTile item = item_of(slot.item);
        const float* lse = p.lse + (int64_t(item.b) * H + item.h) * T;
        const float* dlt = delta + (int64_t(item.b) * H + item.h) * T;
        const SeqMask mask = seq_mask_if<kMasked>(doc_start, window, T, item.b);
        for (int i = queries.first; i < queries.end; ++i, ++seq) {
          const int st = seq % NS;
          const uint32_t use = uint32_t(seq / NS);
          // (lo's doc_start entry loaded with the statistics, not after them: one round trip a tile)
          const int last = mask.row(i * Br + Br - 1);
          const int doc_last = kMasked && lane == 0 && mask.doc ? int(mask.doc[last]) : 0;
          if (use > 0) sm90::mbarrier_wait(&qdo.k_empty[st], (use - 1) & 1);
#pragma unroll
          for (int r = lane; r < Br; r += 32) {
            const int row = i * Br + r;
            sL[st * Br + r] = row < T ? lse[row] : 0.0f;
            sDelta[st * Br + r] = row < T ? dlt[row] : 0.0f;
          }
          if (kMasked && lane == 0) sLo[st] = mask.lo_given(last, doc_last);
          sm90::mbarrier_arrive(&qdo.k_full[st]);  // release: the stores above before the consumers' reads
        }
      }
    } else if (Tr::kFormDq && tid == 64) {
      // The dQ reductions: each tile's staged (Br, D) fp32 rows added into its head's dq_accum
      // rows (accum_rows per head, a multiple of Br ≥ T, zeroed by the launcher; the destination
      // from s_dq) in one bulk reduction, tile after tile; the staging is free again once the
      // copy engine has read it.
      for (int g = 0, last = 0; !last; ++g) {
        const int k = g % NSt;
        sm90::mbarrier_wait(&dq_full[k], uint32_t(g / NSt) & 1);
        const long long dst = s_dq[2 * k];
        last = int(s_dq[2 * k + 1]);
        sm90::bulk_reduce_add_f32(dq_accum + dst, sDq + k * (Tr::kTileDq / 4), Tr::kTileDq);
        sm90::bulk_commit();
        sm90::bulk_wait_read<0>();
        sm90::mbarrier_arrive(&dq_empty[k]);
      }
      sm90::bulk_wait<0>();  // every reduction done before the block exits
    }
    return;
  }

  const DkdvSmem sm{sK,       sV,       sQ,       sdO,     sStage,   sdSt,    sDq,      sL,     sDelta, sLo,
                    qdo,      own_full, own_empty, ds_full, ds_empty, dq_full, dq_empty, s_item, s_dq};
  dkdv_consumer<Tr, kMasked>(p, maps, sm, T, H, causal, n_items, item_of, dq_accum, accum_rows, tid, wg);
}

}  // namespace flash

// ───────────────────────────── launchers ─────────────────────────────

namespace {

// The grid: one block per SM, each taking several work items, the next one claimed from a
// counter (launch.cuh, item_counter), as the forward's: a block's start and epilogue overlap the
// next item's loads, which pays most at short causal T, and the dynamic claiming keeps the
// heaviest-first order at long T, where a static split loses (docs/kernels.md §5.3).
// Work items of tiles of `rows` rows (the kernels decode them: sm90::item_tile).
int item_count(const FlashAttentionParams& p, int rows) { return int(p.H * p.B * ((p.T + rows - 1) / rows)); }

// The dQ kernel: its tensor maps are encoded on the host at every call (host time not measured).
// It is launched to overlap the dK/dV kernel (programmatic dependent launch, launch.cuh): its
// blocks start on the SMs the dK/dV kernel's blocks leave, rather than after the last of them —
// the dK/dV kernel's last wave of items leaves SMs idle, at non-causal T a fixed fraction (its
// items are alike: 2048 at d 128, 2736–2816 at d 64 from 2k, for 132 SMs) — and the launch's gap
// closes. It reads only what the delta pass and the forward wrote, and takes its own item counter
// (slot 1: the dK/dV kernel's last blocks may still be claiming from slot 0). It pays most at
// short T, where the last wave is a larger share of the kernel (docs/kernels.md §5.3).
// Each kernel as its masked instantiation when p has a structured mask (causal shapes only have
// one), else as its unmasked one: f(the kernel of Tr, masked or not).
template <class Tr, template <class, bool> class Kernel, class F>
void with_masked(const FlashAttentionParams& p, F&& f) {
  if constexpr (Tr::S::mask != flash::Mask::kNonCausal)
    if (flash::has_mask(p)) return f(Kernel<Tr, true>::get());
  f(Kernel<Tr, false>::get());
}
template <class Tr, bool kMasked>
struct DqKernel {
  static auto get() { return flash::flash_bwd_dq_sm90a_kernel<Tr, kMasked>; }
};
template <class Tr, bool kMasked>
struct DkdvKernel {
  static auto get() { return flash::flash_bwd_dkdv_sm90a_ws_kernel<Tr, kMasked>; }
};

template <class Tr>
void launch_dq_sm90a_with(const FlashAttentionParams& p, const float* delta, cudaStream_t stream) {
  with_masked<Tr, DqKernel>(p, [&](auto kernel) {
    flash::launch_item_kernel<Tr>(flash::Overlap::kPrevious, kernel, Tr::kSmemBytes, item_count(p, Tr::kBr), p, stream,
                                  delta, flash::bwd_tma_maps<Tr>(p), flash::item_counter(stream, 1));
  });
}
// The dK/dV kernel, likewise.
template <class Tr>
void launch_dkdv_sm90a_with(const FlashAttentionParams& p, const float* delta, cudaStream_t stream) {
  with_masked<Tr, DkdvKernel>(p, [&](auto kernel) {
    flash::launch_item_kernel<Tr>(flash::Overlap::kNone, kernel, Tr::kSmemBytes, item_count(p, Tr::kBc), p, stream,
                                  delta, static_cast<float*>(nullptr), 0, flash::bwd_tma_maps<Tr>(p),
                                  flash::item_counter(stream));
  });
}
// FlashDq::kAtomic's dK/dV kernel, which forms dQ too and adds it into dq_accum.
template <class Tr>
void launch_dkdv_atomic_sm90a_with(const FlashAttentionParams& p, const float* delta, float* dq_accum, int accum_rows,
                                   cudaStream_t stream) {
  with_masked<Tr, DkdvKernel>(p, [&](auto kernel) {
    flash::launch_item_kernel<Tr>(flash::Overlap::kNone, kernel, Tr::kSmemBytes, item_count(p, Tr::kBc), p, stream,
                                  delta, dq_accum, accum_rows, flash::bwd_tma_maps<Tr>(p), flash::item_counter(stream));
  });
}

}  // namespace

namespace flash {

// kAtomic permits a run-dependent dQ; it does not require one, and runs the atomic kernel only
// where it is the faster (kAtomicKernel wherever it is built). At d 128 from T = 16384: below,
// the deterministic pair, with its causal items in groups of heads, is the faster, and at causal
// T ≤ 2048 the accumulator's zeroing and conversion, passes of their own, weigh most. At d 64
// non-causal from 4096, where it is level with the pair, kept as the mode that does 5 products,
// not 7 (docs/kernels.md §6).
bool sm90a_runs_atomic_dq(const FlashAttentionParams& p) {
  // (At d 96 the d 128 atomic kernel would add 128-column rows into a 96-column accumulator.)
  const bool built = p.D == 128 ? kSm90aAtomicDq<128> : p.D == 64 ? kSm90aAtomicDq<64> : false;
  if (!built || p.dq_mode == FlashDq::kRecompute) return false;
  if (p.dq_mode == FlashDq::kAtomicKernel) return true;
  return p.D == 128 ? p.T >= 16384 : !p.causal && p.T >= 4096;
}

// The T the backward's tables choose the dK/dV and dQ shapes at: T, but with documents of at
// most kBwdSm90aLongT tokens below that, since items then span no more keys (dK/dV) or queries
// (dQ) than at such a T, whatever T is: the short-T d 64 shapes (K and V in registers released at
// the item's start; two Q/dO buffers) run the backward 1.20× faster with 1,024-token documents at
// T 8k and 1.08× with 2,048 at 16k; at 4,096 (T 32k) the long-T ones were level with them
// (docs/kernels.md §2.4).
static int64_t bwd_shape_t(const FlashAttentionParams& p) {
  const bool short_documents = p.doc_start && p.longest_document > 0 && p.longest_document <= kBwdSm90aLongT;
  return short_documents ? std::min<int64_t>(p.T, kBwdSm90aLongT - 1) : p.T;
}

// The shapes the backward's tables (sm90_shapes.h: dkdv_shape, dq_shape, dkdv_atomic_shape)
// select for p's head dim, mask and length (bwd_shape_t). Head dim 96 runs the d 128 kernels, zero-padded as in
// the forward (flash_fwd_sm90a): dQ, dK and dV are m64n96 products (their columns past 96 would be
// zeros); it has no atomic kernel (kSm90aAtomicDq).
void flash_bwd_sm90a(const FlashAttentionParams& p, const float* delta, float* dq_accum, int accum_rows,
                     cudaStream_t stream) {
  auto no_shape = [&](const char* kernel) {
    return std::invalid_argument(std::string("flash_attention_backward: no sm_90a ") + kernel + " shape for head dim " +
                                 std::to_string(p.D));
  };
  // (kAtomic only where sm90a_runs_atomic_dq: the caller passes kRecompute elsewhere.)
  if (p.dq_mode == FlashDq::kAtomic && with_named_shape(DkdvAtomicTable{}, dkdv_atomic_shape(p.D, p.causal, p.T), [&](auto tag) {
        launch_dkdv_atomic_sm90a_with<DkdvWsSm90aTraits<typename decltype(tag)::type>>(p, delta, dq_accum, accum_rows,
                                                                                       stream);
      }))
    return;
  if (!with_named_shape(join(DkdvTable{}, DkdvVariants{}), dkdv_shape(p.D, p.causal, bwd_shape_t(p), variant_name(p.variant)), [&](auto tag) {
        launch_dkdv_sm90a_with<DkdvWsSm90aTraits<typename decltype(tag)::type>>(p, delta, stream);
      }))
    throw no_shape("dK/dV");
  if (!with_named_shape(join(DqTable{}, DqVariants{}), dq_shape(p.D, p.causal, bwd_shape_t(p), variant_name(p.variant)), [&](auto tag) {
        launch_dq_sm90a_with<DqSm90aTraits<typename decltype(tag)::type>>(p, delta, stream);
      }))
    throw no_shape("dQ");
}

}  // namespace flash

}  // namespace tg::cuda
