// CPU AdamW over one contiguous range of the flat parameter buffer, and the global grad norm.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace tg::cpu {

// Decoupled weight decay (Loshchilov & Hutter): p ← p − lr·(m̂/(√v̂ + eps) + wd·p).
// bias_correction1/2 = 1 − β1^t, 1 − β2^t for the step t being taken. The gradient is read as
// g·grad_scale (gradient clipping's factor, applied here rather than by a pass of its own).
inline void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr,
                         float beta1, float beta2, float eps, float weight_decay,
                         float bias_correction1, float bias_correction2, float grad_scale = 1.0f) {
#pragma omp parallel for simd if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i] * grad_scale;
    float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float mhat = mi / bias_correction1;
    float vhat = vi / bias_correction2;
    p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * p[i]);
  }
}

// Sum of squares in double, in fixed-size blocks combined in order: bitwise reproducible
// for any thread count.
inline double sum_squares(const float* g, int64_t n) {
  constexpr int64_t kBlock = 4096;
  int64_t nblocks = (n + kBlock - 1) / kBlock;
  double total = 0;
  // Partial sums per block are independent; the final combine is serial.
  std::vector<double> partial(static_cast<size_t>(nblocks));
#pragma omp parallel for if (n > (1 << 16))
  for (int64_t b = 0; b < nblocks; ++b) {
    double s = 0;
    int64_t end = (b + 1) * kBlock < n ? (b + 1) * kBlock : n;
    for (int64_t i = b * kBlock; i < end; ++i) s += double(g[i]) * double(g[i]);
    partial[b] = s;
  }
  for (int64_t b = 0; b < nblocks; ++b) total += partial[b];
  return total;
}

inline void scale_inplace(float* x, float s, int64_t n) {
#pragma omp parallel for simd if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

}  // namespace tg::cpu
