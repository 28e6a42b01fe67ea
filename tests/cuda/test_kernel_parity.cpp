// CPU/GPU parity table: every CUDA launcher against its CPU twin in kernels/cpu (the
// specification), in fp32 and bf16, plus bitwise determinism of the reductions.
#include <gtest/gtest.h>

#include "tests/cuda/cuda_test_util.h"

#ifdef TILEGRAD_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/permute.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/layout.h"
#include "kernels/cuda/optim.h"
#include "kernels/cuda/softmax.h"
#include "src/tensor/dtype.h"
#include "tests/op_specs.h"

using tg::testing::have_gpu;

namespace {

using tg::bf16;


// ── host-side values ──

inline float to_f(float x) { return x; }
inline float to_f(bf16 x) { return tg::bf16_to_float(x); }
template <typename T>
T from_f(float x);
template <>
float from_f<float>(float x) { return x; }
template <>
bf16 from_f<bf16>(float x) { return tg::float_to_bf16(x); }

// Values rounded through T, so both sides start from the same (bf16-representable) inputs.
template <typename T>
std::vector<float> quantize(std::vector<float> v) {
  for (float& x : v) x = to_f(from_f<T>(x));
  return v;
}

// Uniform in [lo, hi), seeded: the CPU dropout hash doubles as a counter-based generator.
std::vector<float> uniform(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = lo + (hi - lo) * tg::cpu::uniform_from(seed, i);
  return v;
}

std::vector<double> widen(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }
std::vector<float> narrow(const std::vector<double>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float(v[i]);
  return out;
}

// ||gpu − cpu|| / ||cpu||; NaN where the CPU has none (an unwritten, poisoned element), or a
// mismatched infinity, is an infinite error. Matching infinities are skipped.
double rel_err(const std::vector<float>& gpu, const std::vector<float>& cpu) {
  if (gpu.size() != cpu.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    const double g = gpu[i], c = cpu[i];
    if (std::isnan(g) || std::isnan(c)) {
      if (std::isnan(g) != std::isnan(c)) return INFINITY;
      continue;
    }
    if (std::isinf(g) || std::isinf(c)) {
      if (g != c) return INFINITY;
      continue;
    }
    num += (g - c) * (g - c);
    den += c * c;
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// ── device buffers ──

// n elements at an optional element offset from a 256-byte aligned allocation (offset 1 makes
// every pointer misaligned for 16-byte accesses and exercises the scalar fallbacks). Poisoned
// with 0xFF bytes (NaN for float and bf16) on creation and on demand.
template <typename T>
struct DevBuf {
  T* base = nullptr;
  T* p = nullptr;
  size_t n = 0;
  explicit DevBuf(size_t n_, size_t offset = 0) : n(n_) {
    TG_CUDA_CHECK(cudaMalloc(&base, (n + offset + 1) * sizeof(T)));
    p = base + offset;
    poison();
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { cudaFree(base); }
  void poison() { TG_CUDA_CHECK(cudaMemset(p, 0xFF, n * sizeof(T))); }
  void upload_raw(const std::vector<T>& v) {
    TG_CUDA_CHECK(cudaMemcpy(p, v.data(), std::min(v.size(), n) * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download_raw() const {
    std::vector<T> v(n);
    TG_CUDA_CHECK(cudaDeviceSynchronize());
    TG_CUDA_CHECK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
  // Float views (T = float or bf16 only).
  void upload(const std::vector<float>& v) {
    std::vector<T> t(v.size());
    for (size_t i = 0; i < v.size(); ++i) t[i] = from_f<T>(v[i]);
    upload_raw(t);
  }
  std::vector<float> download() const {
    std::vector<T> t = download_raw();
    std::vector<float> v(t.size());
    for (size_t i = 0; i < t.size(); ++i) v[i] = to_f(t[i]);
    return v;
  }
};

template <typename T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

const cudaStream_t kStream = nullptr;  // the legacy default stream: cudaMemcpy orders after it

// Checks a GPU result against the CPU's, with the op and dtype in the message.
#define EXPECT_PARITY(gpu, cpu, tol) \
  do {                               \
    double e_ = rel_err(gpu, cpu);   \
    EXPECT_LE(e_, tol) << #gpu;      \
  } while (0)

// ───────────────────────────── cases ─────────────────────────────
// Each case runs the CPU kernel in float on inputs already rounded to T, and the CUDA kernel on T.

template <typename T>
void case_add_forward(double tol, int64_t rows, int64_t cols, size_t off) {
  auto a = quantize<T>(uniform(rows * cols, 1)), b = quantize<T>(uniform(cols, 2));
  std::vector<float> ref(rows * cols);
  tg::cpu::add_forward(a.data(), b.data(), ref.data(), rows, cols);
  DevBuf<T> da(a.size(), off), db(b.size(), off), dout(ref.size(), off);
  da.upload(a), db.upload(b);
  tg::cuda::add_forward(da.p, db.p, dout.p, rows, cols, kStream);
  EXPECT_PARITY(dout.download(), quantize<T>(ref), tol);
}

template <typename T>
void case_add_inplace(double tol, int64_t n, size_t off) {
  auto a = quantize<T>(uniform(n, 3)), b = quantize<T>(uniform(n, 4));
  std::vector<float> ref = a;
  tg::cpu::add_inplace(ref.data(), b.data(), n);
  DevBuf<T> da(n, off), db(n, off);
  da.upload(a), db.upload(b);
  tg::cuda::add_inplace(da.p, db.p, n, kStream);
  EXPECT_PARITY(da.download(), quantize<T>(ref), tol);
}

template <typename T>
void case_sum_rows(double tol, int64_t rows, int64_t cols) {
  auto x = quantize<T>(uniform(rows * cols, 5));
  std::vector<float> ref(cols);
  tg::cpu::sum_rows(x.data(), ref.data(), rows, cols);
  DevBuf<T> dx(x.size()), dout(cols);
  DevBuf<float> scratch(tg::cuda::sum_rows_scratch_floats(rows, cols) + 1);
  scratch.poison();  // the partial sums must all be written before they are read
  dx.upload(x);
  tg::cuda::sum_rows(dx.p, dout.p, rows, cols, scratch.p, kStream);
  EXPECT_PARITY(dout.download(), ref, tol);
  auto first = dout.download_raw();
  dout.poison();
  scratch.poison();
  tg::cuda::sum_rows(dx.p, dout.p, rows, cols, scratch.p, kStream);
  EXPECT_TRUE(same_bytes(first, dout.download_raw())) << "sum_rows is not bitwise reproducible";
}

// A short, wide matrix (a broadcast's gradient, (B, T·C) summed over B) goes to a kernel that adds
// each column's rows in order from zero, as the CPU reference does in fp32: equal bit for bit.
template <typename T>
void case_sum_few_rows(int64_t rows, int64_t cols) {
  auto x = quantize<T>(uniform(rows * cols, 6));
  std::vector<float> ref(cols);
  tg::cpu::sum_rows(x.data(), ref.data(), rows, cols);
  DevBuf<T> dx(x.size()), dout(cols);
  DevBuf<float> scratch(tg::cuda::sum_rows_scratch_floats(rows, cols) + 1);
  dx.upload(x);
  dout.poison();
  tg::cuda::sum_rows(dx.p, dout.p, rows, cols, scratch.p, kStream);
  const std::vector<float> got = dout.download(), want = quantize<T>(ref);
  int64_t differ = 0;
  for (int64_t c = 0; c < cols; ++c) differ += got[size_t(c)] != want[size_t(c)];
  EXPECT_EQ(differ, 0) << rows << " × " << cols << ": columns whose sum differs from the CPU's";
}

// fp32 dst += bf16 src: exact (one fp32 add per element), so compared bit for bit.
void case_add_converted(int64_t n, size_t off) {
  const std::vector<float> d = uniform(n, 30);
  std::vector<bf16> g(n);
  const std::vector<float> gf = uniform(n, 31);
  for (int64_t i = 0; i < n; ++i) g[i] = from_f<bf16>(gf[i]);
  std::vector<float> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = d[i] + to_f(g[i]);
  DevBuf<float> dd(n, off);
  DevBuf<bf16> dg(n, off);
  dd.upload(d), dg.upload_raw(g);
  tg::cuda::add_converted_inplace(dd.p, dg.p, n, kStream);
  EXPECT_TRUE(same_bytes(dd.download_raw(), ref)) << "add_converted_inplace n = " << n << " offset " << off;
}

// Jobs of many sizes in one launch (one element; more than the 16 blocks × 256 threads a job
// gets; at odd offsets), each bitwise dst + float(src), and nothing outside them touched.
void case_add_converted_batched() {
  const std::vector<int64_t> sizes = {1, 13, 768, 3072, 70001};
  std::vector<std::unique_ptr<DevBuf<float>>> dst;
  std::vector<std::unique_ptr<DevBuf<bf16>>> src;
  std::vector<std::vector<float>> ref;
  std::vector<tg::cuda::AddConvertedJob> jobs;
  for (size_t j = 0; j < sizes.size(); ++j) {
    const int64_t n = sizes[j];
    const std::vector<float> d = uniform(n + 2, 40 + j), gf = uniform(n, 50 + j);
    std::vector<bf16> g(n);
    for (int64_t i = 0; i < n; ++i) g[i] = from_f<bf16>(gf[i]);
    std::vector<float> r = d;  // d[0] and d[n + 1] are guards the job must leave alone
    for (int64_t i = 0; i < n; ++i) r[i + 1] += to_f(g[i]);
    dst.push_back(std::make_unique<DevBuf<float>>(n + 2, j % 2));
    src.push_back(std::make_unique<DevBuf<bf16>>(n, j % 2));
    dst.back()->upload(d), src.back()->upload_raw(g);
    ref.push_back(r);
  }
  for (size_t j = 0; j < sizes.size(); ++j) jobs.push_back({dst[j]->p + 1, src[j]->p, sizes[j]});
  tg::cuda::add_converted_batched(jobs.data(), int(jobs.size()), kStream);
  for (size_t j = 0; j < sizes.size(); ++j)
    EXPECT_TRUE(same_bytes(dst[j]->download_raw(), ref[j])) << "add_converted_batched job of " << sizes[j];
  EXPECT_THROW(tg::cuda::add_converted_batched(jobs.data(), tg::cuda::kAddConvertedMaxJobs + 1, kStream),
               std::invalid_argument);
}

template <typename T>
void case_mul(double tol, int64_t n, size_t off) {
  auto a = quantize<T>(uniform(n, 6)), b = quantize<T>(uniform(n, 7));
  std::vector<float> ref(n);
  tg::cpu::mul_forward(a.data(), b.data(), ref.data(), n);
  DevBuf<T> da(n, off), db(n, off), dout(n, off);
  da.upload(a), db.upload(b);
  tg::cuda::mul_forward(da.p, db.p, dout.p, n, kStream);
  EXPECT_PARITY(dout.download(), quantize<T>(ref), tol);
}

template <typename T>
void case_scale(double tol, int64_t n, size_t off) {
  auto x = quantize<T>(uniform(n, 8));
  std::vector<float> ref(n);
  tg::cpu::scale_forward(x.data(), ref.data(), 0.37f, n);
  DevBuf<T> dx(n, off), dout(n, off);
  dx.upload(x);
  tg::cuda::scale_forward(dx.p, dout.p, 0.37f, n, kStream);
  EXPECT_PARITY(dout.download(), quantize<T>(ref), tol);
}

template <typename T>
void case_gelu(double tol, int64_t n, size_t off) {
  auto x = quantize<T>(uniform(n, 9, -4.0f, 4.0f)), d = quantize<T>(uniform(n, 10));
  std::vector<float> ref(n), dref(n);
  tg::cpu::gelu_forward(x.data(), ref.data(), n);
  tg::cpu::gelu_backward(x.data(), d.data(), dref.data(), n);
  DevBuf<T> dx(n, off), dd(n, off), dout(n, off), ddx(n, off);
  dx.upload(x), dd.upload(d);
  tg::cuda::gelu_forward(dx.p, dout.p, n, kStream);
  tg::cuda::gelu_backward(dx.p, dd.p, ddx.p, n, kStream);
  EXPECT_PARITY(dout.download(), quantize<T>(ref), tol);
  EXPECT_PARITY(ddx.download(), quantize<T>(dref), tol);
}

// The fused GELU backward + bias sum against the CPU, and bitwise against the two kernels it
// replaces (gelu_backward, then sum_rows over its output).
template <typename T>
void case_gelu_sum_rows(double tol, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  auto x = quantize<T>(uniform(n, 41, -4.0f, 4.0f)), d = quantize<T>(uniform(n, 42));
  std::vector<float> dref(n), bref;
  tg::cpu::gelu_backward(x.data(), d.data(), dref.data(), n);
  const auto dq = quantize<T>(dref);  // the bias sums what is stored
  std::vector<double> bd(cols);
  tg::cpu::sum_rows(widen(dq).data(), bd.data(), rows, cols);
  bref = narrow(bd);
  DevBuf<T> gx(n), gd(n), gdx(n), gdb(cols), udx(n), udb(cols);
  DevBuf<float> scratch(std::max<size_t>(1, tg::cuda::sum_rows_scratch_floats(rows, cols)));
  gx.upload(x), gd.upload(d);
  gdx.poison(), gdb.poison();
  tg::cuda::gelu_backward_sum_rows(gx.p, gd.p, gdx.p, gdb.p, rows, cols, scratch.p, kStream);
  EXPECT_PARITY(gdx.download(), dq, tol);
  EXPECT_PARITY(gdb.download(), quantize<T>(bref), tol);
  tg::cuda::gelu_backward(gx.p, gd.p, udx.p, n, kStream);
  tg::cuda::sum_rows(udx.p, udb.p, rows, cols, scratch.p, kStream);
  EXPECT_TRUE(same_bytes(gdx.download_raw(), udx.download_raw())) << "dx differs from gelu_backward's";
  EXPECT_TRUE(same_bytes(gdb.download_raw(), udb.download_raw())) << "dbias differs from sum_rows over dx";
}

// Casts are exact: bitwise equal to tg::float_to_bf16 (specials, ties and subnormals included).
void case_cast(size_t off) {
  std::vector<float> x = uniform(4099, 11, -100.0f, 100.0f);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, -3e-39f,
                            std::numeric_limits<float>::max(), std::numeric_limits<float>::min()};
  for (size_t i = 0; i < sizeof(specials) / sizeof(float); ++i) x[i] = specials[i];
  uint32_t ties[] = {0x3F808000u, 0x3F818000u, 0xBF808000u, 0x7F7F8000u, 0x3F80FFFFu};  // halfway and near-halfway
  for (size_t i = 0; i < 5; ++i) std::memcpy(&x[20 + i], &ties[i], 4);
  const int64_t n = int64_t(x.size());
  std::vector<bf16> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = tg::float_to_bf16(x[i]);

  DevBuf<float> dx(n, off), dff(n, off);
  DevBuf<bf16> dbf(n, off), dbb(n, off);
  dx.upload_raw(x);
  tg::cuda::cast(dx.p, dbf.p, n, kStream);
  auto got = dbf.download_raw();
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(got[i].bits, ref[i].bits) << "float→bf16 at " << i << " (" << x[i] << ")";
    if (got[i].bits != ref[i].bits) break;
  }
  tg::cuda::cast(dbf.p, dff.p, n, kStream);  // bf16 → float: exact widening
  auto wide = dff.download_raw();
  for (int64_t i = 0; i < n; ++i) {
    float want = tg::bf16_to_float(ref[i]);
    EXPECT_EQ(std::memcmp(&wide[i], &want, 4), 0) << "bf16→float at " << i;
    if (std::memcmp(&wide[i], &want, 4) != 0) break;
  }
  dff.poison();
  tg::cuda::cast(dx.p, dff.p, n, kStream);
  EXPECT_TRUE(same_bytes(dff.download_raw(), x)) << "float→float copy";
  tg::cuda::cast(dbf.p, dbb.p, n, kStream);
  auto copy = dbb.download_raw();
  EXPECT_TRUE(same_bytes(copy, ref)) << "bf16→bf16 copy";
}

// The mask is a pure function of (seed, index): kept values are bitwise the CPU's.
template <typename T>
void case_dropout(int64_t n, float p, size_t off) {
  auto x = quantize<T>(uniform(n, 12));
  std::vector<float> ref(n);
  const uint64_t seed = 0x1234abcdull;
  tg::cpu::dropout_apply(x.data(), ref.data(), n, p, seed);
  DevBuf<T> dx(n, off), dout(n, off);
  dx.upload(x);
  tg::cuda::dropout_apply(dx.p, dout.p, n, p, seed, 0, kStream);
  auto got = dout.download();
  auto want = quantize<T>(ref);
  int64_t dropped = 0, mismatched = 0;
  for (int64_t i = 0; i < n; ++i) {
    dropped += want[i] == 0.0f;
    mismatched += std::memcmp(&got[i], &want[i], 4) != 0;
  }
  EXPECT_EQ(mismatched, 0) << "dropout differs from the CPU";
  if (n > 10000) {
    EXPECT_NEAR(double(dropped) / double(n), p, 0.01);
  }
}

template <typename T>
void case_fill(int64_t n, size_t off) {
  DevBuf<T> dx(n, off);
  tg::cuda::fill(dx.p, 0.1f, n, kStream);
  auto got = dx.download();
  const float want = to_f(from_f<T>(0.1f));
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [&](float v) { return v == want; }));
}

template <typename T>
void case_swap_dims12(int64_t A, int64_t M, int64_t N, int64_t D, size_t off) {
  auto x = quantize<T>(uniform(A * M * N * D, 13));
  std::vector<float> ref(x.size());
  tg::cpu::swap_dims12(x.data(), ref.data(), A, M, N, D);
  DevBuf<T> dx(x.size(), off), dout(x.size(), off);
  dx.upload(x);
  tg::cuda::swap_dims12(dx.p, dout.p, A, M, N, D, kStream);
  EXPECT_EQ(rel_err(dout.download(), ref), 0.0);
}

template <typename T>
void case_slice(int64_t rows, int64_t cols, int64_t start, int64_t len, size_t off) {
  auto x = quantize<T>(uniform(rows * cols, 14)), d = quantize<T>(uniform(rows * len, 15));
  std::vector<float> ref(rows * len), dref = x;  // unslice writes into a dx that already holds data
  tg::cpu::slice_last(x.data(), ref.data(), rows, cols, start, len);
  tg::cpu::unslice_last(d.data(), dref.data(), rows, cols, start, len);
  DevBuf<T> dx(x.size(), off), dout(ref.size(), off), dd(d.size(), off);
  dx.upload(x), dd.upload(d);
  tg::cuda::slice_last(dx.p, dout.p, rows, cols, start, len, kStream);
  EXPECT_EQ(rel_err(dout.download(), ref), 0.0) << "slice_last";
  tg::cuda::unslice_last(dd.p, dx.p, rows, cols, start, len, kStream);
  EXPECT_EQ(rel_err(dx.download(), dref), 0.0) << "unslice_last (the untouched columns must survive)";
}

template <typename T>
void case_causal_mask(int64_t batch, int64_t Tq, int64_t Tk, float fill, size_t off) {
  auto s = quantize<T>(uniform(batch * Tq * Tk, 16));
  std::vector<float> ref(s.size());
  tg::cpu::causal_mask(s.data(), ref.data(), batch, Tq, Tk, fill);
  DevBuf<T> ds(s.size(), off), dout(s.size(), off);
  ds.upload(s);
  tg::cuda::causal_mask(ds.p, dout.p, batch, Tq, Tk, fill, kStream);
  EXPECT_EQ(rel_err(dout.download(), ref), 0.0);
}

template <typename T>
void case_rope(double tol, int64_t B, int64_t Tn, int64_t H, int64_t D, int direction, size_t off) {
  auto x = quantize<T>(uniform(B * Tn * H * D, 17));
  std::vector<float> ref(x.size());
  tg::cpu::rope_apply(x.data(), ref.data(), B, Tn, H, D, 10000.0, 5, direction);
  DevBuf<T> dx(x.size(), off), dout(x.size(), off);
  dx.upload(x);
  tg::cuda::rope_apply(dx.p, dout.p, B, Tn, H, D, 10000.0, 5, direction, kStream);
  EXPECT_PARITY(dout.download(), quantize<T>(ref), tol);
}

// Ids with heavy repeats (a few ids take most tokens, like real text) plus the vocabulary edges.
std::vector<int32_t> token_ids(int64_t N, int64_t V, uint64_t seed) {
  std::vector<int32_t> ids(N);
  for (int64_t i = 0; i < N; ++i) {
    float u = tg::cpu::uniform_from(seed, uint64_t(i));
    ids[i] = u < 0.3f ? int32_t(i % 7) : int32_t(tg::cpu::hash64(seed + uint64_t(i)) % uint64_t(V));
  }
  ids[0] = 0;
  ids[N - 1] = int32_t(V - 1);
  return ids;
}

template <typename T>
void case_embedding(double tol, int64_t N, int64_t V, int64_t C, size_t off) {
  auto w = quantize<T>(uniform(V * C, 18)), d = quantize<T>(uniform(N * C, 19));
  auto ids = token_ids(N, V, 20);
  std::vector<float> ref(N * C), dref(V * C);
  tg::cpu::embedding_forward(w.data(), ids.data(), ref.data(), N, C);
  tg::cpu::embedding_backward(d.data(), ids.data(), dref.data(), N, V, C);
  DevBuf<T> dw(w.size(), off), dout(ref.size(), off), dd(d.size(), off), ddw(dref.size(), off);
  DevBuf<int32_t> dids(N);
  dw.upload(w), dd.upload(d), dids.upload_raw(ids);
  tg::cuda::embedding_forward(dw.p, dids.p, dout.p, N, C, kStream);
  EXPECT_EQ(rel_err(dout.download(), ref), 0.0) << "embedding_forward";
  tg::cuda::embedding_backward<T>(dd.p, dids.p, nullptr, ddw.p, N, V, C, kStream);
  EXPECT_PARITY(ddw.download(), quantize<T>(dref), tol);
  auto first = ddw.download_raw();
  ddw.poison();
  tg::cuda::embedding_backward<T>(dd.p, dids.p, nullptr, ddw.p, N, V, C, kStream);
  EXPECT_TRUE(same_bytes(first, ddw.download_raw())) << "embedding_backward is not bitwise reproducible";
  // With another consumer's gradient of the table added as it is written (a tied LM head's).
  auto other = quantize<T>(uniform(V * C, 26));
  std::vector<float> total(V * C);
  for (int64_t i = 0; i < V * C; ++i) total[size_t(i)] = dref[size_t(i)] + other[size_t(i)];
  DevBuf<T> dother(other.size(), off);
  dother.upload(other);
  ddw.poison();
  tg::cuda::embedding_backward(dd.p, dids.p, dother.p, ddw.p, N, V, C, kStream);
  EXPECT_PARITY(ddw.download(), quantize<T>(total), tol);
  // Added into an fp32 table (a parameter's gradient), only the rows that occur: the table's
  // other rows keep their values exactly, and the sums come out the same on every run (ids 0–6
  // take 30 % of the tokens: runs of hundreds, summed by several warps).
  auto init = uniform(V * C, 27);
  std::vector<float> expect(V * C);
  for (int64_t i = 0; i < V * C; ++i) expect[size_t(i)] = init[size_t(i)] + dref[size_t(i)];
  DevBuf<float> dacc(init.size(), off);
  DevBuf<char> scratch(tg::cuda::embedding_backward_accumulate_scratch_bytes(N));
  dacc.upload(init);
  tg::cuda::embedding_backward_accumulate(dd.p, dids.p, dacc.p, N, V, C, scratch.p, scratch.n, kStream);
  const auto got = dacc.download();
  EXPECT_PARITY(got, expect, tol);
  std::vector<bool> occurs(size_t(V), false);
  for (int32_t id : ids) occurs[size_t(id)] = true;
  for (int64_t v = 0; v < V; ++v)
    if (!occurs[size_t(v)])
      for (int64_t c = 0; c < C; ++c)
        ASSERT_EQ(got[size_t(v * C + c)], init[size_t(v * C + c)]) << "row " << v << " has no token but changed";
  dacc.upload(init);
  tg::cuda::embedding_backward_accumulate(dd.p, dids.p, dacc.p, N, V, C, scratch.p, scratch.n, kStream);
  EXPECT_TRUE(same_bytes(dacc.download_raw(), std::vector<float>(got.begin(), got.end())))
      << "embedding_backward_accumulate is not bitwise reproducible";
}

template <typename T>
void case_layernorm(double tol, int64_t N, int64_t C, bool with_bias, size_t off) {
  auto x = quantize<T>(uniform(N * C, 21, -2.0f, 3.0f)), w = quantize<T>(uniform(C, 22, 0.5f, 1.5f));
  auto b = quantize<T>(uniform(C, 23)), d = quantize<T>(uniform(N * C, 24));
  std::vector<float> out(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  const float eps = 1e-5f;
  tg::cpu::layernorm_forward(x.data(), w.data(), with_bias ? b.data() : nullptr, out.data(), mean.data(), rstd.data(),
                             N, C, eps);
  tg::cpu::layernorm_backward(x.data(), w.data(), mean.data(), rstd.data(), d.data(), dx.data(), dw.data(),
                              with_bias ? db.data() : nullptr, N, C);
  DevBuf<T> gx(N * C, off), gw(C, off), gb(C, off), gout(N * C, off), gd(N * C, off), gdx(N * C, off), gdw(C, off),
      gdb(C, off);
  DevBuf<float> gmean(N), grstd(N), scratch(tg::cuda::layernorm_backward_scratch_floats(N, C));
  gx.upload(x), gw.upload(w), gb.upload(b), gd.upload(d);
  tg::cuda::layernorm_forward(gx.p, gw.p, with_bias ? gb.p : nullptr, gout.p, gmean.p, grstd.p, N, C, eps, kStream);
  EXPECT_PARITY(gout.download(), quantize<T>(out), tol);
  EXPECT_PARITY(gmean.download(), mean, 1e-5);
  EXPECT_PARITY(grstd.download(), rstd, 1e-5);
  // The backward takes the CPU's statistics so it is checked on its own.
  DevBuf<float> cmean(N), crstd(N);
  cmean.upload_raw(mean), crstd.upload_raw(rstd);
  auto run_backward = [&](const T* dx_add, T* dx_colsum = nullptr) {
    gdx.poison(), gdw.poison(), gdb.poison(), scratch.poison();
    tg::cuda::layernorm_backward(gx.p, gw.p, cmean.p, crstd.p, gd.p, dx_add, gdx.p, gdw.p, with_bias ? gdb.p : nullptr,
                                 dx_colsum, N, C, scratch.p, kStream);
  };
  run_backward(nullptr);
  EXPECT_PARITY(gdx.download(), quantize<T>(dx), tol);
  EXPECT_PARITY(gdw.download(), quantize<T>(dw), tol);
  if (with_bias) EXPECT_PARITY(gdb.download(), quantize<T>(db), tol);
  auto dx1 = gdx.download_raw(), dw1 = gdw.download_raw(), db1 = gdb.download_raw();
  run_backward(nullptr);
  EXPECT_TRUE(same_bytes(dx1, gdx.download_raw()) && same_bytes(dw1, gdw.download_raw()) &&
              (!with_bias || same_bytes(db1, gdb.download_raw())))
      << "layernorm_backward is not bitwise reproducible";
  // With another consumer's gradient added into dx as it is written (the residual stream's).
  auto r = quantize<T>(uniform(N * C, 25));
  std::vector<float> dx_total(N * C);
  for (int64_t i = 0; i < N * C; ++i) dx_total[size_t(i)] = dx[size_t(i)] + r[size_t(i)];
  DevBuf<T> gr(N * C, off);
  gr.upload(r);
  run_backward(gr.p);
  EXPECT_PARITY(gdx.download(), quantize<T>(dx_total), tol);
  EXPECT_TRUE(same_bytes(dw1, gdw.download_raw()) && (!with_bias || same_bytes(db1, gdb.download_raw())))
      << "dx_add changed dweight or dbias";
  // With dx's column sums (a bias added into x gets them as its gradient): the sums against the
  // CPU's dx summed in double, dx as before (the compiler may contract its arithmetic differently
  // in the kernel that also sums it: in fp32 its last bits may move), dweight and dbias the bits of
  // the run without them.
  std::vector<double> colsum(C, 0.0);
  for (int64_t i = 0; i < N * C; ++i) colsum[size_t(i % C)] += dx_total[size_t(i)];
  DevBuf<T> gcs(C, off);
  gcs.poison();
  run_backward(gr.p, gcs.p);
  EXPECT_PARITY(gcs.download(), quantize<T>(std::vector<float>(colsum.begin(), colsum.end())), tol);
  EXPECT_PARITY(gdx.download(), quantize<T>(dx_total), tol);
  EXPECT_TRUE(same_bytes(dw1, gdw.download_raw()) && (!with_bias || same_bytes(db1, gdb.download_raw())))
      << "the column sums changed dweight or dbias";
  const auto cs1 = gcs.download_raw();
  run_backward(gr.p, gcs.p);
  EXPECT_TRUE(same_bytes(cs1, gcs.download_raw())) << "layernorm_backward's column sums are not bitwise reproducible";
}

// The residual add and the LayerNorm after it in one pass: the sum is the rounded a + b exactly,
// and sum, out and the statistics are bitwise those of add_forward followed by layernorm_forward.
template <typename T>
void case_add_layernorm(double tol, int64_t N, int64_t C, size_t off) {
  auto a = quantize<T>(uniform(N * C, 27, -2.0f, 3.0f)), b = quantize<T>(uniform(N * C, 28));
  auto w = quantize<T>(uniform(C, 29, 0.5f, 1.5f)), bias = quantize<T>(uniform(C, 30));
  std::vector<float> sum(N * C), out(N * C), mean(N), rstd(N);
  for (int64_t i = 0; i < N * C; ++i) sum[size_t(i)] = a[size_t(i)] + b[size_t(i)];
  sum = quantize<T>(sum);
  tg::cpu::layernorm_forward(sum.data(), w.data(), bias.data(), out.data(), mean.data(), rstd.data(), N, C, 1e-5f);
  DevBuf<T> ga(N * C, off), gb(N * C, off), gw(C, off), gbias(C, off), gsum(N * C, off), gout(N * C, off);
  DevBuf<float> gmean(N), grstd(N);
  ga.upload(a), gb.upload(b), gw.upload(w), gbias.upload(bias);
  gsum.poison(), gout.poison();
  tg::cuda::add_layernorm_forward<T>(ga.p, gb.p, nullptr, gsum.p, gw.p, gbias.p, gout.p, gmean.p, grstd.p, N, C, 1e-5f,
                                  kStream);
  EXPECT_EQ(rel_err(gsum.download(), sum), 0.0) << "add_layernorm_forward's sum";
  EXPECT_PARITY(gout.download(), quantize<T>(out), tol);
  EXPECT_PARITY(gmean.download(), mean, 1e-5);
  EXPECT_PARITY(grstd.download(), rstd, 1e-5);
  DevBuf<T> gsum2(N * C, off), gout2(N * C, off);
  DevBuf<float> gmean2(N), grstd2(N);
  tg::cuda::add_forward(ga.p, gb.p, gsum2.p, 1, N * C, kStream);
  tg::cuda::layernorm_forward(gsum2.p, gw.p, gbias.p, gout2.p, gmean2.p, grstd2.p, N, C, 1e-5f, kStream);
  EXPECT_TRUE(same_bytes(gsum.download_raw(), gsum2.download_raw()) &&
              same_bytes(gout.download_raw(), gout2.download_raw()) &&
              same_bytes(gmean.download_raw(), gmean2.download_raw()) &&
              same_bytes(grstd.download_raw(), grstd2.download_raw()))
      << "add_layernorm_forward differs from add_forward then layernorm_forward";
  // With b's bias (a projection's, added here rather than in its GEMM): a + (b + b_bias rounded),
  // bitwise the two adds then the LayerNorm.
  auto bb = quantize<T>(uniform(C, 31));
  std::vector<float> b_biased(N * C);
  for (int64_t i = 0; i < N * C; ++i) b_biased[size_t(i)] = b[size_t(i)] + bb[size_t(i % C)];
  b_biased = quantize<T>(b_biased);
  for (int64_t i = 0; i < N * C; ++i) sum[size_t(i)] = a[size_t(i)] + b_biased[size_t(i)];
  sum = quantize<T>(sum);
  tg::cpu::layernorm_forward(sum.data(), w.data(), bias.data(), out.data(), mean.data(), rstd.data(), N, C, 1e-5f);
  DevBuf<T> gbb(C, off), gtmp(N * C, off);
  gbb.upload(bb);
  gsum.poison(), gout.poison();
  tg::cuda::add_layernorm_forward(ga.p, gb.p, gbb.p, gsum.p, gw.p, gbias.p, gout.p, gmean.p, grstd.p, N, C, 1e-5f,
                                  kStream);
  EXPECT_EQ(rel_err(gsum.download(), sum), 0.0) << "add_layernorm_forward's sum with b_bias";
  EXPECT_PARITY(gout.download(), quantize<T>(out), tol);
  tg::cuda::add_forward(gb.p, gbb.p, gtmp.p, N, C, kStream);
  tg::cuda::add_forward(ga.p, gtmp.p, gsum2.p, 1, N * C, kStream);
  tg::cuda::layernorm_forward(gsum2.p, gw.p, gbias.p, gout2.p, gmean2.p, grstd2.p, N, C, 1e-5f, kStream);
  EXPECT_TRUE(same_bytes(gsum.download_raw(), gsum2.download_raw()) &&
              same_bytes(gout.download_raw(), gout2.download_raw()))
      << "add_layernorm_forward with b_bias differs from the two adds then layernorm_forward";
}

// Some rows fully masked (all −inf → zeros), some with a masked tail (−inf entries). The CPU
// reference runs in double: a float CPU's sequential sum over long rows is itself off by more
// than the GPU's error, which would make the CPU, not the GPU, the thing being measured.
template <typename T>
void case_softmax(double tol, int64_t N, int64_t C, size_t off) {
  auto x = quantize<T>(uniform(N * C, 25, -5.0f, 5.0f)), dy = quantize<T>(uniform(N * C, 26));
  for (int64_t c = 0; c < C; ++c) x[c] = -INFINITY;  // row 0 fully masked
  if (N > 2)
    for (int64_t c = C / 2; c < C; ++c) x[2 * C + c] = -INFINITY;
  std::vector<double> y(N * C), dx(N * C);
  tg::cpu::softmax_forward(widen(x).data(), y.data(), N, C);
  auto yq = quantize<T>(narrow(y));  // the backward gets the forward output in T on both sides
  tg::cpu::softmax_backward(widen(yq).data(), widen(dy).data(), dx.data(), N, C);
  DevBuf<T> gx(N * C, off), gy(N * C, off), gyq(N * C, off), gdy(N * C, off), gdx(N * C, off);
  gx.upload(x), gyq.upload(yq), gdy.upload(dy);
  tg::cuda::softmax_forward(gx.p, gy.p, N, C, kStream);
  EXPECT_PARITY(gy.download(), yq, tol);
  tg::cuda::softmax_backward(gyq.p, gdy.p, gdx.p, N, C, kStream);
  EXPECT_PARITY(gdx.download(), quantize<T>(narrow(dx)), tol);
}

template <typename T>
void case_cross_entropy(double tol, int64_t N, int64_t V, bool all_ignored, size_t off) {
  const int32_t ignore = -100;
  auto logits = quantize<T>(uniform(N * V, 27, -8.0f, 8.0f));
  std::vector<int32_t> targets(N);
  for (int64_t n = 0; n < N; ++n)
    targets[n] = all_ignored || n % 5 == 3 ? ignore : int32_t(tg::cpu::hash64(uint64_t(n) + 99) % uint64_t(V));
  if (!all_ignored) targets[0] = int32_t(V - 1);
  // Reference in double: a float CPU's sequential sum of 50304 exps is off by ~5e-5 in lse.
  std::vector<double> lse_d(N), row_loss_d(N), dl_d(N * V);
  const auto logits_d = widen(logits);
  const int64_t counted =
      tg::cpu::cross_entropy_forward(logits_d.data(), targets.data(), lse_d.data(), row_loss_d.data(), N, V, ignore);
  const double total = tg::cpu::sum_all(row_loss_d.data(), N);
  const float loss = counted > 0 ? float(total / double(counted)) : 0.0f;
  // The forward writes the gradient for dloss = 1; the backward rescales it for any other.
  std::vector<double> dl1_d(N * V);
  tg::cpu::cross_entropy_backward(logits_d.data(), targets.data(), lse_d.data(), 1.0, counted, dl1_d.data(), N, V,
                                  ignore);
  const float dloss = 1.5f;
  tg::cpu::cross_entropy_backward(logits_d.data(), targets.data(), lse_d.data(), double(dloss), counted, dl_d.data(),
                                  N, V, ignore);
  const auto lse = narrow(lse_d), row_loss = narrow(row_loss_d), dl = narrow(dl_d), dl_unit = narrow(dl1_d);

  DevBuf<T> glogits(N * V, off), gdl(N * V, off);
  DevBuf<int32_t> gtargets(N), gcount(1);
  DevBuf<float> glse(N), grow(N), gloss(1), gdloss(1), gone(1);
  glogits.upload(logits), gtargets.upload_raw(targets), gdloss.upload_raw({dloss}), gone.upload_raw({1.0f});
  auto forward = [&](bool with_grad) {
    glse.poison(), grow.poison(), gloss.poison(), gcount.poison(), gdl.poison();
    tg::cuda::cross_entropy_forward(glogits.p, gtargets.p, glse.p, grow.p, gloss.p, gcount.p,
                                    with_grad ? gdl.p : static_cast<T*>(nullptr), N, V, ignore, kStream);
  };
  forward(true);
  // Statistics are fp32 on both sides (from the same T inputs): fp32-level agreement.
  EXPECT_PARITY(glse.download(), lse, 1e-5);
  EXPECT_PARITY(grow.download(), row_loss, 1e-5);
  EXPECT_PARITY(gloss.download(), std::vector<float>{loss}, 1e-5);
  EXPECT_EQ(gcount.download_raw()[0], counted);
  EXPECT_PARITY(gdl.download(), quantize<T>(dl_unit), tol);
  auto lse1 = glse.download_raw(), loss1 = gloss.download_raw(), dl1 = gdl.download_raw();
  tg::cuda::cross_entropy_backward(gone.p, gdl.p, N * V, kStream);  // dloss = 1: untouched
  EXPECT_TRUE(same_bytes(dl1, gdl.download_raw())) << "a unit upstream gradient changed the gradient";
  tg::cuda::cross_entropy_backward(gdloss.p, gdl.p, N * V, kStream);
  EXPECT_PARITY(gdl.download(), quantize<T>(dl), tol);
  forward(true);
  EXPECT_TRUE(same_bytes(lse1, glse.download_raw()) && same_bytes(loss1, gloss.download_raw()) &&
              same_bytes(dl1, gdl.download_raw()))
      << "cross_entropy is not bitwise reproducible";
  forward(false);  // no gradient asked: the same statistics, the gradient buffer untouched
  EXPECT_TRUE(same_bytes(lse1, glse.download_raw()) && same_bytes(loss1, gloss.download_raw()))
      << "the statistics depend on whether the gradient is written";
  const auto untouched = gdl.download_raw();
  gdl.poison();
  EXPECT_TRUE(same_bytes(untouched, gdl.download_raw())) << "the forward without a gradient wrote dlogits";
}

void case_adamw(double tol, int64_t n, int64_t n_decay, float grad_scale, size_t off) {
  auto p = uniform(n, 28), g = uniform(n, 29, -0.1f, 0.1f), m = uniform(n, 30, -0.01f, 0.01f),
       v = uniform(n, 31, 0.0f, 1e-3f);
  const float lr = 6e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  const float bc1 = 1.0f - std::pow(b1, 3.0f), bc2 = 1.0f - std::pow(b2, 3.0f);
  DevBuf<float> gp(n, off), gg(n, off), gm(n, off), gv(n, off);
  gp.upload_raw(p), gg.upload_raw(g), gm.upload_raw(m), gv.upload_raw(v);
  tg::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n_decay, lr, b1, b2, eps, wd, bc1, bc2, grad_scale);
  tg::cpu::adamw_update(p.data() + n_decay, g.data() + n_decay, m.data() + n_decay, v.data() + n_decay, n - n_decay,
                        lr, b1, b2, eps, 0.0f, bc1, bc2, grad_scale);
  // The same update writing the bf16 compute copy too: the same fp32 results, and the copy is
  // the cast of the updated values, bit for bit.
  DevBuf<float> cp(n, off), cm(n, off), cv(n, off);
  DevBuf<bf16> compute(n, off);
  cp.upload_raw(gp.download_raw()), cm.upload_raw(gm.download_raw()), cv.upload_raw(gv.download_raw());
  compute.poison();
  tg::cuda::adamw_update(gp.p, gg.p, gm.p, gv.p, nullptr, n, n_decay, lr, b1, b2, eps, wd, bc1, bc2, grad_scale,
                         kStream);
  EXPECT_PARITY(gp.download_raw(), p, tol);
  EXPECT_PARITY(gm.download_raw(), m, tol);
  EXPECT_PARITY(gv.download_raw(), v, tol);
  tg::cuda::adamw_update(cp.p, gg.p, cm.p, cv.p, compute.p, n, n_decay, lr, b1, b2, eps, wd, bc1, bc2, grad_scale,
                         kStream);
  const std::vector<float> updated = gp.download_raw();
  EXPECT_TRUE(same_bytes(cp.download_raw(), updated) && same_bytes(cm.download_raw(), gm.download_raw()) &&
              same_bytes(cv.download_raw(), gv.download_raw()))
      << "writing the compute copy changed the update";
  std::vector<bf16> cast(updated.size());
  for (size_t i = 0; i < updated.size(); ++i) cast[i] = tg::float_to_bf16(updated[i]);
  EXPECT_TRUE(same_bytes(compute.download_raw(), cast)) << "the compute copy is not the cast of the updated values";
}

void case_sum_squares(int64_t n, size_t off) {
  auto g = uniform(n, 32);
  const double ref = tg::cpu::sum_squares(g.data(), n);
  DevBuf<float> gg(n, off);
  DevBuf<double> out(1);
  DevBuf<unsigned char> scratch(tg::cuda::sum_squares_scratch_bytes(n));
  gg.upload_raw(g);
  tg::cuda::sum_squares(gg.p, n, scratch.p, out.p, kStream);
  const double got = out.download_raw()[0];
  EXPECT_LE(std::abs(got - ref), 1e-12 * std::max(1.0, std::abs(ref))) << got << " vs " << ref;
  out.poison(), scratch.poison();
  tg::cuda::sum_squares(gg.p, n, scratch.p, out.p, kStream);
  const double again = out.download_raw()[0];
  EXPECT_EQ(std::memcmp(&got, &again, sizeof(double)), 0) << "sum_squares is not bitwise reproducible";
}

void case_scale_inplace(int64_t n, size_t off) {
  auto x = uniform(n, 33);
  DevBuf<float> gx(n, off);
  gx.upload_raw(x);
  tg::cpu::scale_inplace(x.data(), 0.25f, n);
  tg::cuda::scale_inplace(gx.p, 0.25f, n, kStream);
  EXPECT_EQ(rel_err(gx.download_raw(), x), 0.0);
}

// ───────────────────────────── the table ─────────────────────────────

// Tolerances on ||gpu − cpu|| / ||cpu||. fp32: elementwise ops differ only by libm ulps and FMA
// contraction (1e-6); reductions also by summation order (1e-5). bf16: inputs are the same
// bf16 values on both sides, so the gap is the final rounding of outputs to bf16 (≤ 2⁻⁹ relative
// per element) — 1e-2 leaves room and still catches a wrong formula or an unwritten element.
constexpr double kF32 = 1e-6, kF32Reduce = 1e-5, kBf16 = 1e-2, kExact = 0.0;

struct Case {
  std::string name;
  bool has_bf16;  // false: the op is fp32-only (optimizer) or checks both dtypes itself (cast)
  std::function<void(bool bf16)> run;
};

// A case written once as a template over T, run for float and bf16 with their tolerances.
#define TG_CASE(name, tol_f32, tol_bf16, call)                                                           \
  Case {                                                                                                 \
    name, true, [](bool bf16_) {                                                                         \
      if (bf16_) {                                                                                       \
        using T = bf16;                                                                                  \
        [[maybe_unused]] const double tol = tol_bf16;                                                    \
        call;                                                                                            \
      } else {                                                                                           \
        using T = float;                                                                                 \
        [[maybe_unused]] const double tol = tol_f32;                                                     \
        call;                                                                                            \
      }                                                                                                  \
    }                                                                                                    \
  }
#define TG_CASE_F32(name, call) \
  Case { name, false, [](bool) { call; } }

std::vector<Case> parity_table() {
  return {
      TG_CASE("add_forward_1x4099", kF32, kBf16, case_add_forward<T>(tol, 1, 4099, 0)),
      TG_CASE("add_forward_7x13", kF32, kBf16, case_add_forward<T>(tol, 7, 13, 0)),
      TG_CASE("add_forward_64x768", kF32, kBf16, case_add_forward<T>(tol, 64, 768, 0)),
      TG_CASE("add_forward_64x768_misaligned", kF32, kBf16, case_add_forward<T>(tol, 64, 768, 1)),
      TG_CASE("add_inplace_1048579", kF32, kBf16, case_add_inplace<T>(tol, 1048579, 0)),
      TG_CASE("add_inplace_13_misaligned", kF32, kBf16, case_add_inplace<T>(tol, 13, 1)),
      TG_CASE_F32("add_converted_1048579", case_add_converted(1048579, 0)),
      TG_CASE_F32("add_converted_13_misaligned", case_add_converted(13, 1)),
      TG_CASE_F32("add_converted_batched", case_add_converted_batched()),
      TG_CASE("sum_rows_37x13", kF32Reduce, kBf16, case_sum_rows<T>(tol, 37, 13)),
      TG_CASE("sum_rows_16384x768", kF32Reduce, kBf16, case_sum_rows<T>(tol, 16384, 768)),
      TG_CASE("sum_rows_1000x3072", kF32Reduce, kBf16, case_sum_rows<T>(tol, 1000, 3072)),
      TG_CASE("sum_rows_16384x2304", kF32Reduce, kBf16, case_sum_rows<T>(tol, 16384, 2304)),
      TG_CASE("sum_rows_5000x100", kF32Reduce, kBf16, case_sum_rows<T>(tol, 5000, 100)),  // bf16: 100 % 8 ≠ 0, one pass
      TG_CASE("sum_rows_16x786432_few_rows", kF32Reduce, kBf16, case_sum_few_rows<T>(16, 786432)),
      TG_CASE("sum_rows_32x65536_few_rows", kF32Reduce, kBf16, case_sum_few_rows<T>(32, 65536)),
      TG_CASE("sum_rows_33x65536", kF32Reduce, kBf16, case_sum_rows<T>(tol, 33, 65536)),
      TG_CASE("mul_4099", kF32, kBf16, case_mul<T>(tol, 4099, 0)),
      TG_CASE("mul_4099_misaligned", kF32, kBf16, case_mul<T>(tol, 4099, 1)),
      TG_CASE("scale_65539", kF32, kBf16, case_scale<T>(tol, 65539, 0)),
      TG_CASE("scale_13_misaligned", kF32, kBf16, case_scale<T>(tol, 13, 1)),
      TG_CASE("gelu_1048579", kF32, kBf16, case_gelu<T>(tol, 1048579, 0)),
      TG_CASE("gelu_4099_misaligned", kF32, kBf16, case_gelu<T>(tol, 4099, 1)),
      TG_CASE("gelu_sum_rows_4096x3072", kF32Reduce, kBf16, case_gelu_sum_rows<T>(tol, 4096, 3072)),
      TG_CASE("gelu_sum_rows_300x40", kF32Reduce, kBf16, case_gelu_sum_rows<T>(tol, 300, 40)),
      TG_CASE("gelu_sum_rows_37x13", kF32Reduce, kBf16, case_gelu_sum_rows<T>(tol, 37, 13)),
      TG_CASE_F32("cast_4099", case_cast(0)),
      TG_CASE_F32("cast_4099_misaligned", case_cast(1)),
      TG_CASE("dropout_1048579", kExact, kExact, case_dropout<T>(1048579, 0.1f, 0)),
      TG_CASE("dropout_4099_misaligned", kExact, kExact, case_dropout<T>(4099, 0.5f, 1)),
      TG_CASE("fill_4099", kExact, kExact, case_fill<T>(4099, 0)),
      TG_CASE("fill_13_misaligned", kExact, kExact, case_fill<T>(13, 1)),
      TG_CASE("swap_dims12_2x5x3x64", kExact, kExact, case_swap_dims12<T>(2, 5, 3, 64, 0)),
      TG_CASE("swap_dims12_2x7x3x5", kExact, kExact, case_swap_dims12<T>(2, 7, 3, 5, 0)),
      TG_CASE("swap_dims12_4x64x12x64", kExact, kExact, case_swap_dims12<T>(4, 64, 12, 64, 0)),
      TG_CASE("slice_33x2304_768_768", kExact, kExact, case_slice<T>(33, 2304, 768, 768, 0)),
      TG_CASE("slice_7x13_3_5", kExact, kExact, case_slice<T>(7, 13, 3, 5, 0)),
      TG_CASE("slice_33x2304_misaligned", kExact, kExact, case_slice<T>(33, 2304, 1536, 768, 1)),
      TG_CASE("causal_mask_3x17x17_neginf", kExact, kExact, case_causal_mask<T>(3, 17, 17, -INFINITY, 0)),
      TG_CASE("causal_mask_2x64x64_zero", kExact, kExact, case_causal_mask<T>(2, 64, 64, 0.0f, 0)),
      TG_CASE("causal_mask_2x5x9", kExact, kExact, case_causal_mask<T>(2, 5, 9, -INFINITY, 0)),
      TG_CASE("rope_2x17x3x64_fwd", kF32, kBf16, case_rope<T>(tol, 2, 17, 3, 64, 1, 0)),
      TG_CASE("rope_2x17x3x64_bwd", kF32, kBf16, case_rope<T>(tol, 2, 17, 3, 64, -1, 0)),
      TG_CASE("rope_3x5x2x6_misaligned", kF32, kBf16, case_rope<T>(tol, 3, 5, 2, 6, 1, 1)),
      TG_CASE("embedding_37x11x13", kF32, kBf16, case_embedding<T>(tol, 37, 11, 13, 0)),
      TG_CASE("embedding_129x1000x768", kF32, kBf16, case_embedding<T>(tol, 129, 1000, 768, 0)),
      TG_CASE("embedding_16384x50304x768", kF32, kBf16, case_embedding<T>(tol, 16384, 50304, 768, 0)),
      TG_CASE("embedding_64x300x200_misaligned", kF32, kBf16, case_embedding<T>(tol, 64, 300, 200, 1)),
      TG_CASE("layernorm_16384x768", kF32Reduce, kBf16, case_layernorm<T>(tol, 16384, 768, true, 0)),  // GPT-2's step
      TG_CASE("layernorm_64x768", kF32Reduce, kBf16, case_layernorm<T>(tol, 64, 768, true, 0)),
      TG_CASE("add_layernorm_forward_64x768", kF32Reduce, kBf16, case_add_layernorm<T>(tol, 64, 768, 0)),
      TG_CASE("add_layernorm_forward_4096x768", kF32Reduce, kBf16, case_add_layernorm<T>(tol, 4096, 768, 0)),
      TG_CASE("add_layernorm_forward_300x128", kF32Reduce, kBf16, case_add_layernorm<T>(tol, 300, 128, 0)),
      TG_CASE("add_layernorm_forward_17x13", kF32Reduce, kBf16, case_add_layernorm<T>(tol, 17, 13, 0)),  // one pass each
      TG_CASE("add_layernorm_forward_50x2000", kF32Reduce, kBf16, case_add_layernorm<T>(tol, 50, 2000, 1)),
      TG_CASE("layernorm_64x768_nobias", kF32Reduce, kBf16, case_layernorm<T>(tol, 64, 768, false, 0)),
      TG_CASE("layernorm_17x13", kF32Reduce, kBf16, case_layernorm<T>(tol, 17, 13, true, 0)),
      TG_CASE("layernorm_4096x768", kF32Reduce, kBf16, case_layernorm<T>(tol, 4096, 768, true, 0)),
      TG_CASE("layernorm_3x1000_misaligned", kF32Reduce, kBf16, case_layernorm<T>(tol, 3, 1000, true, 1)),
      // Vectors per lane 1..4 (the register kernel, partly filled last vectors included) and more
      // (the general kernel), for both element sizes.
      TG_CASE("layernorm_300x128", kF32Reduce, kBf16, case_layernorm<T>(tol, 300, 128, true, 0)),
      TG_CASE("layernorm_200x520", kF32Reduce, kBf16, case_layernorm<T>(tol, 200, 520, true, 0)),
      TG_CASE("layernorm_100x1024", kF32Reduce, kBf16, case_layernorm<T>(tol, 100, 1024, false, 0)),
      TG_CASE("layernorm_50x2000", kF32Reduce, kBf16, case_layernorm<T>(tol, 50, 2000, true, 0)),
      TG_CASE("softmax_5x13", kF32Reduce, kBf16, case_softmax<T>(tol, 5, 13, 0)),
      TG_CASE("softmax_64x1000", kF32Reduce, kBf16, case_softmax<T>(tol, 64, 1000, 0)),
      TG_CASE("softmax_16x2048", kF32Reduce, kBf16, case_softmax<T>(tol, 16, 2048, 0)),
      TG_CASE("softmax_8x4099", kF32Reduce, kBf16, case_softmax<T>(tol, 8, 4099, 0)),
      TG_CASE("softmax_64x1024_misaligned", kF32Reduce, kBf16, case_softmax<T>(tol, 64, 1024, 1)),
      TG_CASE("cross_entropy_64x50304", kF32Reduce, kBf16, case_cross_entropy<T>(tol, 64, 50304, false, 0)),
      // More rows than multiprocessors: on Hopper a block takes several rows, its two buffers in turn
      // (bf16 at GPT-2's vocabulary; in f32 two such rows do not fit in shared memory).
      TG_CASE("cross_entropy_600x50304", kF32Reduce, kBf16, case_cross_entropy<T>(tol, 600, 50304, false, 0)),
      TG_CASE("cross_entropy_1000x4000", kF32Reduce, kBf16, case_cross_entropy<T>(tol, 1000, 4000, false, 0)),
      TG_CASE("cross_entropy_7x1001", kF32Reduce, kBf16, case_cross_entropy<T>(tol, 7, 1001, false, 0)),
      TG_CASE("cross_entropy_9x64_all_ignored", kF32Reduce, kBf16, case_cross_entropy<T>(tol, 9, 64, true, 0)),
      TG_CASE("cross_entropy_33x5000_misaligned", kF32Reduce, kBf16, case_cross_entropy<T>(tol, 33, 5000, false, 1)),
      TG_CASE_F32("adamw_1048579", case_adamw(kF32, 1048579, 700001, 1.0f, 0)),
      TG_CASE_F32("adamw_1048579_clipped", case_adamw(kF32, 1048579, 700001, 0.37f, 0)),
      TG_CASE_F32("adamw_13_misaligned", case_adamw(kF32, 13, 5, 1.0f, 1)),
      TG_CASE_F32("sum_squares_3000005", case_sum_squares(3000005, 0)),
      TG_CASE_F32("sum_squares_8192", case_sum_squares(8192, 0)),
      TG_CASE_F32("sum_squares_13_misaligned", case_sum_squares(13, 1)),
      TG_CASE_F32("sum_squares_0", case_sum_squares(0, 0)),
      TG_CASE_F32("scale_inplace_4099", case_scale_inplace(4099, 0)),
      TG_CASE_F32("scale_inplace_13_misaligned", case_scale_inplace(13, 1)),
  };
}

struct Param {
  Case c;
  bool bf16;
};

std::vector<Param> parity_params() {
  std::vector<Param> out;
  for (const Case& c : parity_table()) {
    out.push_back({c, false});
    if (c.has_bf16) out.push_back({c, true});
  }
  return out;
}

void PrintTo(const Param& p, std::ostream* os) { *os << p.c.name << (p.bf16 ? " bf16" : " f32"); }

class Parity : public ::testing::TestWithParam<Param> {};

TEST_P(Parity, MatchesCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  GetParam().c.run(GetParam().bf16);
  TG_CUDA_CHECK(cudaDeviceSynchronize());  // a kernel fault surfaces here, named by the test
}

INSTANTIATE_TEST_SUITE_P(Kernels, Parity, ::testing::ValuesIn(parity_params()),
                         [](const ::testing::TestParamInfo<Param>& info) {
                           return info.param.c.name + (info.param.bf16 ? "_bf16" : "_f32");
                         });

// The op specification (tests/op_specs.h) names the launchers each op runs: each has rows in this
// table, and each row belongs to a launcher some op runs or to one outside the ops (conversions,
// gradient additions, the optimizer). A launcher's rows are named "<launcher>" or
// "<launcher>_<shape…>"; the longest launcher name that fits a row owns it. Needs no GPU.
TEST(KernelParityCoverage, EveryOpKernelHasRowsAndEveryRowAnOwner) {
  std::vector<std::string> launchers = tg::testing::kernels_outside_ops();
  for (const tg::testing::OpSpec& s : tg::testing::op_specs())
    launchers.insert(launchers.end(), s.kernels.begin(), s.kernels.end());
  auto owner = [&](const std::string& row) {
    std::string best;
    for (const std::string& k : launchers)
      if ((row == k || row.rfind(k + "_", 0) == 0) && k.size() > best.size()) best = k;
    return best;
  };
  std::vector<std::string> owned;
  for (const Case& c : parity_table()) {
    const std::string k = owner(c.name);
    EXPECT_FALSE(k.empty()) << "the kernel parity row " << c.name << " belongs to no launcher of tests/op_specs.h";
    owned.push_back(k);
  }
  for (const tg::testing::OpSpec& s : tg::testing::op_specs())
    for (const std::string& k : s.kernels)
      EXPECT_NE(std::find(owned.begin(), owned.end(), k), owned.end())
          << s.name << " runs " << k << ", which has no row in the kernel parity table";
}

// Broken preconditions are reported, not launched.
TEST(ParityPreconditions, Throw) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  DevBuf<float> a(64), b(64);
  EXPECT_THROW(tg::cuda::slice_last(a.p, b.p, 4, 16, 10, 8, kStream), std::invalid_argument);
  EXPECT_THROW(tg::cuda::rope_apply(a.p, b.p, 1, 1, 1, 7, 10000.0, 0, 1, kStream), std::invalid_argument);
  EXPECT_THROW(tg::cuda::adamw_update(a.p, b.p, a.p, b.p, nullptr, 64, 65, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.1f, 1.0f, kStream),
               std::invalid_argument);
}

}  // namespace

#else  // !TILEGRAD_HAVE_CUDA

TEST(Parity, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif
