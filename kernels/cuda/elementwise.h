// CUDA elementwise ops (add with broadcast, mul, scale, GELU, cast, dropout, fill) and the
// column sum their backwards need: the GPU twins of kernels/cpu/elementwise.h and dropout.h.
#pragma once
#include "kernels/cuda/stream.h"

#include <cstdint>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// T is float or tg::bf16 throughout; arithmetic is fp32 and bf16 results are rounded to nearest
// even once, on store. Every launcher runs on `stream` and throws std::invalid_argument on a
// broken precondition (negative sizes) or std::runtime_error on a failed launch.

// out (rows, cols) = a (rows, cols) + b (cols) broadcast over rows; rows = 1 is a plain add.
template <typename T>
void add_forward(const T* a, const T* b, T* out, int64_t rows, int64_t cols, cudaStream_t stream);

// dst (n) += src (n).
template <typename T>
void add_inplace(T* dst, const T* src, int64_t n, cudaStream_t stream);

// out (cols) = sum over rows of x (rows, cols), accumulated in fp32 in a fixed order (bitwise
// reproducible): blocks over (column tile, row chunk) write fp32 partial sums to scratch, which a
// second pass adds in chunk order (see elementwise.cu). scratch: sum_rows_scratch_floats(rows,
// cols) floats; the chunking depends only on (rows, cols).
size_t sum_rows_scratch_floats(int64_t rows, int64_t cols);
template <typename T>
void sum_rows(const T* x, T* out, int64_t rows, int64_t cols, float* scratch, cudaStream_t stream);

// dst (n, fp32) += src (n, bf16) as floats (a bf16 gradient accumulated into an fp32 one).
void add_converted_inplace(float* dst, const tg::bf16* src, int64_t n, cudaStream_t stream);

// Many small add_converted_inplace in one launch: a model's biases and LayerNorm parameters would
// each be a launch of ~2 µs for a few thousand elements. Up to kAddConvertedMaxJobs jobs; the
// destinations must not overlap.
struct AddConvertedJob {
  float* dst;
  const tg::bf16* src;
  int64_t n;
};
constexpr int kAddConvertedMaxJobs = 128;  // the jobs travel as a kernel argument (3 KB)
void add_converted_batched(const AddConvertedJob* jobs, int count, cudaStream_t stream);

// out (n) = a (n) ∘ b (n).
template <typename T>
void mul_forward(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream);

// out (n) = x (n) · s.
template <typename T>
void scale_forward(const T* x, T* out, float s, int64_t n, cudaStream_t stream);

// GELU, tanh form (GPT-2), and its backward dx = gelu'(x) · dout; same formulas as the CPU.
template <typename T>
void gelu_forward(const T* x, T* out, int64_t n, cudaStream_t stream);
template <typename T>
void gelu_backward(const T* x, const T* dout, T* dx, int64_t n, cudaStream_t stream);

// gelu_backward over x, dout (rows, cols) and, in the same pass, dbias (cols) = Σ_rows dx: the
// bias gradient of the linear layer that produced x (GPT's MLP), without reading dx back. dbias
// is bitwise what sum_rows(dx) gives (same chunks, same order, the stored T values summed).
// scratch: sum_rows_scratch_floats(rows, cols) floats.
template <typename T>
void gelu_backward_sum_rows(const T* x, const T* dout, T* dx, T* dbias, int64_t rows, int64_t cols, float* scratch,
                            cudaStream_t stream);

// out (n) = x (n) converted: float→bf16 rounds exactly like tg::float_to_bf16 (bitwise, NaN
// included), bf16→float is exact, float→float and bf16→bf16 are device copies.
// Instantiated for (Src, Dst) in {float, tg::bf16}².
template <typename Src, typename Dst>
void cast(const Src* x, Dst* out, int64_t n, cudaStream_t stream);

// out (n) = x (n) · keep / (1 − p), keep = uniform_from(seed, i) ≥ p: the same mask as
// tg::cpu::dropout_apply for the same (seed, first + i). Used for both directions. Requires 0 ≤ p ≤ 1.
template <typename T>
void dropout_apply(const T* x, T* out, int64_t n, float p, uint64_t seed, uint64_t first, cudaStream_t stream);

// x (n) = value (rounded to T).
template <typename T>
void fill(T* x, float value, int64_t n, cudaStream_t stream);

}  // namespace tg::cuda
