// CUDA embedding kernels and their launchers: the twins of kernels/cpu/embedding.h.
#include "kernels/cuda/embedding.h"

#include <algorithm>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/copy_rows.cuh"

namespace tg::cuda {

// ───────────────────────────── kernels ─────────────────────────────

namespace {

struct GatherMap {  // output row n ← weight row ids[n]
  const int32_t* ids;
  int64_t C;
  __device__ void operator()(int64_t r, int64_t& src, int64_t& dst) const {
    src = int64_t(ids[r]) * C;
    dst = r * C;
  }
};

// The backward without atomics. Block (bucket, chunk) owns dweight rows [v0, v0 + kBucketRows) ×
// channels [c0, c0 + blockDim.x): it scans all ids in token order, keeps the tokens whose id falls
// in its bucket (a block-wide compaction that preserves token order), and adds their dout rows
// into fp32 accumulators in shared memory. Thread t only ever touches channel column t, so the
// accumulation needs no synchronisation and its order per (row, channel) is exactly token order.
// Every row of the bucket is written once at the end (zeros included): no separate zeroing pass.
// A block spans up to 1024 channels (all of GPT-2's 768), so the ids are scanned once per bucket
// rather than once per bucket and 128-channel chunk: the scans dominate (each bucket of GPT-2's
// 50,304-row table holds ~10 of 16,384 tokens), and with 128-channel blocks the kernel took 222 µs
// of a GPT-2 step (docs/performance.md, "Where a step's time goes").
constexpr int kBucketRows = 32;
constexpr int kMaxChunkCols = 1024;  // threads per block at most
constexpr int kIdsPerThread = 4;
constexpr int kMaxWarps = kMaxChunkCols / 32;

// Dynamic shared memory of a block of `threads` channels: the accumulators, then the tile's matches.
size_t embedding_backward_smem(int threads) {
  const size_t tile = size_t(threads) * kIdsPerThread;
  return size_t(kBucketRows) * size_t(threads) * sizeof(float) + tile * sizeof(int) + tile;
}

template <typename T>
__global__ void __launch_bounds__(kMaxChunkCols)
    embedding_backward_kernel(const T* __restrict__ dout, const int32_t* __restrict__ ids,
                              const T* __restrict__ dweight_add, T* __restrict__ dweight, int64_t N, int64_t V,
                              int64_t C) {
  extern __shared__ float acc[];  // [kBucketRows][blockDim.x], column t private to thread t
  const int threads = int(blockDim.x), tile = threads * kIdsPerThread, warps = threads / 32;
  int* match_tok = reinterpret_cast<int*>(acc + kBucketRows * threads);  // [tile]
  uint8_t* match_row = reinterpret_cast<uint8_t*>(match_tok + tile);      // [tile]
  __shared__ int warp_total[kMaxWarps];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t v0 = int64_t(blockIdx.x) * kBucketRows;
  const int64_t c = int64_t(blockIdx.y) * threads + t;
  const bool active = c < C;
#pragma unroll
  for (int r = 0; r < kBucketRows; ++r) acc[r * threads + t] = 0.0f;

  for (int64_t base = 0; base < N; base += tile) {
    // 1. Which of this thread's 4 consecutive tokens hit the bucket.
    int rel[kIdsPerThread];
    int count = 0;
#pragma unroll
    for (int k = 0; k < kIdsPerThread; ++k) {
      const int64_t n = base + int64_t(t) * kIdsPerThread + k;
      rel[k] = -1;
      if (n < N) {
        const int64_t r = int64_t(ids[n]) - v0;
        if (r >= 0 && r < kBucketRows && r + v0 < V) rel[k] = int(r);
      }
      count += rel[k] >= 0;
    }
    // 2. Exclusive prefix of the counts in thread order = slot of this thread's first match.
    int incl = count;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      int y = __shfl_up_sync(0xffffffffu, incl, d);
      if (lane >= d) incl += y;
    }
    if (lane == 31) warp_total[warp] = incl;
    __syncthreads();
    int offset = incl - count, total = 0;
    for (int w = 0; w < warps; ++w) {
      offset += w < warp ? warp_total[w] : 0;
      total += warp_total[w];
    }
#pragma unroll
    for (int k = 0; k < kIdsPerThread; ++k)
      if (rel[k] >= 0) {
        match_tok[offset] = t * kIdsPerThread + k;  // offset within the tile
        match_row[offset] = uint8_t(rel[k]);
        ++offset;
      }
    __syncthreads();
    // 3. Accumulate the matched tokens in order; four loads in flight before the dependent adds.
    if (active) {
      const T* dcol = dout + base * C + c;  // match_tok holds the token's offset within the tile
      int k = 0;
      for (; k + 4 <= total; k += 4) {
        float d0 = to_float(dcol[int64_t(match_tok[k]) * C]);
        float d1 = to_float(dcol[int64_t(match_tok[k + 1]) * C]);
        float d2 = to_float(dcol[int64_t(match_tok[k + 2]) * C]);
        float d3 = to_float(dcol[int64_t(match_tok[k + 3]) * C]);
        acc[match_row[k] * threads + t] += d0;
        acc[match_row[k + 1] * threads + t] += d1;
        acc[match_row[k + 2] * threads + t] += d2;
        acc[match_row[k + 3] * threads + t] += d3;
      }
      for (; k < total; ++k) acc[match_row[k] * threads + t] += to_float(dcol[int64_t(match_tok[k]) * C]);
    }
    __syncthreads();  // match_* and warp_total are rewritten by the next tile
  }
  if (!active) return;
#pragma unroll 4
  for (int r = 0; r < kBucketRows; ++r) {
    if (v0 + r >= V) break;
    float v = acc[r * threads + t];
    if (dweight_add) v += to_float(dweight_add[(v0 + r) * C + c]);
    dweight[(v0 + r) * C + c] = from_float<T>(v);
  }
}

}  // namespace

// ───────────────────────────── launchers ─────────────────────────────

template <typename T>
void embedding_forward(const T* weight, const int32_t* ids, T* out, int64_t N, int64_t C, cudaStream_t stream) {
  require(N >= 0 && C >= 0, "embedding_forward", "negative size");
  copy_rows(weight, out, N, C, C % kVec<T> == 0, GatherMap{ids, C}, stream);
}

template <typename T>
void embedding_backward(const T* dout, const int32_t* ids, const T* dweight_add, T* dweight, int64_t N, int64_t V,
                        int64_t C, cudaStream_t stream) {
  require(N >= 0 && V >= 0 && C >= 0, "embedding_backward", "negative size");
  require(N <= INT32_MAX - kMaxChunkCols * kIdsPerThread, "embedding_backward", "more than 2^31 tokens");
  if (V == 0 || C == 0) return;
  const int64_t buckets = (V + kBucketRows - 1) / kBucketRows;
  // One block across all channels up to 1024 (whole warps); wider rows in chunks of 1024.
  const int threads = int(std::min<int64_t>(kMaxChunkCols, (C + 31) / 32 * 32));
  const int64_t chunks = (C + threads - 1) / threads;
  require(buckets <= INT32_MAX && chunks <= 65535, "embedding_backward", "V or C too large for the grid");
  const size_t smem = embedding_backward_smem(threads);
  auto kernel = embedding_backward_kernel<T>;
  if (smem > 48 * 1024) TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<dim3(unsigned(buckets), unsigned(chunks)), unsigned(threads), smem, stream>>>(dout, ids, dweight_add, dweight, N, V, C);
  TG_CUDA_CHECK(cudaGetLastError());
}

#define TG_INSTANTIATE(T)                                                                            \
  template void embedding_forward<T>(const T*, const int32_t*, T*, int64_t, int64_t, cudaStream_t); \
  template void embedding_backward<T>(const T*, const int32_t*, const T*, T*, int64_t, int64_t, int64_t, \
                                      cudaStream_t);
TG_INSTANTIATE(float)
TG_INSTANTIATE(tg::bf16)
#undef TG_INSTANTIATE

}  // namespace tg::cuda
