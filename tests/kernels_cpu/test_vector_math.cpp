// The vectorizable exp and tanh of the CPU kernels against libm in double, over their whole
// useful range, and at the values the kernels rely on (−inf → 0 for masked scores, NaN kept).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/vector_math.h"

namespace tg::cpu {
namespace {

// Distance in units in the last place of float at the exact value.
double ulps(float got, double exact) {
  const double ulp = std::ldexp(1.0, std::ilogb(float(exact)) - 23);
  return std::fabs(double(got) - exact) / ulp;
}

TEST(VectorMath, ExpIsWithinTwoUlpsOverItsRange) {
  double worst = 0, at = 0;
  for (float x = -87.0f; x <= 88.0f; x = std::nextafter(x + 1e-4f * std::fabs(x), 89.0f)) {
    const double u = ulps(exp_vectorizable(x), std::exp(double(x)));
    if (u > worst) worst = u, at = x;
  }
  EXPECT_LE(worst, 2.0) << "at x = " << at;
  EXPECT_EQ(exp_vectorizable(0.0f), 1.0f);
}

TEST(VectorMath, ExpOfMaskedScoresIsExactlyZeroAndNaNStaysNaN) {
  EXPECT_EQ(exp_vectorizable(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(exp_vectorizable(-88.5f), 0.0f);
  EXPECT_EQ(exp_vectorizable(-1e30f), 0.0f);
  EXPECT_TRUE(std::isnan(exp_vectorizable(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_GT(exp_vectorizable(88.0f), 1e38f);
}

TEST(VectorMath, TanhIsCloseEverywhere) {
  double worst = 0, at = 0;
  for (float x = -20.0f; x <= 20.0f; x += 1.0f / 4096) {
    const double exact = std::tanh(double(x));
    // relative below |x| = 1/16 (where tanh x ≈ x), absolute above
    const double err = std::fabs(double(tanh_vectorizable(x)) - exact) / (std::fabs(x) < 0.0625f ? std::fabs(exact) + 1e-30 : 1.0);
    if (err > worst) worst = err, at = x;
  }
  EXPECT_LE(worst, 3e-7) << "at x = " << at;
  for (float tiny : {1e-30f, -1e-20f, 1e-8f, 0.0f, -0.0f}) EXPECT_EQ(tanh_vectorizable(tiny), tiny);
  EXPECT_EQ(tanh_vectorizable(100.0f), 1.0f);
  EXPECT_EQ(tanh_vectorizable(-std::numeric_limits<float>::infinity()), -1.0f);
  EXPECT_TRUE(std::isnan(tanh_vectorizable(std::numeric_limits<float>::quiet_NaN())));
}

// The float GELU runs the AVX2 build of its loops where the CPU has AVX2: it computes every
// element as this file's plain code (built for any x86-64) does, to the bit.
TEST(VectorMath, GeluGivesTheSameBitsOnEveryCpu) {
  std::vector<float> x, dout;
  for (float v = -12.0f; v <= 12.0f; v += 0.001953125f) x.push_back(v), dout.push_back(0.5f - v / 7.0f);
  std::vector<float> y(x.size()), dx(x.size());
  gelu_forward(x.data(), y.data(), int64_t(x.size()));
  gelu_backward(x.data(), dout.data(), dx.data(), int64_t(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
#ifndef __FMA__
    ASSERT_EQ(y[i], gelu_value(x[i])) << "x = " << x[i];
    ASSERT_EQ(dx[i], gelu_derivative(x[i]) * dout[i]) << "x = " << x[i];
#else  // -DTILEGRAD_NATIVE=ON: this file may contract into FMAs, gelu_f32.cpp never does
    ASSERT_NEAR(y[i], gelu_value(x[i]), 1e-6f * (1 + std::fabs(y[i]))) << "x = " << x[i];
    ASSERT_NEAR(dx[i], gelu_derivative(x[i]) * dout[i], 1e-6f * (1 + std::fabs(dx[i]))) << "x = " << x[i];
#endif
  }
  EXPECT_NEAR(gelu_value(1.0f), 0.841192, 1e-6);  // 0.5·(1 + tanh(√(2/π)·1.044715))
}

}  // namespace
}  // namespace tg::cpu
