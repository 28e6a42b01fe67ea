// The epilogues of the sm_90a attention kernels (docs/kernels.md §5.2): a consumer's fp32
// accumulator, scaled per row and rounded to bf16, staged as swizzled tiles in shared memory and
// stored by the tensor copy engine (or, in tile.cuh's store_rows, from registers).
#pragma once

#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/flash_attention/sm90_ptx.cuh"
#include "kernels/cuda/flash_attention/tile.cuh"

namespace tg::cuda::flash::sm90 {


// The warp's (16, Dh) fp32 accumulator (m64nDh rows [row0, row0 + 16) of its warpgroup), its
// rows g and g + 8 scaled by f[0] and f[1] (store_rows's factors) and rounded to bf16 → those
// rows of a swizzled tile at dst (64-column panels panel_bytes apart), the layout tma_store_4d
// reads. Each store is a lane's bf16x2 of one row; a store's 8
// rows hit 8 distinct 16-byte chunks (the swizzle), so no bank conflicts; both of a lane's rows
// are lane/4 mod 8 (row0 a multiple of 8), so one XOR term serves every store.
template <int Dh>
__device__ __forceinline__ void store_acc_swizzled(unsigned char* dst, int panel_bytes, const float (&acc)[Dh / 8][4],
                                                   const float (&f)[2], int row0, int lane) {
  unsigned char* base = dst + (row0 + (lane >> 2)) * kSwizzleRowBytes + 4 * (lane & 3);
  const uint32_t chunk_xor = opaque_u32(16 * (lane >> 2));
#pragma unroll
  for (int nt = 0; nt < Dh / 8; ++nt) {
    unsigned char* at = base + (nt / 8) * panel_bytes + ((16 * (nt % 8)) ^ chunk_xor);
    *reinterpret_cast<uint32_t*>(at) = pack_bf16x2(acc[nt][0] * f[0], acc[nt][1] * f[0]);
    *reinterpret_cast<uint32_t*>(at + 8 * kSwizzleRowBytes) = pack_bf16x2(acc[nt][2] * f[1], acc[nt][3] * f[1]);
  }
}

// A consumer warpgroup's output rows through the copy engine (the epilogues' kStoreByTma): its
// staging tiles are rewritten only once the copy engine has read the last item's (their issuer,
// the warpgroup's first thread, waits; the warpgroup's named barrier `barrier_id` holds the
// others), written by `stage` (each thread its accumulator fragments: store_acc_swizzled), made
// visible to the async proxy, and stored by the issuer (`store`: tma_store_tile per tile) as one
// bulk group, not waited for here; none when the rows all lie past T (`any_row` false). The block
// waits for its last groups before it exits (bulk_wait<0>): its shared memory is their source.
constexpr int kStagingBarrier = 8;  // + the consumer index: named barrier ids above the turns' (1 … 3)
template <class Stage, class Store>
__device__ __forceinline__ void store_staged_by_tma(int barrier_id, bool issuer, bool any_row, Stage&& stage,
                                                    Store&& store) {
  if (issuer) bulk_wait_read<0>();
  named_barrier_sync(barrier_id, 128);
  stage();
  fence_async_shared();  // st.shared, read by the copy engine
  named_barrier_sync(barrier_id, 128);
  if (issuer && any_row) {
    store();
    bulk_commit();
  }
}
// A staged tile at src (64 rows, Panels 64-column panels, as store_acc_swizzled writes it) → rows
// [row0, row0 + 64) of head h, batch b of `map` (64-row boxes), one tensor store per panel.
template <int Panels>
__device__ __forceinline__ void tma_store_tile(const CUtensorMap* map, int h, int row0, int b, const unsigned char* src) {
#pragma unroll
  for (int panel = 0; panel < Panels; ++panel) tma_store_4d(map, 64 * panel, h, row0, b, src + panel * 64 * kSwizzleRowBytes);
}
// One output tile the common way (the forward's O, the dQ kernel's dQ): consumer `consumer`'s
// (64, Dh) accumulator, rows scaled by f as store_acc_swizzled's, staged at st and stored to rows
// [row0, row0 + 64) of head h, batch b of `map`. (The dK/dV kernel stages two tiles per bulk
// group and calls store_staged_by_tma itself.)
template <int Dh, int Panels>
__device__ __forceinline__ void store_tile_by_tma(int consumer, bool issuer, unsigned char* st, const float (&acc)[Dh / 8][4],
                                                  const float (&f)[2], const CUtensorMap* map, int h, int row0, int b,
                                                  int T, int warp, int lane) {
  store_staged_by_tma(
      kStagingBarrier + consumer, issuer, row0 < T,
      [&] { store_acc_swizzled<Dh>(st, 64 * kSwizzleRowBytes, acc, f, 16 * warp, lane); },
      [&] { tma_store_tile<Panels>(map, h, row0, b, st); });
}

}  // namespace tg::cuda::flash::sm90

namespace tg::cuda::flash {

// The forward's epilogue of one consumer's 64 rows of an item (head h, batch b, query tile q0;
// Tr: FwdSm90aTraits): O = acc / l, staged in shared memory and stored by the copy engine through
// o_map (kStoreByTma) or stored from registers, and lse = m·scale + ln l (m is a raw score),
// natural-log units as the CPU defines it. l is summed over the quad first. issuer: the
// warpgroup's first thread (store_staged_by_tma's); row0: this warp's first query row.
template <class Tr, class Map>
__device__ __forceinline__ void fwd_epilogue(const FlashAttentionParams& p, const Map& o_map, unsigned char* sStage, int T,
                                             int H, int h, int b, int q0, int c, bool issuer, int warp, int lane,
                                             int row0, const float (&o)[Tr::kHeadDim / 8][4], const float (&m)[2],
                                             float (&l)[2]) {
  constexpr int Dh = Tr::kHeadDim;
  tg::bf16* O = p.o + int64_t(b) * T * p.o_row_stride + h * p.D;
  float* L = p.lse + (int64_t(b) * H + h) * T;
  float inv_l[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = quad_sum(l[i]);
    inv_l[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
  }
  if constexpr (Tr::kStoreByTma) {
    sm90::store_tile_by_tma<Dh, Tr::kPanels>(c, issuer, sStage + c * Tr::kTileStage, o, inv_l, &o_map, h, q0 + 64 * c, b,
                                             T, warp, lane);
  } else {
    store_rows<Dh>(O, int(p.o_row_stride), o, inv_l, row0, T, lane);
  }
  if ((lane & 3) == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = row0 + (lane >> 2) + 8 * i;
      if (row < T) L[row] = m[i] * p.scale + logf(l[i]);
    }
  }
}

}  // namespace tg::cuda::flash
