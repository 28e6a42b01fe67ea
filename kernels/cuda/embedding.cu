// CUDA embedding kernels and their launchers: the twins of kernels/cpu/embedding.h.
#include "kernels/cuda/embedding.h"

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
// channels [c0, c0 + kChunkCols): it scans all ids in token order, keeps the tokens whose id falls
// in its bucket (a block-wide compaction that preserves token order), and adds their dout rows
// into fp32 accumulators in shared memory. Thread t only ever touches channel column t, so the
// accumulation needs no synchronisation and its order per (row, channel) is exactly token order.
// Every row of the bucket is written once at the end (zeros included): no separate zeroing pass.
constexpr int kBucketRows = 64;
constexpr int kChunkCols = 128;  // = threads per block
constexpr int kIdsPerThread = 4;
constexpr int kTile = kChunkCols * kIdsPerThread;  // ids scanned per step
constexpr int kWarps = kChunkCols / 32;

template <typename T>
__global__ void __launch_bounds__(kChunkCols)
    embedding_backward_kernel(const T* __restrict__ dout, const int32_t* __restrict__ ids, T* __restrict__ dweight,
                              int64_t N, int64_t V, int64_t C) {
  __shared__ float acc[kBucketRows][kChunkCols];  // 32 KB, column t private to thread t
  __shared__ int match_tok[kTile];
  __shared__ uint8_t match_row[kTile];
  __shared__ int warp_total[kWarps];
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t v0 = int64_t(blockIdx.x) * kBucketRows;
  const int64_t c = int64_t(blockIdx.y) * kChunkCols + t;
  const bool active = c < C;
#pragma unroll
  for (int r = 0; r < kBucketRows; ++r) acc[r][t] = 0.0f;

  for (int64_t base = 0; base < N; base += kTile) {
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
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
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
        acc[match_row[k]][t] += d0;
        acc[match_row[k + 1]][t] += d1;
        acc[match_row[k + 2]][t] += d2;
        acc[match_row[k + 3]][t] += d3;
      }
      for (; k < total; ++k) acc[match_row[k]][t] += to_float(dcol[int64_t(match_tok[k]) * C]);
    }
    __syncthreads();  // match_* and warp_total are rewritten by the next tile
  }
  if (!active) return;
#pragma unroll 4
  for (int r = 0; r < kBucketRows; ++r)
    if (v0 + r < V) dweight[(v0 + r) * C + c] = from_float<T>(acc[r][t]);
}

}  // namespace

// ───────────────────────────── launchers ─────────────────────────────

template <typename T>
void embedding_forward(const T* weight, const int32_t* ids, T* out, int64_t N, int64_t C, cudaStream_t stream) {
  require(N >= 0 && C >= 0, "embedding_forward", "negative size");
  copy_rows(weight, out, N, C, C % kVec<T> == 0, GatherMap{ids, C}, stream);
}

template <typename T>
void embedding_backward(const T* dout, const int32_t* ids, T* dweight, int64_t N, int64_t V, int64_t C,
                        cudaStream_t stream) {
  require(N >= 0 && V >= 0 && C >= 0, "embedding_backward", "negative size");
  require(N <= INT32_MAX - kTile, "embedding_backward", "more than 2^31 tokens");
  if (V == 0 || C == 0) return;
  const int64_t buckets = (V + kBucketRows - 1) / kBucketRows;
  const int64_t chunks = (C + kChunkCols - 1) / kChunkCols;
  require(buckets <= INT32_MAX && chunks <= 65535, "embedding_backward", "V or C too large for the grid");
  embedding_backward_kernel<<<dim3(unsigned(buckets), unsigned(chunks)), kChunkCols, 0, stream>>>(dout, ids, dweight,
                                                                                                   N, V, C);
  TG_CUDA_CHECK(cudaGetLastError());
}

#define TG_INSTANTIATE(T)                                                                            \
  template void embedding_forward<T>(const T*, const int32_t*, T*, int64_t, int64_t, cudaStream_t); \
  template void embedding_backward<T>(const T*, const int32_t*, T*, int64_t, int64_t, int64_t, cudaStream_t);
TG_INSTANTIATE(float)
TG_INSTANTIATE(tg::bf16)
#undef TG_INSTANTIATE

}  // namespace tg::cuda
