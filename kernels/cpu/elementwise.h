// CPU reference kernels for elementwise ops: add (with trailing broadcast), mul, scale, GELU,
// and the reductions their backwards need. Plain loops; OpenMP where the size pays for it.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/cpu/vector_math.h"

namespace tg::cpu {

constexpr int64_t kParallelGrain = 1 << 15;  // below this, thread start-up costs more than it saves

template <typename T>
void add_inplace(T* dst, const T* src, int64_t n) {
#pragma omp parallel for simd if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

// out (rows, cols) = a (rows, cols) + b (cols) broadcast over rows; rows = 1 is a plain add.
template <typename T>
void add_forward(const T* a, const T* b, T* out, int64_t rows, int64_t cols) {
#pragma omp parallel for if (rows * cols > kParallelGrain)
  for (int64_t r = 0; r < rows; ++r) {
    const T* ar = a + r * cols;
    T* outr = out + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) outr[c] = ar[c] + b[c];
  }
}

// out (cols) = sum over rows of x (rows, cols): the gradient of a broadcast operand.
template <typename T>
void sum_rows(const T* x, T* out, int64_t rows, int64_t cols) {
  for (int64_t c = 0; c < cols; ++c) out[c] = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) out[c] += xr[c];
  }
}

template <typename T>
void mul_forward(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for simd if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];
}

template <typename T>
void scale_forward(const T* x, T* out, T s, int64_t n) {
#pragma omp parallel for simd if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * s;
}

template <typename T>
T sum_all(const T* x, int64_t n) {
  T s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];  // serial: bitwise reproducible
  return s;
}

// GELU, tanh form (GPT-2): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))).
template <typename T>
void gelu_forward(const T* x, T* out, int64_t n) {
  const T k = T(0.7978845608028654);  // √(2/π)
#pragma omp parallel for simd if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    T v = x[i];
    out[i] = T(0.5) * v * (T(1) + tanh_vectorizable(k * (v + T(0.044715) * v * v * v)));
  }
}

template <typename T>
void gelu_backward(const T* x, const T* dout, T* dx, int64_t n) {
  const T k = T(0.7978845608028654);
#pragma omp parallel for simd if (n > kParallelGrain)
  for (int64_t i = 0; i < n; ++i) {
    T v = x[i];
    T inner = k * (v + T(0.044715) * v * v * v);
    T th = tanh_vectorizable(inner);
    T sech2 = T(1) - th * th;
    T local = T(0.5) * (T(1) + th) + T(0.5) * v * sech2 * k * (T(1) + T(3) * T(0.044715) * v * v);
    dx[i] = local * dout[i];
  }
}

}  // namespace tg::cpu
