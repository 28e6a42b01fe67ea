// The counter-based hash behind dropout masks, callable on host and device, bit-identical to
// kernels/cpu/dropout.h so a mask drawn on the GPU equals the CPU's for the same (seed, index).
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define TG_HASH_HD __host__ __device__ __forceinline__
#else
#define TG_HASH_HD inline
#endif

namespace tg::cuda {

// splitmix64 finaliser (same constants and steps as tg::cpu::hash64).
TG_HASH_HD uint64_t hash64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, 1) from the top 24 bits: exact in fp32, so host and device agree bitwise.
TG_HASH_HD float uniform_from(uint64_t seed, uint64_t index) {
  return float(hash64(seed ^ hash64(index)) >> 40) * (1.0f / 16777216.0f);
}

}  // namespace tg::cuda

#undef TG_HASH_HD
