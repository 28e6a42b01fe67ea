// The counter-based hash behind dropout masks and deterministic initialisation. One definition
// for host and device (nvcc sees __host__ __device__), so a GPU dropout mask equals the CPU's
// bit for bit for the same (seed, index).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define TG_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TG_HOST_DEVICE inline
#endif

namespace tg::cpu {

// splitmix64 finaliser: a counter-based hash with good avalanche.
TG_HOST_DEVICE uint64_t hash64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from the top 24 bits: exact in fp32, so host and device agree bitwise.
TG_HOST_DEVICE float uniform_from(uint64_t seed, uint64_t index) {
  return float(hash64(seed ^ hash64(index)) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace tg::cpu

#undef TG_HOST_DEVICE
