// Index arithmetic past 2^31 and 2^32 elements on the GPU. At a sequence length of two million
// tokens GPT-2 small's fused qkv (T, 2304) and MLP hidden (T, 3072) hold 4.8 and 6.4 G elements,
// past 2^32, and its (T, 768) activations pass 2^31 from T = 2.8 M: every op of a training step
// on such tensors must index in 64 bits. Each test builds bf16 (or fp32) tensors of just over 2^32
// elements on the device, runs one op through the ops API and checks sampled rows — the first,
// those around elements 2^31 and 2^32, the last, and rows spread in between — against a formula
// evaluated in double on the host. An index that wraps at 2^31 (int32) points before the buffer,
// one that wraps at 2^32 (uint32) at element i − 2^32: either way the elements past the wrap are
// never written. Outputs are allocated over freed blocks of NaN bytes (poison_next), so an
// unwritten element reads NaN and fails its check; each test prints whether they landed there.
//
// Run alone: test_cuda --gtest_filter='LargeIndex.*'. Each test states the device memory it
// needs (at most about 52 GB, the cast test) and skips, saying why, when that much is not free.
#include <gtest/gtest.h>

#include "tests/cuda/cuda_test_util.h"

#ifdef TILEGRAD_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/hash.h"
#include "src/autograd/autograd.h"
#include "src/ops/ops.h"

namespace tg {
namespace {

constexpr int64_t kTwo31 = int64_t(1) << 31;
constexpr int64_t kTwo32 = int64_t(1) << 32;
const Device kGpu = Device::cuda(0);

// Rows of `cols` elements whose product passes 2^32 by `extra` whole rows.
int64_t rows_past_2_32(int64_t cols, int64_t extra = 1024) { return kTwo32 / cols + 1 + extra; }

size_t bf16_bytes(int64_t rows, int64_t cols) { return size_t(rows) * size_t(cols) * 2; }

// Frees what the device's memory pool holds unused (earlier tests' tensors), then "" when `bytes`
// (plus 2 GiB for cuBLASLt's workspace and small tensors) are free, else why the test skips.
std::string memory_shortfall(size_t bytes) {
  CHECK_CUDA(cudaDeviceSynchronize());
  int dev = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  cudaMemPool_t pool;
  CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev));
  CHECK_CUDA(cudaMemPoolTrimTo(pool, 0));
  size_t free_bytes = 0, total_bytes = 0;
  CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t need = bytes + (size_t(2) << 30);
  if (free_bytes >= need) return "";
  char why[160];
  std::snprintf(why, sizeof why, "needs %.1f GiB of free GPU memory, %.1f GiB are free (of %.1f GiB)",
                double(need) / double(1 << 30), double(free_bytes) / double(1 << 30), double(total_bytes) / double(1 << 30));
  return why;
}

// A test's first line: skips without a GPU or without `bytes` of free device memory.
#define REQUIRE_GPU_MEMORY(bytes)                                                 \
  REQUIRE_GPU();                                                                  \
  if (const std::string why_ = memory_shortfall(bytes); !why_.empty()) GTEST_SKIP() << why_

// Blocks of the given sizes (each 256 MiB larger, room for the small allocations an op may make
// first) filled with 0xFF bytes, NaN in bf16 and fp32, and freed again: the stream-ordered pool
// hands freed memory back to the next allocations on the same stream, so the outputs of the op
// that follows start as NaN rather than as zeros or as values an earlier op left there.
// poisoned() says whether a tensor did land in such a block (it is printed, not asserted: where
// the pool places an allocation is the pool's choice).
std::vector<std::pair<uintptr_t, uintptr_t>> g_poisoned;
void poison_next(const std::vector<size_t>& sizes) {
  std::vector<Tensor> blocks;
  g_poisoned.clear();
  for (size_t bytes : sizes) {
    blocks.push_back(Tensor::empty({int64_t((bytes + (size_t(256) << 20)) / 4)}, DType::f32, kGpu));
    CHECK_CUDA(cudaMemsetAsync(blocks.back().raw(), 0xFF, blocks.back().nbytes(), cudaStreamPerThread));
    const uintptr_t at = reinterpret_cast<uintptr_t>(blocks.back().raw());
    g_poisoned.push_back({at, at + blocks.back().nbytes()});
  }
}
void report_poisoned(const Tensor& t, const char* what) {
  const uintptr_t lo = reinterpret_cast<uintptr_t>(t.raw()), hi = lo + t.nbytes();
  bool inside = false;
  for (const auto& [a, b] : g_poisoned) inside = inside || (lo >= a && hi <= b);
  std::printf("%s: %s\n", what,
              inside ? "allocated over NaN (poisoned) memory"
                     : "not allocated over the poisoned block: an element never written reads what the memory held");
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A multiple of 1/8 in [−2, 2]: exact in bf16, and products and sums of a few thousand of them
// are exact in fp32, so GEMMs and column sums have one right answer.
float grid_value(uint64_t seed, uint64_t i) { return float(int(mix(seed * 0x100000001b3ull + i) % 33) - 16) / 8.0f; }

// (rows, cols) = table[ids]: row r of the tensor is row ids[r] of a small table, so every sampled
// value is known on the host. Made on the device by ops::embedding (the gather is tested below).
struct Pattern {
  int64_t rows = 0, cols = 0;
  std::vector<float> table;  // (table rows, cols)
  std::vector<int32_t> ids;  // (rows)
  float at(int64_t r, int64_t c) const { return table[size_t(ids[size_t(r)]) * size_t(cols) + size_t(c)]; }
};

// The sampled rows of a (rows, cols) tensor: the first two, five around the row holding element
// 2^31, five around element 2^32, the last three, and 16 more spread by a hash.
std::vector<int64_t> sample_rows(int64_t rows, int64_t cols) {
  std::vector<int64_t> s;
  auto window = [&](int64_t at, int64_t before, int64_t after) {
    for (int64_t r = at - before; r < at + after; ++r)
      if (r >= 0 && r < rows) s.push_back(r);
  };
  window(0, 0, 2);
  window(kTwo31 / cols, 2, 3);
  window(kTwo32 / cols, 2, 3);
  window(rows, 3, 0);
  for (uint64_t k = 0; k < 16; ++k) s.push_back(int64_t(mix(777 + k) % uint64_t(rows)));
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
  return s;
}

// Every row its own hashed table row (a table of 509 rows: neighbouring rows differ).
Pattern dense_pattern(int64_t rows, int64_t cols, uint64_t seed, float fraction = 0.0f) {
  Pattern p;
  p.rows = rows, p.cols = cols;
  const int64_t table_rows = 509;
  p.table.resize(size_t(table_rows * cols));
  for (size_t i = 0; i < p.table.size(); ++i) {
    p.table[i] = grid_value(seed, i);
    // fraction > 0: finer values in fp32, so a conversion to bf16 has something to round.
    if (fraction > 0.0f) p.table[i] += fraction * float(mix(seed + 99 * i) % 255);
  }
  p.ids.resize(size_t(rows));
  for (int64_t r = 0; r < rows; ++r) p.ids[size_t(r)] = int32_t(mix(seed ^ uint64_t(r)) % uint64_t(table_rows));
  return p;
}

// Zero except at the sampled rows r with r % 3 != 0 ("active"), so a sum over all rows is a sum
// over those few, exactly known, and the sampled rows with r % 3 == 0 must come out zero.
bool active(int64_t r) { return r % 3 != 0; }
Pattern sparse_pattern(int64_t rows, int64_t cols, uint64_t seed) {
  Pattern p;
  p.rows = rows, p.cols = cols;
  const int64_t table_rows = 64;
  p.table.assign(size_t(table_rows * cols), 0.0f);  // row 0 stays zero
  for (size_t i = size_t(cols); i < p.table.size(); ++i) p.table[i] = grid_value(seed, i);
  p.ids.assign(size_t(rows), 0);
  for (int64_t r : sample_rows(rows, cols))
    if (active(r)) p.ids[size_t(r)] = int32_t(1 + mix(seed + uint64_t(r)) % uint64_t(table_rows - 1));
  return p;
}

Tensor on_gpu(const std::vector<float>& v, const Shape& shape, DType dtype) {
  return Tensor::from_vector(std::vector<double>(v.begin(), v.end()), shape, dtype).to(kGpu);
}

Tensor device_pattern(const Pattern& p, DType dtype) {
  const Tensor table = on_gpu(p.table, {int64_t(p.table.size()) / p.cols, p.cols}, dtype);
  return ops::embedding(table, Tensor::from_ints(p.ids, {p.rows}));
}

// Row r (of `cols` elements) of a device tensor, on the host.
std::vector<double> read_row(const Tensor& t, int64_t r, int64_t cols) {
  return Tensor::view_of(t, r * cols, {cols}).to_double_vector();
}

// Counts sampled values outside their tolerance (NaN always is) and reports the first few with
// their element index; the destructor fails the test if there were any.
class Checker {
 public:
  explicit Checker(std::string what) : what_(std::move(what)) {}
  ~Checker() { EXPECT_EQ(bad_, 0) << what_ << ": " << bad_ << " of " << seen_ << " sampled values are wrong"; }
  void operator()(int64_t row, int64_t col, int64_t cols, double got, double want, double tol) {
    ++seen_;
    if (std::abs(got - want) <= tol) return;
    if (bad_++ < 8)
      ADD_FAILURE() << what_ << ": row " << row << ", column " << col << " (element " << row * cols + col
                    << "): got " << got << ", want " << want << " (tolerance " << tol << ")";
  }

 private:
  std::string what_;
  int64_t bad_ = 0, seen_ = 0;
};

double bf16_round(double v) { return double(bf16_to_float(float_to_bf16(float(v)))); }

// GPT-2's GELU (tanh form) and its derivative, in double.
constexpr double kGeluK = 0.7978845608028654;
double gelu(double x) { return 0.5 * x * (1.0 + std::tanh(kGeluK * (x + 0.044715 * x * x * x))); }
double gelu_grad(double x) {
  const double t = std::tanh(kGeluK * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kGeluK * (1.0 + 3.0 * 0.044715 * x * x);
}

// ── gather ──

TEST(LargeIndex, EmbeddingGather) {
  const int64_t C = 768, N = rows_past_2_32(C);
  REQUIRE_GPU_MEMORY(bf16_bytes(N, C));
  const Pattern p = dense_pattern(N, C, 1);
  poison_next({bf16_bytes(N, C)});
  const Tensor x = device_pattern(p, DType::bf16);
  ASSERT_GT(x.numel(), kTwo32);
  report_poisoned(x, "embedding output");
  Checker check("embedding forward");
  for (int64_t r : sample_rows(N, C)) {
    const std::vector<double> row = read_row(x, r, C);
    for (int64_t c = 0; c < C; ++c) check(r, c, C, row[size_t(c)], p.at(r, c), 0.0);
  }
}

// ── elementwise ──

TEST(LargeIndex, AddSameShapeBroadcastAndBiasGradient) {
  const int64_t C = 768, N = rows_past_2_32(C);
  const size_t S = bf16_bytes(N, C);
  REQUIRE_GPU_MEMORY(3 * S);
  const Pattern pa = dense_pattern(N, C, 2), pb = dense_pattern(N, C, 3);
  const std::vector<int64_t> rows = sample_rows(N, C);
  const Tensor a = device_pattern(pa, DType::bf16);
  {
    const Tensor a2 = device_pattern(pb, DType::bf16);
    poison_next({S});
    const Tensor sum = ops::add(a, a2);  // same shapes: the flat elementwise kernel
    report_poisoned(sum, "add output");
    Checker check("add, same shapes");
    for (int64_t r : rows) {
      const std::vector<double> row = read_row(sum, r, C);
      for (int64_t c = 0; c < C; ++c) check(r, c, C, row[size_t(c)], double(pa.at(r, c)) + pb.at(r, c), 0.0);
    }
  }
  // (N, C) + (C): the broadcast kernel; its backward sums the (N, C) gradient over rows.
  std::vector<float> bias(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) bias[size_t(c)] = grid_value(4, uint64_t(c));
  Tensor b = on_gpu(bias, {C}, DType::bf16);
  b.set_requires_grad(true);
  poison_next({S});
  const Tensor y = ops::add(a, b);
  report_poisoned(y, "broadcast add output");
  {
    Checker check("add, broadcast bias");
    for (int64_t r : rows) {
      const std::vector<double> row = read_row(y, r, C);
      for (int64_t c = 0; c < C; ++c) check(r, c, C, row[size_t(c)], double(pa.at(r, c)) + bias[size_t(c)], 0.0);
    }
  }
  const Pattern pg = sparse_pattern(N, C, 5);
  backward(y, device_pattern(pg, DType::bf16));
  std::vector<double> want(size_t(C), 0.0);
  for (int64_t r : rows)
    for (int64_t c = 0; c < C; ++c) want[size_t(c)] += pg.at(r, c);
  const std::vector<double> got = b.grad().to_double_vector();
  Checker check("bias gradient (column sum over rows)");
  for (int64_t c = 0; c < C; ++c) check(0, c, C, got[size_t(c)], bf16_round(want[size_t(c)]), 0.0);
}

TEST(LargeIndex, GeluForwardBackward) {
  const int64_t C = 768, N = rows_past_2_32(C);
  const size_t S = bf16_bytes(N, C);
  REQUIRE_GPU_MEMORY(5 * S);  // x, gelu(x), the upstream gradient, dx and the leaf's copy of it
  const Pattern px = dense_pattern(N, C, 6), pg = dense_pattern(N, C, 7);
  const std::vector<int64_t> rows = sample_rows(N, C);
  Tensor x = device_pattern(px, DType::bf16);
  x.set_requires_grad(true);
  poison_next({S});
  const Tensor y = ops::gelu(x);
  report_poisoned(y, "gelu output");
  {
    Checker check("gelu forward");
    for (int64_t r : rows) {
      const std::vector<double> row = read_row(y, r, C);
      for (int64_t c = 0; c < C; ++c) {
        const double want = gelu(px.at(r, c));
        check(r, c, C, row[size_t(c)], want, std::abs(want) / 128 + 1.0 / 4096);
      }
    }
  }
  const Tensor g = device_pattern(pg, DType::bf16);
  poison_next({S, S});
  backward(y, g);
  report_poisoned(x.grad(), "gelu input gradient");
  Checker check("gelu backward");
  for (int64_t r : rows) {
    const std::vector<double> row = read_row(x.grad(), r, C);
    for (int64_t c = 0; c < C; ++c) {
      const double want = gelu_grad(px.at(r, c)) * pg.at(r, c);
      check(r, c, C, row[size_t(c)], want, std::abs(want) / 128 + 1.0 / 1024);
    }
  }
}

// Dropout's mask is a hash of the element index (plus `first`): elements past 2^32 must draw
// their own keep bits, not those of element i − 2^32.
TEST(LargeIndex, DropoutMaskByElementIndex) {
  const int64_t C = 768, N = rows_past_2_32(C);
  const size_t S = bf16_bytes(N, C);
  REQUIRE_GPU_MEMORY(2 * S);
  const Pattern px = dense_pattern(N, C, 18);
  const Tensor x = device_pattern(px, DType::bf16);
  const uint64_t seed = 0x5eed, first = 12345;
  poison_next({S});
  const Tensor y = ops::dropout(x, 0.5, seed, /*training=*/true, first);
  report_poisoned(y, "dropout output");
  Checker check("dropout");
  int64_t kept = 0, seen = 0;
  for (int64_t r : sample_rows(N, C)) {
    const std::vector<double> row = read_row(y, r, C);
    for (int64_t c = 0; c < C; ++c) {
      const bool keep = cpu::uniform_from(seed, first + uint64_t(r * C + c)) >= 0.5f;
      kept += keep, ++seen;
      check(r, c, C, row[size_t(c)], keep ? 2.0 * px.at(r, c) : 0.0, 0.0);
    }
  }
  EXPECT_GT(kept, seen / 4);  // the mask is not all zeros (nor, with the values checked, all ones)
  EXPECT_LT(kept, 3 * seen / 4);
}

// fp32 → bf16 (rounding), and the backward's bf16 → fp32: the gradient of a bf16 copy of an fp32
// tensor converted into the tensor's gradient, then added into it (add_converted_inplace).
TEST(LargeIndex, CastsAndConvertedGradientAdd) {
  const int64_t C = 768, N = rows_past_2_32(C);
  const size_t S = bf16_bytes(N, C);
  REQUIRE_GPU_MEMORY(6 * S);  // x and its gradient (fp32, 2S each), the bf16 copy, its gradient
  const Pattern px = dense_pattern(N, C, 8, 1.0f / 4096), pg = dense_pattern(N, C, 9);
  const std::vector<int64_t> rows = sample_rows(N, C);
  Tensor x = device_pattern(px, DType::f32);
  x.set_requires_grad(true);
  const Tensor g = device_pattern(pg, DType::bf16);
  {
    poison_next({S});
    const Tensor xb = ops::cast(x, DType::bf16);
    report_poisoned(xb, "cast output");
    {
      Checker check("cast fp32 → bf16");
      for (int64_t r : rows) {
        const std::vector<double> row = read_row(xb, r, C);
        for (int64_t c = 0; c < C; ++c) check(r, c, C, row[size_t(c)], bf16_round(px.at(r, c)), 0.0);
      }
    }
    poison_next({2 * S});
    backward(xb, g);  // x.grad = g converted to fp32
    report_poisoned(x.grad(), "converted gradient");
  }
  {
    Checker check("cast bf16 → fp32 (the first gradient)");
    for (int64_t r : rows) {
      const std::vector<double> row = read_row(x.grad(), r, C);
      for (int64_t c = 0; c < C; ++c) check(r, c, C, row[size_t(c)], pg.at(r, c), 0.0);
    }
  }
  backward(ops::cast(x, DType::bf16), g);  // x.grad += g, converted as it is added
  Checker check("add_converted (the second gradient)");
  for (int64_t r : rows) {
    const std::vector<double> row = read_row(x.grad(), r, C);
    for (int64_t c = 0; c < C; ++c) check(r, c, C, row[size_t(c)], 2.0 * pg.at(r, c), 0.0);
  }
}

// ── LayerNorm ──

TEST(LargeIndex, LayerNormForwardBackward) {
  const int64_t C = 768, N = rows_past_2_32(C);
  const size_t S = bf16_bytes(N, C);
  REQUIRE_GPU_MEMORY(5 * S);  // x, out, the upstream gradient, dx and the leaf's copy of it
  const Pattern px = dense_pattern(N, C, 10), pg = sparse_pattern(N, C, 11);
  const std::vector<int64_t> rows = sample_rows(N, C);
  std::vector<float> w(static_cast<size_t>(C)), b(static_cast<size_t>(C));
  for (int64_t c = 0; c < C; ++c) {
    w[size_t(c)] = 1.0f + grid_value(12, uint64_t(c)) / 4;  // [0.5, 1.5]
    b[size_t(c)] = grid_value(13, uint64_t(c)) / 2;
  }
  Tensor x = device_pattern(px, DType::bf16), wt = on_gpu(w, {C}, DType::bf16), bt = on_gpu(b, {C}, DType::bf16);
  x.set_requires_grad(true);
  wt.set_requires_grad(true);
  bt.set_requires_grad(true);
  const double eps = 1e-5;
  poison_next({S});
  const Tensor y = ops::layernorm(x, wt, bt, eps);
  report_poisoned(y, "layernorm output");

  // Per sampled row, in double: x̂, then out = x̂·w + b and dx from dout (the sparse gradient).
  std::vector<double> dw(size_t(C), 0.0), db(size_t(C), 0.0), dw_abs(size_t(C), 0.0);
  Checker check_out("layernorm forward"), check_dx("layernorm backward dx");
  std::vector<std::vector<double>> want_dx;
  for (int64_t r : rows) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mean += px.at(r, c);
    mean /= double(C);
    for (int64_t c = 0; c < C; ++c) var += (px.at(r, c) - mean) * (px.at(r, c) - mean);
    const double rstd = 1.0 / std::sqrt(var / double(C) + eps);
    std::vector<double> xhat(static_cast<size_t>(C)), dnorm(static_cast<size_t>(C));
    double m1 = 0, m2 = 0;
    for (int64_t c = 0; c < C; ++c) {
      xhat[size_t(c)] = (px.at(r, c) - mean) * rstd;
      dnorm[size_t(c)] = double(pg.at(r, c)) * w[size_t(c)];
      m1 += dnorm[size_t(c)];
      m2 += dnorm[size_t(c)] * xhat[size_t(c)];
      dw[size_t(c)] += pg.at(r, c) * xhat[size_t(c)];
      dw_abs[size_t(c)] += std::abs(pg.at(r, c) * xhat[size_t(c)]);
      db[size_t(c)] += pg.at(r, c);
    }
    m1 /= double(C), m2 /= double(C);
    const std::vector<double> row = read_row(y, r, C);
    std::vector<double> dx(static_cast<size_t>(C));
    for (int64_t c = 0; c < C; ++c) {
      const double want = xhat[size_t(c)] * w[size_t(c)] + b[size_t(c)];
      check_out(r, c, C, row[size_t(c)], want, std::abs(want) / 128 + 1.0 / 256);
      dx[size_t(c)] = rstd * (dnorm[size_t(c)] - m1 - xhat[size_t(c)] * m2);
    }
    want_dx.push_back(dx);
  }
  const Tensor g = device_pattern(pg, DType::bf16);
  poison_next({S, S});
  backward(y, g);
  report_poisoned(x.grad(), "layernorm input gradient");
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::vector<double> row = read_row(x.grad(), rows[i], C);
    double scale = 0;
    for (double v : want_dx[i]) scale = std::max(scale, std::abs(v));
    for (int64_t c = 0; c < C; ++c)
      check_dx(rows[i], c, C, row[size_t(c)], want_dx[i][size_t(c)], std::abs(want_dx[i][size_t(c)]) / 128 + scale / 512);
    if (!active(rows[i]))  // no upstream gradient in this row: dx is exactly zero
      for (int64_t c = 0; c < C; ++c) check_dx(rows[i], c, C, row[size_t(c)], 0.0, 0.0);
  }
  const std::vector<double> got_dw = wt.grad().to_double_vector(), got_db = bt.grad().to_double_vector();
  Checker check_dw("layernorm backward dweight"), check_db("layernorm backward dbias");
  for (int64_t c = 0; c < C; ++c) {
    check_dw(0, c, C, got_dw[size_t(c)], dw[size_t(c)], std::abs(dw[size_t(c)]) / 128 + dw_abs[size_t(c)] / 4096);
    check_db(0, c, C, got_db[size_t(c)], bf16_round(db[size_t(c)]), 0.0);
  }
}

// ── cross-entropy ──

// Logits (N, V) of GPT-2's vocabulary past 2^32 elements (the unchunked loss; the chunked head's
// chunks are 4096 rows): the loss and, written in the same pass, its gradient.
TEST(LargeIndex, CrossEntropyLossAndGradient) {
  const int64_t V = 50304, N = rows_past_2_32(V, 16);
  const size_t S = bf16_bytes(N, V);
  REQUIRE_GPU_MEMORY(3 * S);  // logits, their gradient and the leaf's copy of it
  const Pattern pl = dense_pattern(N, V, 30);
  const int64_t table_rows = int64_t(pl.table.size()) / V;
  std::vector<int32_t> targets(static_cast<size_t>(N));
  int64_t count = 0;
  for (int64_t r = 0; r < N; ++r) {
    targets[size_t(r)] = r % 7 == 3 ? -1 : int32_t(mix(31 + uint64_t(r)) % uint64_t(V));  // some rows ignored
    count += targets[size_t(r)] != -1;
  }
  // Per table row: max and log Σ exp, in double.
  std::vector<double> lse(static_cast<size_t>(table_rows));
  for (int64_t v = 0; v < table_rows; ++v) {
    const float* row = &pl.table[size_t(v * V)];
    double m = -INFINITY, sum = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, double(row[j]));
    for (int64_t j = 0; j < V; ++j) sum += std::exp(double(row[j]) - m);
    lse[size_t(v)] = m + std::log(sum);
  }
  double want_loss = 0;
  for (int64_t r = 0; r < N; ++r)
    if (targets[size_t(r)] != -1) want_loss += lse[size_t(pl.ids[size_t(r)])] - pl.at(r, targets[size_t(r)]);
  want_loss /= double(count);

  Tensor logits = device_pattern(pl, DType::bf16);
  logits.set_requires_grad(true);
  poison_next({S, S});  // the gradient written with the loss, and the leaf's copy of it
  const Tensor loss = ops::cross_entropy(logits, Tensor::from_ints(targets, {N}));
  EXPECT_NEAR(loss.item(), want_loss, 1e-4 * want_loss);
  backward(loss);
  report_poisoned(logits.grad(), "cross_entropy logits gradient");
  Checker check("cross_entropy gradient");
  for (int64_t r : sample_rows(N, V)) {
    const std::vector<double> row = read_row(logits.grad(), r, V);
    const int32_t t = targets[size_t(r)];
    for (int64_t j = 0; j < V; ++j) {
      const double p = std::exp(double(pl.at(r, j)) - lse[size_t(pl.ids[size_t(r)])]);
      const double want = t == -1 ? 0.0 : (p - (j == t ? 1.0 : 0.0)) / double(count);
      check(r, j, V, row[size_t(j)], want, std::abs(want) / 128);
    }
  }
}

// ── layout: the fused qkv's thirds, and RoPE ──

// concat_last writes three (N, C) tensors into (N, 3C) column ranges (the copy that places dq,
// dk, dv into d(qkv)), split_last reads them back out (the slice that takes q, k out of qkv).
TEST(LargeIndex, QkvConcatAndSplit) {
  const int64_t C = 768, N = rows_past_2_32(3 * C);
  const size_t S = bf16_bytes(N, 3 * C);
  REQUIRE_GPU_MEMORY(3 * S);
  const Pattern pq = dense_pattern(N, C, 14), pk = dense_pattern(N, C, 15), pv = dense_pattern(N, C, 16);
  const Pattern* parts[3] = {&pq, &pk, &pv};
  const std::vector<int64_t> rows = sample_rows(N, 3 * C);
  const Tensor q = device_pattern(pq, DType::bf16), k = device_pattern(pk, DType::bf16),
               v = device_pattern(pv, DType::bf16);
  poison_next({S});
  const Tensor qkv = ops::concat_last({q, k, v});
  ASSERT_GT(qkv.numel(), kTwo32);
  report_poisoned(qkv, "concat_last output");
  {
    Checker check("concat_last (unslice)");
    for (int64_t r : rows) {
      const std::vector<double> row = read_row(qkv, r, 3 * C);
      for (int64_t c = 0; c < 3 * C; ++c) check(r, c, 3 * C, row[size_t(c)], parts[c / C]->at(r, c % C), 0.0);
    }
  }
  poison_next({S / 3, S / 3, S / 3});
  const std::vector<Tensor> split = ops::split_last(qkv, 3);
  for (const Tensor& t : split) report_poisoned(t, "split_last output");
  Checker check("split_last (slice)");
  for (int j = 0; j < 3; ++j)
    for (int64_t r : rows) {
      const std::vector<double> row = read_row(split[size_t(j)], r, C);
      for (int64_t c = 0; c < C; ++c) check(r, c, C, row[size_t(c)], parts[j]->at(r, c), 0.0);
    }
}

// RoPE on (1, T, H, D) and its inverse (what its backward runs), positions up to T − 1.
TEST(LargeIndex, RopeForwardAndInverse) {
  const int64_t H = 12, D = 64, C = H * D, T = rows_past_2_32(C);
  const size_t S = bf16_bytes(T, C);
  REQUIRE_GPU_MEMORY(3 * S);
  const double base = 10000.0;
  const Pattern px = dense_pattern(T, C, 17);
  const std::vector<int64_t> rows = sample_rows(T, C);
  const Tensor x = device_pattern(px, DType::bf16).view({1, T, H, D});
  poison_next({S});
  const Tensor y = ops::rope(x, base);
  report_poisoned(y, "rope output");
  poison_next({S});
  const Tensor z = ops::rope(y, base, 0, /*inverse=*/true);
  report_poisoned(z, "rope inverse output");
  Checker check_y("rope"), check_z("rope inverse");
  const int64_t half = D / 2;
  for (int64_t t : rows) {
    const std::vector<double> yr = read_row(y, t, C), zr = read_row(z, t, C);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double angle = double(t) * std::pow(base, -2.0 * double(i) / double(D));
        const double cs = std::cos(angle), sn = std::sin(angle);
        const int64_t c1 = h * D + i, c2 = c1 + half;
        const double x1 = px.at(t, c1), x2 = px.at(t, c2);
        const double y1 = x1 * cs - x2 * sn, y2 = x1 * sn + x2 * cs;
        check_y(t, c1, C, yr[size_t(c1)], y1, std::abs(y1) / 128 + 1.0 / 512);
        check_y(t, c2, C, yr[size_t(c2)], y2, std::abs(y2) / 128 + 1.0 / 512);
        // The inverse from the GPU's own y: rotated back by the same angle.
        const double z1 = yr[size_t(c1)] * cs + yr[size_t(c2)] * sn, z2 = -yr[size_t(c1)] * sn + yr[size_t(c2)] * cs;
        check_z(t, c1, C, zr[size_t(c1)], z1, std::abs(z1) / 128 + 1.0 / 512);
        check_z(t, c2, C, zr[size_t(c2)], z2, std::abs(z2) / 128 + 1.0 / 512);
      }
  }
}

// ── linear layers (cuBLASLt with 64-bit layouts) ──

// x (N, K) · Wᵀ + b with an output of more than 2^32 elements, forward and backward: the GEMMs
// (cuBLASLt, bias in its epilogue), the bias gradient (column sum over N rows) and, for the MLP's
// up-projection, the GELU and its backward fused with that column sum. Inputs are multiples of
// 1/8 and 1/64, so every product and sum is exact in fp32: the linear layer's values are exact up to the
// final rounding to bf16; with GELU its approximation enters.
void check_linear(bool with_gelu, int64_t out_features) {
  const int64_t K = 64, Nf = out_features, N = rows_past_2_32(Nf);
  const size_t S = bf16_bytes(N, Nf);
  const Pattern px = dense_pattern(N, K, 20), pg = sparse_pattern(N, Nf, 21);
  const std::vector<int64_t> rows = sample_rows(N, Nf);
  std::vector<float> w(static_cast<size_t>(Nf * K)), b(static_cast<size_t>(Nf));
  // Multiples of 1/64 in [−1/4, 1/4]: pre-activations of order 1, where GELU bends.
  for (size_t i = 0; i < w.size(); ++i) w[i] = grid_value(22, i) / 8;
  for (size_t i = 0; i < b.size(); ++i) b[i] = grid_value(23, i) / 8;
  Tensor x = device_pattern(px, DType::bf16), wt = on_gpu(w, {Nf, K}, DType::bf16), bt = on_gpu(b, {Nf}, DType::bf16);
  x.set_requires_grad(true);
  wt.set_requires_grad(true);
  bt.set_requires_grad(true);
  const std::string name = with_gelu ? "linear_gelu" : "linear";
  poison_next(with_gelu ? std::vector<size_t>{S, S} : std::vector<size_t>{S});  // linear_gelu: pre and out
  const Tensor y = with_gelu ? ops::linear_gelu(x, wt, bt) : ops::linear(x, wt, bt);
  ASSERT_GT(y.numel(), kTwo32);
  report_poisoned(y, (name + " output").c_str());

  // Forward, and per sampled row the gradient of the pre-activation as the GPU stores it (bf16).
  std::vector<std::vector<double>> dpre(rows.size());
  {
    Checker check(name + " forward");
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t r = rows[i];
      const std::vector<double> row = read_row(y, r, Nf);
      dpre[i].resize(size_t(Nf));
      for (int64_t n = 0; n < Nf; ++n) {
        double pre = b[size_t(n)];
        for (int64_t k = 0; k < K; ++k) pre += double(px.at(r, k)) * w[size_t(n * K + k)];
        pre = bf16_round(pre);  // exact in fp32; the GEMM's output is rounded once
        if (with_gelu) {
          const double want = gelu(pre);
          check(r, n, Nf, row[size_t(n)], want, std::abs(want) / 128 + 1.0 / 4096);
          dpre[i][size_t(n)] = bf16_round(gelu_grad(pre) * pg.at(r, n));
        } else {
          check(r, n, Nf, row[size_t(n)], pre, 0.0);
          dpre[i][size_t(n)] = pg.at(r, n);
        }
      }
    }
  }
  const Tensor g = device_pattern(pg, DType::bf16);
  poison_next({bf16_bytes(N, K), bf16_bytes(N, K)});  // dx and the leaf's copy of it
  backward(y, g);
  report_poisoned(x.grad(), (name + " input gradient").c_str());

  // dx = dpre · W per sampled row; dW = dpreᵀ · x and db = Σ dpre over the active rows. With GELU
  // a stored dpre may differ from the host's by a bf16 rounding (tolerances scale with Σ|terms|),
  // and one of order 1e-10 (GELU's far negative tail) may come out as zero in fp32.
  const double rel = with_gelu ? 1.0 / 128 : 0.0, floor = with_gelu ? 1e-6 : 0.0;
  Checker check_dx(name + " backward dx");
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::vector<double> row = read_row(x.grad(), rows[i], K);
    for (int64_t k = 0; k < K; ++k) {
      double want = 0, mag = 0;
      for (int64_t n = 0; n < Nf; ++n) {
        want += dpre[i][size_t(n)] * w[size_t(n * K + k)];
        mag += std::abs(dpre[i][size_t(n)] * w[size_t(n * K + k)]);
      }
      check_dx(rows[i], k, K, row[size_t(k)], bf16_round(want), rel * mag + std::abs(want) / 256 + floor);
    }
  }
  std::vector<double> dw(size_t(Nf * K), 0.0), dw_mag(size_t(Nf * K), 0.0), db(size_t(Nf), 0.0),
      db_mag(size_t(Nf), 0.0);
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t n = 0; n < Nf; ++n) {
      const double d = dpre[i][size_t(n)];
      db[size_t(n)] += d;
      db_mag[size_t(n)] += std::abs(d);
      for (int64_t k = 0; k < K; ++k) {
        dw[size_t(n * K + k)] += d * px.at(rows[i], k);
        dw_mag[size_t(n * K + k)] += std::abs(d * px.at(rows[i], k));
      }
    }
  const std::vector<double> got_dw = wt.grad().to_double_vector(), got_db = bt.grad().to_double_vector();
  Checker check_dw(name + " backward dweight"), check_db(name + " backward dbias");
  for (int64_t n = 0; n < Nf; ++n) {
    check_db(0, n, Nf, got_db[size_t(n)], bf16_round(db[size_t(n)]), rel * db_mag[size_t(n)] + std::abs(db[size_t(n)]) / 256 + floor);
    for (int64_t k = 0; k < K; ++k) {
      const size_t j = size_t(n * K + k);
      check_dw(n, k, K, got_dw[j], bf16_round(dw[j]), rel * dw_mag[j] + std::abs(dw[j]) / 256 + floor);
    }
  }
}

// The fused qkv projection: (N, 2304).
TEST(LargeIndex, LinearQkvProjection) {
  const int64_t N = rows_past_2_32(2304);
  REQUIRE_GPU_MEMORY(2 * bf16_bytes(N, 2304));  // the output and its gradient
  check_linear(false, 2304);
}

// The MLP's up-projection with its GELU: (N, 3072).
TEST(LargeIndex, LinearGeluMlp) {
  const int64_t N = rows_past_2_32(3072);
  REQUIRE_GPU_MEMORY(4 * bf16_bytes(N, 3072));  // pre-activation, output, their gradients
  check_linear(true, 3072);
}

}  // namespace
}  // namespace tg

#else  // !TILEGRAD_HAVE_CUDA

TEST(LargeIndex, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif
