// A one-warpgroup sm_90a kernel that loads tiles with the tensor copy engine (TMA) the way the
// attention kernels' producer does (tests/cuda/test_tma.cpp checks them on the CPU): a tensor
// map over a strided bf16 matrix of heads from kernels/cuda/tma.h, the 128-byte swizzle of
// kernels/cuda/flash_attention/sm90_ptx.cuh, rows past the end and columns past a head's zero-filled, completion counted in
// bytes on an mbarrier, and the barrier's phase flipping from one load to the next.
#pragma once
#include <cstdint>

namespace tg::testing {

// src: rows × (heads · head_dim) bf16 (raw bits) in device memory, row r at src + r·row_stride
// (elements; row_stride and head_dim multiples of 8), seen as tma.h's head map (head h's columns
// [h·head_dim, (h + 1)·head_dim)). Loads the 64 × 64 box of head head[t] at (row0[t], col0[t]) for
// t = 0, 1 into one swizzled shared tile, one after the other on one mbarrier, and writes each as
// it sits in shared memory, unswizzled with sm90_ptx.cuh's swizzled_offset, to out[t] (64 × 64
// row-major, device memory). Returns false (and runs nothing) where the device is not compute
// capability 9.0; throws std::runtime_error if the driver has no cuTensorMapEncodeTiled or rejects
// the map (tma.h).
bool run_tma_probe(const uint16_t* src, int rows, int head_dim, int heads, int row_stride, const int (&head)[2],
                   const int (&row0)[2], const int (&col0)[2], uint16_t* out0, uint16_t* out1);

}  // namespace tg::testing
