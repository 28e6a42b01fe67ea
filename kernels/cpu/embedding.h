// CPU embedding lookup and its deterministic scatter-add backward.
#pragma once
#include <cstdint>

namespace tg::cpu {

// out (N, C) = weight[ids[n]] for weight (V, C); ids were range-checked by the op.
template <typename T>
void embedding_forward(const T* weight, const int32_t* ids, T* out, int64_t N, int64_t C) {
#pragma omp parallel for if (N * C > (1 << 15))
  for (int64_t n = 0; n < N; ++n) {
    const T* w = weight + int64_t(ids[n]) * C;
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) o[c] = w[c];
  }
}

// dweight (V, C) is overwritten with the sum of dout rows per id. Tokens are visited in order
// (parallel only over channels), so repeated ids sum in a fixed order: bitwise reproducible.
template <typename T>
void embedding_backward(const T* dout, const int32_t* ids, T* dweight, int64_t N, int64_t V,
                        int64_t C) {
  for (int64_t i = 0; i < V * C; ++i) dweight[i] = 0;
  for (int64_t n = 0; n < N; ++n) {
    T* w = dweight + int64_t(ids[n]) * C;
    const T* d = dout + n * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) w[c] += d[c];
  }
}

}  // namespace tg::cpu
