// CPU dropout: the keep mask is a pure function of (seed, element index), so the backward
// regenerates it instead of storing it, and a GPU kernel can produce the same mask.
#pragma once
#include <cstdint>

namespace tg::cpu {

// splitmix64 finaliser: a counter-based hash with good avalanche.
inline uint64_t hash64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// Uniform in [0, 1) from the top 24 bits.
inline float uniform_from(uint64_t seed, uint64_t index) {
  return float(hash64(seed ^ hash64(index)) >> 40) * (1.0f / 16777216.0f);
}

// out = x · keep / (1 − p), keep = (u ≥ p). Used for both directions (x = dout in the backward).
template <typename T>
void dropout_apply(const T* x, T* out, int64_t n, float p, uint64_t seed) {
  const T scale = T(1) / T(1 - p);
#pragma omp parallel for if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) out[i] = uniform_from(seed, uint64_t(i)) >= p ? x[i] * scale : T(0);
}

}  // namespace tg::cpu
