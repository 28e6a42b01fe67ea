// CPU LayerNorm, fused: one pass for the statistics, mean and rstd saved for the backward.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/elementwise.h"

namespace tg::cpu {

// x, out: (N, C); weight, bias: (C) (bias may be null); mean, rstd: (N).
template <typename T>
void layernorm_forward(const T* x, const T* weight, const T* bias, T* out, T* mean, T* rstd,
                       int64_t N, int64_t C, double eps) {
#pragma omp parallel for if (N * C > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    T m = 0;
    for (int64_t c = 0; c < C; ++c) m += xr[c];
    m /= T(C);
    T var = 0;
    for (int64_t c = 0; c < C; ++c) var += (xr[c] - m) * (xr[c] - m);
    var /= T(C);
    T rs = T(1) / std::sqrt(var + T(eps));
    T* o = out + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = (xr[c] - m) * rs * weight[c] + (bias ? bias[c] : T(0));
    mean[n] = m;
    rstd[n] = rs;
  }
}

// dx (N, C) is overwritten; dweight, dbias (C) are overwritten (dbias may be null).
// Rows are reduced in a fixed order so the result is bitwise reproducible.
template <typename T>
void layernorm_backward(const T* x, const T* weight, const T* mean, const T* rstd, const T* dout,
                        T* dx, T* dweight, T* dbias, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C > kParallelGrain)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const T* dr = dout + n * C;
    T m = mean[n], rs = rstd[n];
    // dnorm = dout·w; dx = rstd·(dnorm − mean(dnorm) − norm·mean(dnorm·norm))
    T dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int64_t c = 0; c < C; ++c) {
      T norm = (xr[c] - m) * rs;
      T dnorm = dr[c] * weight[c];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= T(C);
    dnorm_norm_mean /= T(C);
    T* dxr = dx + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      T norm = (xr[c] - m) * rs;
      dxr[c] = (dr[c] * weight[c] - dnorm_mean - norm * dnorm_norm_mean) * rs;
    }
  }
  for (int64_t c = 0; c < C; ++c) {
    dweight[c] = 0;
    if (dbias) dbias[c] = 0;
  }
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    const T* dr = dout + n * C;
    T m = mean[n], rs = rstd[n];
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dweight[c] += dr[c] * (xr[c] - m) * rs;
    if (dbias) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) dbias[c] += dr[c];
    }
  }
}

}  // namespace tg::cpu
