// A bit-exact gathered row copy shared by the layout and embedding kernels: output row r of
// `len` elements comes from src + map(r).src and goes to dst + map(r).dst.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"

namespace tg::cuda {

// Block (bx, by): bx threads share a row (coalesced 16-byte packs), by rows per block, rows
// grid-stride. Raw bytes are moved (no fp32 round trip), so NaN payloads survive. V = 1 is the
// scalar fallback; V > 1 needs every row offset and len to be multiples of V.
template <int V, typename T, typename Map>
__global__ void copy_rows_kernel(const T* __restrict__ src, T* __restrict__ dst, int64_t rows, int64_t len, Map map) {
  const int64_t packs = len / V;
  for (int64_t r = int64_t(blockIdx.x) * blockDim.y + threadIdx.y; r < rows; r += int64_t(gridDim.x) * blockDim.y) {
    int64_t so, dof;
    map(r, so, dof);
    for (int64_t p = threadIdx.x; p < packs; p += blockDim.x) {
      if constexpr (V == 1) {
        dst[dof + p] = src[so + p];
      } else {
        static_assert(V * sizeof(T) == 16, "packs are 16 bytes");
        *reinterpret_cast<uint4*>(dst + dof + p * V) = *reinterpret_cast<const uint4*>(src + so + p * V);
      }
    }
  }
}

// Launches copy_rows_kernel; `offsets_vec_ok` says the map's offsets and len are multiples of the
// 16-byte pack (the pointers' alignment is checked here).
template <typename T, typename Map>
void copy_rows(const T* src, T* dst, int64_t rows, int64_t len, bool offsets_vec_ok, Map map, cudaStream_t stream) {
  if (rows == 0 || len == 0) return;
  constexpr int V = kVec<T>;
  const bool vec = offsets_vec_ok && aligned16(src) && aligned16(dst);
  const int64_t packs = vec ? len / V : len;
  int bx = 1;
  while (bx < 32 && bx < packs) bx *= 2;  // a warp spans several short rows instead of idling
  const dim3 block(bx, 256 / bx);
  const unsigned grid = unsigned(std::min<int64_t>((rows + block.y - 1) / block.y, 132 * 64));
  if (vec) {
    copy_rows_kernel<V><<<grid, block, 0, stream>>>(src, dst, rows, len, map);
  } else {
    copy_rows_kernel<1><<<grid, block, 0, stream>>>(src, dst, rows, len, map);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tg::cuda
