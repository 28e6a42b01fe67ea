// CPU AdamW over one contiguous range of the flat parameter buffer, and the global grad norm.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__CUDACC__)
#define TG_HOST_DEVICE __host__ __device__
#else
#define TG_HOST_DEVICE
#endif

namespace tg::cpu {

// What a training step's update depends on that is known only once its loss and gradients are:
// whether both are finite and, from that, AdamW's step count, bias corrections and clipping
// factor. Decided where the gradients are (on a GPU, by a one-thread kernel), so that a step
// needs no host read: the host reads this state and the steps' records when it logs.
struct StepDecision {
  double clip = 1.0;               // clip_factor(norm, max_norm): AdamW reads g·clip
  double bias_correction1 = 1.0;   // 1 − β1^t, 1 − β2^t for the update being taken
  double bias_correction2 = 1.0;
  int64_t steps = 0;               // AdamW updates taken
  int32_t bad_in_row = 0;          // consecutive steps with a non-finite loss or gradient norm
  int32_t skip = 0;                // this step's update is skipped
  int32_t stopped = 0;             // bad_in_row reached train.max_bad_steps: no update until the host stops
  int32_t reserved = 0;
};

// The decision for a step with mean loss `loss` and squared gradient norm `sum_squares`; the same
// expressions as optim::clip_factor and AdamW::step, so both placements decide alike.
TG_HOST_DEVICE inline void decide_step(double loss, double sum_squares, double max_norm, double beta1, double beta2,
                                       int64_t max_bad_steps, StepDecision& d) {
  const double norm = sqrt(sum_squares);
#if defined(__CUDA_ARCH__)
  const bool finite = isfinite(loss) && isfinite(norm);
#else
  const bool finite = std::isfinite(loss) && std::isfinite(norm);
#endif
  if (d.stopped) {
    d.skip = 1;
    return;
  }
  if (!finite) {
    d.skip = 1;
    ++d.bad_in_row;
    if (d.bad_in_row >= max_bad_steps) d.stopped = 1;
    return;
  }
  d.skip = 0;
  d.bad_in_row = 0;
  ++d.steps;
  d.bias_correction1 = 1.0 - pow(beta1, double(d.steps));
  d.bias_correction2 = 1.0 - pow(beta2, double(d.steps));
  d.clip = max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

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
