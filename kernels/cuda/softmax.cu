// CUDA softmax and softmax–cross-entropy kernels and their launchers: the twins of
// kernels/cpu/softmax.h, with fp32 reductions in a fixed (bitwise reproducible) order.
#include "kernels/cuda/softmax.h"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/bulk_copy.cuh"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"

namespace tg::cuda {

// ───────────────────────────── kernels ─────────────────────────────

namespace {

// ── row reductions ──
// A row is reduced by TPR threads: a warp (TPR = 32, several rows per block) or the whole block
// (TPR > 32, one row per block). Lanes combine by butterfly, warps fold in warp order through
// shared memory: the order depends only on the launch shape, so results are reproducible.

// Running (max, Σ exp(x − max)) of a set of logits; the empty set is (−inf, 0).
struct MaxSum {
  float m, s;
};
// __fmul_rn keeps the compiler from fusing one product into an FMA, so combine(a, b) and
// combine(b, a) round identically and all lanes of a butterfly agree bitwise.
__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float M = fmaxf(a.m, b.m);
  if (M == -INFINITY) return {M, 0.0f};
  return {M, __fmul_rn(a.s, expf(a.m - M)) + __fmul_rn(b.s, expf(b.m - M))};
}
// Folds V more logits into a running MaxSum: one rescale per pack, not per element.
template <int V>
__device__ __forceinline__ MaxSum absorb(MaxSum acc, const float (&f)[V]) {
  float pm = f[0];
#pragma unroll
  for (int k = 1; k < V; ++k) pm = fmaxf(pm, f[k]);
  const float M = fmaxf(acc.m, pm);
  if (M == -INFINITY) return acc;  // everything so far is −inf: contributes nothing
  float s = acc.s * expf(acc.m - M);
#pragma unroll
  for (int k = 0; k < V; ++k) s += expf(f[k] - M);
  return {M, s};
}

template <int TPR>
__device__ __forceinline__ MaxSum row_reduce(MaxSum v, MaxSum* smem) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    MaxSum o{__shfl_xor_sync(0xffffffffu, v.m, d), __shfl_xor_sync(0xffffffffu, v.s, d)};
    v = combine(v, o);
  }
  if constexpr (TPR > 32) {
    if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
    __syncthreads();
    v = smem[0];
    for (int w = 1; w < TPR / 32; ++w) v = combine(v, smem[w]);
    __syncthreads();  // smem may be reused by the next reduction
  }
  return v;
}

template <int TPR>
__device__ __forceinline__ float row_sum(float v, float* smem) {
  v = warp_sum(v);
  if constexpr (TPR > 32) {
    if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
    __syncthreads();
    v = smem[0];
    for (int w = 1; w < TPR / 32; ++w) v += smem[w];
    __syncthreads();
  }
  return v;
}

// ── softmax ──
// TPR threads per row; rows per block = blockDim.x / TPR (TPR > 32 means one row per block).
template <int V, int TPR, typename T>
__global__ void softmax_forward_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t N, int64_t C) {
  __shared__ MaxSum smem[TPR > 32 ? TPR / 32 : 1];
  const int rows_per_block = blockDim.x / TPR;
  const int t = threadIdx.x % TPR;
  const int64_t packs = C / V;
  for (int64_t row = int64_t(blockIdx.x) * rows_per_block + threadIdx.x / TPR; row < N;
       row += int64_t(gridDim.x) * rows_per_block) {
    const T* xr = x + row * C;
    MaxSum acc{-INFINITY, 0.0f};
    for (int64_t p = t; p < packs; p += TPR) {
      float f[V];
      load_vec<V>(xr + p * V, f);
      acc = absorb(acc, f);
    }
    acc = row_reduce<TPR>(acc, smem);
    // A fully masked row (max = −inf) gives zeros, as on the CPU.
    const bool masked = acc.m == -INFINITY;
    const float inv = 1.0f / acc.s;
    T* o = out + row * C;
    for (int64_t p = t; p < packs; p += TPR) {
      float f[V];
      load_vec<V>(xr + p * V, f);
#pragma unroll
      for (int k = 0; k < V; ++k) f[k] = masked ? 0.0f : expf(f[k] - acc.m) * inv;
      store_vec<V>(o + p * V, f);
    }
  }
}

template <int V, int TPR, typename T>
__global__ void softmax_backward_kernel(const T* __restrict__ y, const T* __restrict__ dy, T* __restrict__ dx,
                                        int64_t N, int64_t C) {
  __shared__ float smem[TPR > 32 ? TPR / 32 : 1];
  const int rows_per_block = blockDim.x / TPR;
  const int t = threadIdx.x % TPR;
  const int64_t packs = C / V;
  for (int64_t row = int64_t(blockIdx.x) * rows_per_block + threadIdx.x / TPR; row < N;
       row += int64_t(gridDim.x) * rows_per_block) {
    const T* yr = y + row * C;
    const T* dyr = dy + row * C;
    float dot = 0.0f;
    for (int64_t p = t; p < packs; p += TPR) {
      float fy[V], fd[V];
      load_vec<V>(yr + p * V, fy);
      load_vec<V>(dyr + p * V, fd);
#pragma unroll
      for (int k = 0; k < V; ++k) dot += fy[k] * fd[k];
    }
    dot = row_sum<TPR>(dot, smem);
    T* dxr = dx + row * C;
    for (int64_t p = t; p < packs; p += TPR) {
      float fy[V], fd[V];
      load_vec<V>(yr + p * V, fy);
      load_vec<V>(dyr + p * V, fd);
#pragma unroll
      for (int k = 0; k < V; ++k) fy[k] = fy[k] * (fd[k] - dot);
      store_vec<V>(dxr + p * V, fy);
    }
  }
}

// ── cross-entropy ──
// The loss and its gradient in one pass over the logits. GPT-2's logits are 16k × 50304 bf16
// (1.65 GB): a separate backward kernel read them again and wrote the gradient, 0.80 + 0.91 ms a
// step; written here while the row is at hand (its second read hits L2), the gradient costs
// only its write. The gradient is that of the mean loss for an upstream gradient of 1 — what
// loss.backward() asks for — and cross_entropy_backward rescales it for any other.
constexpr int kCeThreads = 512;  // one block per row: V = 50304 bf16 is ~12 packs per thread

// Rows not ignored, before the rows kernel (which scales the gradient by 1/count).
constexpr int kCeReduceThreads = 1024;

__global__ void __launch_bounds__(kCeReduceThreads)
    cross_entropy_count_kernel(const int32_t* __restrict__ targets, int64_t N, int32_t ignore_index,
                               int32_t* __restrict__ count_out) {
  __shared__ int counts[kCeReduceThreads / 32];
  int cnt = 0;
  for (int64_t i = threadIdx.x; i < N; i += kCeReduceThreads) cnt += targets[i] != ignore_index;
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) cnt += __shfl_xor_sync(0xffffffffu, cnt, d);
  if ((threadIdx.x & 31) == 0) counts[threadIdx.x >> 5] = cnt;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t count = 0;
    for (int w = 0; w < kCeReduceThreads / 32; ++w) count += counts[w];
    *count_out = int32_t(count);
  }
}

// absorb() for the cross-entropy rows: the same running (max, Σ e^(x − max)), the exponentials as
// 2^(x·log2e − max·log2e) on the special-function unit. The rows kernel is otherwise bound by
// its arithmetic: 824 M accurate expf per GPT-2 step, twice.
template <int V>
__device__ __forceinline__ MaxSum absorb_fast(MaxSum acc, const float (&f)[V]) {
  float pm = f[0];
#pragma unroll
  for (int k = 1; k < V; ++k) pm = fmaxf(pm, f[k]);
  const float M = fmaxf(acc.m, pm);
  if (M == -INFINITY) return acc;
  const float m2 = M * kLog2e;
  float s = acc.s * fast_exp2(fmaf(acc.m, kLog2e, -m2));
#pragma unroll
  for (int k = 0; k < V; ++k) s += fast_exp2(fmaf(f[k], kLog2e, -m2));
  return {M, s};
}

// One row of the cross-entropy, by the whole block: the online (max, Σexp) over the row's logits
// lr (global memory, or the row's copy in shared memory), lse and the row's loss; with kGrad also
// dlogits = (softmax − onehot(target)) / count (zeros for an ignored row) into dr. Both rows
// kernels run this, so they give the same bits.
template <int V, bool kGrad, typename T>
__device__ __forceinline__ void cross_entropy_row(const T* lr, T* dr, int64_t row, const int32_t* __restrict__ targets,
                                                  float* __restrict__ lse, float* __restrict__ row_loss,
                                                  float inv_count, int64_t Vocab, int32_t ignore_index,
                                                  MaxSum* smem) {
  const int64_t packs = Vocab / V;
  MaxSum acc{-INFINITY, 0.0f};
#pragma unroll 4
  for (int64_t p = threadIdx.x; p < packs; p += kCeThreads) {
    float f[V];
    load_vec<V>(lr + p * V, f);
    acc = absorb_fast(acc, f);
  }
  const int32_t tgt = targets[row];
  const bool tgt_in_row = tgt >= 0 && tgt < Vocab && tgt != ignore_index;
  const float tgt_logit = threadIdx.x == 0 && tgt_in_row ? to_float(lr[tgt]) : 0.0f;
  acc = row_reduce<kCeThreads>(acc, smem);  // every thread gets the row's (max, sum)
  const float l = acc.m + logf(acc.s);
  if (threadIdx.x == 0) {
    lse[row] = l;
    if (tgt == ignore_index) {
      row_loss[row] = 0.0f;
    } else if (tgt_in_row) {
      row_loss[row] = l - tgt_logit;
    } else {
      row_loss[row] = NAN;
    }
  }
  if constexpr (kGrad) {
    const bool ignored = tgt == ignore_index;
    const float l2 = l * kLog2e;
#pragma unroll 4
    for (int64_t p = threadIdx.x; p < packs; p += kCeThreads) {
      float f[V];
      if (ignored) {
#pragma unroll
        for (int k = 0; k < V; ++k) f[k] = 0.0f;
      } else {
        load_vec<V>(lr + p * V, f);
#pragma unroll
        for (int k = 0; k < V; ++k) f[k] = fast_exp2(fmaf(f[k], kLog2e, -l2)) * inv_count;
        const int64_t at = int64_t(tgt) - p * V;  // the target's place in this pack, if it is here
        if (at >= 0 && at < V) {
#pragma unroll
          for (int k = 0; k < V; ++k)
            if (k == at) f[k] -= inv_count;
        }
      }
      store_vec_fast<V>(dr + p * V, f);
    }
  }
}

// Per row: the online (max, Σexp) over the logits, lse and the row's loss; with kGrad also
// dlogits = (softmax − onehot(target)) / count (zeros for an ignored row). dlogits may be logits
// itself (the LM head overwrites its logits with their gradient): each element is read by the
// thread that then writes it, and the target's logit is read before the row's reduction, whose
// barrier every thread passes before the gradient pass writes anything.
template <int V, bool kGrad, typename T>
__global__ void __launch_bounds__(kCeThreads)
    cross_entropy_rows_kernel(const T* logits, const int32_t* __restrict__ targets, float* __restrict__ lse,
                              float* __restrict__ row_loss, const int32_t* __restrict__ count, T* dlogits, int64_t N,
                              int64_t Vocab, int32_t ignore_index) {
  __shared__ MaxSum smem[kCeThreads / 32];
  float inv_count = 0.0f;
  if constexpr (kGrad) {
    const int32_t c = *count;
    inv_count = c > 0 ? 1.0f / float(c) : 0.0f;
  }
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x) {
    const T* lr = logits + row * Vocab;
    cross_entropy_row<V, kGrad>(lr, kGrad ? dlogits + row * Vocab : nullptr, row, targets, lse, row_loss, inv_count,
                                Vocab, ignore_index, smem);
  }
}

// The same rows on Hopper with each row brought into shared memory whole by the bulk copy
// engine, the next row's copy in flight while this one is reduced and its gradient written: one
// block per multiprocessor, two row buffers. The kernel above reads each row twice from memory
// (its second read mostly misses L2: 4.9 GB moved a GPT-2 step for 3.3 GB of work), and threads
// that load a row pack by pack keep too few bytes in flight to hide the latency; here a row is
// read from memory once, by one instruction. The arithmetic, its order and so the bits are the
// kernel above's: thread t absorbs packs t, t + kCeThreads, … in the same order and the block
// reduces in the same shape. Rows must be 16-byte multiples, the logits 16-byte aligned, and two
// rows must fit in shared memory (cross_entropy_rows checks).
template <int V, bool kGrad, typename T>
__global__ void __launch_bounds__(kCeThreads, 1)
    cross_entropy_rows_bulk_kernel(const T* logits, const int32_t* __restrict__ targets, float* __restrict__ lse,
                                   float* __restrict__ row_loss, const int32_t* __restrict__ count, T* dlogits,
                                   int64_t N, int64_t Vocab, int32_t ignore_index) {
#if __CUDA_ARCH__ >= 900
  extern __shared__ __align__(128) unsigned char ce_smem[];
  __shared__ MaxSum smem[kCeThreads / 32];
  __shared__ uint64_t full[2];  // row buffer b holds its row
  const uint32_t row_bytes = uint32_t(Vocab * int64_t(sizeof(T)));
  const uint32_t buffer_bytes = (row_bytes + 127u) & ~127u;
  auto buffer = [&](int b) { return reinterpret_cast<const T*>(ce_smem + b * buffer_bytes); };
  auto fetch = [&](int b, int64_t row) {  // one thread: start the copy of `row` into buffer b
    mbarrier_arrive_expect_tx(&full[b], row_bytes);
    bulk_load(ce_smem + b * buffer_bytes, logits + row * Vocab, row_bytes, &full[b]);
  };
  if (threadIdx.x == 0) {
    mbarrier_init(&full[0], 1);
    mbarrier_init(&full[1], 1);
    fence_barrier_init();
    if (blockIdx.x < N) fetch(0, blockIdx.x);
  }
  __syncthreads();
  float inv_count = 0.0f;
  if constexpr (kGrad) {
    const int32_t c = *count;
    inv_count = c > 0 ? 1.0f / float(c) : 0.0f;
  }
  int use = 0;  // rows this block has taken: buffer use & 1, in its (use >> 1)-th phase
  for (int64_t row = blockIdx.x; row < N; row += gridDim.x, ++use) {
    const int b = use & 1;
    // The other buffer's last row was finished by every thread before the barrier that ended
    // the previous iteration: it may be refilled while this row is worked on.
    if (threadIdx.x == 0 && row + gridDim.x < N) fetch(b ^ 1, row + gridDim.x);
    mbarrier_wait(&full[b], uint32_t(use >> 1) & 1u);
    const T* lr = buffer(b);
    cross_entropy_row<V, kGrad>(lr, kGrad ? dlogits + row * Vocab : nullptr, row, targets, lse, row_loss, inv_count,
                                Vocab, ignore_index, smem);
    __syncthreads();  // this buffer is read: the next iteration's copy may refill it
  }
#endif
}

// The mean over the rows: thread t adds rows t, t+1024, … in double, then warps and lanes
// combine in a fixed order.
__global__ void __launch_bounds__(kCeReduceThreads)
    cross_entropy_mean_kernel(const float* __restrict__ row_loss, int64_t N, const int32_t* __restrict__ count,
                              float* __restrict__ loss_out) {
  __shared__ double sums[kCeReduceThreads / 32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < N; i += kCeReduceThreads) s += double(row_loss[i]);
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) sums[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kCeReduceThreads / 32; ++w) total += sums[w];
    const int32_t c = *count;
    *loss_out = c > 0 ? float(total / double(c)) : 0.0f;
  }
}

// dlogits *= dloss, read on the device. Every thread reads the one float first and the whole
// grid returns at once when it is 1 (loss.backward() on the mean loss: the common case costs a
// few µs, not a pass over 1.65 GB).
template <int V, typename T>
__global__ void cross_entropy_rescale_kernel(T* __restrict__ dlogits, const float* __restrict__ dloss, int64_t n) {
  const float d = *dloss;
  if (d == 1.0f) return;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t nv = n / V;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < nv; j += stride) {
    float f[V];
    load_vec<V>(dlogits + j * V, f);
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] *= d;
    store_vec<V>(dlogits + j * V, f);
  }
  const int64_t i = nv * V + int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (V > 1 && i < n) dlogits[i] = from_float<T>(to_float(dlogits[i]) * d);
}

// Threads per row for softmax: a warp for rows up to 1024 (attention scores), the block above.
constexpr int64_t kSoftmaxWarpMaxC = 1024;
constexpr int kSoftmaxThreads = 256;

template <int V, typename T>
void launch_softmax_forward(const T* x, T* out, int64_t N, int64_t C, cudaStream_t stream) {
  if (C <= kSoftmaxWarpMaxC) {
    softmax_forward_kernel<V, 32><<<grid_for(N, kSoftmaxThreads / 32), kSoftmaxThreads, 0, stream>>>(x, out, N, C);
  } else {
    softmax_forward_kernel<V, kSoftmaxThreads><<<grid_for(N, 1, 132 * 64), kSoftmaxThreads, 0, stream>>>(x, out, N, C);
  }
}

template <int V, typename T>
void launch_softmax_backward(const T* y, const T* dy, T* dx, int64_t N, int64_t C, cudaStream_t stream) {
  if (C <= kSoftmaxWarpMaxC) {
    softmax_backward_kernel<V, 32><<<grid_for(N, kSoftmaxThreads / 32), kSoftmaxThreads, 0, stream>>>(y, dy, dx, N, C);
  } else {
    softmax_backward_kernel<V, kSoftmaxThreads>
        <<<grid_for(N, 1, 132 * 64), kSoftmaxThreads, 0, stream>>>(y, dy, dx, N, C);
  }
}

}  // namespace

// ───────────────────────────── launchers ─────────────────────────────


template <typename T>
void softmax_forward(const T* x, T* out, int64_t N, int64_t C, cudaStream_t stream) {
  require(N >= 0 && C >= 0, "softmax_forward", "negative size");
  if (N == 0 || C == 0) return;
  constexpr int V = kVec<T>;
  if (C % V == 0 && aligned16(x) && aligned16(out)) {
    launch_softmax_forward<V>(x, out, N, C, stream);
  } else {
    launch_softmax_forward<1>(x, out, N, C, stream);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t N, int64_t C, cudaStream_t stream) {
  require(N >= 0 && C >= 0, "softmax_backward", "negative size");
  if (N == 0 || C == 0) return;
  constexpr int V = kVec<T>;
  if (C % V == 0 && aligned16(y) && aligned16(dy) && aligned16(dx)) {
    launch_softmax_backward<V>(y, dy, dx, N, C, stream);
  } else {
    launch_softmax_backward<1>(y, dy, dx, N, C, stream);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_count(const int32_t* targets, int64_t N, int32_t ignore_index, int32_t* count_out,
                         cudaStream_t stream) {
  require(N >= 0, "cross_entropy_count", "negative N");
  // The count is an int32 (and so is each thread's share before the 64-bit total): more rows
  // than INT32_MAX would wrap it, and with it the mean and every chunk's gradient scale.
  require(N <= INT32_MAX, "cross_entropy_count", "more than 2^31 rows");
  cross_entropy_count_kernel<<<1, kCeReduceThreads, 0, stream>>>(targets, N, ignore_index, count_out);
  TG_CUDA_CHECK(cudaGetLastError());
}

// The device's multiprocessors and whether it has the bulk copy engine (sm_90 and later), and the
// shared memory a block may opt into: what decides the cross-entropy rows kernel.
struct CeDevice {
  int sms = 0;
  bool bulk = false;
  size_t smem_optin = 0;
};
CeDevice ce_device() {
  int device = 0, major = 0, sms = 0, optin = 0;
  TG_CUDA_CHECK(cudaGetDevice(&device));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return {sms, major >= 9, size_t(optin)};
}

template <typename T>
void cross_entropy_rows(const T* logits, const int32_t* targets, float* lse, float* row_loss, const int32_t* count,
                        T* dlogits, int64_t rows, int64_t V, int32_t ignore_index, cudaStream_t stream) {
  require(rows >= 0 && V > 0, "cross_entropy_rows", "need rows ≥ 0 and V > 0");
  require(rows <= INT32_MAX, "cross_entropy_rows", "more than 2^31 rows");
  if (rows == 0) return;
  constexpr int kV = kVec<T>;
  const unsigned grid = grid_for(rows, 1, 1 << 20);
  const bool packed = V % kV == 0 && aligned16(logits) && (dlogits == nullptr || aligned16(dlogits));
  // Two rows in shared memory (the static reduction slots and barriers beside them), a row a
  // 16-byte multiple below the bulk copy's 2^20 bytes.
  const size_t row_bytes = size_t(V) * sizeof(T), buffer_bytes = (row_bytes + 127) & ~size_t(127);
  static const CeDevice device = ce_device();  // the first device's: a process drives one kind of GPU
  if (packed && device.bulk && row_bytes % 16 == 0 && row_bytes < (size_t(1) << 20) &&
      2 * buffer_bytes + 1024 <= device.smem_optin) {
    const int smem = int(2 * buffer_bytes);
    auto launch_bulk = [&](auto kernel) {
      TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
      const unsigned bulk_grid = unsigned(std::min<int64_t>(rows, device.sms));
      kernel<<<bulk_grid, kCeThreads, smem, stream>>>(logits, targets, lse, row_loss, count, dlogits, rows, V,
                                                      ignore_index);
    };
    if (dlogits) launch_bulk(cross_entropy_rows_bulk_kernel<kV, true, T>);
    else launch_bulk(cross_entropy_rows_bulk_kernel<kV, false, T>);
    TG_CUDA_CHECK(cudaGetLastError());
    return;
  }
  auto launch = [&](auto kernel) {
    kernel<<<grid, kCeThreads, 0, stream>>>(logits, targets, lse, row_loss, count, dlogits, rows, V, ignore_index);
  };
  if (packed) {
    if (dlogits) launch(cross_entropy_rows_kernel<kV, true, T>);
    else launch(cross_entropy_rows_kernel<kV, false, T>);
  } else {
    if (dlogits) launch(cross_entropy_rows_kernel<1, true, T>);
    else launch(cross_entropy_rows_kernel<1, false, T>);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

void cross_entropy_mean(const float* row_loss, int64_t N, const int32_t* count, float* loss_out, cudaStream_t stream) {
  require(N >= 0, "cross_entropy_mean", "negative N");
  cross_entropy_mean_kernel<<<1, kCeReduceThreads, 0, stream>>>(row_loss, N, count, loss_out);
  TG_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void cross_entropy_forward(const T* logits, const int32_t* targets, float* lse, float* row_loss, float* loss_out,
                           int32_t* count_out, T* dlogits, int64_t N, int64_t V, int32_t ignore_index,
                           cudaStream_t stream) {
  require(N >= 0 && V > 0, "cross_entropy_forward", "need N ≥ 0 and V > 0");
  cross_entropy_count(targets, N, ignore_index, count_out, stream);
  cross_entropy_rows(logits, targets, lse, row_loss, count_out, dlogits, N, V, ignore_index, stream);
  cross_entropy_mean(row_loss, N, count_out, loss_out, stream);
}

template <typename T>
void cross_entropy_backward(const float* dloss, T* dlogits, int64_t n, cudaStream_t stream) {
  require(n >= 0, "cross_entropy_backward", "negative size");
  if (n == 0) return;
  constexpr int kV = kVec<T>;
  constexpr int kThreads = 256;
  if (aligned16(dlogits) && n >= kV) {
    cross_entropy_rescale_kernel<kV><<<grid_for(n / kV, kThreads), kThreads, 0, stream>>>(dlogits, dloss, n);
  } else {
    cross_entropy_rescale_kernel<1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(dlogits, dloss, n);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

#define TG_INSTANTIATE(T)                                                                                       \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t, cudaStream_t);                              \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t, cudaStream_t);                   \
  template void cross_entropy_forward<T>(const T*, const int32_t*, float*, float*, float*, int32_t*, T*,       \
                                         int64_t, int64_t, int32_t, cudaStream_t);                              \
  template void cross_entropy_rows<T>(const T*, const int32_t*, float*, float*, const int32_t*, T*, int64_t,    \
                                      int64_t, int32_t, cudaStream_t);                                          \
  template void cross_entropy_backward<T>(const float*, T*, int64_t, cudaStream_t);
TG_INSTANTIATE(float)
TG_INSTANTIATE(tg::bf16)
#undef TG_INSTANTIATE

}  // namespace tg::cuda
