// The flash-attention tests' shared ground truth: seeded bf16 inputs, a naive attention forward
// and backward in double, and the error measures. Used by the GPU kernel tests
// (tests/cuda/test_flash_attention.cpp) and by the CPU emulation of the same kernels
// (tests/kernel_emu/).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "src/tensor/dtype.h"

namespace tg::testing::flash {

// Deterministic inputs in [-1, 1) (splitmix64), so a failure reproduces exactly.
struct Rng {
  uint64_t s;
  double next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return double(z >> 11) / double(1ull << 53) * 2.0 - 1.0;
  }
};

// n bf16 values amplitude·U[-1, 1), and the same values exactly as doubles for the reference.
struct Input {
  std::vector<tg::bf16> bits;
  std::vector<double> val;
};
inline Input random_input(size_t n, double amplitude, uint64_t seed) {
  Rng rng{seed};
  Input in;
  in.bits.resize(n);
  in.val.resize(n);
  for (size_t i = 0; i < n; ++i) {
    in.bits[i] = tg::float_to_bf16(float(amplitude * rng.next()));
    in.val[i] = tg::bf16_to_float(in.bits[i]);
  }
  return in;
}

inline std::vector<double> to_double(const std::vector<tg::bf16>& x) {
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = tg::bf16_to_float(x[i]);
  return out;
}
inline std::vector<double> to_double(const std::vector<float>& x) { return {x.begin(), x.end()}; }

inline size_t count_nonfinite(const std::vector<double>& x) {
  return size_t(std::count_if(x.begin(), x.end(), [](double v) { return !std::isfinite(v); }));
}

// ‖got − ref‖ / ‖ref‖. The denominator is floored at an RMS of 1e-3 so that a gradient that is
// zero in exact arithmetic (dK at T = 1: P ≡ 1 makes dS ≡ 0) is judged by its absolute error.
inline double rel_error(const std::vector<double>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-3 * std::sqrt(double(ref.size())));
}

inline double max_abs_diff(const std::vector<double>& got, const std::vector<double>& ref) {
  double m = 0;
  for (size_t i = 0; i < ref.size(); ++i) m = std::max(m, std::abs(got[i] - ref[i]));
  return m;
}

struct Case {
  int64_t B, T, H, D;
  bool causal;
  double scale;  // 0: the usual 1/sqrt(D)
};

struct Reference {
  std::vector<double> o, lse, dq, dk, dv;
};

// Naive materialised attention and its backward in double, one query row at a time (O(T) extra
// memory). Layout as the kernels: (B, T, H, D) tensors, lse (B, H, T). With the structured masks
// (causal only), query i of row b sees keys max(doc_start[b·T + i], i − window + 1) ≤ j ≤ i.
inline Reference reference(const Case& c, double scale, const std::vector<double>& q, const std::vector<double>& k,
                    const std::vector<double>& v, const std::vector<double>& dout,
                    const int32_t* doc_start = nullptr, int64_t window = 0) {
  const int64_t B = c.B, T = c.T, H = c.H, D = c.D;
  Reference r;
  r.o.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(q.size(), 0.0);
  r.dv.assign(q.size(), 0.0);
  r.lse.assign(size_t(B * H * T), 0.0);
  std::vector<double> p(static_cast<size_t>(T)), dp(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      auto at = [&](int64_t t) { return size_t(((b * T + t) * H + h) * D); };
      for (int64_t i = 0; i < T; ++i) {
        const int64_t n = c.causal ? i + 1 : T;  // keys j0 .. n-1 are visible to query i
        int64_t j0 = 0;
        if (c.causal && doc_start) j0 = doc_start[b * T + i];
        if (c.causal && window > 0) j0 = std::max<int64_t>(j0, i - window + 1);
        const double* qi = &q[at(i)];
        const double* doi = &dout[at(i)];
        double m = -INFINITY;
        for (int64_t j = j0; j < n; ++j) {
          const double* kj = &k[at(j)];
          double s = 0;
          for (int64_t d = 0; d < D; ++d) s += qi[d] * kj[d];
          p[j] = scale * s;
          m = std::max(m, p[j]);
        }
        double sum = 0;
        for (int64_t j = j0; j < n; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (int64_t j = j0; j < n; ++j) p[j] /= sum;
        r.lse[size_t((b * H + h) * T + i)] = m + std::log(sum);

        double delta = 0;  // Σ_j P_ij dP_ij
        double* oi = &r.o[at(i)];
        for (int64_t j = j0; j < n; ++j) {
          const double* vj = &v[at(j)];
          double s = 0;
          for (int64_t d = 0; d < D; ++d) {
            oi[d] += p[j] * vj[d];
            s += doi[d] * vj[d];
          }
          dp[j] = s;
          delta += p[j] * s;
        }
        double* dqi = &r.dq[at(i)];
        for (int64_t j = j0; j < n; ++j) {
          const double ds = p[j] * (dp[j] - delta) * scale;  // scale · dS
          const double* kj = &k[at(j)];
          double* dkj = &r.dk[at(j)];
          double* dvj = &r.dv[at(j)];
          for (int64_t d = 0; d < D; ++d) {
            dqi[d] += ds * kj[d];
            dkj[d] += ds * qi[d];
            dvj[d] += p[j] * doi[d];
          }
        }
      }
    }
  return r;
}

// One case's inputs, drawn as every flash test draws them (seeded by the shape), and the double
// reference of the outputs and gradients. q, k with amplitude 2: scores of standard deviation ≈
// 1.3 after the 1/sqrt(D) scale, so the softmax is far from uniform and the running max moves.
struct Problem {
  size_t n, n_lse;  // elements of q (and of o, dq, …); of lse
  double scale;
  Input q, k, v, dout;
  Reference ref;
};
inline Problem make_problem(const Case& c) {
  Problem pr;
  pr.n = size_t(c.B * c.T * c.H * c.D), pr.n_lse = size_t(c.B * c.H * c.T);
  pr.scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(double(c.D));
  const uint64_t seed = uint64_t(c.T * 1000 + c.D * 10 + (c.causal ? 1 : 0));
  pr.q = random_input(pr.n, 2.0, seed + 1), pr.k = random_input(pr.n, 2.0, seed + 2);
  pr.v = random_input(pr.n, 1.0, seed + 3), pr.dout = random_input(pr.n, 1.0, seed + 4);
  pr.ref = reference(c, pr.scale, pr.q.val, pr.k.val, pr.v.val, pr.dout.val);
  return pr;
}

}  // namespace tg::testing::flash
