// The op specification: one entry per op case, the single source of the op table
// (tests/ops/test_op_table.cpp: forward against a double-precision reference, backward against
// finite differences), the CPU/GPU parity table (tests/cuda/test_op_parity.cpp: GPU in f32 and
// bf16 against the CPU) and the kernel parity table's coverage (tests/cuda/test_kernel_parity.cpp).
// Adding an op is one entry here plus the op and its kernels. An entry without a GPU row must say
// why (tests/ops checks it, so a missing GPU row fails the CPU suite too).
#pragma once
#include <algorithm>
#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/cpu/dropout.h"
#include "src/ops/ops.h"

namespace tg::testing {

using Vec = std::vector<double>;
using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;
using RefFn = std::function<Vec(const std::vector<Vec>&)>;

// One row of the CPU/GPU parity table: the op on the GPU in f32 and bf16 against the CPU in f32,
// as a relative-norm error, on shapes sized for the kernels (vector widths, tiles, fused paths).
struct GpuSample {
  std::string name;  // the row's test name
  std::vector<Shape> inputs;
  OpFn op;
  double tol_f32 = 1e-5, tol_bf16 = 2e-2;
};

struct OpSpec {
  std::string name;           // the op table's test name
  std::vector<Shape> inputs;  // the CPU sample: all floating, all differentiated
  OpFn op;
  RefFn reference;            // the forward in double precision, written from the definition
  double tol_f32 = 1e-5;      // the f32 forward against the reference (f64: 1e-12)
  std::vector<GpuSample> gpu;  // its GPU rows
  std::string no_gpu;          // why it has none
  // The CUDA launchers it runs that the kernel parity table checks against their CPU twins: each
  // names that table's rows (a row "layernorm_64x768" is the launcher "layernorm"'s).
  std::vector<std::string> kernels;

  OpSpec& on_gpu(std::vector<GpuSample> rows, std::vector<std::string> kernel_rows = {}) {
    gpu = std::move(rows);
    kernels = std::move(kernel_rows);
    return *this;
  }
  OpSpec& cpu_only(std::string why, std::vector<std::string> kernel_rows = {}) {
    no_gpu = std::move(why);
    kernels = std::move(kernel_rows);
    return *this;
  }
};

// gtest prints parameters in failure messages and test listings: show the case's name.
inline void PrintTo(const OpSpec& c, std::ostream* os) { *os << c.name; }
inline void PrintTo(const GpuSample& c, std::ostream* os) { *os << c.name; }

// Launchers of the kernel parity table that no op runs: the tensor layer's conversions and
// gradient additions (the sink's folds), the optimizer's.
inline const std::vector<std::string>& kernels_outside_ops() {
  static const std::vector<std::string> k = {"add_inplace", "add_converted", "cast", "fill",
                                             "adamw", "sum_squares", "scale_inplace"};
  return k;
}

// --- independent naive references, written for clarity rather than speed ---

inline Vec ref_matmul(const Vec& a, const Vec& b, int64_t batch, int64_t M, int64_t N, int64_t K, bool ta, bool tb) {
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

inline Vec ref_layernorm(const Vec& x, const Vec& w, const Vec* b, int64_t N, int64_t C) {
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

inline Vec ref_softmax_rows(const Vec& x, int64_t N, int64_t C) {
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
// first (optional, (B, T)): the first key each query may see (structured masks, causal only).
inline Vec ref_attention(const Vec& q, const Vec& k, const Vec& v, int64_t B, int64_t T, int64_t H, int64_t D, bool causal,
                         const std::vector<int64_t>* first = nullptr) {
  Vec o(q.size(), 0.0);
  auto at = [&](int64_t b, int64_t t, int64_t h, int64_t d) { return size_t(((b * T + t) * H + h) * D + d); };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        Vec s(size_t(T), -INFINITY);
        double mx = -INFINITY;
        for (int64_t j = 0; j < T; ++j) {
          if (causal && j > i) continue;
          if (first && j < (*first)[size_t(b * T + i)]) continue;
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

inline std::vector<OpSpec> op_specs() {
  const std::vector<int32_t> ids = {3, 0, 4, 3, 1, 4};  // repeated ids exercise the scatter-add
  const std::vector<int32_t> targets = {2, -1, 0, 4, 4, 1};
  const std::vector<int32_t> gpu_ids = {3, 0, 4, 3, 1, 4, 2, 2};
  const std::vector<int32_t> gpu_targets = {2, -1, 0, 4, 4, 1, 3, 0};
  std::vector<OpSpec> t;
  t.emplace_back(OpSpec{"add", {{2, 3, 4}, {2, 3, 4}}, [](auto& x) { return ops::add(x[0], x[1]); },
               [](auto& x) { Vec y(x[0]); for (size_t i = 0; i < y.size(); ++i) y[i] += x[1][i]; return y; }}).on_gpu({{"add", {{4, 33}, {4, 33}}, [](auto& x) { return ops::add(x[0], x[1]); }}}, {"add_forward"});
  t.emplace_back(OpSpec{"add_broadcast", {{2, 3, 4}, {3, 4}}, [](auto& x) { return ops::add(x[0], x[1]); },
               [](auto& x) { Vec y(x[0]); for (size_t i = 0; i < y.size(); ++i) y[i] += x[1][i % 12]; return y; }}).on_gpu({{"add_broadcast", {{2, 9, 33}, {33}}, [](auto& x) { return ops::add(x[0], x[1]); }}}, {"add_forward", "sum_rows"});
  t.emplace_back(OpSpec{"mul", {{3, 5}, {3, 5}}, [](auto& x) { return ops::mul(x[0], x[1]); },
               [](auto& x) { Vec y(x[0]); for (size_t i = 0; i < y.size(); ++i) y[i] *= x[1][i]; return y; }}).on_gpu({{"mul", {{5, 17}, {5, 17}}, [](auto& x) { return ops::mul(x[0], x[1]); }}}, {"mul"});
  t.emplace_back(OpSpec{"scale", {{7}}, [](auto& x) { return ops::scale(x[0], -0.37); },
               [](auto& x) { Vec y(x[0]); for (double& v : y) v *= -0.37; return y; }}).on_gpu({{"scale", {{7, 3}}, [](auto& x) { return ops::scale(x[0], -0.37); }}}, {"scale"});
  t.emplace_back(OpSpec{"sum", {{4, 3}}, [](auto& x) { return ops::sum(x[0]); },
               [](auto& x) { double s = 0; for (double v : x[0]) s += v; return Vec{s}; }}).on_gpu({{"sum", {{37, 5}}, [](auto& x) { return ops::sum(x[0]); }}}, {"sum_rows"});
  t.emplace_back(OpSpec{"mean", {{4, 3}}, [](auto& x) { return ops::mean(x[0]); },
               [](auto& x) { double s = 0; for (double v : x[0]) s += v; return Vec{s / 12}; }}).cpu_only("scale(sum(x)): both ops have GPU rows");
  t.emplace_back(OpSpec{"reshape", {{2, 6}}, [](auto& x) { return ops::mul(ops::reshape(x[0], {3, 4}), ops::reshape(x[0], {3, 4})); },
               [](auto& x) { Vec y(x[0]); for (double& v : y) v *= v; return y; }}).cpu_only("a view: no kernel of its own (the product is mul's)");
  t.emplace_back(OpSpec{"transpose12", {{2, 3, 4, 5}}, [](auto& x) { return ops::transpose12(x[0]); },
               [](auto& x) {
                 Vec y(x[0].size());
                 for (int a = 0; a < 2; ++a) for (int m = 0; m < 3; ++m) for (int n = 0; n < 4; ++n) for (int d = 0; d < 5; ++d)
                   y[size_t(((a * 4 + n) * 3 + m) * 5 + d)] = x[0][size_t(((a * 3 + m) * 4 + n) * 5 + d)];
                 return y;
               }}).on_gpu({{"transpose12", {{2, 3, 4, 40}}, [](auto& x) { return ops::transpose12(x[0]); }}}, {"swap_dims12"});
  t.emplace_back(OpSpec{"slice_last", {{3, 9}}, [](auto& x) { return ops::slice_last(x[0], 3, 4); },
               [](auto& x) { Vec y; for (int r = 0; r < 3; ++r) for (int c = 3; c < 7; ++c) y.push_back(x[0][size_t(r * 9 + c)]); return y; }}).on_gpu({{"slice_last", {{3, 99}}, [](auto& x) { return ops::slice_last(x[0], 33, 33); }}}, {"slice"});
  t.emplace_back(OpSpec{"concat_last", {{2, 3, 2}, {2, 3, 5}, {2, 3, 1}},
               [](auto& x) { return ops::concat_last({x[0], x[1], x[2]}); },
               [](auto& x) {
                 Vec y;
                 for (int r = 0; r < 6; ++r) {
                   for (int c = 0; c < 2; ++c) y.push_back(x[0][size_t(r * 2 + c)]);
                   for (int c = 0; c < 5; ++c) y.push_back(x[1][size_t(r * 5 + c)]);
                   y.push_back(x[2][size_t(r)]);
                 }
                 return y;
               }}).on_gpu({{"concat_last", {{4, 9, 16}, {4, 9, 8}}, [](auto& x) { return ops::concat_last({x[0], x[1]}); }}}, {"slice"});
  t.emplace_back(OpSpec{"embedding", {{5, 3}}, [ids](auto& x) { return ops::embedding(x[0], Tensor::from_ints(ids, {2, 3})); },
               [ids](auto& x) { Vec y; for (int32_t i : ids) for (int c = 0; c < 3; ++c) y.push_back(x[0][size_t(i * 3 + c)]); return y; }}).on_gpu({{"embedding", {{5, 24}}, [gpu_ids](auto& x) { return ops::embedding(x[0], Tensor::from_ints(gpu_ids, {2, 4})); }}}, {"embedding"});
  // A table tied to an output projection (GPT-2's LM head): the table reaches the result through
  // the embedding and the linear, whose gradient the embedding's backward takes over and adds as
  // it writes its own (GradHandOver). The table is made by an op so that its gradient is pending.
  t.emplace_back(OpSpec{"embedding+tied_linear", {{5, 3}},
               [ids](auto& x) {
                 Tensor w = ops::scale(x[0], 1.5);
                 return ops::linear(ops::embedding(w, Tensor::from_ints(ids, {2, 3})), w, Tensor());
               },
               [ids](auto& x) {
                 Vec w(x[0]);
                 for (double& v : w) v *= 1.5;
                 Vec y;
                 for (int32_t i : ids)
                   for (int v = 0; v < 5; ++v) {
                     double d = 0;
                     for (int c = 0; c < 3; ++c) d += w[size_t(i * 3 + c)] * w[size_t(v * 3 + c)];
                     y.push_back(d);
                   }
                 return y;
               }}).on_gpu({{"embedding+tied_linear", {{5, 24}}, [gpu_ids](auto& x) {
                              Tensor w = ops::scale(x[0], 1.5);
                              return ops::linear(ops::embedding(w, Tensor::from_ints(gpu_ids, {2, 4})), w, Tensor());
                            }}},
                  {"embedding", "scale"});
  t.emplace_back(OpSpec{"linear", {{2, 3, 4}, {5, 4}, {5}}, [](auto& x) { return ops::linear(x[0], x[1], x[2]); },
               [](auto& x) {
                 Vec y = ref_matmul(x[0], x[1], 1, 6, 5, 4, false, true);
                 for (size_t i = 0; i < y.size(); ++i) y[i] += x[2][i % 5];
                 return y;
               }}).on_gpu({{"linear", {{2, 7, 64}, {48, 64}, {48}}, [](auto& x) { return ops::linear(x[0], x[1], x[2]); }}}, {"sum_rows"});
  t.emplace_back(OpSpec{"linear_nobias", {{6, 4}, {5, 4}}, [](auto& x) { return ops::linear(x[0], x[1], Tensor()); },
               [](auto& x) { return ref_matmul(x[0], x[1], 1, 6, 5, 4, false, true); }}).on_gpu({{"linear_nobias", {{9, 40}, {24, 40}}, [](auto& x) { return ops::linear(x[0], x[1], Tensor()); }}});
  auto gelu_ref = [](Vec y) {
    for (double& v : y) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    return y;
  };
  t.emplace_back(OpSpec{"linear_gelu", {{2, 3, 4}, {5, 4}, {5}}, [](auto& x) { return ops::linear_gelu(x[0], x[1], x[2]); },
               [gelu_ref](auto& x) {
                 Vec y = ref_matmul(x[0], x[1], 1, 6, 5, 4, false, true);
                 for (size_t i = 0; i < y.size(); ++i) y[i] += x[2][i % 5];
                 return gelu_ref(y);
               }}).on_gpu({  // 384 rows: the fused GELU-backward + bias-sum kernel (two passes); 14 rows: its one-pass fallback.
                   {"linear_gelu", {{4, 96, 64}, {48, 64}, {48}}, [](auto& x) { return ops::linear_gelu(x[0], x[1], x[2]); }},
                   {"linear_gelu_small", {{2, 7, 64}, {48, 64}, {48}}, [](auto& x) { return ops::linear_gelu(x[0], x[1], x[2]); }}},
                  {"gelu", "gelu_sum_rows"});
  t.emplace_back(OpSpec{"linear_gelu_nobias", {{6, 4}, {5, 4}}, [](auto& x) { return ops::linear_gelu(x[0], x[1], Tensor()); },
               [gelu_ref](auto& x) { return gelu_ref(ref_matmul(x[0], x[1], 1, 6, 5, 4, false, true)); }}).on_gpu({{"linear_gelu_nobias", {{9, 40}, {24, 40}}, [](auto& x) { return ops::linear_gelu(x[0], x[1], Tensor()); }}},
                  {"gelu"});
  // x (2, 3, 4) → pre, h (6 rows, 5) → out (6 rows, 3).
  auto mlp_ref = [gelu_ref](auto& x, bool bias) {
    Vec pre = ref_matmul(x[0], x[1], 1, 6, 5, 4, false, true);
    if (bias)
      for (size_t i = 0; i < pre.size(); ++i) pre[i] += x[2][i % 5];
    Vec y = ref_matmul(gelu_ref(pre), x[bias ? 3 : 2], 1, 6, 3, 5, false, true);
    if (bias)
      for (size_t i = 0; i < y.size(); ++i) y[i] += x[4][i % 3];
    return y;
  };
  t.emplace_back(OpSpec{"mlp", {{2, 3, 4}, {5, 4}, {5}, {3, 5}, {3}}, [](auto& x) { return ops::mlp(x[0], x[1], x[2], x[3], x[4]); },
               [mlp_ref](auto& x) { return mlp_ref(x, true); }}).on_gpu({
                   // 4C = 256 (a multiple of 8): bf16 takes cuBLASLt's DGELU_BGRAD epilogue; 4C = 44: the
                   // plain GEMM and the GELU-backward + bias-sum kernel (one pass at 14 rows).
                   {"mlp", {{4, 96, 64}, {256, 64}, {256}, {64, 256}, {64}}, [](auto& x) { return ops::mlp(x[0], x[1], x[2], x[3], x[4]); }},
                   {"mlp_fallback", {{2, 7, 64}, {44, 64}, {44}, {48, 44}, {48}}, [](auto& x) { return ops::mlp(x[0], x[1], x[2], x[3], x[4]); }}},
                  {"gelu", "gelu_sum_rows", "sum_rows"});
  t.emplace_back(OpSpec{"mlp_nobias", {{6, 4}, {5, 4}, {3, 5}}, [](auto& x) { return ops::mlp(x[0], x[1], Tensor(), x[2], Tensor()); },
               [mlp_ref](auto& x) { return mlp_ref(x, false); }}).on_gpu({  // 4C = 24: bf16 takes DGELU without the bias gradient
                   {"mlp_nobias", {{9, 40}, {24, 40}, {40, 24}}, [](auto& x) { return ops::mlp(x[0], x[1], Tensor(), x[2], Tensor()); }}},
                  {"gelu"});
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Shape sa = ta ? Shape{2, 4, 3} : Shape{2, 3, 4}, sb = tb ? Shape{2, 5, 4} : Shape{2, 4, 5};
      t.emplace_back(OpSpec{"matmul_t" + std::to_string(ta) + std::to_string(tb), {sa, sb},
                   [ta, tb](auto& x) { return ops::matmul(x[0], x[1], ta, tb); },
                   [ta, tb](auto& x) { return ref_matmul(x[0], x[1], 2, 3, 5, 4, ta, tb); }}).on_gpu({{"matmul_t" + std::to_string(ta) + std::to_string(tb),
                            {ta ? Shape{3, 16, 12} : Shape{3, 12, 16}, tb ? Shape{3, 20, 16} : Shape{3, 16, 20}},
                            [ta, tb](auto& x) { return ops::matmul(x[0], x[1], ta, tb); }}});
    }
  t.emplace_back(OpSpec{"gelu", {{3, 7}}, [](auto& x) { return ops::gelu(x[0]); },
               [](auto& x) {
                 Vec y(x[0]);
                 for (double& v : y) v = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
                 return y;
               }}).on_gpu({{"gelu", {{3, 71}}, [](auto& x) { return ops::gelu(x[0]); }}}, {"gelu"});
  t.emplace_back(OpSpec{"layernorm", {{4, 6}, {6}, {6}}, [](auto& x) { return ops::layernorm(x[0], x[1], x[2]); },
               [](auto& x) { return ref_layernorm(x[0], x[1], &x[2], 4, 6); }}).on_gpu({{"layernorm", {{6, 96}, {96}, {96}}, [](auto& x) { return ops::layernorm(x[0], x[1], x[2]); }}}, {"layernorm"});
  t.emplace_back(OpSpec{"layernorm_nobias", {{2, 2, 5}, {5}}, [](auto& x) { return ops::layernorm(x[0], x[1], Tensor()); },
               [](auto& x) { return ref_layernorm(x[0], x[1], nullptr, 4, 5); }}).on_gpu({{"layernorm_nobias", {{5, 37}, {37}}, [](auto& x) { return ops::layernorm(x[0], x[1], Tensor()); }}},
                  {"layernorm"});
  // A residual stream: a feeds the add and the LayerNorm, whose backward takes over the gradient
  // the add already sent to a (GradHandOver::take) and returns the sum.
  t.emplace_back(OpSpec{"residual+layernorm", {{4, 6}, {6}, {6}},
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
               }}).on_gpu({{"residual+layernorm", {{6, 96}, {96}, {96}}, [](auto& x) {  // dx_add: the residual's gradient
                              Tensor a = ops::scale(x[0], 1.5);
                              return ops::add(a, ops::layernorm(a, x[1], x[2]));
                            }}},
                  {"layernorm", "add_forward", "scale"});
  // The residual add and the LayerNorm after it as one op: both outputs feed the result, and the
  // sum also reaches it directly, so LayerNorm's backward takes the add's gradient over.
  t.emplace_back(OpSpec{"add_layernorm", {{4, 6}, {4, 6}, {6}, {6}},
               [](auto& x) {
                 ops::AddLayerNorm r = ops::add_layernorm(x[0], x[1], x[2], x[3]);
                 return ops::add(ops::scale(r.sum, 0.5), r.normed);
               },
               [](auto& x) {
                 Vec s(x[0]);
                 for (size_t i = 0; i < s.size(); ++i) s[i] += x[1][i];
                 Vec y = ref_layernorm(s, x[2], &x[3], 4, 6);
                 for (size_t i = 0; i < y.size(); ++i) y[i] += 0.5 * s[i];
                 return y;
               }}).on_gpu({{"add_layernorm", {{6, 96}, {6, 96}, {96}, {96}}, [](auto& x) {
                              ops::AddLayerNorm r = ops::add_layernorm(x[0], x[1], x[2], x[3]);
                              return ops::add(ops::scale(r.sum, 0.5), r.normed);
                            }}},
                  {"add_layernorm_forward", "layernorm", "add_forward", "scale"});
  // With the bias of b added in the op (a projection's): its gradient is the column sums of the
  // sum's whole gradient. The GPU rows read the sum in both orders: where the LayerNorm's backward
  // runs last among the sum's readers it forms those sums itself, otherwise the add's backward does.
  auto add_layernorm_bias = [](bool sum_first) {
    return [sum_first](auto& x) {
      ops::AddLayerNorm r = ops::add_layernorm(x[0], x[1], x[2], x[3], 1e-5, x[4]);
      Tensor half = ops::scale(r.sum, 0.5);
      return sum_first ? ops::add(half, r.normed) : ops::add(r.normed, half);
    };
  };
  t.emplace_back(OpSpec{"add_layernorm_bias", {{4, 6}, {4, 6}, {6}, {6}, {6}}, add_layernorm_bias(true),
               [](auto& x) {
                 Vec s(x[0]);
                 for (size_t i = 0; i < s.size(); ++i) s[i] += x[1][i] + x[4][i % 6];
                 Vec y = ref_layernorm(s, x[2], &x[3], 4, 6);
                 for (size_t i = 0; i < y.size(); ++i) y[i] += 0.5 * s[i];
                 return y;
               }}).on_gpu({{"add_layernorm_bias_sum_first", {{6, 96}, {6, 96}, {96}, {96}, {96}}, add_layernorm_bias(true)},
                           {"add_layernorm_bias_normed_first", {{6, 96}, {6, 96}, {96}, {96}, {96}},
                            add_layernorm_bias(false)}},
                          {"add_layernorm_forward", "layernorm", "add_forward", "scale", "sum_rows"});
  t.emplace_back(OpSpec{"softmax", {{4, 7}}, [](auto& x) { return ops::softmax(x[0]); },
               [](auto& x) { return ref_softmax_rows(x[0], 4, 7); }}).on_gpu({{"softmax", {{6, 77}}, [](auto& x) { return ops::softmax(x[0]); }}}, {"softmax"});
  t.emplace_back(OpSpec{"causal_mask+softmax", {{2, 4, 4}}, [](auto& x) { return ops::softmax(ops::causal_mask(x[0])); },
               [](auto& x) {
                 Vec s(x[0]);
                 for (int b = 0; b < 2; ++b) for (int i = 0; i < 4; ++i) for (int j = i + 1; j < 4; ++j) s[size_t((b * 4 + i) * 4 + j)] = -INFINITY;
                 return ref_softmax_rows(s, 8, 4);
               }}).on_gpu({{"causal_mask+softmax", {{3, 9, 9}}, [](auto& x) { return ops::softmax(ops::causal_mask(x[0])); }}},
                  {"causal_mask", "softmax"});
  for (bool causal : {false, true})
    t.emplace_back(OpSpec{std::string("attention_softmax") + (causal ? "_causal" : ""), {{2, 5, 5}},
                 [causal](auto& x) { return ops::attention_softmax(x[0], 0.7, causal); },
                 [causal](auto& x) {
                   Vec s(x[0]);
                   for (double& v : s) v *= 0.7;
                   if (causal)
                     for (int b = 0; b < 2; ++b) for (int i = 0; i < 5; ++i) for (int j = i + 1; j < 5; ++j)
                       s[size_t((b * 5 + i) * 5 + j)] = -INFINITY;
                   return ref_softmax_rows(s, 10, 5);
                 }}).on_gpu({{std::string("attention_softmax") + (causal ? "_causal" : ""), {{3, 40, 40}},
                            [causal](auto& x) { return ops::attention_softmax(x[0], 0.3, causal); }}});
  t.emplace_back(OpSpec{"cross_entropy", {{6, 5}}, [targets](auto& x) { return ops::cross_entropy(x[0], Tensor::from_ints(targets, {6})); },
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
               }}).on_gpu({{"cross_entropy", {{8, 5}}, [gpu_targets](auto& x) {
                              return ops::cross_entropy(x[0], Tensor::from_ints(gpu_targets, {8}));
                            }}},
                  {"cross_entropy"});
  // The LM head and loss in chunks of 1, 4 (ragged: 4 + 2) and all 6 rows (0), against
  // cross_entropy(x·Wᵀ) written out; row 1 is ignored.
  for (int64_t chunk : {1, 4, 0}) {
    OpSpec& e = t.emplace_back(OpSpec{"linear_cross_entropy_chunk" + std::to_string(chunk), {{6, 3}, {5, 3}},
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
    // On the GPU: 8 rows in chunks of 3 (ragged), V 50 (not a multiple of the vector width), and
    // all at once.
    const int64_t gpu_chunk = chunk == 4 ? 3 : chunk;
    if (chunk == 1)
      e.cpu_only("chunks of one row: the GPU's chunk loop runs in the ragged row (linear_cross_entropy_chunk3)");
    else
      e.on_gpu({{"linear_cross_entropy_chunk" + std::to_string(gpu_chunk), {{8, 64}, {50, 64}},
                 [gpu_targets, gpu_chunk](auto& x) {
                   return ops::linear_cross_entropy(x[0], x[1], Tensor::from_ints(gpu_targets, {8}), gpu_chunk);
                 }}},
               {"cross_entropy"});
  }
  t.emplace_back(OpSpec{"dropout", {{4, 16}}, [](auto& x) { return ops::dropout(x[0], 0.25, 42); },
               [](auto& x) {
                 Vec y(x[0]);
                 for (size_t i = 0; i < y.size(); ++i) y[i] = cpu::uniform_from(42, i) >= 0.25f ? y[i] / 0.75 : 0.0;
                 return y;
               }}).on_gpu({{"dropout", {{4, 50}}, [](auto& x) { return ops::dropout(x[0], 0.25, 42); }}}, {"dropout"});
  t.emplace_back(OpSpec{"rope", {{2, 3, 2, 6}}, [](auto& x) { return ops::rope(x[0], 100.0, 1); },
               [](auto& x) {
                 Vec y(x[0]);
                 for (int b = 0; b < 2; ++b) for (int tt = 0; tt < 3; ++tt) for (int h = 0; h < 2; ++h) for (int i = 0; i < 3; ++i) {
                   double ang = (tt + 1) * std::pow(100.0, -2.0 * i / 6);
                   size_t r = size_t(((b * 3 + tt) * 2 + h) * 6);
                   y[r + size_t(i)] = x[0][r + size_t(i)] * std::cos(ang) - x[0][r + size_t(i) + 3] * std::sin(ang);
                   y[r + size_t(i) + 3] = x[0][r + size_t(i)] * std::sin(ang) + x[0][r + size_t(i) + 3] * std::cos(ang);
                 }
                 return y;
               }}).on_gpu({{"rope", {{2, 7, 3, 16}}, [](auto& x) { return ops::rope(x[0], 10000.0, 3); }}}, {"rope"});
  for (int kind = 0; kind < 2; ++kind)
    for (double base : {0.0, 100.0}) {  // (B, T, 3C) with C = 8, two heads of 4; with and without RoPE
      std::string name = std::string("self_attention_") + (kind ? "naive" : "flash") + (base > 0 ? "_rope" : "");
      OpSpec& e = t.emplace_back(OpSpec{name, {{2, 5, 24}},
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
      if (kind)
        e.cpu_only("its kernels (matmul, attention_softmax, rope, swap_dims12) have GPU rows, and "
                   "tests/cuda/test_flash_vs_materialised.cpp compares it with the flash path on the GPU");
      else  // d = 64 takes the fused kernel in bf16 (and the materialised fallback in f32).
        e.on_gpu({{name, {{2, 77, 3 * 128}},
                   [base](auto& x) {
                     return ops::self_attention(x[0], 2, ops::AttentionKind::flash, base > 0 ? 10000.0 : 0.0);
                   }}},
                 {"rope", "slice"});
    }
  for (bool causal : {false, true}) {
    std::string suffix = causal ? "_causal" : "";
    Shape s = {2, 5, 2, 4};
    t.emplace_back(OpSpec{"attention_naive" + suffix, {s, s, s}, [causal](auto& x) { return ops::attention_naive(x[0], x[1], x[2], causal); },
                 [causal](auto& x) { return ref_attention(x[0], x[1], x[2], 2, 5, 2, 4, causal); }}).on_gpu({{"attention_naive" + suffix, {{2, 19, 2, 16}, {2, 19, 2, 16}, {2, 19, 2, 16}},
                              [causal](auto& x) { return ops::attention_naive(x[0], x[1], x[2], causal); }}},
                    {"swap_dims12", "causal_mask"});
    t.emplace_back(OpSpec{"attention_flash" + suffix, {s, s, s}, [causal](auto& x) { return ops::attention_flash(x[0], x[1], x[2], causal); },
                 [causal](auto& x) { return ref_attention(x[0], x[1], x[2], 2, 5, 2, 4, causal); }}).cpu_only("the flash kernels are checked against attention in double precision on the GPU in "
                      "tests/cuda/test_flash_attention.cpp and test_flash_vs_materialised.cpp");
  }
  {
    // Structured masks: a window of 5 and documents of lengths 1, 9, 3, 30, … over T = 40, so the
    // 32-wide key tiles include skipped, unmasked and boundary tiles. Row 1 has other documents.
    const int64_t T = 40, W = 5;
    std::vector<int32_t> starts(size_t(2 * T));
    std::vector<int64_t> first(size_t(2 * T));
    for (int64_t b = 0; b < 2; ++b) {
      const std::vector<int64_t> ends = b == 0 ? std::vector<int64_t>{1, 10, 13, 40} : std::vector<int64_t>{20, 21, 40};
      int64_t start = 0;
      for (int64_t t = 0, d = 0; t < T; ++t) {
        starts[size_t(b * T + t)] = int32_t(start);
        first[size_t(b * T + t)] = std::max(start, t - W + 1);
        if (t + 1 == ends[size_t(d)]) start = t + 1, ++d;
      }
    }
    auto mask = [starts] {
      ops::AttentionMask m;
      m.window = W;
      m.doc_start = Tensor::from_ints(starts, {2, T});
      return m;
    };
    Shape s = {2, T, 1, 4};
    for (int kind = 0; kind < 2; ++kind)
      t.emplace_back(OpSpec{std::string("attention_") + (kind ? "naive" : "flash") + "_window_documents", {s, s, s},
                            [kind, mask](auto& x) {
                              return ops::attention(x[0], x[1], x[2], true,
                                                    kind ? ops::AttentionKind::naive : ops::AttentionKind::flash, mask());
                            },
                            [first](auto& x) { return ref_attention(x[0], x[1], x[2], 2, T, 1, 4, true, &first); }})
          .cpu_only("the GPU's masked attention has tests of its own (tests/cuda/test_attention_masks_gpu.cpp, "
                    "tests/cuda/test_flash_attention.cpp)");
  }
  return t;
}

}  // namespace tg::testing
