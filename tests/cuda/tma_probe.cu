// See tma_probe.h. Compiled for sm_90a only (CMakeLists.txt: test_cuda_sm90a).
#include "tests/cuda/tma_probe.h"

#include <cuda.h>  // CUtensorMap and its enums (the function itself comes from the runtime, below)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/flash_attention/wgmma.cuh"

namespace tg::testing {
namespace {

namespace sm90 = tg::cuda::flash::sm90;
constexpr int kBox = 64;                      // rows and bf16 columns of a box: 128-byte rows
constexpr uint32_t kBoxBytes = kBox * kBox * 2;  // 8 KiB

__device__ uint32_t shared_address(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__global__ void __launch_bounds__(128) tma_probe_kernel(const __grid_constant__ CUtensorMap map, int2 box0, int2 box1,
                                                        uint16_t* out0, uint16_t* out1) {
  extern __shared__ unsigned char raw[];
  unsigned char* tile = sm90::align_to_swizzle_atom(raw);  // the 128-byte swizzle needs 1024-byte alignment
  __shared__ uint64_t full;                                 // the mbarrier: one arrival plus the bytes
  const uint32_t bar = shared_address(&full);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");  // visible to the async proxy
  }
  __syncthreads();
  for (int phase = 0; phase < 2; ++phase) {
    const int2 at = phase == 0 ? box0 : box1;  // (column, row): the innermost coordinate first
    if (threadIdx.x == 0) {
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(kBoxBytes) : "memory");
      asm volatile(
          "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
              shared_address(tile)),
          "l"(reinterpret_cast<uint64_t>(&map)), "r"(at.x), "r"(at.y), "r"(bar)
          : "memory");
    }
    uint32_t done = 0;
    while (!done)
      asm volatile(
          "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
          : "=r"(done)
          : "r"(bar), "r"(uint32_t(phase))
          : "memory");
    uint16_t* out = phase == 0 ? out0 : out1;
    for (int i = threadIdx.x; i < kBox * kBox; i += blockDim.x)
      out[i] = *reinterpret_cast<const uint16_t*>(tile + sm90::swizzled_offset(uint32_t(i / kBox), uint32_t(i % kBox)));
    sm90::fence_async_shared();  // these generic reads before the next load's async-proxy writes
    __syncthreads();
  }
}

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr)
      throw std::runtime_error("tma_probe: the driver has no cuTensorMapEncodeTiled (" +
                               std::string(cudaGetErrorString(err)) + ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

bool run_tma_probe(const uint16_t* src, int rows, int cols, int row_stride, const int (&row0)[2],
                   const int (&col0)[2], uint16_t* out0, uint16_t* out1) {
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (major != 9 || minor != 0) return false;

  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};  // innermost first
  const cuuint64_t strides[1] = {cuuint64_t(row_stride) * 2};        // bytes between rows
  const cuuint32_t box[2] = {kBox, kBox};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(src), dims,
                                    strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                    CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);  // out of bounds: zeros
  if (r != CUDA_SUCCESS) throw std::runtime_error("tma_probe: cuTensorMapEncodeTiled failed, CUresult " + std::to_string(int(r)));
  tma_probe_kernel<<<1, 128, kBoxBytes + 1024>>>(map, make_int2(col0[0], row0[0]), make_int2(col0[1], row0[1]), out0,
                                                 out1);
  return true;
}

}  // namespace tg::testing
