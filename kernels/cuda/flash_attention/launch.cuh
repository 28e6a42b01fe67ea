// The one launch shape of the FlashAttention kernels: grid (head, batch, tile of TileRows rows —
// the rows a block owns: Tr::kOwn for the backward's, Tr::kBr for the warp-specialised ones).
// Blocks start in launch order, x fastest, so with the tile index slowest every head's heaviest
// causal tile starts before any lighter one (see flash_fwd_kernel).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/flash_attention/flash.h"

namespace tg::cuda::flash {

template <class Tr, int TileRows = Tr::kOwn, typename Kernel, typename... Args>
void launch_tile_kernel(Kernel kernel, size_t smem_bytes, const FlashAttentionParams& p, cudaStream_t stream,
                        Args... args) {
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
  const dim3 grid(unsigned(p.H), unsigned(p.B), unsigned((p.T + TileRows - 1) / TileRows));
  kernel<<<grid, Tr::kThreads, smem_bytes, stream>>>(p, args...);
  TG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tg::cuda::flash
