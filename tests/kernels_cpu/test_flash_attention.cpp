// Tests of the CPU FlashAttention kernels against a naive double-precision attention and finite differences.
#include "kernels/cpu/flash_attention.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

namespace {

using tg::cpu::AttentionShape;
using tg::cpu::flash_attention_backward;
using tg::cpu::flash_attention_forward;

// Deterministic normals from a seeded mt19937_64 (own Box–Muller, so the values do not depend
// on the standard library's distribution implementation).
std::vector<double> normals(size_t n, uint64_t seed, double sigma = 1.0) {
  std::mt19937_64 gen(seed);
  auto uniform = [&] { return (static_cast<double>(gen() >> 11) + 0.5) * 0x1.0p-53; };  // (0, 1)
  std::vector<double> x(n);
  for (size_t i = 0; i < n; i += 2) {
    const double r = std::sqrt(-2.0 * std::log(uniform())), th = 2.0 * M_PI * uniform();
    x[i] = sigma * r * std::cos(th);
    if (i + 1 < n) x[i + 1] = sigma * r * std::sin(th);
  }
  return x;
}

size_t numel(const AttentionShape& s) { return static_cast<size_t>(s.B * s.T * s.H * s.D); }
size_t stats_numel(const AttentionShape& s) { return static_cast<size_t>(s.B * s.H * s.T); }

struct Inputs {
  std::vector<double> q, k, v, dout;  // (B, T, H, D)
};

Inputs make_inputs(const AttentionShape& s, uint64_t seed, double qk_sigma = 1.0) {
  return {normals(numel(s), seed, qk_sigma), normals(numel(s), seed + 1, qk_sigma),
          normals(numel(s), seed + 2), normals(numel(s), seed + 3)};
}

struct Grads {
  std::vector<double> o, lse, dq, dk, dv;
};

// Naive attention in double: materialises the T×T scores of each head, as the kernel must not.
Grads reference(const Inputs& in, const AttentionShape& s) {
  const int64_t T = s.T, H = s.H, D = s.D;
  Grads g{std::vector<double>(numel(s)), std::vector<double>(stats_numel(s)),
          std::vector<double>(numel(s)), std::vector<double>(numel(s)),
          std::vector<double>(numel(s))};
  std::vector<double> P(T * T), dS(T * T);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      auto at = [&](int64_t t) { return ((b * T + t) * H + h) * D; };  // row offset in (B,T,H,D)
      for (int64_t i = 0; i < T; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < T; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += in.q[at(i) + d] * in.k[at(j) + d];
          P[i * T + j] = (s.causal && j > i) ? -std::numeric_limits<double>::infinity() : s.scale * dot;
          m = std::max(m, P[i * T + j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < T; ++j) sum += (P[i * T + j] = std::exp(P[i * T + j] - m));
        for (int64_t j = 0; j < T; ++j) P[i * T + j] /= sum;
        g.lse[(b * H + h) * T + i] = m + std::log(sum);
        for (int64_t j = 0; j < T; ++j)
          for (int64_t d = 0; d < D; ++d) g.o[at(i) + d] += P[i * T + j] * in.v[at(j) + d];
      }
      // Standard softmax backward: dS = P ∘ (dP − rowsum(P ∘ dP)), dP = dO Vᵀ.
      for (int64_t i = 0; i < T; ++i) {
        double row = 0;
        for (int64_t j = 0; j < T; ++j) {
          double dP = 0;
          for (int64_t d = 0; d < D; ++d) dP += in.dout[at(i) + d] * in.v[at(j) + d];
          dS[i * T + j] = dP;
          row += P[i * T + j] * dP;
        }
        for (int64_t j = 0; j < T; ++j) dS[i * T + j] = P[i * T + j] * (dS[i * T + j] - row);
      }
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < T; ++j)
          for (int64_t d = 0; d < D; ++d) {
            g.dv[at(j) + d] += P[i * T + j] * in.dout[at(i) + d];
            g.dq[at(i) + d] += s.scale * dS[i * T + j] * in.k[at(j) + d];
            g.dk[at(j) + d] += s.scale * dS[i * T + j] * in.q[at(i) + d];
          }
    }
  return g;
}

template <typename T>
std::vector<T> cast(const std::vector<double>& x) {
  return std::vector<T>(x.begin(), x.end());
}

// Runs the kernels in precision T. Outputs start as NaN so anything not written (or accumulated
// into rather than overwritten) shows up.
template <typename T>
Grads run_flash(const Inputs& in, const AttentionShape& s) {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const auto q = cast<T>(in.q), k = cast<T>(in.k), v = cast<T>(in.v), dout = cast<T>(in.dout);
  std::vector<T> o(numel(s), nan), lse(stats_numel(s), nan);
  std::vector<T> dq(numel(s), nan), dk(numel(s), nan), dv(numel(s), nan);
  flash_attention_forward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), s);
  flash_attention_backward<T>(q.data(), k.data(), v.data(), o.data(), lse.data(), dout.data(),
                              dq.data(), dk.data(), dv.data(), s);
  auto up = [](const std::vector<T>& x) { return std::vector<double>(x.begin(), x.end()); };
  return {up(o), up(lse), up(dq), up(dk), up(dv)};
}

// max |a − ref| / max(max |ref|, floor): relative to the tensor's scale, so entries near zero
// (where cancellation makes per-element relative error meaningless) do not dominate.
double scaled_error(const std::vector<double>& a, const std::vector<double>& ref, double floor = 0) {
  double err = 0, mag = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    err = std::max(err, std::isnan(a[i]) ? std::numeric_limits<double>::infinity()
                                         : std::abs(a[i] - ref[i]));
    mag = std::max(mag, std::abs(ref[i]));
  }
  return err / std::max(mag, 1e-300);
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double e : x) m = std::max(m, std::abs(e));
  return m;
}

// dq and dk sum terms scale·dS·K and scale·dS·Q, with dS = P ∘ (dP − Delta) a difference of two
// sums of size |dO|·|V|. Where every row sees a single key (T = 1) dS is exactly 0, dq and dk are
// 0, and the kernel's are the rounding of that difference: with `in`, their error is measured
// against the size of one term instead of against 0.
void expect_close(const Grads& got, const Grads& ref, double tol, const Inputs* in = nullptr,
                  const AttentionShape* s = nullptr) {
  const double term = in ? s->scale * max_abs(in->dout) * max_abs(in->v) : 0;
  EXPECT_LE(scaled_error(got.o, ref.o), tol) << "o";
  EXPECT_LE(scaled_error(got.lse, ref.lse), tol) << "lse";
  EXPECT_LE(scaled_error(got.dq, ref.dq, in ? term * max_abs(in->k) : 0), tol) << "dq";
  EXPECT_LE(scaled_error(got.dk, ref.dk, in ? term * max_abs(in->q) : 0), tol) << "dk";
  EXPECT_LE(scaled_error(got.dv, ref.dv), tol) << "dv";
}

AttentionShape shape(int64_t B, int64_t T, int64_t H, int64_t D, bool causal) {
  return {B, T, H, D, causal, 1.0 / std::sqrt(static_cast<double>(D))};
}

// ---- Against the naive reference, over causal × T × D --------------------------------------

using Case = std::tuple<bool, int64_t, int64_t>;  // causal, T, D

class FlashVsReference : public ::testing::TestWithParam<Case> {
 protected:
  AttentionShape s() const {
    const auto [causal, T, D] = GetParam();
    return shape(2, T, 3, D, causal);
  }
};

TEST_P(FlashVsReference, Double) {
  const Inputs in = make_inputs(s(), 1234);
  const AttentionShape shape = s();
  expect_close(run_flash<double>(in, shape), reference(in, shape), 1e-12, &in, &shape);
}

TEST_P(FlashVsReference, Float) {
  // The reference sees the same float-rounded inputs, so only the kernel's arithmetic differs.
  Inputs in = make_inputs(s(), 1234);
  for (auto* x : {&in.q, &in.k, &in.v, &in.dout})
    for (double& e : *x) e = static_cast<float>(e);
  const AttentionShape shape = s();
  expect_close(run_flash<float>(in, shape), reference(in, shape), 1e-5, &in, &shape);
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const auto [causal, T, D] = info.param;
  return std::string(causal ? "causal" : "full") + "_T" + std::to_string(T) + "_D" +
         std::to_string(D);
}

// T around the block size (1, 31, 32, 33) and spanning several blocks with a ragged tail (100).
INSTANTIATE_TEST_SUITE_P(Shapes, FlashVsReference,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values<int64_t>(1, 5, 31, 32, 33, 100),
                                            ::testing::Values<int64_t>(8, 40, 64, 128)),
                         case_name);

// ---- Other cases --------------------------------------------------------------------------

// A scale other than 1/sqrt(D), and a head count / batch that differ from the table's.
TEST(FlashAttention, CustomScaleAndShape) {
  for (bool causal : {false, true}) {
    AttentionShape s{3, 70, 2, 24, causal, 0.37};
    const Inputs in = make_inputs(s, 99);
    expect_close(run_flash<double>(in, s), reference(in, s), 1e-12);
  }
}

// Scores of order ±100: exp would overflow float without the running max, and the max moves a
// lot between key blocks, which exercises the rescaling.
TEST(FlashAttention, LargeScoresStayFinite) {
  for (bool causal : {false, true}) {
    const AttentionShape s = shape(1, 100, 2, 64, causal);
    Inputs in = make_inputs(s, 7, /*qk_sigma=*/4.0);
    for (auto* x : {&in.q, &in.k, &in.v, &in.dout})
      for (double& e : *x) e = static_cast<float>(e);
    const Grads ref = reference(in, s);
    expect_close(run_flash<double>(in, s), ref, 1e-10);
    // |S| ~ 100 makes each float rounding of S worth ~1e-5 in P; measured error is ~2e-6.
    expect_close(run_flash<float>(in, s), ref, 2e-5);
  }
}

// The running max must never decrease: here every query scores ~+85 against the first key block
// and ~−85 against the rest, so re-basing on a later, smaller tile max would need exp(170),
// which overflows float.
TEST(FlashAttention, RunningMaxKeepsEarlyPeak) {
  for (bool causal : {false, true}) {
    const AttentionShape s = shape(1, 100, 1, 8, causal);
    Inputs in = make_inputs(s, 5);
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t d = 0; d < s.D; ++d) {
        in.q[t * s.D + d] = 1.0 + 0.01 * in.q[t * s.D + d];
        in.k[t * s.D + d] = (t < 32 ? 30.0 : -30.0) * (1.0 + 0.01 * in.k[t * s.D + d]);
      }
    for (auto* x : {&in.q, &in.k, &in.v, &in.dout})
      for (double& e : *x) e = static_cast<float>(e);
    const Grads ref = reference(in, s);
    expect_close(run_flash<double>(in, s), ref, 1e-12);
    // |S| ~ 85 in float: rounding S alone costs ~1e-5 relative in P (measured ~2.4e-5 in dq).
    // The failure this test is for is inf/NaN, far above this bound.
    expect_close(run_flash<float>(in, s), ref, 1e-4);
  }
}

// Same inputs → bitwise same outputs, twice in a row and for different thread counts.
template <typename T>
void expect_bitwise_deterministic() {
  for (bool causal : {false, true}) {
    const AttentionShape s = shape(2, 100, 3, 64, causal);
    const Inputs in = make_inputs(s, 42);
    const int saved = omp_get_max_threads();
    const Grads first = run_flash<T>(in, s);
    const Grads second = run_flash<T>(in, s);
    omp_set_num_threads(1);
    const Grads serial = run_flash<T>(in, s);
    omp_set_num_threads(3);
    const Grads odd = run_flash<T>(in, s);
    omp_set_num_threads(saved);
    auto same = [](const std::vector<double>& a, const std::vector<double>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
    };
    for (const Grads* g : {&second, &serial, &odd}) {
      EXPECT_TRUE(same(first.o, g->o));
      EXPECT_TRUE(same(first.lse, g->lse));
      EXPECT_TRUE(same(first.dq, g->dq));
      EXPECT_TRUE(same(first.dk, g->dk));
      EXPECT_TRUE(same(first.dv, g->dv));
    }
  }
}

TEST(FlashAttention, BitwiseDeterministicDouble) { expect_bitwise_deterministic<double>(); }
TEST(FlashAttention, BitwiseDeterministicFloat) { expect_bitwise_deterministic<float>(); }

// The double kernel's gradients against central differences of loss = sum(O ∘ W), whose dO is W.
TEST(FlashAttention, GradientMatchesFiniteDifferences) {
  // Thousands of tiny forward calls: one thread avoids paying a parallel region for each, which
  // on a busy machine dominated this test's time. Threading is covered by the tests above.
  const int saved_threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (bool causal : {false, true}) {
    const AttentionShape s = shape(2, 7, 2, 8, causal);
    Inputs in = make_inputs(s, 2024);
    const std::vector<double>& W = in.dout;
    auto loss = [&](const Inputs& x) {
      std::vector<double> o(numel(s)), lse(stats_numel(s));
      flash_attention_forward<double>(x.q.data(), x.k.data(), x.v.data(), o.data(), lse.data(), s);
      double L = 0;
      for (size_t i = 0; i < o.size(); ++i) L += o[i] * W[i];
      return L;
    };
    const Grads g = run_flash<double>(in, s);
    const double eps = 1e-5;
    const std::pair<std::vector<double>*, const std::vector<double>*> checks[] = {
        {&in.q, &g.dq}, {&in.k, &g.dk}, {&in.v, &g.dv}};
    const char* names[] = {"dq", "dk", "dv"};
    for (int c = 0; c < 3; ++c) {
      auto& [x, grad] = checks[c];
      double err = 0, mag = 0;
      for (size_t i = 0; i < x->size(); ++i) {
        const double saved = (*x)[i];
        (*x)[i] = saved + eps;
        const double up = loss(in);
        (*x)[i] = saved - eps;
        const double down = loss(in);
        (*x)[i] = saved;
        const double fd = (up - down) / (2 * eps);
        err = std::max(err, std::abs(fd - (*grad)[i]));
        mag = std::max(mag, std::abs(fd));
      }
      EXPECT_LE(err / mag, 1e-8) << names[c] << (causal ? " causal" : " full");
    }
  }
  omp_set_num_threads(saved_threads);
}

}  // namespace
