// Shared helpers for the tests: deterministic random tensors and error comparisons.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "src/nn/parameters.h"
#include "src/tensor/tensor.h"

namespace tg::testing {

inline Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::f64, double std = 1.0) {
  std::vector<double> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std * nn::normal_from(seed, 99, i);
  return Tensor::from_vector(v, shape, dtype);
}

// max |a − b| / max(1, max |b|): a relative error that stays meaningful near zero.
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 1;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    if (std::isinf(b[i]) && a[i] == b[i]) continue;
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

// Bitwise equality of two tensors on any devices (compared on the host).
inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  Tensor ha = a.device().is_cpu() ? a : a.to(Device::cpu());
  Tensor hb = b.device().is_cpu() ? b : b.to(Device::cpu());
  return ha.nbytes() == hb.nbytes() && std::memcmp(ha.raw(), hb.raw(), ha.nbytes()) == 0;
}

// Per-token document starts (B, T) i32 from document lengths taken in turn, cyclically; row b
// begins at lengths[b % n], so the rows' boundaries differ.
inline Tensor document_starts_of_lengths(int64_t B, int64_t T, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> s(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0, next = 0;
    size_t d = size_t(b);
    for (int64_t t = 0; t < T; ++t) {
      if (t == next) start = t, next = t + lengths[d++ % lengths.size()];
      s[size_t(b * T + t)] = int32_t(start);
    }
  }
  return Tensor::from_ints(s, {B, T});
}

}  // namespace tg::testing
