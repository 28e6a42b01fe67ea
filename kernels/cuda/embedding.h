// CUDA embedding lookup and its deterministic (atomic-free) backward: twins of kernels/cpu/embedding.h.
#pragma once
#include "kernels/cuda/stream.h"

#include <cstdint>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// out (N, C) = weight (V, C)[ids (N)]. ids must lie in [0, V) (the op checks; the kernel does not).
template <typename T>
void embedding_forward(const T* weight, const int32_t* ids, T* out, int64_t N, int64_t C, cudaStream_t stream);

// dweight (V, C) is overwritten with the sum of the dout (N, C) rows per id. Each (row, channel)
// sums its tokens in token order in fp32 and is rounded to T once, so the result is bitwise
// reproducible, and for T = float bitwise equal to the CPU's. Ids outside [0, V) are skipped.
// Cost: ceil(V/64)·ceil(C/128) blocks each scan all N ids (GPT-2, N = 16384: 4716 blocks × 64 KB
// of ids from L2) plus one read of dout and one write of dweight; on the order of 0.1 ms.
template <typename T>
void embedding_backward(const T* dout, const int32_t* ids, T* dweight, int64_t N, int64_t V, int64_t C,
                        cudaStream_t stream);

}  // namespace tg::cuda
