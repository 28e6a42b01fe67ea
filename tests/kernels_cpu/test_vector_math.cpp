// The vectorizable exp and tanh of the CPU kernels against libm in double, over their whole
// useful range, and at the values the kernels rely on (−inf → 0 for masked scores, NaN kept).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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

}  // namespace
}  // namespace tg::cpu
