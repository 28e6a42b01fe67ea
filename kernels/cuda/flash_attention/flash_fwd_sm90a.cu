// FlashAttention forward on Hopper (sm_90a; built for that architecture alone, see
// CMakeLists.txt): FlashAttention-3's structure. The algorithm is flash_fwd.cu's — online softmax
// in log2 units, heaviest causal tiles first, mask only where a tile reaches past T or straddles
// the diagonal — on Hopper's three engines:
//   - the tensor copy engine (TMA, tma.h): one producer thread loads Q once and streams K and V
//     tiles of 128 keys (176 at d 128 when not causal) into stage buffers, 128-byte swizzled 64-column panels, each stage with
//     a "full" mbarrier that the copies' bytes complete and an "empty" one the consumers
//     complete when they are done with it;
//   - warpgroup MMA (wgmma.cuh): each consumer warpgroup owns 64 query rows and forms
//     S = Q Kᵀ from shared memory (Q and K K-major) and O += P V with P from registers (the S
//     accumulator repacked, as the layouts coincide) and V MN-major;
//   - warp specialisation: the producer warpgroup gives its registers to the consumers
//     (setmaxnreg), and the consumers take turns at the tensor cores (named barriers), so one
//     warpgroup's softmax runs while another's products do.
// Within a consumer the loop is pipelined: S for tile j is issued with P_{j−1} V_{j−1}, and tile
// j's softmax runs while the second product does; the scale is folded into the exponent's FFMA
// (tile.cuh, "raw scores"). Work items (query tile, head, batch) go heaviest first when causal,
// head-major when not (sm90::item_tile); the grid is one block per SM, each taking several items
// in turn, its producer loading the next item's Q and K/V while the consumers finish the last
// (launch_fwd_sm90a).
//
// flash_attention_forward runs it on compute capability 9.0 (FlashKernels::kAuto) for scale > 0;
// flash_fwd.cu's kernel is the fallback elsewhere and the tests' second opinion.
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
#include "kernels/cuda/flash_attention/sm90_epilogue.cuh"
#include "kernels/cuda/flash_attention/sm90_fwd_mainloop.cuh"
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

// One producer warpgroup and Consumers warpgroups of 64 query rows each; Bc keys per K/V tile,
// Stages stage buffers. The producer keeps 24 or 32 registers per thread and gives the rest to
// the consumers. The consumers take turns: named barriers pass the right to issue a tile's two
// products around the ring of consumer warpgroups, so one warpgroup's softmax overlaps the
// others' products rather than coinciding with them (FlashAttention-3's ping-pong).
// Shape: a forward shape of sm90_shapes.h (FwdShape's fields); the traits derive the sizes.
template <class Shape>
struct FwdSm90aTraits {
  using S = Shape;
  static constexpr int Consumers = S::consumers, Stages = S::stages;
  // O of an item staged in shared memory (per consumer, its 64 rows) and written by the tensor
  // copy engine (tma_store_4d), so the consumers go on to the next item at once rather than
  // issuing Dh/4 four-byte global stores per thread.
  static constexpr bool kStoreByTma = S::store_by_tma;
  // Causal, two consumers on 128-row items and 128-key tiles: an item's last K/V tile is its
  // diagonal one, of whose keys the first consumer's rows reach only the first 64 — its
  // products over that tile stop there (S m64n64 and P V over 64 keys, in accumulators of their
  // own: as a prefix of the full ones ptxas serialised the wgmmas).
  static constexpr bool kHalfDiagonal = S::half_diagonal;
  // A consumer multiplies only the K/V tiles its own rows need: none when they all lie past T (a
  // head's last, part-filled query tile), and when causal those up to its last row's diagonal;
  // it takes the block's other tiles as turns without products.
  static constexpr bool kSkipIdle = S::skip_idle;
  static constexpr int kD = tile_dim<S>();
  // The head's columns (≤ kD): head dim 96 runs the d 128 tiles, which the tensor maps zero-fill
  // past column 96; the products that sum over the head's columns stop there (their k-steps
  // over the padding would add zeros), and those whose N is the head's columns run N = 96
  // (their columns past it would be zeros).
  static constexpr int kHeadDim = S::head_dim;
  // S = Q K_jᵀ with Q's A fragments loaded once per item into registers (RS) instead of read from
  // shared memory at every tile (SS): a third of the product's shared-memory traffic less.
  static constexpr bool kQInRegisters = S::q_in_registers;
  static constexpr int kConsumers = Consumers;            // warpgroups of 64 query rows
  static constexpr int kThreads = 128 * (Consumers + 1);  // warpgroup 0 is the producer
  static constexpr int kBr = 64 * Consumers;              // query rows per block
  static constexpr int kBc = S::key_tile;                 // keys per tile: S is m64 n Bc per warpgroup
  // Keys of the products over an item's last K/V tile (≤ kBc; not causal, where every item's
  // last tile is T's last, part-filled one): S = Q Kᵀ and P V stop there rather than at kBc —
  // the tile's keys past T are zero-filled and masked, and past kTailBc not multiplied at all
  // (the softmax still runs over the whole tile). fwd_last_tile_keys picks it per T.
  static constexpr int kTailBc = S::last_tile_keys ? S::last_tile_keys : kBc;
  static constexpr bool kNarrowLastTile = S::narrow_last_tile;
  static constexpr int kStages = Stages;                  // K/V stage buffers
  static constexpr int kPanels = kD / 64;
  static constexpr int kPanelQ = kBr * sm90::kSwizzleRowBytes, kPanelKV = kBc * sm90::kSwizzleRowBytes;
  static constexpr int kTileQ = kPanels * kPanelQ, kTileKV = kPanels * kPanelKV;  // bytes
  // Registers per thread after the hand-over (FlashAttention-3's split: 24 + 2 × 240 = 3 × 168,
  // 32 + 3 × 160 = 4 × 128: the launch allocation exactly).
  static constexpr int kProducerRegs = Consumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = Consumers == 2 ? 240 : 160;
  static constexpr int kBarrierBytes = 8 * (3 + 4 * kStages);  // the mbarriers and the item slot, after the tiles
  // kStoreByTma: per consumer an O staging tile of 64 rows (kPanels panels).
  static constexpr int kTileStage = kPanels * 64 * sm90::kSwizzleRowBytes;
  static constexpr int kStageBytes = kStoreByTma ? Consumers * kTileStage : 0;
  static constexpr size_t kSmemBytes =
      size_t(kTileQ + 2 * kStages * kTileKV + kStageBytes + kBarrierBytes + sm90::kSwizzleAtomBytes);
  static_assert(kD == 64 || kD == 128, "head dims 64 and 128");
  static_assert(kHeadDim % 16 == 0 && kHeadDim <= kD && kHeadDim > kD - 64, "the head fills the tile's last panel in part");
  static_assert(kBc == 64 || kBc == 128 || kBc == 176, "S is one m64n64, m64n128 or m64n176 product per warpgroup");
  static_assert(kBc != 176 || !kQInRegisters, "S (88 registers), P and O leave no room for Q's fragments");
  static_assert(kTailBc % 64 == 0 || kTailBc == kBc, "the last tile's products: m64n64, m64n128 or the whole tile");
  static_assert(kTailBc <= kBc, "the last tile's products lie within the tile");
  static_assert(!kHalfDiagonal || (Consumers == 2 && kBc == 128 && kTailBc == kBc), "half diagonals: 128-row items, 128-key tiles");
  static_assert(!kNarrowLastTile || kBc == 176, "last tiles as narrow as T needs: on 176-key tiles");
  static_assert(Consumers == 2 || Consumers == 3, "the register split is written for 2 or 3 consumers");
  static_assert(sm90::fits_launch_registers(kThreads, kProducerRegs, Consumers, kConsumerRegs),
                "the hand-over must fit the registers the block is launched with (sm90_ptx.cuh, setmaxnreg)");
  static_assert(kSmemBytes <= 227 * 1024, "one block's shared memory");
};

// The tensor maps of q, k, v (tma.h): (D columns, H heads, T rows, B sequences), boxes of 64
// columns × kBr rows (q) or kBc rows (k, v), so a box never reads past its own sequence, nor past
// its own head's columns (zeros there: head dim 96 on the d 128 kernels).
struct FwdTmaMaps {
  CUtensorMap q, k, v;
  CUtensorMap o;  // boxes of 64 rows (Tr::kStoreByTma only)
};
template <class Tr>
FwdTmaMaps fwd_tma_maps(const FlashAttentionParams& p) {  // p's row strides resolved
  const uint64_t head_dim = uint64_t(p.D), heads = uint64_t(p.H), T = uint64_t(p.T), B = uint64_t(p.B);
  const uint64_t ldq = uint64_t(p.q_row_stride), ldk = uint64_t(p.k_row_stride), ldv = uint64_t(p.v_row_stride);
  FwdTmaMaps maps{make_bf16_head_tensor_map(p.q, head_dim, heads, T, B, ldq, T * ldq, Tr::kBr),
                  make_bf16_head_tensor_map(p.k, head_dim, heads, T, B, ldk, T * ldk, Tr::kBc),
                  make_bf16_head_tensor_map(p.v, head_dim, heads, T, B, ldv, T * ldv, Tr::kBc),
                  {}};
  if constexpr (Tr::kStoreByTma) {
    const uint64_t ldo = uint64_t(p.o_row_stride);
    maps.o = make_bf16_head_tensor_map(p.o, head_dim, heads, T, B, ldo, T * ldo, 64);
  }
  return maps;
}

// Block shapes: sm90_shapes.h's forward table (FwdTable), each shape's reason beside it and its
// measurements in docs/kernels.md §4.2.

// Work items: (query tile, head, batch), numbered heaviest first when causal — the head fastest,
// then the batch, the tile slowest and reversed, the order in which a grid of one item per block
// would start its blocks — and head-major when not (sm90::item_tile). The grid has one block per SM (persistent, so that the next
// item's Q and first K/V tiles load while the last one's final products, softmax and epilogue
// run): block x takes item x first, then claims the lowest unclaimed item from a counter each
// time its producer is ready for another (a dynamic scheduler, so the heaviest-first order holds
// however unequal the causal items are).
// An item's K/V tiles are kb0 … kb0 + n_kb − 1: causal, up to the diagonal; with a structured
// mask (mask.cuh) from the one holding lo(q0).
struct FwdWorkItem {
  int h, b, q0, n_kb, kb0;
};
template <class Tr>
__device__ __forceinline__ sm90::ItemTile fwd_item_tile(int w, int T, int H, int B, bool causal) {
  return sm90::item_tile(w, H, B, (T + Tr::kBr - 1) / Tr::kBr, Tr::kBr, causal, true);
}
// lo_q0: the first key the tile's first query sees (0 without a mask).
template <class Tr>
__device__ __forceinline__ FwdWorkItem fwd_work_item(const sm90::ItemTile& t, int T, bool causal, int lo_q0) {
  const int q_last = min(t.row0 + Tr::kBr, T) - 1;
  const int kb0 = lo_q0 / Tr::kBc;
  return {t.h, t.b, t.row0, causal ? q_last / Tr::kBc + 1 - kb0 : (T + Tr::kBc - 1) / Tr::kBc, kb0};
}
template <class Tr>
__host__ __device__ inline int fwd_work_items(int T, int H, int B) {
  return H * B * ((T + Tr::kBr - 1) / Tr::kBr);
}

// Not causal, the keys of the products over every item's last K/V tile: T's last tile holds
// T − (n_kb − 1)·Bc keys, and on 176-key tiles (d 128) its products stop at the narrowest of 64,
// 128 and 176 keys that covers them. At the benchmark's T from 2k the last tile holds 16–112
// keys: at 2k and 4k 3 % of an item's 176-key products multiplied zeros past T, 0.2–1 % with
// these (by count). (On 128-key tiles, d 64 and d 96, a 64-key last tile taken as a prefix of the
// S and P arrays, as here, makes ptxas serialise the kernel's wgmmas for want of registers,
// C7511; in accumulator arrays of their own it does not — the half diagonals, kHalfDiagonal.)
template <class Tr>
__host__ __device__ inline int fwd_last_tile_keys(int64_t T) {
  const int64_t n_kb = (T + Tr::kBc - 1) / Tr::kBc, rem = T - (n_kb - 1) * Tr::kBc;
  if (Tr::kBc != 176 || n_kb < 2) return Tr::kBc;  // (a single tile is the item's first: full width)
  return rem <= 64 ? 64 : rem <= 128 ? 128 : Tr::kBc;
}
template <class Tr>
struct TraitsTag {
  using type = Tr;
};
template <class S, int Keys>
struct WithLastTileKeys : S {
  static constexpr int last_tile_keys = Keys;
};
// f(TraitsTag<the traits of Shape>{}), with last_tile_keys = fwd_last_tile_keys(T) where the shape
// narrows its last tile (narrow_last_tile).
template <class Shape, class F>
void with_last_tile_traits(int64_t T, F&& f) {
  using Tr = FwdSm90aTraits<Shape>;
  if constexpr (Tr::kNarrowLastTile) {
    const int keys = fwd_last_tile_keys<Tr>(T);
    if (keys == 64) return f(TraitsTag<FwdSm90aTraits<WithLastTileKeys<Shape, 64>>>{});
    if (keys == 128) return f(TraitsTag<FwdSm90aTraits<WithLastTileKeys<Shape, 128>>>{});
  }
  f(TraitsTag<Tr>{});
}

// kMasked: the structured masks (mask.cuh) are on.
template <class Tr, bool kMasked = false>
__global__ void __launch_bounds__(Tr::kThreads, 1)
    flash_fwd_sm90a_kernel(const FlashAttentionParams p, const __grid_constant__ FwdTmaMaps maps,
                           unsigned* item_counter) {
  constexpr int Bc = Tr::kBc, NS = Tr::kStages, C = Tr::kConsumers;
  // The head's columns: S = Q Kᵀ sums over them and O = P V is that wide (m64n96 at head dim 96,
  // reading V's first panel and half its second, rather than m64n128 over the zero padding).
  constexpr int Dh = Tr::kHeadDim;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* sQ = sm90::align_to_swizzle_atom(smem);
  unsigned char* sK = sQ + Tr::kTileQ;  // (stage) tiles of Tr::kTileKV bytes
  unsigned char* sV = sK + NS * Tr::kTileKV;
  unsigned char* sStage = sV + NS * Tr::kTileKV;  // kStoreByTma: (consumer) O staging tiles

  const int T = int(p.T), H = int(p.H), B = int(p.B);
  const bool causal = p.causal;
  const int tid = threadIdx.x, wg = sm90::warpgroup_index();
  const int n_items = fwd_work_items<Tr>(T, H, B);

  // The mbarriers, after the tiles: Q's full (q_full), then the K/V stream's, whose empty ones
  // count one arrival per consumer warp, then Q's empty (q_empty, likewise).
  uint64_t* q_full;
  const sm90::KvStream kv = sm90::kv_stream_barriers<NS>(sStage + Tr::kStageBytes, sK, sV, &q_full, 4 * C, tid == 0);
  uint64_t* q_empty = kv.v_empty + NS;
  // The item slot (with Q's lifetime: written before Q's load, read after q_full): the item
  // being run and the one after it (n_items or more: none), so the consumers know an item is the
  // block's last before they take its last turn.
  int* s_item = reinterpret_cast<int*>(q_empty + 1);
  if (tid == 0) {
    sm90::mbarrier_init(q_empty, 4 * C);
    sm90::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    // The producer: per item, Q once the consumers are done with the last one's, then K_j and
    // V_j into the stream's next stages as they are released. The block's first item is
    // blockIdx.x, the next ones claimed from item_counter, one item ahead.
    sm90::setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0) {
      int seq = 0;  // the stream position of the item's first K/V tile
      int w = int(blockIdx.x), next = sm90::claim_item(item_counter);
      for (int it = 0; w < n_items; ++it) {
        const sm90::ItemTile t = fwd_item_tile<Tr>(w, T, H, B, causal);
        const FwdWorkItem item = fwd_work_item<Tr>(t, T, causal, seq_mask_if<kMasked>(p, t.b).lo(t.row0));
        if (it > 0) sm90::mbarrier_wait(q_empty, uint32_t(it - 1) & 1);
        s_item[0] = w;
        s_item[1] = next;
        sm90::mbarrier_arrive_expect_tx(q_full, Tr::kTileQ);  // release: the slot before the consumers' reads
        sm90::produce_tile<Tr::kPanels>(sQ, Tr::kPanelQ, &maps.q, item.h, item.q0, item.b, q_full);
        sm90::produce_kv<Tr::kPanels, Bc, NS>(kv, &maps.k, &maps.v, item.h, item.b, item.n_kb, item.kb0, seq);
        seq += item.n_kb;
        w = next;
        if (w < n_items) next = sm90::claim_item(item_counter);
      }
      sm90::release_items(item_counter);
    }
    return;
  }

  // A consumer warpgroup: rows [q0 + 64c, +64) of each item's query tile.
  sm90::setmaxnreg_inc<Tr::kConsumerRegs>();
  const int c = wg - 1, warp = (tid % 128) / 32, lane = tid & 31;
  // The turn to issue products passes around the ring: this warpgroup waits on barrier 1 + c
  // (its 128 threads and the previous warpgroup's arrival) and hands on to the next one's. The
  // ring runs on across a block's items; only the last consumer's very last turn hands on to no
  // one (consumer 0 has taken all of its turns).
  uint32_t qf[Tr::kQInRegisters ? Dh / 16 : 1][4];  // kQInRegisters: this warp's Q rows, per item
  const FwdConsumer<Tr> cs{kv, sK, sV, sQ + 64 * c * sm90::kSwizzleRowBytes, qf, c, 1 + c, 1 + (c + 1) % C,
                           p.scale * kLog2e};  // (scale > 0: the launcher sends other scales to flash_fwd.cu)
  int seq = 0;  // as the producer's
  if (c == C - 1) sm90::named_barrier_arrive(1, 256);  // consumer 0 takes the first turn

  for (int it = 0, last_item = 0; !last_item; ++it) {
    sm90::mbarrier_wait(q_full, uint32_t(it) & 1);  // Q and the item slot
    if constexpr (Tr::kQInRegisters) sm90::load_a_frags_swizzled<Dh>(qf, cs.sQw, Tr::kPanelQ, 16 * warp, lane);
    const sm90::ItemSlot slot = sm90::read_item_slot(s_item, lane);
    last_item = slot.next >= n_items;
    // With a structured mask, the item's first K/V tile and this warp's rows' first visible keys
    // (ItemMask), their doc_start entries loaded together (mask.cuh).
    FwdWorkItem item;
    ItemMask mask{false, 0, 0, 0};
    if constexpr (kMasked) {
      const sm90::ItemTile t = fwd_item_tile<Tr>(slot.item, T, H, B, causal);
      int lo_q0;
      mask = item_mask(seq_mask(p, t.b), t.row0, t.row0 + 64 * c + 16 * warp, lane, lo_q0);
      item = fwd_work_item<Tr>(t, T, causal, lo_q0);
    } else {
      item = fwd_work_item<Tr>(fwd_item_tile<Tr>(slot.item, T, H, B, causal), T, causal, 0);
    }
    const int n_kb = item.n_kb;
    const int row0 = item.q0 + 64 * c + 16 * warp;  // this warp's first query row
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[Dh / 8][4];  // (16, Dh) per warp: the warpgroup's (64, Dh) accumulator
    zero(o);
    float s[Bc / 8][4];
    uint32_t pf[Bc / 16][4];

    // The tiles this consumer's rows need: all n_kb, or with kSkipIdle none when its rows all lie
    // past T (a head's last, part-filled query tile) and, causal, only those up to its last row's
    // diagonal (the block's later tiles serve its other consumers' rows). It takes the others as
    // turns without products, below.
    int n_need = n_kb;
    if constexpr (Tr::kSkipIdle) {
      const int r0 = item.q0 + 64 * c, r1 = min(r0 + 63, T - 1);
      n_need = r0 >= T ? 0 : causal ? min(n_kb, r1 / Bc + 1 - item.kb0) : n_kb;
    }
    if (!Tr::kSkipIdle || n_need > 0) {
      FwdItemLoop<Tr> loop{cs,  q_empty, seq, n_kb, n_need, bool(last_item), T, causal, item.kb0, mask, row0, lane,
                           o,   m,       l,   s,    pf};
      loop.run();
    }
    if constexpr (Tr::kSkipIdle) {
      // Tiles n_need.. (nothing of them reaches this consumer's rows): turns without products. Q
      // is released with the consumer's last S, or here when it has none.
      if (n_need == 0) cs.release(q_empty);
      sm90::idle_turns<NS>(kv, seq, n_need, n_kb, cs.my_turn, cs.next_turn, c != C - 1 || !last_item);
    }
    seq += n_kb;
    fwd_epilogue<Tr>(p, maps.o, sStage, T, H, item.h, item.b, item.q0, c, tid % 128 == 0, warp, lane, row0, o, m, l);
  }
  if constexpr (Tr::kStoreByTma)
    if (tid % 128 == 0) sm90::bulk_wait<0>();  // the last stores done before the block exits
}

}  // namespace flash

// ───────────────────────────── launchers ─────────────────────────────

namespace {

// The tensor maps are encoded on the host at every call (host time not measured).
//
// The grid: one block per SM, each taking several work items, the next one claimed from a
// counter (launch.cuh, item_counter): a block's start and epilogue overlap the next item's loads,
// which pays at short T, and claiming dynamically keeps the heaviest-first order at long causal
// T too, where a static round-robin split of the items is less even than the hardware's handing
// out of blocks as SMs free up (docs/kernels.md §5.3).
// With a structured mask the kernel's masked instantiation, which only causal shapes have.
template <class Tr>
void launch_fwd_sm90a_traits(const FlashAttentionParams& p, cudaStream_t stream) {
  auto launch = [&](auto kernel) {
    flash::launch_item_kernel<Tr>(flash::Overlap::kNone, kernel, Tr::kSmemBytes,
                                  flash::fwd_work_items<Tr>(int(p.T), int(p.H), int(p.B)), p, stream,
                                  flash::fwd_tma_maps<Tr>(p), flash::item_counter(stream));
  };
  if constexpr (Tr::S::mask != flash::Mask::kNonCausal)
    if (flash::has_mask(p)) return launch(flash::flash_fwd_sm90a_kernel<Tr, true>);
  launch(flash::flash_fwd_sm90a_kernel<Tr, false>);
}
// A shape of sm90_shapes.h; not causal, on 176-key tiles, the products over every item's last K/V
// tile as wide as T's last tile needs (fwd_last_tile_keys), rounded up to 64 or 128 keys:
// products over keys past T multiply zeros at full cost (docs/kernels.md §2.3).
template <class Shape>
void launch_fwd_sm90a(const FlashAttentionParams& p, cudaStream_t stream) {
  flash::with_last_tile_traits<Shape>(p.T, [&](auto tr) { launch_fwd_sm90a_traits<typename decltype(tr)::type>(p, stream); });
}

}  // namespace

namespace flash {

// The shape the forward's table (sm90_shapes.h, fwd_shape) selects for p's head dim, mask and
// length. Head dim 96 runs the d 128 kernel: its tensor maps end each head at column 96, so the
// second 64-column panel of every tile is zero-filled past it (tma.h); S = Q Kᵀ stops at column
// 96 (kHeadDim), and O = P V is an m64n96 product (its columns past 96 would be zeros), stored to
// column 96.
void flash_fwd_sm90a(const FlashAttentionParams& p, cudaStream_t stream) {
  const char* shape = fwd_shape(p.D, p.causal, p.T, variant_name(p.variant));
  if (!with_named_shape(join(FwdTable{}, FwdVariants{}), shape,
                        [&](auto tag) { launch_fwd_sm90a<typename decltype(tag)::type>(p, stream); }))
    throw std::invalid_argument("flash_attention_forward: no sm_90a shape for head dim " + std::to_string(p.D));
}

}  // namespace flash

}  // namespace tg::cuda
