// GPT-2's tanh GELU and its derivative on the device (the elementwise kernels, elementwise.cu),
// and the fp16 pair the MLP keeps its derivative in for its backward GEMM (dgelu_gemm_sm90a.cu).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace tg::cuda {

constexpr float kGeluK = 0.7978845608028654f;  // √(2/π)

// GPT-2's tanh GELU, written through the identity ½(1 + tanh u) = σ(2u) = 1 / (1 + e^(−2u)):
// one ex2 and one reciprocal on the special-function unit instead of tanhf's ~35 instructions.
// The tanh form made both elementwise kernels compute-bound (84 resp. 113 µs for GPT-2's
// 16k × 3072 bf16, against 50 resp. 75 µs of memory traffic); this form keeps them at the memory.
// It also stays accurate where tanh u → −1: 1 + tanh u would cancel there, σ(2u) does not.
// Relative error ~1e-6 (the approximate exp), far below bf16's 4e-3; the CPU keeps the tanh form.
// For u → −∞ the exponential overflows to +inf and the fast division returns 0 (not NaN).
__device__ __forceinline__ float gelu_sigmoid(float u) { return __fdividef(1.0f, 1.0f + __expf(-2.0f * u)); }

__device__ __forceinline__ float gelu(float v) { return v * gelu_sigmoid(kGeluK * (v + 0.044715f * v * v * v)); }

// d/dv [v·σ(2u)] = σ + 2v·σ(1 − σ)·u',  u' = k(1 + 3·0.044715·v²)
__device__ __forceinline__ float gelu_grad(float v) {
  const float s = gelu_sigmoid(kGeluK * (v + 0.044715f * v * v * v));
  const float du = kGeluK * (1.0f + 3.0f * 0.044715f * v * v);
  return s + 2.0f * v * s * (1.0f - s) * du;
}

// Two floats → IEEE fp16 pair (lo in the low half), rounded to nearest even; and back.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // a → upper half, b → lower
  return r;
}
__device__ __forceinline__ float half_low(uint32_t w) { return __half2float(__ushort_as_half(uint16_t(w))); }
__device__ __forceinline__ float half_high(uint32_t w) { return __half2float(__ushort_as_half(uint16_t(w >> 16))); }

}  // namespace tg::cuda
