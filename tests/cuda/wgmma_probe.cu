// See wgmma_probe.h. Compiled for sm_90a only (CMakeLists.txt: test_cuda_sm90a).
#include "tests/cuda/wgmma_probe.h"

#include <cuda_runtime.h>

#include "kernels/cuda/flash_attention/wgmma.cuh"

namespace tg::testing {
namespace {

namespace sm90 = tg::cuda::flash::sm90;
constexpr int kN = 64;
constexpr int kTileBytes = kN * kN * 2;  // 8 KiB: eight 1024-byte swizzle atoms

__device__ uint32_t pack(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

// d's fragment (see wgmma.cuh) to a row-major 64 × N matrix.
template <int N>
__device__ void store_accumulator(const float (&d)[N / 2], float* out) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * warp + lane / 4 + 8 * (e / 2), col = 8 * j + 2 * (lane % 4) + e % 2;
      out[row * N + col] = d[4 * j + e];
    }
}

__global__ void __launch_bounds__(128) wgmma_probe_kernel(const uint16_t* a, const uint16_t* b, const uint16_t* v,
                                                          const uint16_t* v2, float* s_out, float* o_out,
                                                          float* o2_out, float* o3_out) {
  extern __shared__ unsigned char raw[];
  unsigned char* base = raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(raw)) & 1023)) & 1023);
  unsigned char *sa = base, *sb = base + kTileBytes, *sv = base + 2 * kTileBytes;
  unsigned char* sv2 = base + 3 * kTileBytes;  // two panels: columns 0-63, then 64-127
  for (int i = threadIdx.x; i < kN * kN; i += blockDim.x) {
    const uint32_t off = sm90::swizzled_offset(uint32_t(i / kN), uint32_t(i % kN));
    *reinterpret_cast<uint16_t*>(sa + off) = a[i];
    *reinterpret_cast<uint16_t*>(sb + off) = b[i];
    *reinterpret_cast<uint16_t*>(sv + off) = v[i];
  }
  for (int i = threadIdx.x; i < kN * 2 * kN; i += blockDim.x) {
    const int row = i / (2 * kN), col = i % (2 * kN), panel = col / kN;
    *reinterpret_cast<uint16_t*>(sv2 + panel * kTileBytes + sm90::swizzled_offset(uint32_t(row), uint32_t(col % kN))) =
        v2[i];
  }
  sm90::fence_async_shared();  // the tiles were written by the generic proxy; wgmma reads by the async one
  __syncthreads();

  // S = A Bᵀ: k-step k reads columns 16k … 16k + 15 of both tiles, 32 bytes along their rows.
  float s[32];
  sm90::wgmma_fence();
  for (int k = 0; k < kN / 16; ++k)
    sm90::wgmma_m64n64k16_ss<0>(s, sm90::k_major_descriptor(sa + 32 * k), sm90::k_major_descriptor(sb + 32 * k),
                                k > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  store_accumulator<kN>(s, s_out);

  // O = A V: A's fragments straight from global memory; k-step k reads rows 16k … 16k + 15 of V.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = 16 * warp + lane / 4;
  uint32_t af[kN / 16][4];
  for (int k = 0; k < kN / 16; ++k) {
    const int c = 16 * k + 2 * (lane % 4);
    af[k][0] = pack(a[r * kN + c], a[r * kN + c + 1]);
    af[k][1] = pack(a[(r + 8) * kN + c], a[(r + 8) * kN + c + 1]);
    af[k][2] = pack(a[r * kN + c + 8], a[r * kN + c + 9]);
    af[k][3] = pack(a[(r + 8) * kN + c + 8], a[(r + 8) * kN + c + 9]);
  }
  float o[32];
  sm90::wgmma_fence();
  for (int k = 0; k < kN / 16; ++k)
    sm90::wgmma_m64n64k16_rs<1>(o, af[k], sm90::mn_major_descriptor(sv + 16 * 128 * k, kTileBytes), k > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  store_accumulator<kN>(o, o_out);

  float o2[2 * kN / 2];
  sm90::wgmma_fence();
  for (int k = 0; k < kN / 16; ++k)
    sm90::wgmma_m64n128k16_rs<1>(o2, af[k], sm90::mn_major_descriptor(sv2 + 16 * 128 * k, kTileBytes), k > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  store_accumulator<2 * kN>(o2, o2_out);

  float o3[96 / 2];
  sm90::wgmma_fence();
  for (int k = 0; k < kN / 16; ++k)
    sm90::wgmma_m64n96k16_rs<1>(o3, af[k], sm90::mn_major_descriptor(sv2 + 16 * 128 * k, kTileBytes), k > 0);
  sm90::wgmma_commit();
  sm90::wgmma_wait<0>();
  store_accumulator<96>(o3, o3_out);
}

}  // namespace

bool run_wgmma_probe(const uint16_t* a, const uint16_t* b, const uint16_t* v, const uint16_t* v2, float* s, float* o,
                     float* o2, float* o3) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (major != 9 || minor != 0) return false;
  wgmma_probe_kernel<<<1, 128, 5 * kTileBytes + 1024>>>(a, b, v, v2, s, o, o2, o3);
  return true;
}

}  // namespace tg::testing
