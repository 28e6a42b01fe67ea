// Tensor maps for the tensor copy engine (TMA): the descriptor a cp.async.bulk.tensor instruction
// reads to copy a box of a global tensor into shared memory (tma_load_4d) or back out of it
// (tma_store_4d: the kernels' output tiles). Encoded on the host by the driver's
// cuTensorMapEncodeTiled, reached through the runtime (cudaGetDriverEntryPointByVersion), so
// nothing links libcuda. Passed to a kernel as a __grid_constant__ parameter.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace tg::cuda {

// A 4-D map over a bf16 attention tensor (B, T, H, D) with a token stride: element (c, h, r, z)
// at base + z·z_stride + r·row_stride + h·head_dim + c (strides in elements, each a multiple of
// 8, as is head_dim; base 16-byte aligned), for c < head_dim, h < heads, r < rows, z < depth.
// Boxes are 64 × 1 × box_rows × 1 (64 bf16 = one 128-byte row, the 128-byte swizzle of
// kernels/cuda/flash_attention/sm90_ptx.cuh), and elements out of range read as zero — so a box that
// reaches past the end of one sequence (r ≥ rows) is zero-filled, never the next one's rows, and
// one that reaches past a head's last column (c ≥ head_dim: head dim 96 read as two 64-column
// panels) is zero-filled, never the next head's columns. A stored box's elements out of range
// are not written, likewise.
// Throws std::runtime_error naming the cause if the driver lacks the entry point or rejects
// the map.
CUtensorMap make_bf16_head_tensor_map(const void* base, uint64_t head_dim, uint64_t heads, uint64_t rows,
                                      uint64_t depth, uint64_t row_stride, uint64_t z_stride, uint32_t box_rows);

}  // namespace tg::cuda
