// The launch shapes of the FlashAttention kernels. launch_tile_kernel: grid (head, batch, tile of
// TileRows rows — the rows a block owns: Tr::kOwn for the backward's, Tr::kBr for the
// warp-specialised ones). Blocks start in launch order, x fastest, so with the tile index slowest
// every head's heaviest causal tile starts before any lighter one (see flash_fwd_kernel).
// launch_item_kernel: a persistent 1-D grid over n_items work items, heaviest first too when
// causal, in groups of heads (the kernels decode them: sm90::item_tile): one block per SM (fewer
// if there are fewer items), each taking its first item by its index and claiming the next ones
// from item_counter (below); after the previous kernel in the stream or overlapping its tail
// (Overlap).
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

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

inline int sm_count() {  // of the current device
  int dev = 0, n = 0;
  TG_CUDA_CHECK(cudaGetDevice(&dev));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

// How a persistent grid starts. kNone: after the previous kernel in the stream has completed.
// kPrevious: overlapping it (programmatic dependent launch, sm90_ptx.cuh: launch_dependents,
// wait_previous_grid) — its blocks start on the SMs the previous kernel's blocks leave, instead of
// after its last block; the kernel must read nothing the previous kernel writes before
// wait_previous_grid, and call that before it exits, so that its completion implies the previous
// kernel's (the stream's later work relies on both).
enum class Overlap { kNone, kPrevious };
template <class Tr, typename... Params, typename... Args>
void launch_item_kernel(Overlap overlap, void (*kernel)(Params...), size_t smem_bytes, int n_items,
                        const FlashAttentionParams& p, cudaStream_t stream, Args... args) {
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes)));
  const unsigned blocks = unsigned(std::min(n_items, sm_count()));
  if (overlap == Overlap::kNone) {
    kernel<<<blocks, Tr::kThreads, smem_bytes, stream>>>(p, args...);
    TG_CUDA_CHECK(cudaGetLastError());
    return;
  }
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(blocks);
  config.blockDim = dim3(unsigned(Tr::kThreads));
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute programmatic{};
  programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  programmatic.val.programmaticStreamSerializationAllowed = 1;
  config.attrs = &programmatic;
  config.numAttrs = 1;
  TG_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p, args...));
}

// A dynamic scheduler's item counter (sm90_scheduler.cuh: claim_item, release_items): two words in
// global memory, zero between launches — the kernel's last block resets them —, one pair per
// device, stream and slot, so that kernels on different streams never share one, nor a kernel
// and the one it overlaps (Overlap::kPrevious: that takes slot 1). Allocated at first use, kept
// for the process.
inline unsigned* item_counter(cudaStream_t stream, int slot = 0) {
  static std::mutex mutex;
  static std::map<std::tuple<int, cudaStream_t, int>, unsigned*> counters;
  int dev = 0;
  TG_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mutex);
  unsigned*& c = counters[{dev, stream, slot}];
  if (!c) {
    TG_CUDA_CHECK(cudaMalloc(&c, 2 * sizeof(unsigned)));
    TG_CUDA_CHECK(cudaMemset(c, 0, 2 * sizeof(unsigned)));
  }
  return c;
}

}  // namespace tg::cuda::flash
