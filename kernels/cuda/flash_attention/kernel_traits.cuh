// Tile sizes of the FlashAttention kernels per head dimension, every derived size static_assert'ed.
#pragma once
#include <cstddef>

namespace tg::cuda::flash {

// Shared-memory tiles are row-major bf16 with a row stride of D + 8 elements: the 16-byte pad
// moves consecutive rows 4 banks apart, so the 8 row addresses of one ldmatrix 8×8 matrix land
// in 8 distinct 16-byte bank groups (no conflicts) while rows stay 16-byte aligned for cp.async.
template <int D>
constexpr int padded_stride() { return D + 8; }

// Every warp owns 16 rows (one m16n8k16 row block) of the tile the block keeps on chip.
constexpr int kRowsPerWarp = 16;
constexpr int kStages = 2;  // streamed tiles are double-buffered: load tile j+1 while computing j

// Forward: a block owns Br = 16·warps query rows and streams K, V tiles of Bc keys through
// shared memory. Q is either loaded into registers once (QInRegs) or re-read from smem with
// ldmatrix at every k-step (saves D/4 registers per thread); MinBlocks is the __launch_bounds__
// occupancy the register allocation must allow.
template <int D_, int Warps, int Bc_, bool QInRegs, int MinBlocks>
struct FwdTraits {
  static constexpr int kD = D_;
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kBr = kRowsPerWarp * kWarps;  // query rows per block
  static constexpr int kBc = Bc_;                    // keys per streamed K/V tile
  static constexpr bool kQInRegs = QInRegs;
  static constexpr int kMinBlocks = MinBlocks;        // blocks per SM the registers must allow
  static constexpr int kLds = padded_stride<kD>();   // smem row stride, elements
  static constexpr int kTileQ = kBr * kLds;          // elements
  static constexpr int kTileKV = kBc * kLds;         // elements, one of K or V, one stage
  static constexpr size_t kSmemBytes = size_t(kTileQ + 2 * kStages * kTileKV) * 2;

  static_assert(kD % 16 == 0, "D must be a multiple of the mma k-step (16)");
  static_assert(kBc % 16 == 0, "Bc must be a multiple of 16 (P's k-steps in P·V)");
  static_assert((kLds * 2) % 16 == 0, "smem rows must stay 16-byte aligned for cp.async/ldmatrix");
  static_assert((kBr * kD / 8) % kThreads == 0, "Q tile must split evenly into 16-byte chunks");
  static_assert((kBc * kD / 8) % kThreads == 0, "K/V tile must split evenly into 16-byte chunks");
  static_assert(kSmemBytes <= 227 * 1024, "exceeds Hopper's per-block shared memory");
  static_assert(kMinBlocks * kSmemBytes <= 228 * 1024, "MinBlocks blocks must fit an SM's shared memory");
  static_assert(kMinBlocks * kThreads * 128 <= 65536 || kMinBlocks == 1, "register budget below 128/thread");
};

// Backward kernels share one shape: a block owns Own = 16·warps rows of two tensors (dK/dV
// kernel: K_j, V_j; dQ kernel: Q_i, dO_i) and streams tiles of Stream rows of two other tensors
// (dK/dV: Q_i, dO_i plus their lse and delta; dQ: K_j, V_j) double-buffered through smem.
template <int D_, int Warps, int Stream_>
struct BwdTraits {
  static constexpr int kD = D_;
  static constexpr int kWarps = Warps;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kOwn = kRowsPerWarp * kWarps;  // rows kept on chip per block
  static constexpr int kStream = Stream_;             // rows per streamed tile
  static constexpr int kLds = padded_stride<kD>();
  static constexpr int kTileOwn = kOwn * kLds;        // elements, one tensor
  static constexpr int kTileStream = kStream * kLds;  // elements, one tensor, one stage
  // Two owned tiles, two streamed tensors × stages, and (dK/dV kernel) lse and delta per
  // streamed row per stage in fp32.
  static constexpr size_t kSmemBf16Bytes = size_t(2 * kTileOwn + 2 * kStages * kTileStream) * 2;
  static constexpr size_t kSmemBytes = kSmemBf16Bytes + size_t(2 * kStages * kStream) * 4;

  static_assert(kD % 16 == 0, "D must be a multiple of the mma k-step (16)");
  static_assert(kStream % 16 == 0, "streamed rows are a k-dimension of dV/dK/dQ mmas: multiple of 16");
  static_assert((kLds * 2) % 16 == 0, "smem rows must stay 16-byte aligned for cp.async/ldmatrix");
  static_assert((kOwn * kD / 8) % kThreads == 0, "owned tile must split evenly into 16-byte chunks");
  static_assert((kStream * kD / 8) % kThreads == 0, "streamed tile must split evenly into 16-byte chunks");
  static_assert(kSmemBf16Bytes % 16 == 0, "fp32 lse/delta region must start aligned");
  static_assert(kSmemBytes <= 227 * 1024, "exceeds Hopper's per-block shared memory");
};

// The configurations, one per head dim; the reasons are given at the launch functions
// (flash_fwd.cu, flash_bwd.cu).
template <int D> struct FwdConfig;
template <> struct FwdConfig<64> { using type = FwdTraits<64, 8, 64, true, 2>; };
template <> struct FwdConfig<128> { using type = FwdTraits<128, 8, 32, false, 2>; };

template <int D> struct DkdvConfig;  // own = keys, stream = queries
template <> struct DkdvConfig<64> { using type = BwdTraits<64, 4, 64>; };
template <> struct DkdvConfig<128> { using type = BwdTraits<128, 4, 32>; };

template <int D> struct DqConfig;  // own = queries, stream = keys
template <> struct DqConfig<64> { using type = BwdTraits<64, 4, 64>; };
template <> struct DqConfig<128> { using type = BwdTraits<128, 4, 64>; };

}  // namespace tg::cuda::flash
