// CUDA AdamW, sum of squares and in-place scale kernels and their launchers: the twins of kernels/cpu/adamw.h.
#include "kernels/cuda/optim.h"

#include <cstdint>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"

namespace tg::cuda {

// ───────────────────────────── kernels ─────────────────────────────

namespace {

constexpr int kThreads = 256;

struct AdamW {
  float lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale;
  int64_t n_decay;
  // The CPU's expression, step for step (fp32, IEEE division and square root).
  __device__ __forceinline__ void operator()(float& p, float g_raw, float& m, float& v, int64_t i) const {
    const float g = g_raw * grad_scale;
    const float mi = beta1 * m + (1.0f - beta1) * g;
    const float vi = beta2 * v + (1.0f - beta2) * g * g;
    m = mi;
    v = vi;
    const float mhat = mi / bc1;
    const float vhat = vi / bc2;
    const float wd = i < n_decay ? weight_decay : 0.0f;
    p -= lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
  }
};

// One pass over the flat buffers; V = 4 uses float4 accesses, the remainder (< 4) is scalar. With
// `compute` set, the updated values are also stored there in bf16, rounded as the forward's
// conversion rounds them (store_vec, the CPU's bits): the compute copy written with the update.
template <int V>
__device__ __forceinline__ void adamw_pass(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                           float* __restrict__ v, bf16* __restrict__ compute, int64_t n,
                                           const AdamW& op) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / V;
  for (int64_t j = tid; j < nv; j += stride) {
    float fp[V], fg[V], fm[V], fv[V];
    load_vec<V>(p + j * V, fp);
    load_vec<V>(g + j * V, fg);
    load_vec<V>(m + j * V, fm);
    load_vec<V>(v + j * V, fv);
#pragma unroll
    for (int k = 0; k < V; ++k) op(fp[k], fg[k], fm[k], fv[k], j * V + k);
    store_vec<V>(p + j * V, fp);
    store_vec<V>(m + j * V, fm);
    store_vec<V>(v + j * V, fv);
    if (compute) store_vec<V>(compute + j * V, fp);
  }
  const int64_t i = nv * V + tid;
  if (V > 1 && i < n) {
    op(p[i], g[i], m[i], v[i], i);
    if (compute) compute[i] = from_float<bf16>(p[i]);
  }
}

template <int V>
__global__ void adamw_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                             float* __restrict__ v, bf16* __restrict__ compute, int64_t n, AdamW op) {
  adamw_pass<V>(p, g, m, v, compute, n, op);
}

// The same pass with the step's constants from the device-side decision (rounded to float as
// AdamW::step rounds them), or nothing when the decision skips the step (the values, and so the
// compute copy of them, stay as they are).
template <int V>
__global__ void adamw_decided_kernel(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                     float* __restrict__ v, bf16* __restrict__ compute, int64_t n, AdamW op,
                                     const cpu::StepDecision* __restrict__ d) {
  if (d->skip) return;
  op.bc1 = float(d->bias_correction1);
  op.bc2 = float(d->bias_correction2);
  op.grad_scale = float(d->clip);
  adamw_pass<V>(p, g, m, v, compute, n, op);
}

__global__ void decide_step_kernel(const double* record, double max_norm, double beta1, double beta2,
                                   int64_t max_bad_steps, cpu::StepDecision* d) {
  cpu::decide_step(record[0], record[1], max_norm, beta1, beta2, max_bad_steps, *d);
}

__global__ void add_divided_kernel(double* dst, const float* src, double divisor) { *dst += double(*src) / divisor; }

__global__ void sum_in_order_kernel(const double* xs, int64_t n, double* out) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += xs[i];
  *out = total;
}

// Sum of squares: block b owns elements [b·kSsBlock, (b+1)·kSsBlock); each thread adds its
// elements in a fixed order in double (a float square is exact in double), lanes combine by
// butterfly and warps in warp order. The block size is a constant, so the partition — and with
// it the result — depends only on n, not on the GPU.
constexpr int kSsThreads = 256;
constexpr int kSsPerThread = 32;
constexpr int64_t kSsBlock = int64_t(kSsThreads) * kSsPerThread;  // 8192 elements
constexpr int kSsFinalThreads = 1024;

template <int Threads>
__device__ __forceinline__ double block_sum(double s) {
  __shared__ double warp_part[Threads / 32];
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) warp_part[threadIdx.x >> 5] = s;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < Threads / 32; ++w) total += warp_part[w];
  return total;  // meaningful in thread 0 only
}

template <int V>
__global__ void __launch_bounds__(kSsThreads) sum_squares_partial_kernel(const float* __restrict__ g, int64_t n,
                                                                         double* __restrict__ partial) {
  const int64_t base = int64_t(blockIdx.x) * kSsBlock;
  double s = 0.0;
#pragma unroll 4
  for (int k = 0; k < kSsPerThread / V; ++k) {
    const int64_t i = base + (int64_t(k) * kSsThreads + threadIdx.x) * V;
    if (i + V <= n) {
      float f[V];
      load_vec<V>(g + i, f);
#pragma unroll
      for (int e = 0; e < V; ++e) s += double(f[e]) * double(f[e]);
    } else {
      for (int64_t e = i; e < n; ++e) s += double(g[e]) * double(g[e]);
    }
  }
  s = block_sum<kSsThreads>(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void __launch_bounds__(kSsFinalThreads) sum_squares_final_kernel(const double* __restrict__ partial,
                                                                            int64_t blocks, double* __restrict__ out) {
  double s = 0.0;
  for (int64_t b = threadIdx.x; b < blocks; b += kSsFinalThreads) s += partial[b];
  s = block_sum<kSsFinalThreads>(s);
  if (threadIdx.x == 0) *out = s;
}

__global__ void scale_kernel(float* __restrict__ x, float s, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / 4;
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  if (vec) {
    for (int64_t j = tid; j < nv; j += stride) {
      float f[4];
      load_vec<4>(x + j * 4, f);
#pragma unroll
      for (int k = 0; k < 4; ++k) f[k] *= s;
      store_vec<4>(x + j * 4, f);
    }
    if (nv * 4 + tid < n) x[nv * 4 + tid] *= s;
  } else {
    for (int64_t j = tid; j < n; j += stride) x[j] *= s;
  }
}

}  // namespace

// ───────────────────────────── launchers ─────────────────────────────

namespace {
// The float4 pass: the fp32 buffers in 16-byte packs, the compute copy (if any) in 8-byte ones.
bool vectorised(const float* p, const float* g, const float* m, const float* v, const bf16* compute, int64_t n) {
  return aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) &&
         (reinterpret_cast<uintptr_t>(compute) & 7u) == 0 && n >= 4;
}
}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, bf16* compute, int64_t n, int64_t n_decay, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2, float grad_scale,
                  cudaStream_t stream) {
  require(n >= 0 && n_decay >= 0 && n_decay <= n, "adamw_update", "need 0 ≤ n_decay ≤ n");
  require(bc1 > 0.0f && bc2 > 0.0f, "adamw_update", "bias corrections must be positive (step t ≥ 1)");
  if (n == 0) return;
  const AdamW op{lr, beta1, beta2, eps, weight_decay, bc1, bc2, grad_scale, n_decay};
  if (vectorised(p, g, m, v, compute, n)) {
    adamw_kernel<4><<<grid_for(n / 4, kThreads), kThreads, 0, stream>>>(p, g, m, v, compute, n, op);
  } else {
    adamw_kernel<1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(p, g, m, v, compute, n, op);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

void decide_step(const double* record, double max_norm, double beta1, double beta2, int64_t max_bad_steps,
                 cpu::StepDecision* decision, cudaStream_t stream) {
  decide_step_kernel<<<1, 1, 0, stream>>>(record, max_norm, beta1, beta2, max_bad_steps, decision);
  TG_CUDA_CHECK(cudaGetLastError());
}

void adamw_update_decided(float* p, const float* g, float* m, float* v, bf16* compute, int64_t n, int64_t n_decay,
                          float lr, float beta1, float beta2, float eps, float weight_decay,
                          const cpu::StepDecision* decision, cudaStream_t stream) {
  require(n >= 0 && n_decay >= 0 && n_decay <= n, "adamw_update_decided", "need 0 ≤ n_decay ≤ n");
  if (n == 0) return;
  const AdamW op{lr, beta1, beta2, eps, weight_decay, 1.0f, 1.0f, 1.0f, n_decay};
  if (vectorised(p, g, m, v, compute, n)) {
    adamw_decided_kernel<4><<<grid_for(n / 4, kThreads), kThreads, 0, stream>>>(p, g, m, v, compute, n, op, decision);
  } else {
    adamw_decided_kernel<1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(p, g, m, v, compute, n, op, decision);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

void add_divided(double* dst, const float* src, double divisor, cudaStream_t stream) {
  add_divided_kernel<<<1, 1, 0, stream>>>(dst, src, divisor);
  TG_CUDA_CHECK(cudaGetLastError());
}

void sum_in_order(const double* xs, int64_t n, double* out, cudaStream_t stream) {
  sum_in_order_kernel<<<1, 1, 0, stream>>>(xs, n, out);
  TG_CUDA_CHECK(cudaGetLastError());
}

size_t sum_squares_scratch_bytes(int64_t n) {
  const int64_t blocks = n > 0 ? (n + kSsBlock - 1) / kSsBlock : 1;
  return size_t(blocks) * sizeof(double);
}

void sum_squares(const float* g, int64_t n, void* scratch, double* out_device, cudaStream_t stream) {
  require(n >= 0, "sum_squares", "negative size");
  require(scratch != nullptr && (reinterpret_cast<uintptr_t>(scratch) & 7u) == 0, "sum_squares",
          "scratch must be non-null and 8-byte aligned");
  const int64_t blocks = n > 0 ? (n + kSsBlock - 1) / kSsBlock : 0;
  require(blocks <= INT32_MAX, "sum_squares", "n too large");
  double* partial = static_cast<double*>(scratch);
  if (blocks > 0) {
    if (aligned16(g)) {
      sum_squares_partial_kernel<4><<<unsigned(blocks), kSsThreads, 0, stream>>>(g, n, partial);
    } else {
      sum_squares_partial_kernel<1><<<unsigned(blocks), kSsThreads, 0, stream>>>(g, n, partial);
    }
    TG_CUDA_CHECK(cudaGetLastError());
  }
  sum_squares_final_kernel<<<1, kSsFinalThreads, 0, stream>>>(partial, blocks, out_device);
  TG_CUDA_CHECK(cudaGetLastError());
}

void scale_inplace(float* x, float s, int64_t n, cudaStream_t stream) {
  require(n >= 0, "scale_inplace", "negative size");
  if (n == 0) return;
  scale_kernel<<<grid_for((n + 3) / 4, kThreads), kThreads, 0, stream>>>(x, s, n);
  TG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tg::cuda
