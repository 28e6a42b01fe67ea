// CPU reference kernels for elementwise ops: add (with trailing broadcast), mul, scale, GELU,
// and the reductions their backwards need. Plain loops; OpenMP where the size pays for it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

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

// GELU, tanh form (GPT-2): 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), and its derivative.
template <typename T>
inline T gelu_value(T v) {
  const T k = T(0.7978845608028654);  // √(2/π)
  return T(0.5) * v * (T(1) + tanh_vectorizable(k * (v + T(0.044715) * v * v * v)));
}

template <typename T>
inline T gelu_derivative(T v) {
  const T k = T(0.7978845608028654);
  const T th = tanh_vectorizable(k * (v + T(0.044715) * v * v * v));
  const T sech2 = T(1) - th * th;
  return T(0.5) * (T(1) + th) + T(0.5) * v * sech2 * k * (T(1) + T(3) * T(0.044715) * v * v);
}

// Float runs the loops of kernels/cpu/gelu_f32.cpp, built for AVX2 as well.
void gelu_forward_f32(const float* x, float* out, int64_t n);
void gelu_backward_f32(const float* x, const float* dout, float* dx, int64_t n);

template <typename T>
void gelu_forward(const T* x, T* out, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    gelu_forward_f32(x, out, n);
  } else {
#pragma omp parallel for simd if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) out[i] = gelu_value(x[i]);
  }
}

template <typename T>
void gelu_backward(const T* x, const T* dout, T* dx, int64_t n) {
  if constexpr (std::is_same_v<T, float>) {
    gelu_backward_f32(x, dout, dx, n);
  } else {
#pragma omp parallel for simd if (n > kParallelGrain)
    for (int64_t i = 0; i < n; ++i) dx[i] = gelu_derivative(x[i]) * dout[i];
  }
}

}  // namespace tg::cpu
