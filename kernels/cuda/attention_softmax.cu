// Fused scale + causal mask + softmax over attention scores (and its backward): one warp per
// row, fp32 arithmetic, so the materialised path keeps only P instead of S, mask(S) and P.
#include <cmath>

#include "kernels/cuda/attention_softmax.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"

namespace tg::cuda {

namespace {

constexpr int kWarpsPerBlock = 8;

// ── kernels ──

template <typename T>
__global__ void attention_softmax_forward_kernel(const T* __restrict__ s, T* __restrict__ p, int64_t rows,
                                                 int64_t Tn, float scale, bool causal) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; row < rows;
       row += int64_t(gridDim.x) * kWarpsPerBlock) {
    const int64_t i = row % Tn;                  // query position
    const int64_t valid = causal ? i + 1 : Tn;   // keys 0..valid-1 take part
    const T* sr = s + row * Tn;
    T* pr = p + row * Tn;
    float mx = -INFINITY;
    for (int64_t j = lane; j < valid; j += 32) mx = fmaxf(mx, to_float(sr[j]) * scale);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int64_t j = lane; j < valid; j += 32) sum += expf(to_float(sr[j]) * scale - mx);
    const float inv = 1.0f / warp_sum(sum);
    for (int64_t j = lane; j < Tn; j += 32)
      pr[j] = from_float<T>(j < valid ? expf(to_float(sr[j]) * scale - mx) * inv : 0.0f);
  }
}

template <typename T>
__global__ void attention_softmax_backward_kernel(const T* __restrict__ p, const T* __restrict__ dp,
                                                  T* __restrict__ ds, int64_t rows, int64_t Tn, float scale) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; row < rows;
       row += int64_t(gridDim.x) * kWarpsPerBlock) {
    const T* pr = p + row * Tn;
    const T* dr = dp + row * Tn;
    float dot = 0.0f;
    for (int64_t j = lane; j < Tn; j += 32) dot += to_float(pr[j]) * to_float(dr[j]);
    dot = warp_sum(dot);
    T* o = ds + row * Tn;
    for (int64_t j = lane; j < Tn; j += 32) {
      const float pj = to_float(pr[j]);
      o[j] = from_float<T>(scale * pj * (to_float(dr[j]) - dot));
    }
  }
}

}  // namespace

// ── launchers ──

template <typename T>
void attention_softmax_forward(const T* s, T* p, int64_t batch, int64_t Tn, float scale, bool causal,
                               cudaStream_t stream) {
  const int64_t rows = batch * Tn;
  if (rows == 0) return;
  attention_softmax_forward_kernel<<<grid_for(rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
      s, p, rows, Tn, scale, causal);
  TG_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void attention_softmax_backward(const T* p, const T* dp, T* ds, int64_t batch, int64_t Tn, float scale,
                                cudaStream_t stream) {
  const int64_t rows = batch * Tn;
  if (rows == 0) return;
  attention_softmax_backward_kernel<<<grid_for(rows, kWarpsPerBlock), 32 * kWarpsPerBlock, 0, stream>>>(
      p, dp, ds, rows, Tn, scale);
  TG_CUDA_CHECK(cudaGetLastError());
}

template void attention_softmax_forward<float>(const float*, float*, int64_t, int64_t, float, bool, cudaStream_t);
template void attention_softmax_forward<bf16>(const bf16*, bf16*, int64_t, int64_t, float, bool, cudaStream_t);
template void attention_softmax_backward<float>(const float*, const float*, float*, int64_t, int64_t, float,
                                                cudaStream_t);
template void attention_softmax_backward<bf16>(const bf16*, const bf16*, bf16*, int64_t, int64_t, float,
                                               cudaStream_t);

}  // namespace tg::cuda
