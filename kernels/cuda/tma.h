// Tensor maps for the tensor copy engine (TMA): the descriptor a cp.async.bulk.tensor instruction
// reads to copy a box of a global tensor into shared memory. Encoded on the host by the driver's
// cuTensorMapEncodeTiled, reached through the runtime (cudaGetDriverEntryPointByVersion), so
// nothing links libcuda. Passed to a kernel as a __grid_constant__ parameter.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace tg::cuda {

// A 3-D map over bf16 elements: element (c, r, z) at base + z·z_stride + r·row_stride + c
// (strides in elements, each a multiple of 8; base 16-byte aligned), for c < cols, r < rows,
// z < depth. Boxes are 64 × box_rows × 1 (64 bf16 = one 128-byte row, the 128-byte swizzle of
// kernels/cuda/flash_attention/wgmma.cuh), and elements out of range read as zero — so a box
// that reaches past the end of one sequence (r ≥ rows) is zero-filled, never the next one's rows.
// Throws std::runtime_error naming the cause if the driver lacks the entry point or rejects
// the map.
CUtensorMap make_bf16_tensor_map(const void* base, uint64_t cols, uint64_t rows, uint64_t depth, uint64_t row_stride,
                                 uint64_t z_stride, uint32_t box_rows);

}  // namespace tg::cuda
