// CPU dropout: the keep mask is a pure function of (seed, element index), so the backward
// regenerates it instead of storing it, and a GPU kernel can produce the same mask.
#pragma once
#include <cstdint>

#include "kernels/cpu/hash.h"

namespace tg::cpu {

// out = x · keep / (1 − p), keep = (u ≥ p), u drawn for element first + i. Used for both
// directions (x = dout in the backward). `first` places x inside a larger tensor (a rank's rows
// of a global batch), so a row's mask does not depend on how the batch is split.
template <typename T>
void dropout_apply(const T* x, T* out, int64_t n, float p, uint64_t seed, uint64_t first = 0) {
  const T scale = T(1) / T(1 - p);
#pragma omp parallel for if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) out[i] = uniform_from(seed, first + uint64_t(i)) >= p ? x[i] * scale : T(0);
}

}  // namespace tg::cpu
