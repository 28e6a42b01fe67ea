// CUDA LayerNorm kernels and their launchers: the twins of kernels/cpu/layernorm.h, with fp32
// statistics and fixed-order (bitwise reproducible) reductions.
#include "kernels/cuda/layernorm.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/common.cuh"

namespace tg::cuda {

// ───────────────────────────── kernels ─────────────────────────────

namespace {

// ── LayerNorm forward: one warp per row, 8 rows per block ──
// Three passes over the row (mean, variance, write) like the CPU's two-pass statistics; the
// second and third read the row again from L1/L2 rather than keeping a runtime-sized row in registers.
constexpr int kLnRowsPerBlock = 8;

template <int V, typename T>
__global__ void __launch_bounds__(kLnRowsPerBlock * 32)
    layernorm_forward_kernel(const T* __restrict__ x, const T* __restrict__ w, const T* __restrict__ b,
                             T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd, int64_t N,
                             int64_t C, float eps) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t packs = C / V;
  for (int64_t row = int64_t(blockIdx.x) * kLnRowsPerBlock + warp; row < N;
       row += int64_t(gridDim.x) * kLnRowsPerBlock) {
    const T* xr = x + row * C;
    float sum = 0.0f;
    for (int64_t p = lane; p < packs; p += 32) {
      float f[V];
      load_vec<V>(xr + p * V, f);
#pragma unroll
      for (int k = 0; k < V; ++k) sum += f[k];
    }
    const float m = warp_sum(sum) / float(C);
    float var = 0.0f;
    for (int64_t p = lane; p < packs; p += 32) {
      float f[V];
      load_vec<V>(xr + p * V, f);
#pragma unroll
      for (int k = 0; k < V; ++k) var += (f[k] - m) * (f[k] - m);
    }
    const float rs = 1.0f / sqrtf(warp_sum(var) / float(C) + eps);
    T* o = out + row * C;
    for (int64_t p = lane; p < packs; p += 32) {
      float f[V], fw[V], fb[V];
      load_vec<V>(xr + p * V, f);
      load_vec<V>(w + p * V, fw);
      if (b) {
        load_vec<V>(b + p * V, fb);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) fb[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < V; ++k) f[k] = (f[k] - m) * rs * fw[k] + fb[k];
      store_vec<V>(o + p * V, f);
    }
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = rs;
    }
  }
}

// The same forward with the row in registers, for rows of at most 32·V·P elements (P ≤ 4
// packs per lane: C ≤ 1024 in bf16; GPT-2 small's 768 is P = 3). A lane issues all its loads at
// once and the statistics come from registers: the three-pass kernel above waits on a round of
// loads per pass and ran GPT-2's 16k × 768 rows at half the memory rate (26 µs for 50 MB).
// With kAdd the row is first formed as x + x2 (a residual add), rounded to T and stored to sum:
// the add and the LayerNorm after it in one pass (reads x and x2, writes sum and out), the
// statistics taken from the rounded sum exactly as a LayerNorm reading the stored sum would.
// x2_bias (C), when not null, is added to x2 first (rounded to T, as add_forward would): the bias
// of the projection whose output x2 is.
constexpr int kLnMaxPacksPerLane = 4;

template <int V, int P, bool kAdd, typename T>
__global__ void __launch_bounds__(kLnRowsPerBlock * 32)
    layernorm_forward_regs_kernel(const T* __restrict__ x, const T* __restrict__ x2, const T* __restrict__ x2_bias,
                                  T* __restrict__ sum, const T* __restrict__ w, const T* __restrict__ b,
                                  T* __restrict__ out, float* __restrict__ mean, float* __restrict__ rstd, int64_t N,
                                  int64_t C, float eps) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t packs = C / V;
  for (int64_t row = int64_t(blockIdx.x) * kLnRowsPerBlock + warp; row < N;
       row += int64_t(gridDim.x) * kLnRowsPerBlock) {
    const T* xr = x + row * C;
    float f[P][V];
    float row_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t p = lane + 32 * i;
      if (p < packs) {
        load_vec<V>(xr + p * V, f[i]);
        if constexpr (kAdd) {
          float g[V];
          load_vec<V>(x2 + row * C + p * V, g);
          if (x2_bias) {
            float gb[V];
            load_vec<V>(x2_bias + p * V, gb);
#pragma unroll
            for (int k = 0; k < V; ++k) g[k] += gb[k];
            round_vec_fast<V, T>(g);
          }
#pragma unroll
          for (int k = 0; k < V; ++k) f[i][k] += g[k];
          round_vec_fast<V, T>(f[i]);
          store_vec_fast<V>(sum + row * C + p * V, f[i]);
        }
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) f[i][k] = 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < P; ++i)
#pragma unroll
      for (int k = 0; k < V; ++k) row_sum += f[i][k];
    const float m = warp_sum(row_sum) / float(C);
    float var = 0.0f;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      if (lane + 32 * i >= packs) continue;  // padding is not (x − m)² = m²
#pragma unroll
      for (int k = 0; k < V; ++k) var += (f[i][k] - m) * (f[i][k] - m);
    }
    const float rs = 1.0f / sqrtf(warp_sum(var) / float(C) + eps);
    T* o = out + row * C;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t p = lane + 32 * i;
      if (p >= packs) continue;
      float fw[V], fb[V];
      load_vec<V>(w + p * V, fw);
      if (b) {
        load_vec<V>(b + p * V, fb);
      } else {
#pragma unroll
        for (int k = 0; k < V; ++k) fb[k] = 0.0f;
      }
#pragma unroll
      for (int k = 0; k < V; ++k) f[i][k] = (f[i][k] - m) * rs * fw[k] + fb[k];
      store_vec_fast<V>(o + p * V, f[i]);
    }
    if (lane == 0) {
      mean[row] = m;
      rstd[row] = rs;
    }
  }
}

// ── LayerNorm backward ──
// Block b owns the contiguous rows [b·R, (b+1)·R); its warps take them round-robin. Per row, a
// warp computes dx (two passes, like the CPU) and adds dout·x̂ and dout into per-warp fp32
// accumulators in shared memory (each lane owns its columns, so no synchronisation). At the end
// the block folds its warps in order into one partial row per block; layernorm_param_grads_kernel
// then adds the G partial rows in order. G depends only on N, so the summation order is fixed.
constexpr int kLnBwdWarps = 4;
// Blocks: at most one wave of the register kernel below (two 4-warp blocks per SM of a 132-SM
// H100/H200), so that every block runs from the start and its warps' row pipelines stay long.
constexpr int64_t kLnBwdMaxBlocks = 264;
constexpr int64_t kLnBwdMaxC = 7168;      // 2 · 4 warps · C floats must fit in 227 KB of shared memory

int64_t ln_bwd_blocks(int64_t N) { return std::clamp<int64_t>((N + 15) / 16, 1, kLnBwdMaxBlocks); }

// The end of both LayerNorm backward kernels: the block's per-warp sums acc ([warps][C] for
// dweight, then [warps][C] for dbias, then with kSumDx [warps][C] for Σ dx) folded in warp order
// into this block's partial rows (partial + s·G·C for sum s).
template <bool kSumDx>
__device__ __forceinline__ void fold_warp_partials(const float* acc, int64_t C, float* __restrict__ partial) {
  constexpr int kSums = kSumDx ? 3 : 2;
  const int64_t GC = int64_t(gridDim.x) * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
#pragma unroll
    for (int s = 0; s < kSums; ++s) {
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kLnBwdWarps; ++k) sum += acc[(s * kLnBwdWarps + k) * C + c];
      partial[s * GC + int64_t(blockIdx.x) * C + c] = sum;
    }
  }
}

// g += the V values at p (the gradient another consumer of x already produced: see dx_add).
template <int V, typename T>
__device__ __forceinline__ void add_row_vec(const T* p, float (&g)[V]) {
  float r[V];
  load_vec<V>(p, r);
#pragma unroll
  for (int k = 0; k < V; ++k) g[k] += r[k];
}

template <int V, bool kSumDx, typename T>
__global__ void __launch_bounds__(kLnBwdWarps * 32)
    layernorm_backward_kernel(const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ mean,
                              const float* __restrict__ rstd, const T* __restrict__ dout,
                              const T* __restrict__ dx_add, T* __restrict__ dx,
                              int64_t N, int64_t C, int64_t rows_per_block, float* __restrict__ partial) {
  // [kLnBwdWarps][C] for dweight, then [kLnBwdWarps][C] for dbias (then for Σ dx)
  extern __shared__ float acc[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t i = threadIdx.x; i < (kSumDx ? 3 : 2) * kLnBwdWarps * C; i += blockDim.x) acc[i] = 0.0f;
  __syncthreads();
  float* adw = acc + warp * C;
  float* adb = acc + (kLnBwdWarps + warp) * C;
  float* adx = acc + (2 * kLnBwdWarps + warp) * C;
  const int64_t packs = C / V;
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;
  for (int64_t row = r0 + warp; row < r1; row += kLnBwdWarps) {
    const T* xr = x + row * C;
    const T* dr = dout + row * C;
    const float m = mean[row], rs = rstd[row];
    float s1 = 0.0f, s2 = 0.0f;  // Σ dnorm, Σ dnorm·norm
    for (int64_t p = lane; p < packs; p += 32) {
      float fx[V], fd[V], fw[V];
      load_vec<V>(xr + p * V, fx);
      load_vec<V>(dr + p * V, fd);
      load_vec<V>(w + p * V, fw);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float dnorm = fd[k] * fw[k];
        s1 += dnorm;
        s2 += dnorm * ((fx[k] - m) * rs);
      }
    }
    const float dnorm_mean = warp_sum(s1) / float(C);
    const float dnorm_norm_mean = warp_sum(s2) / float(C);
    T* dxr = dx + row * C;
    for (int64_t p = lane; p < packs; p += 32) {
      float fx[V], fd[V], fw[V], g[V];
      load_vec<V>(xr + p * V, fx);
      load_vec<V>(dr + p * V, fd);
      load_vec<V>(w + p * V, fw);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float norm = (fx[k] - m) * rs;
        g[k] = (fd[k] * fw[k] - dnorm_mean - norm * dnorm_norm_mean) * rs;
        adw[p * V + k] += fd[k] * (fx[k] - m) * rs;
        adb[p * V + k] += fd[k];
      }
      if (dx_add) add_row_vec<V>(dx_add + row * C + p * V, g);
      if constexpr (kSumDx) {
#pragma unroll
        for (int k = 0; k < V; ++k) adx[p * V + k] += g[k];
      }
      store_vec<V>(dxr + p * V, g);
    }
  }
  __syncthreads();
  fold_warp_partials<kSumDx>(acc, C, partial);
}

// The same backward with everything a lane touches in registers, for rows of at most 32·V·P
// elements (P ≤ 4 packs per lane: C ≤ 1024 in bf16, 512 in fp32; GPT-2 small's C = 768 is P = 3).
// Each lane keeps its columns' weight and its dweight/dbias sums in registers for the whole block,
// and a row's x, dout and dx_add as loaded (16-byte packs, widened where used) from one read of
// global memory. The loads run a row ahead: a warp issues the next row's x, dout, dx_add, mean and
// rstd before it computes the current one, so each warp keeps two rows of reads in flight through
// both passes and the row's reductions. The rows of a warp otherwise wait on a full memory round
// trip each (two where dx_add was read after the reductions): with two 4-warp blocks per SM (the
// registers allow no more) that left the kernel at 40 % of the memory rate in GPT-2's step
// (docs/performance.md, "Where a step's time goes"). The warps fold through shared memory once, at
// the end, into one partial row per block.
constexpr int kLnBwdMaxPacksPerLane = 4;

template <int V, int P, bool kSumDx, typename T>
__global__ void __launch_bounds__(kLnBwdWarps * 32)
    layernorm_backward_regs_kernel(const T* __restrict__ x, const T* __restrict__ w, const float* __restrict__ mean,
                                   const float* __restrict__ rstd, const T* __restrict__ dout,
                                   const T* __restrict__ dx_add, T* __restrict__ dx,
                                   int64_t N, int64_t C, int64_t rows_per_block, float* __restrict__ partial) {
  static_assert(V * int(sizeof(T)) == 16, "rows in 16-byte packs");
  // [kLnBwdWarps][C] for dweight, then [kLnBwdWarps][C] for dbias (then for Σ dx)
  extern __shared__ float acc[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t packs = C / V;
  float fw[P][V], adw[P][V], adb[P][V], adx[kSumDx ? P : 1][V];
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int64_t p = lane + 32 * i;
#pragma unroll
    for (int k = 0; k < V; ++k) fw[i][k] = adw[i][k] = adb[i][k] = adx[kSumDx ? i : 0][k] = 0.0f;
    if (p < packs) load_vec<V>(w + p * V, fw[i]);
  }
  const int64_t r0 = int64_t(blockIdx.x) * rows_per_block;
  const int64_t r1 = r0 + rows_per_block < N ? r0 + rows_per_block : N;

  // The next row's reads, issued before the current row is computed.
  uint4 nx[P] = {}, nd[P] = {}, na[P] = {};
  float nm = 0.0f, nrs = 0.0f;
  auto fetch = [&](int64_t row) {
    if (row >= r1) return;
    nm = mean[row], nrs = rstd[row];
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t p = lane + 32 * i;
      if (p >= packs) continue;
      nx[i] = *reinterpret_cast<const uint4*>(x + row * C + p * V);
      nd[i] = *reinterpret_cast<const uint4*>(dout + row * C + p * V);
      if (dx_add) na[i] = *reinterpret_cast<const uint4*>(dx_add + row * C + p * V);
    }
  };
  fetch(r0 + warp);
  for (int64_t row = r0 + warp; row < r1; row += kLnBwdWarps) {
    uint4 cx[P], cd[P], ca[P];
#pragma unroll
    for (int i = 0; i < P; ++i) cx[i] = nx[i], cd[i] = nd[i], ca[i] = na[i];
    const float m = nm, rs = nrs;
    fetch(row + kLnBwdWarps);

    float s1 = 0.0f, s2 = 0.0f;  // Σ dnorm, Σ dnorm·norm
#pragma unroll
    for (int i = 0; i < P; ++i) {
      if (lane + 32 * i >= packs) continue;
      float fx[V], fd[V];
      unpack_vec<V, T>(cx[i], fx);
      unpack_vec<V, T>(cd[i], fd);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float dnorm = fd[k] * fw[i][k];
        s1 += dnorm;
        s2 += dnorm * ((fx[k] - m) * rs);
      }
    }
    const float dnorm_mean = warp_sum(s1) / float(C);
    const float dnorm_norm_mean = warp_sum(s2) / float(C);
    T* dxr = dx + row * C;
#pragma unroll
    for (int i = 0; i < P; ++i) {
      const int64_t p = lane + 32 * i;
      if (p >= packs) continue;
      float fx[V], fd[V], g[V];
      unpack_vec<V, T>(cx[i], fx);
      unpack_vec<V, T>(cd[i], fd);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float norm = (fx[k] - m) * rs;
        g[k] = (fd[k] * fw[i][k] - dnorm_mean - norm * dnorm_norm_mean) * rs;
        adw[i][k] += fd[k] * (fx[k] - m) * rs;
        adb[i][k] += fd[k];
      }
      if (dx_add) {
        float r[V];
        unpack_vec<V, T>(ca[i], r);
#pragma unroll
        for (int k = 0; k < V; ++k) g[k] += r[k];
      }
      if constexpr (kSumDx) {
#pragma unroll
        for (int k = 0; k < V; ++k) adx[i][k] += g[k];
      }
      store_vec_fast<V>(dxr + p * V, g);
    }
  }
#pragma unroll
  for (int i = 0; i < P; ++i) {
    const int64_t p = lane + 32 * i;
    if (p >= packs) continue;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      acc[warp * C + p * V + k] = adw[i][k];
      acc[(kLnBwdWarps + warp) * C + p * V + k] = adb[i][k];
      if constexpr (kSumDx) acc[(2 * kLnBwdWarps + warp) * C + p * V + k] = adx[i][k];
    }
  }
  __syncthreads();
  fold_warp_partials<kSumDx>(acc, C, partial);
}

// dweight, dbias and Σ dx from the blocks' partial rows in one launch: blockIdx.y = s sums the
// partial rows of sum s (partial + s·G·C) into out[s], in column_sum_kernel's fixed order.
template <typename T>
struct LnParamGradOutputs {
  T* out[3];
};
template <typename T>
__global__ void layernorm_param_grads_kernel(const float* __restrict__ partial, LnParamGradOutputs<T> outputs,
                                             int64_t G, int64_t C) {
  T* out = outputs.out[blockIdx.y];
  if (out) column_sum_block(partial + int64_t(blockIdx.y) * G * C, out, G, C, blockIdx.x);
}

}  // namespace

// ───────────────────────────── launchers ─────────────────────────────



namespace {

// The forward of LayerNorm (x2 == nullptr) or of the residual add and LayerNorm (sum = x + (x2 +
// x2_bias)).
template <typename T>
void launch_layernorm_forward(const T* x, const T* x2, const T* x2_bias, T* sum, const T* weight, const T* bias,
                              T* out, float* mean, float* rstd, int64_t N, int64_t C, float eps,
                              cudaStream_t stream) {
  constexpr int V = kVec<T>;
  const unsigned grid = grid_for(N, kLnRowsPerBlock);
  const bool vec = C % V == 0 && aligned16(x) && aligned16(weight) && aligned16(out) && (!bias || aligned16(bias)) &&
                   (!x2 || (aligned16(x2) && aligned16(sum))) && (!x2_bias || aligned16(x2_bias));
  const int64_t packs_per_lane = (C / V + 31) / 32;
  if (vec && packs_per_lane <= kLnMaxPacksPerLane) {
    auto launch = [&](auto kernel) {
      kernel<<<grid, kLnRowsPerBlock * 32, 0, stream>>>(x, x2, x2_bias, sum, weight, bias, out, mean, rstd, N, C,
                                                        eps);
    };
    auto pick = [&](auto add) {  // add: std::bool_constant (the CUDA sources are C++17)
      constexpr bool kAdd = decltype(add)::value;
      switch (packs_per_lane) {
        case 1: return launch(layernorm_forward_regs_kernel<V, 1, kAdd, T>);
        case 2: return launch(layernorm_forward_regs_kernel<V, 2, kAdd, T>);
        case 3: return launch(layernorm_forward_regs_kernel<V, 3, kAdd, T>);
        default: return launch(layernorm_forward_regs_kernel<V, kLnMaxPacksPerLane, kAdd, T>);
      }
    };
    if (x2) pick(std::true_type{});
    else pick(std::false_type{});
  } else {
    if (x2) {  // rows too long for registers, or not in 16-byte packs: the adds, then the LayerNorm
      if (x2_bias) {
        add_forward(x2, x2_bias, sum, N, C, stream);
        x2 = sum;
      }
      add_forward(x, x2, sum, 1, N * C, stream);
      x = sum;
    }
    if (vec) {
      layernorm_forward_kernel<V><<<grid, kLnRowsPerBlock * 32, 0, stream>>>(x, weight, bias, out, mean, rstd, N, C, eps);
    } else {
      layernorm_forward_kernel<1><<<grid, kLnRowsPerBlock * 32, 0, stream>>>(x, weight, bias, out, mean, rstd, N, C, eps);
    }
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

template <typename T>
void layernorm_forward(const T* x, const T* weight, const T* bias, T* out, float* mean, float* rstd, int64_t N,
                       int64_t C, float eps, cudaStream_t stream) {
  require(N >= 0 && C > 0, "layernorm_forward", "need N ≥ 0 and C > 0");
  if (N == 0) return;
  launch_layernorm_forward<T>(x, nullptr, nullptr, nullptr, weight, bias, out, mean, rstd, N, C, eps, stream);
}

template <typename T>
void add_layernorm_forward(const T* a, const T* b, const T* b_bias, T* sum, const T* weight, const T* bias, T* out,
                           float* mean, float* rstd, int64_t N, int64_t C, float eps, cudaStream_t stream) {
  require(N >= 0 && C > 0, "add_layernorm_forward", "need N ≥ 0 and C > 0");
  require(a && b && sum, "add_layernorm_forward", "a, b and sum must be given");
  if (N == 0) return;
  launch_layernorm_forward<T>(a, b, b_bias, sum, weight, bias, out, mean, rstd, N, C, eps, stream);
}

size_t layernorm_backward_scratch_floats(int64_t N, int64_t C) {
  return size_t(3 * ln_bwd_blocks(N) * C);
}

template <typename T>
void layernorm_backward(const T* x, const T* weight, const float* mean, const float* rstd, const T* dout,
                        const T* dx_add, T* dx, T* dweight, T* dbias, T* dx_colsum, int64_t N, int64_t C,
                        float* scratch, cudaStream_t stream) {
  require(N >= 0 && C > 0, "layernorm_backward", "need N ≥ 0 and C > 0");
  require(C <= kLnBwdMaxC, "layernorm_backward", "C > 7168 does not fit the shared-memory accumulators");
  require(scratch != nullptr, "layernorm_backward", "scratch is null");
  const int64_t G = ln_bwd_blocks(N);
  const int64_t rows_per_block = (N + G - 1) / G;
  const bool sum_dx = dx_colsum != nullptr;
  const size_t smem = size_t((sum_dx ? 3 : 2) * kLnBwdWarps * C) * sizeof(float);
  constexpr int V = kVec<T>;
  const bool vec = C % V == 0 && aligned16(x) && aligned16(weight) && aligned16(dout) && aligned16(dx) &&
                   (!dx_add || aligned16(dx_add));
  auto launch = [&](auto kernel) {
    if (smem > 48 * 1024)
      TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    // With N = 0 the blocks still run and write zero partials, so dweight/dbias come out zero.
    kernel<<<unsigned(G), kLnBwdWarps * 32, smem, stream>>>(x, weight, mean, rstd, dout, dx_add, dx, N, C,
                                                           rows_per_block, scratch);
    TG_CUDA_CHECK(cudaGetLastError());
  };
  auto pick = [&](auto sum_dx_constant) {
    constexpr bool kSumDx = decltype(sum_dx_constant)::value;
    const int64_t packs_per_lane = (C / V + 31) / 32;
    if (vec && packs_per_lane == 1) {
      launch(layernorm_backward_regs_kernel<V, 1, kSumDx, T>);
    } else if (vec && packs_per_lane == 2) {
      launch(layernorm_backward_regs_kernel<V, 2, kSumDx, T>);
    } else if (vec && packs_per_lane == 3) {
      launch(layernorm_backward_regs_kernel<V, 3, kSumDx, T>);
    } else if (vec && packs_per_lane == kLnBwdMaxPacksPerLane) {
      launch(layernorm_backward_regs_kernel<V, kLnBwdMaxPacksPerLane, kSumDx, T>);
    } else if (vec) {
      launch(layernorm_backward_kernel<V, kSumDx, T>);
    } else {
      launch(layernorm_backward_kernel<1, kSumDx, T>);
    }
  };
  if (sum_dx) pick(std::true_type{});
  else pick(std::false_type{});
  // The sums wanted, in the partials' order: dweight, dbias (its partials are always written), Σ dx.
  const LnParamGradOutputs<T> outputs{{dweight, dbias, dx_colsum}};
  const dim3 col_grid(unsigned((C + 31) / 32), sum_dx ? 3u : dbias ? 2u : 1u);
  layernorm_param_grads_kernel<<<col_grid, dim3(32, 32), 0, stream>>>(scratch, outputs, G, C);
  TG_CUDA_CHECK(cudaGetLastError());
}

#define TG_INSTANTIATE(T)                                                                                       \
  template void layernorm_forward<T>(const T*, const T*, const T*, T*, float*, float*, int64_t, int64_t, float, \
                                     cudaStream_t);                                                             \
  template void add_layernorm_forward<T>(const T*, const T*, const T*, T*, const T*, const T*, T*, float*, float*, \
                                         int64_t, int64_t, float, cudaStream_t);                                  \
  template void layernorm_backward<T>(const T*, const T*, const float*, const float*, const T*, const T*, T*,  \
                                      T*, T*, T*, int64_t, int64_t, float*, cudaStream_t);
TG_INSTANTIATE(float)
TG_INSTANTIATE(tg::bf16)
#undef TG_INSTANTIATE

}  // namespace tg::cuda
