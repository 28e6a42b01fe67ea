// Hopper (sm_90a) warpgroup products of the attention kernels, over 128-byte-swizzled tiles of
// 64-column panels (the instructions, swizzle and descriptors: sm90_ptx.cuh), and the moves of
// tiles between shared memory and A fragments in registers.
#pragma once

#include <cstdint>

#include "kernels/cuda/flash_attention/sm90_ptx.cuh"
#include "kernels/cuda/flash_attention/tile.cuh"  // load_rows_async

namespace tg::cuda::flash::sm90 {

// ── The products of the flash kernels, over 128-byte-swizzled tiles of 64-column panels ──
// acc (64 × N per warpgroup, N = 64, 96, 128 or 176) = A Bᵀ over the D columns of two K-major swizzled
// tiles: A the warpgroup's 64 rows (panels panel_a bytes apart), B the other tile's N rows
// (panels panel_b apart). k-steps of 16 along D are 32 bytes along a panel's rows. The k-steps'
// descriptors are one opaque base each plus immediate offsets (the address field counts 16-byte
// units from bit 0): hoisted as 16 loop-invariant 64-bit values, they made the d 128 dK/dV
// consumers spill 116 bytes inside their loop; computed per call, 0 (the same below).
template <int D, int N = 64>
__device__ __forceinline__ void wgmma_abt_ss(float (&acc)[N / 8][4], const unsigned char* a, int panel_a,
                                             const unsigned char* b, int panel_b) {
  static_assert(N == 64 || N == 96 || N == 128 || N == 176, "the wgmma shapes wrapped above");
  const uint64_t da0 = opaque_u64(k_major_descriptor(a));
  const uint64_t db0 = opaque_u64(k_major_descriptor(b));
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int at = 32 * (ks % 4);
    const uint64_t da = da0 + uint64_t(((ks / 4) * panel_a + at) >> 4);
    const uint64_t db = db0 + uint64_t(((ks / 4) * panel_b + at) >> 4);
    if constexpr (N == 176)
      wgmma_m64n176k16_ss<0>(flat(acc), da, db, ks > 0);
    else if constexpr (N == 96)
      wgmma_m64n96k16_ss<0>(flat(acc), da, db, ks > 0);
    else if constexpr (N == 128)
      wgmma_m64n128k16_ss<0>(flat(acc), da, db, ks > 0);
    else
      wgmma_m64n64k16_ss<0>(flat(acc), da, db, ks > 0);
  }
}

// The same with A from registers: the warpgroup's 64 rows as D/16 k-steps of A fragments
// (load_a_frags_swizzled, below), B read from shared memory as above.
template <int D, int N>
__device__ __forceinline__ void wgmma_abt_rs(float (&acc)[N / 8][4], const uint32_t (&a)[D / 16][4],
                                             const unsigned char* b, int panel_b) {
  static_assert(N == 64 || N == 96 || N == 128, "the wgmma shapes wrapped above");
  const uint64_t db0 = opaque_u64(k_major_descriptor(b));
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const uint64_t db = db0 + uint64_t(((ks / 4) * panel_b + 32 * (ks % 4)) >> 4);
    if constexpr (N == 128)
      wgmma_m64n128k16_rs<0>(flat(acc), a[ks], db, ks > 0);
    else if constexpr (N == 96)
      wgmma_m64n96k16_rs<0>(flat(acc), a[ks], db, ks > 0);
    else
      wgmma_m64n64k16_rs<0>(flat(acc), a[ks], db, ks > 0);
  }
}

// acc (64 × D per warpgroup, D = 64, 96 or 128) += A B: A (64 × K, K = 64, 96, 128 or 176) from
// registers as K/16 k-steps of A fragments, B the (K, D) streamed or owned tile at b read MN-major
// (rows are K; 64-column panels panel_b bytes apart): a k-step of 16 rows starts 16·128 bytes
// further.
template <int D, int K = 64>
__device__ __forceinline__ void wgmma_ab_rs(float (&acc)[D / 8][4], const uint32_t (&a)[K / 16][4], const unsigned char* b,
                                            int panel_b) {
  static_assert(D == 64 || D == 96 || D == 128, "the wgmma shapes wrapped above");
  const uint64_t desc0 = opaque_u64(mn_major_descriptor(b, panel_b));
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const uint64_t desc = desc0 + uint64_t(kk * 16 * kSwizzleRowBytes / 16);
    if constexpr (D == 64)
      wgmma_m64n64k16_rs<1>(flat(acc), a[kk], desc, true);
    else if constexpr (D == 96)
      wgmma_m64n96k16_rs<1>(flat(acc), a[kk], desc, true);
    else
      wgmma_m64n128k16_rs<1>(flat(acc), a[kk], desc, true);
  }
}

// dst ← rows [t0, t0 + ROWS) of one head (row t at src + t·ld, D contiguous bf16) as D/64
// swizzled panels of ROWS × 64 (panel p at dst + p·ROWS·128 bytes); rows ≥ T zero-filled. The
// same tile serves as a K-major operand (rows are M or N) and as an MN-major one (rows are K).
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_swizzled(unsigned char* dst, const tg::bf16* src, int ld, int t0, int T,
                                                   int tid) {
  load_rows_async<ROWS, D, THREADS>(
      [=](int r, int col) { return dst + (col / 64) * ROWS * kSwizzleRowBytes + swizzled_offset(r, col % 64); },
      src, ld, t0, T, tid);
}

// The warp's 16 × 64 tile held as A fragments (bf16, 4 k-steps; tile.cuh's store_a_frags layout)
// → rows [row0, row0 + 16) (row0 a multiple of 8) of a 64-column swizzled tile at dst. Each lane
// stores bf16x2 words; the 8 rows of one store hit 8 distinct 16-byte chunks (the swizzle), so no
// bank conflicts. Both of a lane's rows are lane/4 mod 8, so one XOR term serves all 16 stores
// (opaque: recomputed per call, not hoisted as 16 offsets).
__device__ __forceinline__ void store_a_frags_swizzled(unsigned char* dst, const uint32_t (&a)[4][4], int row0,
                                                       int lane) {
  unsigned char* base = dst + (row0 + (lane >> 2)) * kSwizzleRowBytes + 4 * (lane & 3);
  const uint32_t chunk_xor = opaque_u32(16 * (lane >> 2));
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e)  // a[kk][e]: row + 8·(e % 2), 16-byte chunk 2kk + e / 2
      *reinterpret_cast<uint32_t*>(base + 8 * kSwizzleRowBytes * (e & 1) + ((32 * kk + 16 * (e >> 1)) ^ chunk_xor)) =
          a[kk][e];
}

// The inverse, for a tile that stays in registers as a wgmma A operand: rows [row0, row0 + 16)
// of a D-column swizzled tile at src (64-column panels panel_bytes apart) → the warp's A
// fragments for D/16 k-steps. The same addresses as the stores, so no bank conflicts either.
template <int D>
__device__ __forceinline__ void load_a_frags_swizzled(uint32_t (&a)[D / 16][4], const unsigned char* src,
                                                      int panel_bytes, int row0, int lane) {
  const unsigned char* base = src + (row0 + (lane >> 2)) * kSwizzleRowBytes + 4 * (lane & 3);
  const uint32_t chunk_xor = opaque_u32(16 * (lane >> 2));
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      a[ks][e] = *reinterpret_cast<const uint32_t*>(base + (ks / 4) * panel_bytes + 8 * kSwizzleRowBytes * (e & 1) +
                                                    ((32 * (ks % 4) + 16 * (e >> 1)) ^ chunk_xor));
}

}  // namespace tg::cuda::flash::sm90
