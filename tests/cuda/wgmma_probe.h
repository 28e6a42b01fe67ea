// A one-warpgroup sm_90a kernel that exercises kernels/cuda/flash_attention/wgmma.cuh the way the
// attention kernels will use it (tests/cuda/test_wgmma.cpp checks its results on the CPU).
#pragma once
#include <cstdint>

namespace tg::testing {

// a, b, v: 64 × 64 bf16 (raw bits), row-major, device memory. Writes, fp32 row-major 64 × 64:
//   s = a · bᵀ — both operands K-major from swizzled shared memory (S = Q Kᵀ's form), 4 k-steps;
//   o = a · v  — a from registers in the A-fragment layout, v MN-major from swizzled shared
//                memory (O = P V's form), 4 k-steps;
//   o2 (64 × 128) = a · v2 with v2 64 × 128 (head dim 128): N = 128, v2 in two 64-column panels;
//   o3 (64 × 96) = a · v2[:, 0:96] (head dim 96 on the d 128 tiles): N = 96 over the same two
//                panels, the first whole and half of the second.
// Returns false (and runs nothing) where the device is not compute capability 9.0, the only one
// sm_90a code runs on.
bool run_wgmma_probe(const uint16_t* a, const uint16_t* b, const uint16_t* v, const uint16_t* v2, float* s, float* o,
                     float* o2, float* o3);

}  // namespace tg::testing
