// The block shapes of the sm_90a attention kernels, as named structs, and the one table per kernel
// that picks a shape for (head dim, mask, T). A shape is a struct whose static fields name its
// configuration (consumers, stages, tile rows, buffers, flags); the defaults are in the kernel's
// base struct (FwdShape, DkdvShape, DqShape), and each shape overrides only what differs. The
// kernels read a shape through their traits (FwdSm90aTraits<Shape>, …), which derive the sizes.
//
// A shape also says where it applies — its head dim, its mask, its range of T — and a table is an
// ordered list of shapes, of which the first that applies runs. Beside the tables, the
// development registry (the *Variants lists) keeps a few shapes that were measured against the
// kept ones (docs/kernels.md §4.4): a variant named in FlashAttentionParams::variant runs instead
// of the table's shape wherever it applies, so that an A/B compares two shapes in one binary
// (`tilegrad bench attention --variant NAME`, tools/attention_ab.sh).
//
// Plain C++17 (host and device; no CUDA headers): the launchers, the emulator (tools/kernel_emu)
// and the benchmark read it alike.
#pragma once
#include <cstdint>
#include <cstring>

namespace tg::cuda::flash {

// Where a shape applies.
enum class Mask { kAny, kCausal, kNonCausal };
constexpr int64_t kAnyT = int64_t(1) << 62;
// The forward's short causal shape up to this T; the backward's long shapes from kBwdSm90aLongT.
constexpr int64_t kFwdShortCausalMaxT = 1024;
constexpr int64_t kBwdSm90aLongT = 2048;

// ───────────────────────── the fields and their defaults ─────────────────────────

// The forward (flash_fwd_sm90a.cu, FwdSm90aTraits).
struct FwdShape {
  static constexpr int head_dim = 128;  // the head's columns: 64, 96 or 128 (96 on 128-column tiles)
  static constexpr Mask mask = Mask::kAny;
  static constexpr int64_t min_t = 0, max_t = kAnyT;
  static constexpr int consumers = 2;   // warpgroups of 64 query rows
  static constexpr int key_tile = 128;  // keys per streamed K/V tile (64, 128 or 176)
  static constexpr int stages = 2;      // K/V stage buffers
  static constexpr bool q_in_registers = false;  // S = Q Kᵀ with Q's A fragments in registers
  static constexpr bool skip_idle = false;       // a consumer multiplies only the tiles its rows need
  static constexpr bool half_diagonal = false;   // causal: the first consumer's diagonal product over 64 keys
  static constexpr bool store_by_tma = false;    // O staged in shared memory and stored by the copy engine
  // Keys of the products over an item's last K/V tile (0: the whole tile); narrow_last_tile: the
  // launcher sets it per T (fwd_last_tile_keys; 176-key tiles only).
  static constexpr int last_tile_keys = 0;
  static constexpr bool narrow_last_tile = false;
};

// The dK/dV kernel, deterministic and atomic (flash_bwd_sm90a.cu, DkdvWsSm90aTraits).
struct DkdvShape {
  static constexpr int head_dim = 128;
  static constexpr Mask mask = Mask::kAny;
  static constexpr int64_t min_t = 0, max_t = kAnyT;
  static constexpr int consumers = 2;     // warpgroups of 64 keys
  static constexpr int query_tile = 64;   // queries per streamed Q/dO tile
  static constexpr int stages = 3;        // Q/dO stage buffers
  static constexpr bool ping_pong = false;         // consumers take turns at issuing
  static constexpr bool form_dq = false;           // the atomic kernel: dQ formed here and added
  static constexpr bool own_in_registers = false;  // K and V as A fragments, loaded once per item
  static constexpr bool grouped_items = true;      // causal items in groups of heads (sm90::item_tile)
  static constexpr bool pipelined = true;          // dK_{j−1} issued with Sᵀ_j, dPᵀ_j
  static constexpr bool skip_idle = false;
  static constexpr bool store_by_tma = false;      // dK, dV staged and stored by the copy engine
};

// The dQ kernel (flash_bwd_sm90a.cu, DqSm90aTraits).
struct DqShape {
  static constexpr int head_dim = 128;
  static constexpr Mask mask = Mask::kAny;
  static constexpr int64_t min_t = 0, max_t = kAnyT;
  static constexpr int consumers = 2;   // warpgroups of 64 query rows
  static constexpr int key_tile = 96;   // keys per streamed K/V tile (64, 96 or 128)
  static constexpr int stages = 3;
  static constexpr bool pipelined = true;  // dQ += dS_{j−1} K_{j−1} issued with tile j's S, dP
  static constexpr bool skip_idle = false;
  static constexpr bool store_by_tma = false;
  static constexpr int q_buffers = 1;   // Q/dO buffers: with two the next item's load under this one
};

// The tiles' columns: the head's, rounded up to a 64-column panel (head dim 96 runs 128).
template <class S>
constexpr int tile_dim() {
  return (S::head_dim + 63) / 64 * 64;
}
// Whether shape S applies at (head dim D, mask, T).
template <class S>
constexpr bool applies(int64_t D, bool causal, int64_t T) {
  return S::head_dim == D && (S::mask == Mask::kAny || (S::mask == Mask::kCausal) == causal) && T >= S::min_t &&
         T <= S::max_t;
}

// ───────────────────────── the tables ─────────────────────────
// In the order they are searched; each shape's reason, with its measurement, in docs/kernels.md
// §4.2 (the table there lists them by these names).

// Forward (docs/kernels.md §4.2 has the measurements that chose these shapes):
//   d 128: 2 consumers × 128-key tiles, 2 stages (168 registers at launch, 240 per consumer
//          thread after the hand-over, 0 consumer spills, 193 KiB). 64-key tiles form S as two
//          m64n64 products per Q read and ran slower; a third stage gained nothing.
//   d 64:  3 consumers (192 query rows) × 128-key tiles, 2 stages (160 registers per consumer).
//          At d 64 the softmax is as long as a tile's products, so a third consumer keeps the
//          tensor cores busy while two of them exponentiate; a third stage gained nothing.
// Q in registers at d 128 (S register-A, no consumer spills at 240); at d 64 (3 × 160 registers)
// it would spill 96 bytes and ptxas would serialise the wgmmas, so d 64 reads Q from shared memory.
// d 64's three consumers each multiply only the K/V tiles their own rows need (kSkipIdle): when
// causal, a 192-row item's first consumer's rows stop a tile or more before its last one's, and
// rows past T need none. d 128 (causal only: the non-causal shape is fwd_d128_noncausal)
// halves its diagonal tile for the first consumer, whose rows reach only its first 64 keys
// (kHalfDiagonal; at d 64's short causal shape it gains nothing and is left out). Figures:
// docs/kernels.md §2.3.
// O leaves through shared memory and the tensor copy engine (kStoreByTma) in every shape but d 128's
// non-causal 176-key one (no shared memory left for the staging) and d 96's non-causal one (not
// measured): the consumers go on to the next item at once, which pays where items are short
// (docs/kernels.md §5.2).
// d 96 runs d 128's shape; its products stop at the head's 96 columns, both those that sum over
// them and those whose N they are — P V here, Pᵀ dO, dSᵀ Q, dS K in the backward (docs/kernels.md
// §4.3; the figures in §4.2). Causal, its diagonal tile is halved as d 128's (kHalfDiagonal).
// Not causal, d 128: FlashAttention-3's 176-key tiles (S m64n176: one softmax reduction, one
// turn and one K/V stage hand-over per 176 keys rather than 128; S, P and O fill the consumers'
// 240 registers, so Q is read from shared memory: 168 registers at launch, no consumer spills,
// 209 KiB; docs/kernels.md §4.2). Causal keeps 128 keys with Q in registers (its diagonal
// tiles' masked work would grow with the tile).
// Its products over an item's last tile stop where T does, rounded up to 64 or 128 keys
// (narrow_last_tile: fwd_last_tile_keys).
// Causal up to T = 1024 (kFwdShortCausalMaxT), d 64: two consumers (128 query rows) with Q in
// registers. At short causal T the 192-row tiles compute much that the mask then discards: at
// T = 1024, 6 tiles per head (the last with 64 rows in 192) over 2–8 K/V tiles, 786,432 scores
// per head against 589,824 with 128-row tiles and 524,800 under the mask — 1.33× the 128-row
// tiles' work, more than the third consumer's speed-up (1.15× at causal 8k) makes up.
// The bound: at causal 1k this shape is 1.09× the three-consumer one, from 2k slower
// (docs/kernels.md §4.2).
struct FwdD64ShortCausal : FwdShape {  // 2 × 64 rows: 192-row tiles compute 1.33× the masked work at 1k
  static constexpr const char* name = "fwd_d64_short_causal";
  static constexpr int head_dim = 64;
  static constexpr Mask mask = Mask::kCausal;
  static constexpr int64_t max_t = kFwdShortCausalMaxT;
  static constexpr bool q_in_registers = true;
  static constexpr bool store_by_tma = true;
};
struct FwdD64 : FwdShape {  // 3 consumers: a tile's softmax is as long as its products at d 64
  static constexpr const char* name = "fwd_d64";
  static constexpr int head_dim = 64;
  static constexpr int consumers = 3;
  static constexpr bool skip_idle = true;
  static constexpr bool store_by_tma = true;
};
struct FwdD128Causal : FwdShape {
  static constexpr const char* name = "fwd_d128_causal";
  static constexpr Mask mask = Mask::kCausal;
  static constexpr bool q_in_registers = true;
  static constexpr bool half_diagonal = true;
  static constexpr bool store_by_tma = true;
};
struct FwdD128NonCausal : FwdShape {  // FlashAttention-3's 176-key tiles; S, P and O fill 240 registers
  static constexpr const char* name = "fwd_d128_noncausal";
  static constexpr Mask mask = Mask::kNonCausal;
  static constexpr int key_tile = 176;
  static constexpr bool narrow_last_tile = true;
};
struct FwdD96Causal : FwdD128Causal {  // d 128's tiles, products over the head's 96 columns
  static constexpr const char* name = "fwd_d96_causal";
  static constexpr int head_dim = 96;
};
struct FwdD96NonCausal : FwdShape {
  static constexpr const char* name = "fwd_d96_noncausal";
  static constexpr int head_dim = 96;
  static constexpr Mask mask = Mask::kNonCausal;
  static constexpr bool q_in_registers = true;
};

// dK/dV (measured on the H200; docs/kernels.md §4.2 has the figures): two consumers of 64
// keys each and 3 Q/dO stages of 64 queries — Q_i, dO_i stay in their stage until dK += dSᵀ Q_i
// has run, a tile later, so of three stages two are held and one loads ahead (2 stages were
// slower). The pipelined loop (dK_{j−1} issued with Sᵀ_j, dPᵀ_j) pays with ping-pong turns at
// d 64 and without them at d 128 (where turns make it spill), so the turns are per head dim.
// d 64 keeps K and V in registers, released at the item's start so that the next item's tiles
// load under this one where items are short; d 128 has no registers for them (dK, dV and the
// pipelined tile fill 240).
// Both skip, causal, the diagonal tile wholly before their second consumer's keys (kSkipIdle on the
// pipelined loop: an item's first query tile, rows k0 … k0 + 63, precedes keys k0 + 64 …; 5.6 % of
// the consumer-tiles at 1k, 2.9 % at 2k; docs/kernels.md §2.3).
// Their dK and dV leave through shared memory and the tensor copy engine (kStoreByTma): register
// stores from every thread are held up by the full memory queue and keep the consumers from the
// next item, which shows where items are short (docs/kernels.md §5.2). (d 64's long-T shape: see
// below.)
// From T = 2048 at d 64: three consumers (192 keys per block, 160 registers each) taking turns,
// K and V read from shared memory, each tile's four products issued and retired in turn (the
// pipelined loop's dSᵀ of the tile before would not fit: it spills 148 bytes). At d 64 a tile's
// exponentials and dS take about as long as its products, and with two consumers the tensor
// cores idle while both compute them; a third keeps them busy, as in the d 64 forward. Below
// 2048 items are a few tiles long and the 64-query shape's early release of K and V (which needs
// them in registers) pays more (docs/kernels.md §4.2).
// Causal, it stores dK and dV by the copy engine (dkdv_d64_long_causal); not
// causal, from registers: there the staged stores, whose shared memory (101 → 149 KB) the
// non-causal items' long loops do not repay, are level or slower (docs/kernels.md §5.2).
// (deterministic)
struct DkdvD64 : DkdvShape {  // K, V in registers, released at the item's start: short items
  static constexpr const char* name = "dkdv_d64";
  static constexpr int head_dim = 64;
  static constexpr int64_t max_t = kBwdSm90aLongT - 1;
  static constexpr bool ping_pong = true;
  static constexpr bool own_in_registers = true;
  static constexpr bool skip_idle = true;
  static constexpr bool store_by_tma = true;
};
struct DkdvD64LongCausal : DkdvShape {  // 3 consumers, products retired in turn (160 registers)
  static constexpr const char* name = "dkdv_d64_long_causal";
  static constexpr int head_dim = 64;
  static constexpr Mask mask = Mask::kCausal;
  static constexpr int64_t min_t = kBwdSm90aLongT;
  static constexpr int consumers = 3;
  static constexpr bool ping_pong = true;
  static constexpr bool pipelined = false;
  static constexpr bool skip_idle = true;
  static constexpr bool store_by_tma = true;
};
struct DkdvD64LongNonCausal : DkdvD64LongCausal {  // stores from registers: the staging does not repay
  static constexpr const char* name = "dkdv_d64_long_noncausal";
  static constexpr Mask mask = Mask::kNonCausal;
  static constexpr bool store_by_tma = false;
};
struct DkdvD128 : DkdvShape {  // no turns (with them the pipelined loop spills)
  static constexpr const char* name = "dkdv_d128";
  static constexpr bool skip_idle = true;
  static constexpr bool store_by_tma = true;
};
struct DkdvD96 : DkdvD128 {
  static constexpr const char* name = "dkdv_d96";
  static constexpr int head_dim = 96;
};

// FlashDq::kAtomic's dK/dV kernel, which forms dQ too (5 products per tile pair, not 7). Each
// block adds a (64 queries, D) fp32 dQ tile per streamed query tile; the L2 performs the
// reductions. Two consumers of 64 keys (128 keys per block: half the reduced bytes per FLOP of
// one), 3 Q/dO stages, no ping-pong turns (the per-tile dSᵀ exchange already paces the
// consumers), tile j's dQ product issued with dK_{j+1} so that the consumers need not meet at
// every tile; at d 64 one consumer forms a whole tile's dQ by turns (an m64n32 half would read
// more shared memory per FLOP than the tensor cores' operand rate allows), and the causal items
// go in groups of heads as in every other kernel, which at d 128 is slower, so d 128 keeps one
// group. Where it is the faster than the deterministic pair: sm90a_runs_atomic_dq. The figures,
// and the variants rejected: docs/kernels.md §6 and §9.
struct DkdvAtomicD64 : DkdvShape {  // one consumer forms a whole tile's dQ, by turns
  static constexpr const char* name = "dkdv_atomic_d64";
  static constexpr int head_dim = 64;
  static constexpr bool form_dq = true;
  static constexpr bool own_in_registers = true;
};
struct DkdvAtomicD128 : DkdvShape {  // every head in one group: grouped, 3–5 % slower
  static constexpr const char* name = "dkdv_atomic_d128";
  static constexpr bool form_dq = true;
  static constexpr bool grouped_items = false;
};

// dQ (docs/kernels.md §4.2 has the measurements that chose these shapes):
//   d 128: 2 consumers × 96-key tiles, 3 stages (m64n96 S and dP; 168 registers, no consumer
//          spills, 209 KiB). K_j stays in its stage until dQ += dS_j K_j has run, in the next
//          turn, so with two stages the next tile's load only starts then and its latency shows;
//          four gain nothing over three. 96-key tiles take a third fewer turns, waits and stage
//          hand-overs per FLOP than 64-key ones; 128-key tiles spill. d 96 runs the same tiles.
//   d 64:  2 consumers × 128-key tiles, 3 stages, below T = 2048 (the long shape below from
//          there). dQ leaves through shared memory and the copy engine (kStoreByTma, both d 64
//          shapes); d 128 and d 96 have no shared memory left for a staging tile per consumer
//          (209 of 227 KiB). Q and dO in two buffers (kQBuffers = 2, 144 → 176 KiB), so that an
//          item's Q/dO tiles load while the item before is still multiplied, which pays where
//          items are short; on the long shape (145 → 193 KiB) it does not, and one is kept.
//   d 128: kSkipIdle on the pipelined loop — when causal, the first consumer's rows end a key
//          tile before the second's in about half the items and it stops there (docs/kernels.md
//          §2.3).
// From T = 2048 at d 64 (kBwdSm90aLongT, as the dK/dV kernel's long shape): three consumers (192
// query rows per block, 160 registers each) on 96-key tiles, each tile's three products issued
// and retired in turn (kPipelined = false: the pipelined loop's dS of the tile before would not
// fit beside the next S and dP in 160 registers). A third consumer keeps the tensor cores busy
// while two compute exponentials and dS, as in the dK/dV kernel's long shape; the tiles are wide
// enough that a turn's products outlast two consumers' exponentials (on 64-key tiles the shape
// is slower). At 1k the two-consumer shape is the faster (docs/kernels.md §4.2).
// Each of its consumers multiplies only the key tiles its own rows need (kSkipIdle; the same in
// dkdv_d64_long_*, from the query tile of its first key on): a 192-row block is a
// coarse unit, and when causal its first consumer's rows stop a tile or more before its last
// one's, as do rows past T. Its per-consumer trip counts compile as short as the plain loops only
// with the warp-uniform warpgroup index (sm90::warpgroup_index; docs/kernels.md §2.3).
struct DqD64 : DqShape {
  static constexpr const char* name = "dq_d64";
  static constexpr int head_dim = 64;
  static constexpr int64_t max_t = kBwdSm90aLongT - 1;
  static constexpr int key_tile = 128;
  static constexpr bool store_by_tma = true;
  static constexpr int q_buffers = 2;
};
struct DqD64Long : DqShape {  // 3 consumers on 96-key tiles, products retired in turn
  static constexpr const char* name = "dq_d64_long";
  static constexpr int head_dim = 64;
  static constexpr int64_t min_t = kBwdSm90aLongT;
  static constexpr int consumers = 3;
  static constexpr bool pipelined = false;
  static constexpr bool skip_idle = true;
  static constexpr bool store_by_tma = true;
};
struct DqD128 : DqShape {  // 96-key tiles (128 spill); no shared memory left for staging
  static constexpr const char* name = "dq_d128";
  static constexpr bool skip_idle = true;
};
struct DqD96 : DqD128 {
  static constexpr const char* name = "dq_d96";
  static constexpr int head_dim = 96;
};

// ───────────────────────── the development registry ─────────────────────────
// Variants kept for comparison: each the alternative a row of docs/kernels.md measured against
// the kept shape, where that A/B may be worth running again.

struct FwdD64Causal192Rows : FwdD64 {  // against fwd_d64_short_causal (§4.2: causal 1k 267 → 290)
  static constexpr const char* name = "fwd_d64_causal_192rows";
  static constexpr Mask mask = Mask::kCausal;
  static constexpr int64_t max_t = kFwdShortCausalMaxT;
};
struct FwdD128NonCausal128Keys : FwdD128Causal {  // against 176-key tiles (§4.2: 1.024×)
  static constexpr const char* name = "fwd_d128_noncausal_128keys";
  static constexpr Mask mask = Mask::kNonCausal;
  static constexpr bool half_diagonal = false;
};
struct FwdD128NonCausalFullLastTile : FwdD128NonCausal {  // against narrow last tiles (§2.3)
  static constexpr const char* name = "fwd_d128_noncausal_full_last_tile";
  static constexpr bool narrow_last_tile = false;
};
struct FwdD128CausalQSmem : FwdD128Causal {  // against Q in registers (§4.2: 1.017×)
  static constexpr const char* name = "fwd_d128_causal_q_smem";
  static constexpr bool q_in_registers = false;
};
struct FwdD128CausalFullDiagonal : FwdD128Causal {  // against half diagonals (§2.3)
  static constexpr const char* name = "fwd_d128_causal_full_diagonal";
  static constexpr bool half_diagonal = false;
};
struct DkdvD64LongTwoConsumers : DkdvD64 {  // against 3 consumers from 2k (§4.2: 1.023×)
  static constexpr const char* name = "dkdv_d64_long_two_consumers";
  static constexpr int64_t min_t = kBwdSm90aLongT, max_t = kAnyT;
};
struct DkdvD64LongNonCausalStoreByTma : DkdvD64LongCausal {  // against register stores (§5.2, §9)
  static constexpr const char* name = "dkdv_d64_long_noncausal_store_by_tma";
  static constexpr Mask mask = Mask::kNonCausal;
};
struct DqD64LongTwoConsumers : DqD64 {  // against 3 × 96 keys from 2k (§4.2)
  static constexpr const char* name = "dq_d64_long_two_consumers";
  static constexpr int64_t min_t = kBwdSm90aLongT, max_t = kAnyT;
};
struct DqD64OneQBuffer : DqD64 {  // against two Q/dO buffers below 2k (§4.2: causal 1k 272 → 280)
  static constexpr const char* name = "dq_d64_one_q_buffer";
  static constexpr int q_buffers = 1;
};

template <class... S>
struct ShapeList {};
template <class S>
struct ShapeTag {
  using type = S;
};
template <class... A, class... B>
constexpr ShapeList<A..., B...> join(ShapeList<A...>, ShapeList<B...>) {
  return {};
}

using FwdTable = ShapeList<FwdD64ShortCausal, FwdD64, FwdD128Causal, FwdD128NonCausal, FwdD96Causal, FwdD96NonCausal>;
using DkdvTable = ShapeList<DkdvD64, DkdvD64LongCausal, DkdvD64LongNonCausal, DkdvD128, DkdvD96>;
using DkdvAtomicTable = ShapeList<DkdvAtomicD64, DkdvAtomicD128>;
using DqTable = ShapeList<DqD64, DqD64Long, DqD128, DqD96>;
// The development registry (the tables are not searched for these).
using FwdVariants = ShapeList<FwdD64Causal192Rows, FwdD128NonCausal128Keys, FwdD128NonCausalFullLastTile,
                              FwdD128CausalQSmem, FwdD128CausalFullDiagonal>;
using DkdvVariants = ShapeList<DkdvD64LongTwoConsumers, DkdvD64LongNonCausalStoreByTma>;
using DqVariants = ShapeList<DqD64LongTwoConsumers, DqD64OneQBuffer>;

// The name of the first shape of a list that applies at (D, causal, T); nullptr if none does.
template <class... S>
const char* first_applying(ShapeList<S...>, int64_t D, bool causal, int64_t T) {
  const char* name = nullptr;
  (void)((applies<S>(D, causal, T) ? (name = S::name, true) : false) || ...);
  return name;
}
// Whether a list holds a shape named `name`.
template <class... S>
bool holds(ShapeList<S...>, const char* name) {
  return name && ((std::strcmp(name, S::name) == 0) || ...);
}
// f(ShapeTag<S>{}) for the shape S of the list named `name`; false if the list has none.
template <class... S, class F>
bool with_named_shape(ShapeList<S...>, const char* name, F&& f) {
  return name && ((std::strcmp(name, S::name) == 0 ? (f(ShapeTag<S>{}), true) : false) || ...);
}
// f(ShapeTag<S>{}) for every shape of the list, in order.
template <class... S, class F>
void for_each_shape(ShapeList<S...>, F&& f) {
  (f(ShapeTag<S>{}), ...);
}

// The selection functions: (head dim, mask, T) → the kernel's shape, by name — the registry's
// `variant` where it names one of the kernel's variants that applies there, else the table's.
template <class Table, class Variants>
const char* select_shape(int64_t D, bool causal, int64_t T, const char* variant) {
  const char* chosen = nullptr;
  with_named_shape(Variants{}, variant, [&](auto tag) {
    if (applies<typename decltype(tag)::type>(D, causal, T)) chosen = variant;
  });
  return chosen ? chosen : first_applying(Table{}, D, causal, T);
}
inline const char* fwd_shape(int64_t D, bool causal, int64_t T, const char* variant = nullptr) {
  return select_shape<FwdTable, FwdVariants>(D, causal, T, variant);
}
inline const char* dkdv_shape(int64_t D, bool causal, int64_t T, const char* variant = nullptr) {
  return select_shape<DkdvTable, DkdvVariants>(D, causal, T, variant);
}
inline const char* dkdv_atomic_shape(int64_t D, bool causal, int64_t T) {
  return first_applying(DkdvAtomicTable{}, D, causal, T);
}
inline const char* dq_shape(int64_t D, bool causal, int64_t T, const char* variant = nullptr) {
  return select_shape<DqTable, DqVariants>(D, causal, T, variant);
}
// Whether `name` is a variant of the registry (of any kernel).
inline bool is_sm90a_variant(const char* name) {
  return holds(FwdVariants{}, name) || holds(DkdvVariants{}, name) || holds(DqVariants{}, name);
}
// The registry's variants numbered from 1, forward, dK/dV, dQ (FlashAttentionParams::variant; 0:
// none): the name of number `id` (nullptr for 0 or past the last), and the number of `name`.
using AllVariants = decltype(join(join(FwdVariants{}, DkdvVariants{}), DqVariants{}));
inline const char* variant_name(int id) {
  const char* name = nullptr;
  int i = 0;
  for_each_shape(AllVariants{}, [&](auto tag) {
    if (++i == id) name = decltype(tag)::type::name;
  });
  return name;
}
inline int variant_id(const char* name) {
  int i = 0, id = 0;
  for_each_shape(AllVariants{}, [&](auto tag) {
    ++i;
    if (name && std::strcmp(name, decltype(tag)::type::name) == 0) id = i;
  });
  return id;
}

}  // namespace tg::cuda::flash
