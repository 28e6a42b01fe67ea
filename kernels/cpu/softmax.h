// CPU softmax over the last dimension, and the fused softmax–cross-entropy.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/elementwise.h"

namespace tg::cpu {

// x, out: (N, C). Rows that are entirely -inf (fully masked) give zeros, not NaN.
template <typename T>
void softmax_forward(const T* x, T* out, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    T* o = out + n * C;
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t c = 0; c < C; ++c) mx = xr[c] > mx ? xr[c] : mx;
    if (mx == -std::numeric_limits<T>::infinity()) {
      for (int64_t c = 0; c < C; ++c) o[c] = 0;
      continue;
    }
    T sum = 0;
    for (int64_t c = 0; c < C; ++c) {
      o[c] = std::exp(xr[c] - mx);
      sum += o[c];
    }
    T inv = T(1) / sum;
    for (int64_t c = 0; c < C; ++c) o[c] *= inv;
  }
}

// dx = y ∘ (dy − rowsum(dy ∘ y)).
template <typename T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* yr = y + n * C;
    const T* dyr = dy + n * C;
    T dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += yr[c] * dyr[c];
    T* dxr = dx + n * C;
    for (int64_t c = 0; c < C; ++c) dxr[c] = yr[c] * (dyr[c] - dot);
  }
}

// The softmax of the materialised attention, fused with its scale and causal mask:
// p (batch, T, T) = softmax over j of scale · s[i, j], keys j > i removed when causal.
template <typename T>
void attention_softmax_forward(const T* s, T* p, int64_t batch, int64_t Tn, T scale, bool causal) {
#pragma omp parallel for if (batch * Tn * Tn > kParallelGrain)
  for (int64_t row = 0; row < batch * Tn; ++row) {
    const int64_t valid = causal ? row % Tn + 1 : Tn;
    const T* sr = s + row * Tn;
    T* pr = p + row * Tn;
    T mx = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < valid; ++j) mx = sr[j] * scale > mx ? sr[j] * scale : mx;
    T sum = 0;
    for (int64_t j = 0; j < valid; ++j) sum += std::exp(sr[j] * scale - mx);
    for (int64_t j = 0; j < Tn; ++j) pr[j] = j < valid ? std::exp(sr[j] * scale - mx) / sum : T(0);
  }
}

// ds = scale · p ∘ (dp − rowsum(dp ∘ p)); masked entries have p = 0, hence ds = 0.
template <typename T>
void attention_softmax_backward(const T* p, const T* dp, T* ds, int64_t batch, int64_t Tn, T scale) {
#pragma omp parallel for if (batch * Tn * Tn > kParallelGrain)
  for (int64_t row = 0; row < batch * Tn; ++row) {
    const T* pr = p + row * Tn;
    const T* dr = dp + row * Tn;
    T dot = 0;
    for (int64_t j = 0; j < Tn; ++j) dot += pr[j] * dr[j];
    for (int64_t j = 0; j < Tn; ++j) ds[row * Tn + j] = scale * pr[j] * (dr[j] - dot);
  }
}

// logits (N, V), targets (N); rows whose target == ignore_index do not count.
// Writes lse (N) for the backward and per-row losses (N, zero when ignored); returns
// the number of counted rows. The mean is taken by the caller in a fixed order.
template <typename T>
int64_t cross_entropy_forward(const T* logits, const int32_t* targets, T* lse, T* row_loss,
                              int64_t N, int64_t V, int32_t ignore_index) {
  int64_t counted = 0;
#pragma omp parallel for reduction(+ : counted) if (N * V > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* lr = logits + n * V;
    T mx = lr[0];
    for (int64_t v = 1; v < V; ++v) mx = lr[v] > mx ? lr[v] : mx;
    T sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(lr[v] - mx);
    lse[n] = mx + std::log(sum);
    if (targets[n] == ignore_index) {
      row_loss[n] = 0;
    } else {
      row_loss[n] = lse[n] - lr[targets[n]];
      counted += 1;
    }
  }
  return counted;
}

// dlogits = (softmax(logits) − onehot(target)) · dloss / counted; ignored rows get zeros.
template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const T* lse, T dloss,
                            int64_t counted, T* dlogits, int64_t N, int64_t V, int32_t ignore_index) {
  T scale = counted > 0 ? dloss / T(counted) : T(0);
#pragma omp parallel for if (N * V > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* lr = logits + n * V;
    T* dr = dlogits + n * V;
    if (targets[n] == ignore_index) {
      for (int64_t v = 0; v < V; ++v) dr[v] = 0;
      continue;
    }
    T l = lse[n];
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) dr[v] = std::exp(lr[v] - l) * scale;
    dr[targets[n]] -= scale;
  }
}

}  // namespace tg::cpu
