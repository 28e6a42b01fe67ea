// See tma_probe.h. Compiled for sm_90a only (CMakeLists.txt: test_cuda_sm90a).
#include "tests/cuda/tma_probe.h"

#include <cuda_runtime.h>

#include "kernels/cuda/flash_attention/sm90_ptx.cuh"
#include "kernels/cuda/tma.h"

namespace tg::testing {
namespace {

namespace sm90 = tg::cuda::flash::sm90;
constexpr int kBox = 64;                         // rows and bf16 columns of a box: 128-byte rows
constexpr uint32_t kBoxBytes = kBox * kBox * 2;  // 8 KiB

// With sm90_ptx.cuh's primitives, as the attention kernels' producers use them.
__global__ void __launch_bounds__(128) tma_probe_kernel(const __grid_constant__ CUtensorMap map, int3 box0, int3 box1,
                                                        uint16_t* out0, uint16_t* out1) {
  extern __shared__ unsigned char raw[];
  unsigned char* tile = sm90::align_to_swizzle_atom(raw);  // the 128-byte swizzle needs 1024-byte alignment
  __shared__ uint64_t full;                                 // the mbarrier: one arrival plus the bytes
  if (threadIdx.x == 0) {
    sm90::mbarrier_init(&full, 1);
    sm90::fence_barrier_init();  // visible to the async proxy
  }
  __syncthreads();
  for (int phase = 0; phase < 2; ++phase) {
    const int3 at = phase == 0 ? box0 : box1;  // (column, head, row): the innermost coordinate first
    if (threadIdx.x == 0) {
      sm90::mbarrier_arrive_expect_tx(&full, kBoxBytes);
      sm90::tma_load_4d(tile, &map, at.x, at.y, at.z, 0, &full);
    }
    sm90::mbarrier_wait(&full, uint32_t(phase));
    uint16_t* out = phase == 0 ? out0 : out1;
    for (int i = threadIdx.x; i < kBox * kBox; i += blockDim.x)
      out[i] = *reinterpret_cast<const uint16_t*>(tile + sm90::swizzled_offset(uint32_t(i / kBox), uint32_t(i % kBox)));
    sm90::fence_async_shared();  // these generic reads before the next load's async-proxy writes
    __syncthreads();
  }
}

}  // namespace

bool run_tma_probe(const uint16_t* src, int rows, int head_dim, int heads, int row_stride, const int (&head)[2],
                   const int (&row0)[2], const int (&col0)[2], uint16_t* out0, uint16_t* out1) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (major != 9 || minor != 0) return false;
  // One sequence (depth 1) of `heads` heads.
  const CUtensorMap map =
      tg::cuda::make_bf16_head_tensor_map(src, uint64_t(head_dim), uint64_t(heads), uint64_t(rows), 1,
                                          uint64_t(row_stride), uint64_t(rows) * uint64_t(row_stride), kBox);
  tma_probe_kernel<<<1, 128, kBoxBytes + 1024>>>(map, make_int3(col0[0], head[0], row0[0]),
                                                 make_int3(col0[1], head[1], row0[1]), out0, out1);
  return true;
}

}  // namespace tg::testing
