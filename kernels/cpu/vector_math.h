// exp and tanh for the CPU kernels' elementwise loops, in straight-line code the compiler turns
// into vector instructions (with -fno-trapping-math, which CMakeLists.txt sets: otherwise GCC
// keeps the selects as branches). libm's expf and tanhf are calls the compiler cannot vectorize:
// GELU's tanh alone took 29 % of the CPU training step (docs/performance.md, "CPU"). The double
// overloads are libm's: double-precision runs are the reference the tests measure against.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace tg::cpu {

// e^x in float, within 1 ulp of the exact value for x ≥ −87 (0.98 at worst over every 64th float
// of [−87, 88]; tests/kernels_cpu/test_vector_math.cpp); 0 exactly for x ≤ −88 and for −inf (the masked scores of attention), NaN for NaN.
// x = n·ln 2 + r with |r| ≤ ln 2 / 2 (ln 2 in two parts, so n·ln 2 is exact), e^r by Cephes'
// degree-6 polynomial, 2^n put straight into the exponent bits.
inline float exp_vectorizable(float x) {
  x = x < -88.0f ? -88.0f : (x > 88.0f ? 88.0f : x);  // NaN passes through both tests
  // n = round(x / ln 2): adding 1.5·2^23 leaves the rounded integer in the low mantissa bits.
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n: n + 127 in the exponent field; n = −127 (x ≤ −88) gives the field 0, a zero.
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  float two_to_n;
  std::memcpy(&two_to_n, &bits, sizeof two_to_n);
  return p * two_to_n;
}
inline double exp_vectorizable(double x) { return std::exp(x); }

// tanh in float, within 1e-7 of the exact value (relative below |x| = 1/16, absolute above).
// Small |x| by its Taylor series (the exp form loses the leading digits there), the rest as
// sign(x)·(1 − e)/(1 + e) with e = e^(−2|x|) ≤ 1; both are computed and one is selected, so the
// loop stays branch-free.
inline float tanh_vectorizable(float x) {
  const float a = std::fabs(x);
  const float e = exp_vectorizable(-2.0f * a);
  const float big = (1.0f - e) / (1.0f + e);
  const float x2 = x * x;
  const float small = x + x * x2 * (-0.333333333f + x2 * (0.133333333f + x2 * -0.0539682540f));
  return a < 0.0625f ? small : std::copysign(big, x);
}
inline double tanh_vectorizable(double x) { return std::tanh(x); }

}  // namespace tg::cpu
