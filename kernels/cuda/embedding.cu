// CUDA embedding kernels and their launchers: the twins of kernels/cpu/embedding.h.
#include "kernels/cuda/embedding.h"

#include <algorithm>

#include <cub/device/device_radix_sort.cuh>

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

// The backward added into an fp32 table, touching only the rows of ids that occur. The ids come
// sorted (stably, with their token positions): block i starts at sorted position i if a run of
// equal ids starts there, and sums the run's dout rows. Its warps take the run's tokens in turn
// (warp w the w-th, w+8-th, …), so a frequent id's thousands of tokens are summed by eight
// warps, not one; the warps' partial sums are added in warp order, so the result is the same
// on every run. Lane l holds channels [c0 + l·V, c0 + l·V + V) of a 32·V-channel chunk.
constexpr int kAccWarps = 8;

__global__ void iota_kernel(int32_t* __restrict__ out, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = int32_t(i);
}

template <int V, typename T>
__global__ void __launch_bounds__(kAccWarps * 32)
    embedding_backward_accumulate_kernel(const T* __restrict__ dout, const int32_t* __restrict__ sorted_ids,
                                         const int32_t* __restrict__ sorted_tokens, float* __restrict__ dweight,
                                         int64_t N, int64_t V_rows, int64_t C) {
  __shared__ float partial[kAccWarps][32 * V];
  const int64_t start = blockIdx.x;
  const int32_t id = sorted_ids[start];
  if ((start > 0 && sorted_ids[start - 1] == id) || id < 0 || id >= V_rows) return;  // not a run's start
  const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
  for (int64_t c0 = 0; c0 < C; c0 += 32 * V) {
    const int64_t c = c0 + int64_t(lane) * V;
    float acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0.0f;
    if (c < C)
      for (int64_t pos = start + warp; pos < N && sorted_ids[pos] == id; pos += kAccWarps) {
        float f[V];
        load_vec<V>(dout + int64_t(sorted_tokens[pos]) * C + c, f);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[k] += f[k];
      }
#pragma unroll
    for (int k = 0; k < V; ++k) partial[warp][lane * V + k] = acc[k];
    __syncthreads();
    for (int j = int(threadIdx.x); j < 32 * V && c0 + j < C; j += kAccWarps * 32) {
      float sum = partial[0][j];
#pragma unroll
      for (int w = 1; w < kAccWarps; ++w) sum += partial[w][j];
      dweight[int64_t(id) * C + c0 + j] += sum;
    }
    __syncthreads();  // partial is rewritten by the next chunk
  }
}

// The scratch of embedding_backward_accumulate: the sorted ids, the token positions before and
// after sorting, then CUB's own temporary storage.
size_t sort_temp_bytes(int64_t N) {
  size_t bytes = 0;
  TG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                static_cast<int32_t*>(nullptr), N));
  return bytes;
}
size_t accumulate_scratch_bytes(int64_t N, size_t sort_bytes) {
  return 3 * size_t(N) * sizeof(int32_t) + 256 + sort_bytes;  // 256: aligning CUB's part
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

size_t embedding_backward_accumulate_scratch_bytes(int64_t N) {
  require(N >= 0 && N <= INT32_MAX, "embedding_backward_accumulate", "token count outside [0, 2^31)");
  return accumulate_scratch_bytes(N, sort_temp_bytes(N));
}

template <typename T>
void embedding_backward_accumulate(const T* dout, const int32_t* ids, float* dweight, int64_t N, int64_t V, int64_t C,
                                   void* scratch, size_t scratch_bytes, cudaStream_t stream) {
  require(N >= 0 && N <= INT32_MAX && V >= 0 && C >= 0, "embedding_backward_accumulate",
          "negative size, or more than 2^31 tokens");
  size_t temp_bytes = sort_temp_bytes(N);
  require(scratch_bytes >= accumulate_scratch_bytes(N, temp_bytes), "embedding_backward_accumulate",
          "scratch smaller than embedding_backward_accumulate_scratch_bytes(N)");
  if (N == 0 || V == 0 || C == 0) return;
  int32_t* sorted_ids = static_cast<int32_t*>(scratch);
  int32_t* tokens = sorted_ids + N;
  int32_t* sorted_tokens = tokens + N;
  // CUB's storage after the three arrays, 256-byte aligned.
  const uintptr_t temp_at = (reinterpret_cast<uintptr_t>(sorted_tokens + N) + 255) & ~uintptr_t(255);
  iota_kernel<<<grid_for(N, 256), 256, 0, stream>>>(tokens, N);
  TG_CUDA_CHECK(cudaGetLastError());
  // All 32 bits of the key: an id outside [0, V) sorts into a run of its own, which is skipped.
  TG_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(reinterpret_cast<void*>(temp_at), temp_bytes, ids, sorted_ids, tokens,
                                                sorted_tokens, N, 0, 32, stream));
  constexpr int kV = kVec<T>;
  const bool packed = C % kV == 0 && aligned16(dout);
  auto kernel = packed ? embedding_backward_accumulate_kernel<kV, T> : embedding_backward_accumulate_kernel<1, T>;
  kernel<<<unsigned(N), kAccWarps * 32, 0, stream>>>(dout, sorted_ids, sorted_tokens, dweight, N, V, C);
  TG_CUDA_CHECK(cudaGetLastError());
}

#define TG_INSTANTIATE(T)                                                                            \
  template void embedding_forward<T>(const T*, const int32_t*, T*, int64_t, int64_t, cudaStream_t); \
  template void embedding_backward<T>(const T*, const int32_t*, const T*, T*, int64_t, int64_t, int64_t, \
                                      cudaStream_t);                                                   \
  template void embedding_backward_accumulate<T>(const T*, const int32_t*, float*, int64_t, int64_t, int64_t, \
                                                 void*, size_t, cudaStream_t);
TG_INSTANTIATE(float)
TG_INSTANTIATE(tg::bf16)
#undef TG_INSTANTIATE

}  // namespace tg::cuda
