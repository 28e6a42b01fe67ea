// See tma.h.
#include "kernels/cuda/tma.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace tg::cuda {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr)
      throw std::runtime_error(std::string("cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled) failed (") +
                               cudaGetErrorString(err) + ") at " __FILE__ ":" + std::to_string(__LINE__) +
                               ": the driver is older than CUDA 12.0's");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

CUtensorMap make_bf16_head_tensor_map(const void* base, uint64_t head_dim, uint64_t heads, uint64_t rows,
                                      uint64_t depth, uint64_t row_stride, uint64_t z_stride, uint32_t box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[4] = {head_dim, heads, rows, depth};                     // innermost first
  const cuuint64_t strides[3] = {head_dim * 2, row_stride * 2, z_stride * 2};  // bytes, of dims 1–3
  const cuuint32_t box[4] = {64, 1, box_rows, 1};                              // 64 bf16: one swizzled row
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides,
                                    box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);  // out of range: zeros
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuTensorMapEncodeTiled failed with CUresult " + std::to_string(int(r)) + " at " __FILE__
                             ":" + std::to_string(__LINE__) + " (head dim " + std::to_string(head_dim) + ", heads " +
                             std::to_string(heads) + ", rows " + std::to_string(rows) + ", depth " +
                             std::to_string(depth) + ", row stride " + std::to_string(row_stride) + ", box rows " +
                             std::to_string(box_rows) + ")");
  return map;
}

}  // namespace tg::cuda
