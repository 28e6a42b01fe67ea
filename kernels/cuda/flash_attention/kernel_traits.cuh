// Tile sizes of the FlashAttention kernels per head dimension, every derived size static_assert'ed.
#pragma once
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/flash_attention/mma_shapes.h"

namespace tg::cuda::flash {

// Launcher check (std::invalid_argument, worded like require()): a row stride is 0 (→ H·D,
// contiguous) or ≥ H·D (token rows of one tensor never overlap), ≤ 2^24 (the kernels index a
// tile's ≤ 128 rows with 32-bit offsets) and a multiple of 8 elements, so
// every token row starts 16-byte aligned when its pointer is (D is a multiple of 8 too): the
// kernels move rows in 16-byte cp.async chunks and 4-byte bf16x2 stores. The forward uses q, k,
// v, o; the backward all eight.
inline void require_row_strides(const FlashAttentionParams& p, const char* fn, bool backward) {
  const int64_t hd = p.H * p.D;
  const struct { int64_t stride; const char* name; } all[] = {
      {p.q_row_stride, "q_row_stride"},   {p.k_row_stride, "k_row_stride"},   {p.v_row_stride, "v_row_stride"},
      {p.o_row_stride, "o_row_stride"},   {p.do_row_stride, "do_row_stride"}, {p.dq_row_stride, "dq_row_stride"},
      {p.dk_row_stride, "dk_row_stride"}, {p.dv_row_stride, "dv_row_stride"}};
  for (int i = 0; i < (backward ? 8 : 4); ++i) {
    const int64_t s = all[i].stride;
    if (s == 0 || (s >= hd && s % 8 == 0 && s <= (int64_t(1) << 24))) continue;
    throw std::invalid_argument(std::string("tg::cuda::") + fn + ": " + all[i].name + " = " + std::to_string(s) +
                                " must be 0 (contiguous, H·D = " + std::to_string(hd) +
                                ") or ≥ H·D, ≤ 2^24 and a multiple of 8 elements (16-byte aligned token rows)");
  }
}

// Launcher check: a structured mask (window, doc_start) only with causal, a window ≥ 0.
inline void require_mask(const FlashAttentionParams& p, const char* fn) {
  if (p.window < 0)
    throw std::invalid_argument(std::string("tg::cuda::") + fn + ": window = " + std::to_string(p.window) +
                                " must be ≥ 0 (0: none)");
  if ((p.window > 0 || p.doc_start) && !p.causal)
    throw std::invalid_argument(std::string("tg::cuda::") + fn +
                                ": structured masks (window, doc_start) combine with causal attention only");
}

// The row strides the kernels index with: every 0 ("contiguous") replaced by H·D. The launchers
// pass the kernels this copy, so a kernel folds each stride into its per-block base pointers and
// tile loads/stores once, with no "is it 0" test on the device.
inline FlashAttentionParams with_resolved_row_strides(FlashAttentionParams p) {
  const int64_t hd = p.H * p.D;
  for (int64_t* s : {&p.q_row_stride, &p.k_row_stride, &p.v_row_stride, &p.o_row_stride, &p.do_row_stride,
                     &p.dq_row_stride, &p.dk_row_stride, &p.dv_row_stride})
    if (*s == 0) *s = hd;
  return p;
}

// ── Which kernels run (FlashKernels) ──

// True when the current device has compute capability 9.0, where the sm_90a kernels run; the
// answer is cached per device (flash_fwd.cu).
bool device_is_sm90();
// The head dims the wgmma kernels run: 64 and 128, and 96 on the d 128 kernels with its tiles
// zero-padded (flash_fwd_sm90a); kAuto runs the mma.sync kernels for the others on every GPU.
constexpr bool wgmma_head_dim(int64_t D) { return D == 64 || D == 96 || D == 128; }
// Whether a call with p.kernels takes the wgmma kernels; std::invalid_argument (naming fn) for
// kWgmma on another GPU or at a head dim they are not built for.
bool use_wgmma(const FlashAttentionParams& p, const char* fn);
// The wgmma kernels' launchers (built for sm_90a alone), on parameters the public entry points
// have checked and whose row strides are resolved: the forward, and the backward after delta.
// With p.dq_mode kAtomic (only where sm90a_runs_atomic_dq(p): the callers pass kRecompute
// otherwise) the backward only adds dS K into dq_accum (accum_rows rows per head, a multiple of 64
// ≥ T, zeroed by the caller), which the caller then converts into dq.
bool sm90a_runs_atomic_dq(const FlashAttentionParams& p);
void flash_fwd_sm90a(const FlashAttentionParams& p, cudaStream_t stream);
void flash_bwd_sm90a(const FlashAttentionParams& p, const float* delta, float* dq_accum, int accum_rows,
                     cudaStream_t stream);

// Shared-memory tiles are row-major bf16 with a row stride of D + 8 elements: the 16-byte pad
// moves consecutive rows 4 banks apart, so the 8 row addresses of one ldmatrix 8×8 matrix land
// in 8 distinct 16-byte bank groups (no conflicts) while rows stay 16-byte aligned for cp.async.
template <int D>
constexpr int padded_stride() { return D + 8; }

// Every warp owns 16 rows (one m16n8k16 row block) of the tile the block keeps on chip.
constexpr int kRowsPerWarp = 16;
constexpr int kStages = 2;  // streamed tiles are double-buffered: load tile j+1 while computing j

// Forward, on a shape (mma_shapes.h, MmaFwdShape): warp w owns row_blocks consecutive 16-row
// blocks of queries (Br = 16·row_blocks·warps query rows per block) and streams K, V tiles of
// Bc = key_tile keys through shared memory. Q is either loaded into registers once
// (q_in_registers) or re-read from smem with ldmatrix at every k-step (saves row_blocks·D/4
// registers per thread); min_blocks is the __launch_bounds__ occupancy the register allocation
// must allow.
template <class Shape>
struct FwdTraits {
  using shape = Shape;
  static constexpr int kD = Shape::head_dim;
  static constexpr int kWarps = Shape::warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowBlocks = Shape::row_blocks;          // 16-row blocks per warp
  static constexpr int kWarpRows = kRowsPerWarp * kRowBlocks;   // query rows per warp
  static constexpr int kBr = kWarpRows * kWarps;                // query rows per block
  static constexpr int kBc = Shape::key_tile;                   // keys per streamed K/V tile
  static constexpr bool kQInRegs = Shape::q_in_registers;
  static constexpr int kMinBlocks = Shape::min_blocks;          // blocks per SM the registers must allow
  static constexpr int kLds = padded_stride<kD>();   // smem row stride, elements
  static constexpr int kTileQ = kBr * kLds;          // elements
  static constexpr int kTileKV = kBc * kLds;         // elements, one of K or V, one stage
  static constexpr size_t kSmemBytes = size_t(kTileQ + 2 * kStages * kTileKV) * 2;
  // 32-bit registers per thread of the long-lived fp32 accumulators and the Q fragments: O
  // (rows × D), S (rows × Bc), Q (rows × D bf16) over a warp's 32 lanes.
  static constexpr int kAccRegs = kWarpRows * (kD + kBc) / 32 + (kQInRegs ? kWarpRows * kD / 64 : 0);

  static_assert(kRowBlocks == 1 || kRowBlocks == 2, "a warp owns one or two 16-row blocks");
  static_assert(kD % 16 == 0, "D must be a multiple of the mma k-step (16)");
  static_assert(kBc % 16 == 0, "Bc must be a multiple of 16 (P's k-steps in P·V)");
  static_assert((kLds * 2) % 16 == 0, "smem rows must stay 16-byte aligned for cp.async/ldmatrix");
  static_assert((kBr * kD / 8) % kThreads == 0, "Q tile must split evenly into 16-byte chunks");
  static_assert((kBc * kD / 8) % kThreads == 0, "K/V tile must split evenly into 16-byte chunks");
  static_assert(kSmemBytes <= 227 * 1024, "exceeds Hopper's per-block shared memory");
  static_assert(kMinBlocks * kSmemBytes <= 228 * 1024, "min_blocks blocks must fit an SM's shared memory");
  static_assert(kAccRegs + 40 <= 65536 / (kMinBlocks * kThreads) && kAccRegs + 40 <= 255,
                "accumulators plus ~40 working registers must fit the per-thread budget");
};

// Backward kernels, on a shape (mma_shapes.h, MmaDkdvShape or MmaDqShape): a block owns
// Own = 16·row_blocks·warps rows of two tensors (dK/dV kernel: K_j, V_j; dQ kernel: Q_i, dO_i),
// warp w the row_blocks 16-row blocks starting at 16·row_blocks·w, and streams tiles of
// stream_tile rows of two other tensors (dK/dV: Q_i, dO_i plus their lse and delta; dQ: K_j, V_j)
// double-buffered through smem. As in the forward, each streamed fragment loaded with ldmatrix
// feeds one mma per row block.
template <class Shape>
struct BwdTraits {
  using shape = Shape;
  static constexpr int kD = Shape::head_dim;
  static constexpr int kWarps = Shape::warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowBlocks = Shape::row_blocks;         // 16-row blocks per warp
  static constexpr int kWarpRows = kRowsPerWarp * kRowBlocks;  // owned rows per warp
  static constexpr int kOwn = kWarpRows * kWarps;              // rows kept on chip per block
  static constexpr int kStream = Shape::stream_tile;           // rows per streamed tile
  static constexpr int kLds = padded_stride<kD>();
  static constexpr int kTileOwn = kOwn * kLds;        // elements, one tensor
  static constexpr int kTileStream = kStream * kLds;  // elements, one tensor, one stage
  // Two owned tiles, two streamed tensors × stages, and (dK/dV kernel) lse and delta per
  // streamed row per stage in fp32.
  static constexpr size_t kSmemBf16Bytes = size_t(2 * kTileOwn + 2 * kStages * kTileStream) * 2;
  static constexpr size_t kSmemBytes = kSmemBf16Bytes + size_t(2 * kStages * kStream) * 4;
  // 32-bit registers per thread of the long-lived fp32 tiles over a warp's 32 lanes: the
  // accumulators (dK and dV: 2 × rows × D; dQ: rows × D) plus S and dP (2 × rows × Stream).
  static constexpr int kDkdvAccRegs = kWarpRows * (2 * kD + 2 * kStream) / 32;
  static constexpr int kDqAccRegs = kWarpRows * (kD + 2 * kStream) / 32;
  // dK/dV kernel forming dQ too (FlashDq::kAtomic): dSᵀ of the current tile pair goes
  // through smem (own rows × streamed rows, bf16, row stride Stream + 8: 16-byte aligned rows,
  // conflict-free ldmatrix) so that the whole block can compute dQ_i = dS K_j, warp w the
  // columns [w·kDqCols, (w + 1)·kDqCols) of all Stream query rows.
  static constexpr int kLdsDs = kStream + 8;
  static constexpr size_t kSmemDsBytes = size_t(kOwn) * kLdsDs * 2;
  static constexpr size_t kSmemDkdvBytes = kSmemBytes + kSmemDsBytes;
  static constexpr int kDqCols = kD / kWarps;

  static_assert(kRowBlocks == 1 || kRowBlocks == 2, "a warp owns one or two 16-row blocks");
  static_assert(kD % 16 == 0, "D must be a multiple of the mma k-step (16)");
  static_assert(kStream % 16 == 0, "streamed rows are a k-dimension of dV/dK/dQ mmas: multiple of 16");
  static_assert((kLds * 2) % 16 == 0, "smem rows must stay 16-byte aligned for cp.async/ldmatrix");
  static_assert((kOwn * kD / 8) % kThreads == 0, "owned tile must split evenly into 16-byte chunks");
  static_assert((kStream * kD / 8) % kThreads == 0, "streamed tile must split evenly into 16-byte chunks");
  static_assert(kSmemBf16Bytes % 16 == 0, "fp32 lse/delta region must start aligned");
  static_assert(kSmemBytes <= 227 * 1024, "exceeds Hopper's per-block shared memory");
  static_assert(kSmemDkdvBytes <= 227 * 1024, "dK/dV with the dS tile exceeds Hopper's per-block shared memory");
  static_assert((kLdsDs * 2) % 16 == 0, "dS rows must stay 16-byte aligned for ldmatrix");
};

// The traits per head dim: the shapes the tables of mma_shapes.h select (docs/kernels.md §4.1).
template <int D> using FwdConfig = FwdTraits<mma_fwd_shape<D>>;
template <int D> using DkdvConfig = BwdTraits<mma_dkdv_shape<D>>;  // own = keys, stream = queries
template <int D> using DqConfig = BwdTraits<mma_dq_shape<D>>;      // own = queries, stream = keys

}  // namespace tg::cuda::flash
