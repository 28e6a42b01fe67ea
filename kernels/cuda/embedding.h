// CUDA embedding lookup and its deterministic (atomic-free) backward: twins of kernels/cpu/embedding.h.
#pragma once
#include "kernels/cuda/stream.h"

#include <cstdint>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// out (N, C) = weight (V, C)[ids (N)]. ids must lie in [0, V) (the op checks; the kernel does not).
template <typename T>
void embedding_forward(const T* weight, const int32_t* ids, T* out, int64_t N, int64_t C, cudaStream_t stream);

// dweight (V, C) is overwritten with the sum of the dout (N, C) rows per id, plus dweight_add (V, C)
// when it is not null (the gradient another consumer of the table already produced: GPT-2's tied
// LM head), added as each row is written. Each (row, channel) sums its tokens in token order in
// fp32, adds dweight_add's value last and is rounded to T once, so the result is bitwise
// reproducible, and for T = float bitwise equal to the CPU's sum followed by the addition. Ids
// outside [0, V) are skipped. Cost: ceil(V/32)·ceil(C/1024) blocks each scan all N ids (GPT-2,
// N = 16384: 1572 blocks × 64 KB of ids from L2) plus one read of dout (and dweight_add) and one
// write of dweight.
template <typename T>
void embedding_backward(const T* dout, const int32_t* ids, const T* dweight_add, T* dweight, int64_t N, int64_t V,
                        int64_t C, cudaStream_t stream);

// dweight (V, C), fp32, += the sum of the dout (N, C) rows per id: a parameter's fp32 gradient
// taking its bf16 compute copy's embedding gradient directly. Only the rows of ids that occur are
// read and written (GPT-2, N = 16384: at most 16384 of 50,304 rows), so unlike embedding_backward
// there is no pass over the whole table. The ids are sorted with their token positions
// (cub::DeviceRadixSort) into scratch; each id's tokens are then summed in fp32 in a fixed order
// (bitwise reproducible; not the CPU's order) and the sum added into its row. Ids outside [0, V)
// are skipped. scratch: embedding_backward_accumulate_scratch_bytes(N) bytes of device memory.
size_t embedding_backward_accumulate_scratch_bytes(int64_t N);
template <typename T>
void embedding_backward_accumulate(const T* dout, const int32_t* ids, float* dweight, int64_t N, int64_t V, int64_t C,
                                   void* scratch, size_t scratch_bytes, cudaStream_t stream);

}  // namespace tg::cuda
