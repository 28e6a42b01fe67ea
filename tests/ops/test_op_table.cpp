// The op table: every op's forward against an independent double-precision reference (in f64
// tightly, in f32 loosely) and its backward against central finite differences in f64.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "kernels/cpu/dropout.h"
#include "src/autograd/gradcheck.h"
#include "src/ops/ops.h"
#include "tests/test_util.h"

namespace tg {
namespace {

using testing::random_tensor;
using testing::rel_error;
using Vec = std::vector<double>;
using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;
using RefFn = std::function<Vec(const std::vector<Vec>&)>;

struct OpCase {
  std::string name;
  std::vector<Shape> inputs;  // all floating, all differentiated
  OpFn op;
  RefFn reference;
  double f32_tolerance = 1e-5;
};

// --- independent naive references, written for clarity rather than speed ---

Vec ref_matmul(const Vec& a, const Vec& b, int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb) {
  Vec c(size_t(batch * M * N), 0.0);
  for (int64_t z = 0; z < batch; ++z)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) {
          double av = ta ? a[size_t(z * M * K + k * M + i)] : a[size_t(z * M * K + i * K + k)];
          double bv = tb ? b[size_t(z * K * N + j * K + k)] : b[size_t(z * K * N + k * N + j)];
          s += av * bv;
        }
        c[size_t(z * M * N + i * N + j)] = s;
      }
  return c;
}

Vec ref_layernorm(const Vec& x, const Vec& w, const Vec* b, int64_t N, int64_t C) {
  Vec y(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int64_t c = 0; c < C; ++c) m += x[size_t(n * C + c)];
    m /= double(C);
    for (int64_t c = 0; c < C; ++c) v += std::pow(x[size_t(n * C + c)] - m, 2);
    v /= double(C);
    for (int64_t c = 0; c < C; ++c)
      y[size_t(n * C + c)] = (x[size_t(n * C + c)] - m) / std::sqrt(v + 1e-5) * w[size_t(c)] + (b ? (*b)[size_t(c)] : 0.0);
  }
  return y;
}

Vec ref_softmax_rows(const Vec& x, int64_t N, int64_t C) {
  Vec y(x.size());
  for (int64_t n = 0; n < N; ++n) {
    double mx = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) mx = std::max(mx, x[size_t(n * C + c)]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[size_t(n * C + c)] - mx);
    for (int64_t c = 0; c < C; ++c) y[size_t(n * C + c)] = std::exp(x[size_t(n * C + c)] - mx) / s;
  }
  return y;
}

// Attention on (B, T, H, D) from the definition.
Vec ref_attention(const Vec& q, const Vec& k, const Vec& v, int64_t B, int64_t T, int64_t H, int64_t D, bool causal) {
  Vec o(q.size(), 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return size_t(((b * T + t) * H + h) * D + d); };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        Vec s(size_t(T), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          if (causal && j > i) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[at(b, i, h, d)] * k[at(b, j, h, d)];
          s[size_t(j)] = dot / std::sqrt(double(D));
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (int64_t j = 0; j < T; ++j) z += std::exp(s[size_t(j)] - mx);
        for (int64_t j = 0; j < T; ++j) {
          double p = std::exp(s[size_t(j)] - mx) / z;
          for (int64_t d = 0; d < D; ++d) o[at(b, i, h, d)] += p * v[at(b, j, h, d)];
        }
      }
  return o;
}

std::vector<OpCase> op_table() {
  const std::vector<int32_t> ids = {3, 0, 4, 3, 1, 4};  // repeated ids exercise the scatter-add
  const std::vector<int32_t> targets = {2, -1, 0, 4, 4, 1};
  std::vector<OpCase> t;
  t.push_back({"add", {{2, 3, 4}, {2, 3, 4}}, [](auto& x) { return ops::add(x[0], x[1]); },
               [](auto& x) { Vec y(x[0]); for (size_t i = 0; i < y.size(); ++i) y[i] += x[1][i]; return y; }});
  t.push_back({"add_broadcast", {{2, 3, 4}, {3, 4}}, [](auto& x) { return ops::add(x[0], x[1]); },
               [](auto& x) { Vec y(x[0]); for (size_t i = 0; i < y.size(); ++i) y[i] += x[1][i % 12]; return y; }});
  t.push_back({"mul", {{3, 5}, {3, 5}}, [](auto& x) { return ops::mul(x[0], x[1]); },
               [](auto& x) { Vec y(x[0]); for (size_t i = 0; i < y.size(); ++i) y[i] *= x[1][i]; return y; }});
  t.push_back({"scale", {{7}}, [](auto& x) { return ops::scale(x[0], -0.37); },
               [](auto& x) { Vec y(x[0]); for (double& v : y) v *= -0.37; return y; }});
  t.push_back({"sum", {{4, 3}}, [](auto& x) { return ops::sum(x[0]); },
               [](auto& x) { double s = 0; for (double v : x[0]) s += v; return Vec{s}; }});
  t.push_back({"mean", {{4, 3}}, [](auto& x) { return ops::mean(x[0]); },
               [](auto& x) { double s = 0; for (double v : x[0]) s += v; return Vec{s / 12}; }});
  t.push_back({"reshape", {{2, 6}}, [](auto& x) { return ops::mul(ops::reshape(x[0], {3, 4}), ops::reshape(x[0], {3, 4})); },
               [](auto& x) { Vec y(x[0]); for (double& v : y) v *= v; return y; }});
  t.push_back({"transpose12", {{2, 3, 4, 5}}, [](auto& x) { return ops::transpose12(x[0]); },
               [](auto& x) {
                 Vec y(x[0].size());
                 for (int a = 0; a < 2; ++a) for (int m = 0; m < 3; ++m) for (int n = 0; n < 4; ++n) for (int d = 0; d < 5; ++d)
                   y[size_t(((a * 4 + n) * 3 + m) * 5 + d)] = x[0][size_t(((a * 3 + m) * 4 + n) * 5 + d)];
                 return y;
               }});
  t.push_back({"slice_last", {{3, 9}}, [](auto& x) { return ops::slice_last(x[0], 3, 4); },
               [](auto& x) { Vec y; for (int r = 0; r < 3; ++r) for (int c = 3; c < 7; ++c) y.push_back(x[0][size_t(r * 9 + c)]); return y; }});
  t.push_back({"concat_last", {{2, 3, 2}, {2, 3, 5}, {2, 3, 1}},
               [](auto& x) { return ops::concat_last({x[0], x[1], x[2]}); },
               [](auto& x) {
                 Vec y;
                 for (int r = 0; r < 6; ++r) {
                   for (int c = 0; c < 2; ++c) y.push_back(x[0][size_t(r * 2 + c)]);
                   for (int c = 0; c < 5; ++c) y.push_back(x[1][size_t(r * 5 + c)]);
                   y.push_back(x[2][size_t(r)]);
                 }
                 return y;
               }});
  t.push_back({"embedding", {{5, 3}}, [ids](auto& x) { return ops::embedding(x[0], Tensor::from_ints(ids, {2, 3})); },
               [ids](auto& x) { Vec y; for (int32_t i : ids) for (int c = 0; c < 3; ++c) y.push_back(x[0][size_t(i * 3 + c)]); return y; }});
  t.push_back({"linear", {{2, 3, 4}, {5, 4}, {5}}, [](auto& x) { return ops::linear(x[0], x[1], x[2]); },
               [](auto& x) {
                 Vec y = ref_matmul(x[0], x[1], 1, 6, 5, 4, false, true);
                 for (size_t i = 0; i < y.size(); ++i) y[i] += x[2][i % 5];
                 return y;
               }});
  t.push_back({"linear_nobias", {{6, 4}, {5, 4}}, [](auto& x) { return ops::linear(x[0], x[1], Tensor()); },
               [](auto& x) { return ref_matmul(x[0], x[1], 1, 6, 5, 4, false, true); }});
  auto gelu_ref = [](Vec y) {
    for (double& v : y) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    return y;
  };
  t.push_back({"linear_gelu", {{2, 3, 4}, {5, 4}, {5}}, [](auto& x) { return ops::linear_gelu(x[0], x[1], x[2]); },
               [gelu_ref](auto& x) {
                 Vec y = ref_matmul(x[0], x[1], 1, 6, 5, 4, false, true);
                 for (size_t i = 0; i < y.size(); ++i) y[i] += x[2][i % 5];
                 return gelu_ref(y);
               }});
  t.push_back({"linear_gelu_nobias", {{6, 4}, {5, 4}}, [](auto& x) { return ops::linear_gelu(x[0], x[1], Tensor()); },
               [gelu_ref](auto& x) { return gelu_ref(ref_matmul(x[0], x[1], 1, 6, 5, 4, false, true)); }});
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Shape sa = ta ? Shape{2, 4, 3} : Shape{2, 3, 4}, sb = tb ? Shape{2, 5, 4} : Shape{2, 4, 5};
      t.push_back({"matmul_t" + std::to_string(ta) + std::to_string(tb), {sa, sb},
                   [ta, tb](auto& x) { return ops::matmul(x[0], x[1], ta, tb); },
                   [ta, tb](auto& x) { return ref_matmul(x[0], x[1], 2, 3, 5, 4, ta, tb); }});
    }
  t.push_back({"gelu", {{3, 7}}, [](auto& x) { return ops::gelu(x[0]); },
               [](auto& x) {
                 Vec y(x[0]);
                 for (double& v : y) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
                 return y;
               }});
  t.push_back({"layernorm", {{4, 6}, {6}, {6}}, [](auto& x) { return ops::layernorm(x[0], x[1], x[2]); },
               [](auto& x) { return ref_layernorm(x[0], x[1], &x[2], 4, 6); }});
  t.push_back({"layernorm_nobias", {{2, 2, 5}, {5}}, [](auto& x) { return ops::layernorm(x[0], x[1], Tensor()); },
               [](auto& x) { return ref_layernorm(x[0], x[1], nullptr, 4, 5); }});
  // A residual stream: a feeds the add and the LayerNorm, whose backward takes over the gradient
  // the add already sent to a (take_pending_gradient) and returns the sum.
  t.push_back({"residual+layernorm", {{4, 6}, {6}, {6}},
               [](auto& x) {
                 Tensor a = ops::scale(x[0], 1.5);
                 return ops::add(a, ops::layernorm(a, x[1], x[2]));
               },
               [](auto& x) {
                 Vec a(x[0]);
                 for (double& v : a) v *= 1.5;
                 Vec y = ref_layernorm(a, x[1], &x[2], 4, 6);
                 for (size_t i = 0; i < y.size(); ++i) y[i] += a[i];
                 return y;
               }});
  t.push_back({"softmax", {{4, 7}}, [](auto& x) { return ops::softmax(x[0]); },
               [](auto& x) { return ref_softmax_rows(x[0], 4, 7); }});
  t.push_back({"causal_mask+softmax", {{2, 4, 4}}, [](auto& x) { return ops::softmax(ops::causal_mask(x[0])); },
               [](auto& x) {
                 Vec s(x[0]);
                 for (int b = 0; b < 2; ++b) for (int i = 0; i < 4; ++i) for (int j = i + 1; j < 4; ++j) s[size_t((b * 4 + i) * 4 + j)] = -INFINITY;
                 return ref_softmax_rows(s, 8, 4);
               }});
  for (bool causal : {false, true})
    t.push_back({std::string("attention_softmax") + (causal ? "_causal" : ""), {{2, 5, 5}},
                 [causal](auto& x) { return ops::attention_softmax(x[0], 0.7, causal); },
                 [causal](auto& x) {
                   Vec s(x[0]);
                   for (double& v : s) v *= 0.7;
                   if (causal)
                     for (int b = 0; b < 2; ++b) for (int i = 0; i < 5; ++i) for (int j = i + 1; j < 5; ++j)
                       s[size_t((b * 5 + i) * 5 + j)] = -INFINITY;
                   return ref_softmax_rows(s, 10, 5);
                 }});
  t.push_back({"cross_entropy", {{6, 5}}, [targets](auto& x) { return ops::cross_entropy(x[0], Tensor::from_ints(targets, {6})); },
               [targets](auto& x) {
                 double total = 0;
                 int counted = 0;
                 for (int n = 0; n < 6; ++n) {
                   if (targets[size_t(n)] < 0) continue;
                   double mx = -INFINITY, s = 0;
                   for (int v = 0; v < 5; ++v) mx = std::max(mx, x[0][size_t(n * 5 + v)]);
                   for (int v = 0; v < 5; ++v) s += std::exp(x[0][size_t(n * 5 + v)] - mx);
                   total += mx + std::log(s) - x[0][size_t(n * 5 + targets[size_t(n)])];
                   ++counted;
                 }
                 return Vec{total / counted};
               }});
  // The LM head and loss in chunks of 1, 4 (ragged: 4 + 2) and all 6 rows (0), against
  // cross_entropy(x·Wᵀ) written out; row 1 is ignored.
  for (int64_t chunk : {1, 4, 0})
    t.push_back({"linear_cross_entropy_chunk" + std::to_string(chunk), {{6, 3}, {5, 3}},
                 [targets, chunk](auto& x) {
                   return ops::linear_cross_entropy(x[0], x[1], Tensor::from_ints(targets, {6}), chunk);
                 },
                 [targets](auto& x) {
                   double total = 0;
                   int counted = 0;
                   for (int n = 0; n < 6; ++n) {
                     if (targets[size_t(n)] < 0) continue;
                     Vec logit(5, 0.0);
                     for (int v = 0; v < 5; ++v)
                       for (int c = 0; c < 3; ++c) logit[size_t(v)] += x[0][size_t(n * 3 + c)] * x[1][size_t(v * 3 + c)];
                     double mx = -INFINITY, s = 0;
                     for (double l : logit) mx = std::max(mx, l);
                     for (double l : logit) s += std::exp(l - mx);
                     total += mx + std::log(s) - logit[size_t(targets[size_t(n)])];
                     ++counted;
                   }
                   return Vec{total / counted};
                 }});
  t.push_back({"dropout", {{4, 16}}, [](auto& x) { return ops::dropout(x[0], 0.25, 42); },
               [](auto& x) {
                 Vec y(x[0]);
                 for (size_t i = 0; i < y.size(); ++i) y[i] = cpu::uniform_from(42, i) >= 0.25f ? y[i] / 0.75 : 0.0;
                 return y;
               }});
  t.push_back({"rope", {{2, 3, 2, 6}}, [](auto& x) { return ops::rope(x[0], 100.0, 1); },
               [](auto& x) {
                 Vec y(x[0]);
                 for (int b = 0; b < 2; ++b) for (int tt = 0; tt < 3; ++tt) for (int h = 0; h < 2; ++h) for (int i = 0; i < 3; ++i) {
                   double ang = (tt + 1) * std::pow(100.0, -2.0 * i / 6);
                   size_t r = size_t(((b * 3 + tt) * 2 + h) * 6);
                   y[r + size_t(i)] = x[0][r + size_t(i)] * std::cos(ang) - x[0][r + size_t(i) + 3] * std::sin(ang);
                   y[r + size_t(i) + 3] = x[0][r + size_t(i)] * std::sin(ang) + x[0][r + size_t(i) + 3] * std::cos(ang);
                 }
                 return y;
               }});
  for (int kind = 0; kind < 2; ++kind)
    for (double base : {0.0, 100.0}) {  // (B, T, 3C) with C = 8, two heads of 4; with and without RoPE
      std::string name = std::string("self_attention_") + (kind ? "naive" : "flash") + (base > 0 ? "_rope" : "");
      t.push_back({name, {{2, 5, 24}},
                   [kind, base](auto& x) {
                     return ops::self_attention(x[0], 2, kind ? ops::AttentionKind::naive : ops::AttentionKind::flash, base);
                   },
                   [base](auto& x) {
                     // Split q, k, v, rotate q and k (rotate-half pairing), attend causally.
                     Vec q, k, v;
                     for (int r = 0; r < 10; ++r)
                       for (int c = 0; c < 24; ++c) (c < 8 ? q : c < 16 ? k : v).push_back(x[0][size_t(r * 24 + c)]);
                     if (base > 0)
                       for (Vec* z : {&q, &k})
                         for (int b = 0; b < 2; ++b) for (int tt = 0; tt < 5; ++tt) for (int h = 0; h < 2; ++h)
                           for (int i = 0; i < 2; ++i) {
                             double ang = tt * std::pow(base, -2.0 * i / 4);
                             size_t r = size_t(((b * 5 + tt) * 2 + h) * 4);
                             double x1 = (*z)[r + size_t(i)], x2 = (*z)[r + size_t(i) + 2];
                             (*z)[r + size_t(i)] = x1 * std::cos(ang) - x2 * std::sin(ang);
                             (*z)[r + size_t(i) + 2] = x1 * std::sin(ang) + x2 * std::cos(ang);
                           }
                     return ref_attention(q, k, v, 2, 5, 2, 4, true);
                   }});
    }
  for (bool causal : {false, true}) {
    std::string suffix = causal ? "_causal" : "";
    Shape s = {2, 5, 2, 4};
    t.push_back({"attention_naive" + suffix, {s, s, s}, [causal](auto& x) { return ops::attention_naive(x[0], x[1], x[2], causal); },
                 [causal](auto& x) { return ref_attention(x[0], x[1], x[2], 2, 5, 2, 4, causal); }});
    t.push_back({"attention_flash" + suffix, {s, s, s}, [causal](auto& x) { return ops::attention_flash(x[0], x[1], x[2], causal); },
                 [causal](auto& x) { return ref_attention(x[0], x[1], x[2], 2, 5, 2, 4, causal); }});
  }
  return t;
}

// gtest prints parameters in failure messages and test listings: show the op's name.
void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

class OpTable : public ::testing::TestWithParam<OpCase> {};

std::vector<Tensor> make_inputs(const OpCase& c, DType dtype) {
  std::vector<Tensor> xs;
  for (size_t i = 0; i < c.inputs.size(); ++i) xs.push_back(random_tensor(c.inputs[i], 100 + i, dtype));
  return xs;
}

TEST_P(OpTable, ForwardMatchesDoubleReference) {
  const OpCase& c = GetParam();
  std::vector<Vec> host;
  for (const Tensor& x : make_inputs(c, DType::f64)) host.push_back(x.to_double_vector());
  Vec expected = c.reference(host);
  Vec got64 = c.op(make_inputs(c, DType::f64)).to_double_vector();
  EXPECT_LT(rel_error(got64, expected), 1e-12) << c.name << " in f64";
  Tensor out32 = c.op(make_inputs(c, DType::f32));
  EXPECT_EQ(out32.dtype(), DType::f32);
  EXPECT_LT(rel_error(out32.to_double_vector(), expected), c.f32_tolerance) << c.name << " in f32";
}

TEST_P(OpTable, BackwardMatchesFiniteDifferences) {
  const OpCase& c = GetParam();
  std::vector<Tensor> xs = make_inputs(c, DType::f64);
  for (Tensor& x : xs) x.set_requires_grad(true);
  GradCheckResult r = gradcheck(c.op, xs);
  EXPECT_TRUE(r.ok) << c.name << ": " << r.detail << " (max abs error " << r.max_abs_error << ")";
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTable, ::testing::ValuesIn(op_table()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n) if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace tg
