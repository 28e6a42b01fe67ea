// cuda::flash_attention_{forward,backward} vs a double-precision naive attention: O, lse, dQ, dK,
// dV over head dims, sequence lengths (tails included) and the causal rule, for both kernel
// families (FlashKernels::kMmaSync everywhere, kWgmma on compute capability 9.0 at head dims 64,
// 96 — the d 128 kernels on zero-padded tiles — and 128; head dim 32 has the mma.sync kernels
// alone); every output
// proven written (poisoned first); the default backward bitwise reproducible, the opt-in atomic dQ
// within the same bounds. Row strides: q, k, v read straight
// out of one packed (B, T, 3·H·D) qkv buffer and dq, dk, dv written into one (B, T, 3·H·D)
// d(qkv) buffer give the same bits as the contiguous layout; invalid strides are rejected.
// Structured masks (sliding window, documents) against the masked reference, and a mask that
// excludes nothing bit for bit equal to plain causal attention.
#include <gtest/gtest.h>

#include "tests/cuda/cuda_test_util.h"

#ifdef TILEGRAD_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/flash_attention/flash.h"
#include "src/tensor/dtype.h"
#include "tests/flash_reference.h"

using tg::testing::have_gpu;

namespace {

using namespace tg::testing::flash;

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) { CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T))); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  void upload(const std::vector<T>& h) { CHECK_CUDA(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    CHECK_CUDA(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
  // 0xFF bytes are NaN in both bf16 and fp32: an element the kernel fails to write shows up.
  void poison() { CHECK_CUDA(cudaMemset(ptr, 0xFF, std::max<size_t>(n, 1) * sizeof(T))); }
};

using tg::cuda::FlashKernels;

bool device_is_sm90() {
  int major = 0, minor = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  return major == 9 && minor == 0;
}

// Why a (shape, kernels) case cannot run here, or "" when it can.
std::string skip_reason(FlashKernels kernels) {
  if (!have_gpu()) return "no CUDA GPU on this machine";
  if (kernels == FlashKernels::kWgmma && !device_is_sm90()) return "the wgmma kernels run on compute capability 9.0 only";
  return "";
}

// A case, the kernel family, and a variant of the wgmma kernels' development registry ("": the
// shapes the launchers select).
using KernelCase = std::tuple<Case, FlashKernels, std::string>;

class FlashAttentionTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(FlashAttentionTest, MatchesDoubleReference) {
  const auto [c, kernels, variant] = GetParam();
  if (const std::string why = skip_reason(kernels); !why.empty()) GTEST_SKIP() << why;
  const Problem pr = make_problem(c);
  const size_t n = pr.n, n_lse = pr.n_lse;
  const double scale = pr.scale;
  const Input &q = pr.q, &k = pr.k, &v = pr.v, &dout = pr.dout;
  const Reference& ref = pr.ref;

  DeviceBuffer<tg::bf16> dq_in(n), dk_in(n), dv_in(n), ddout(n), d_o(n), d_dq(n), d_dk(n), d_dv(n);
  DeviceBuffer<float> d_lse(n_lse);
  // Sized for the atomic mode, which also serves the default.
  const size_t ws_bytes =
      tg::cuda::flash_attention_backward_workspace_bytes(c.B, c.T, c.H, c.D, tg::cuda::FlashDq::kAtomic);
  DeviceBuffer<unsigned char> d_ws(ws_bytes);
  dq_in.upload(q.bits);
  dk_in.upload(k.bits);
  dv_in.upload(v.bits);
  ddout.upload(dout.bits);

  tg::cuda::FlashAttentionParams p{};
  p.q = dq_in.ptr, p.k = dk_in.ptr, p.v = dv_in.ptr, p.o = d_o.ptr, p.lse = d_lse.ptr;
  p.dout = ddout.ptr, p.dq = d_dq.ptr, p.dk = d_dk.ptr, p.dv = d_dv.ptr, p.workspace = d_ws.ptr;
  p.B = c.B, p.T = c.T, p.H = c.H, p.D = c.D;
  p.scale = float(scale);
  p.causal = c.causal;
  p.kernels = kernels;
  p.variant = uint8_t(variant.empty() ? 0 : tg::cuda::flash_attention_variant(variant));
  ASSERT_TRUE(variant.empty() || p.variant != 0) << variant;

  // Forward.
  d_o.poison();
  d_lse.poison();
  tg::cuda::flash_attention_forward(p, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<double> o = to_double(d_o.download()), lse = to_double(d_lse.download());
  ASSERT_EQ(count_nonfinite(o), 0u) << "O has NaN/inf (unwritten or overflowed elements)";
  ASSERT_EQ(count_nonfinite(lse), 0u) << "lse has NaN/inf";
  EXPECT_LE(rel_error(o, ref.o), 2e-2) << "O";
  EXPECT_LE(max_abs_diff(lse, ref.lse), 1e-3) << "lse";

  // Backward, from the kernel's own O and lse (as autograd would run it).
  auto run_backward = [&] {
    d_dq.poison();
    d_dk.poison();
    d_dv.poison();
    d_ws.poison();
    tg::cuda::flash_attention_backward(p, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    return std::vector<std::vector<tg::bf16>>{d_dq.download(), d_dk.download(), d_dv.download()};
  };
  const auto g1 = run_backward();
  const char* names[3] = {"dQ", "dK", "dV"};
  const std::vector<double>* refs[3] = {&ref.dq, &ref.dk, &ref.dv};
  for (int t = 0; t < 3; ++t) {
    const std::vector<double> g = to_double(g1[t]);
    ASSERT_EQ(count_nonfinite(g), 0u) << names[t] << " has NaN/inf (unwritten elements?)";
    EXPECT_LE(rel_error(g, *refs[t]), 5e-2) << names[t];
  }

  // Deterministic: a second run is bitwise identical.
  const auto g2 = run_backward();
  for (int t = 0; t < 3; ++t)
    EXPECT_EQ(std::memcmp(g1[t].data(), g2[t].data(), n * sizeof(tg::bf16)), 0) << names[t] << " not reproducible";

  // The opt-in atomic dQ (either family's dK/dV kernel adding dS K into an fp32 buffer; asked for
  // as kAtomicKernel, so that it runs at every shape, not only where kAtomic takes it) meets the
  // same bound; dK and dV do not depend on the dQ strategy (same kernel arithmetic, bit for bit).
  p.dq_mode = tg::cuda::FlashDq::kAtomicKernel;
  const auto ga = run_backward();
  const std::vector<double> gq = to_double(ga[0]);
  ASSERT_EQ(count_nonfinite(gq), 0u) << "dQ (kAtomic) has NaN/inf";
  EXPECT_LE(rel_error(gq, ref.dq), 5e-2) << "dQ (kAtomic)";
  for (int t = 1; t < 3; ++t)
    EXPECT_EQ(std::memcmp(ga[t].data(), g1[t].data(), n * sizeof(tg::bf16)), 0) << names[t] << " (kAtomic)";
}

// ─── Row strides: packed qkv ───

// Rows of `width` elements from several (rows, hd) contiguous sources laid side by side: source i
// at column offset i·hd of each row (columns past the sources keep `fill`).
std::vector<tg::bf16> pack_rows(const std::vector<const std::vector<tg::bf16>*>& srcs, size_t rows, size_t hd,
                                size_t width, tg::bf16 fill) {
  std::vector<tg::bf16> out(rows * width, fill);
  for (size_t i = 0; i < srcs.size(); ++i)
    for (size_t r = 0; r < rows; ++r) std::memcpy(&out[r * width + i * hd], &(*srcs[i])[r * hd], hd * sizeof(tg::bf16));
  return out;
}
// The (rows, hd) contiguous block at column offset `col` of each `width`-element row.
std::vector<tg::bf16> unpack_rows(const std::vector<tg::bf16>& packed, size_t rows, size_t hd, size_t width, size_t col) {
  std::vector<tg::bf16> out(rows * hd);
  for (size_t r = 0; r < rows; ++r) std::memcpy(&out[r * hd], &packed[r * width + col], hd * sizeof(tg::bf16));
  return out;
}

class FlashAttentionPackedTest : public ::testing::TestWithParam<KernelCase> {};

// The model's fused projection: q, k, v are column blocks 0, H·D, 2·H·D of one (B, T, 3·H·D)
// buffer (row stride 3·H·D), and d(qkv) comes back in one such buffer. O and dO get a padded row
// stride (H·D + 8) so the o/dO strides, and the delta kernel's use of them, are covered too.
// Checked against the double reference (same tolerances as above) and bitwise against the
// contiguous layout: the strides only move addresses, never the arithmetic.
TEST_P(FlashAttentionPackedTest, MatchesContiguousBitwise) {
  const auto [c, kernels, variant] = GetParam();
  (void)variant;  // (packed cases run the launchers' shapes)
  if (const std::string why = skip_reason(kernels); !why.empty()) GTEST_SKIP() << why;
  const size_t hd = size_t(c.H * c.D), rows = size_t(c.B * c.T);
  const size_t w = 3 * hd, wo = hd + 8;  // packed qkv / d(qkv) row; padded o, dout row
  const Problem pr = make_problem(c);
  const size_t n = pr.n, n_lse = pr.n_lse;
  const double scale = pr.scale;
  const Input &q = pr.q, &k = pr.k, &v = pr.v, &dout = pr.dout;
  const Reference& ref = pr.ref;
  // Sized for the atomic mode, which also serves the default.
  const size_t ws_bytes =
      tg::cuda::flash_attention_backward_workspace_bytes(c.B, c.T, c.H, c.D, tg::cuda::FlashDq::kAtomic);
  const tg::bf16 nan_bf16{0xFFFF};

  // Contiguous run: the bits the packed run must reproduce.
  DeviceBuffer<tg::bf16> cq(n), ck(n), cv(n), cdout(n), co(n), cdq(n), cdk(n), cdv(n);
  DeviceBuffer<float> clse(n_lse);
  DeviceBuffer<unsigned char> cws(ws_bytes);
  cq.upload(q.bits);
  ck.upload(k.bits);
  cv.upload(v.bits);
  cdout.upload(dout.bits);
  tg::cuda::FlashAttentionParams p{};
  p.q = cq.ptr, p.k = ck.ptr, p.v = cv.ptr, p.o = co.ptr, p.lse = clse.ptr;
  p.dout = cdout.ptr, p.dq = cdq.ptr, p.dk = cdk.ptr, p.dv = cdv.ptr, p.workspace = cws.ptr;
  p.B = c.B, p.T = c.T, p.H = c.H, p.D = c.D;
  p.scale = float(scale);
  p.causal = c.causal;
  p.kernels = kernels;
  tg::cuda::flash_attention_forward(p, nullptr);
  tg::cuda::flash_attention_backward(p, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<tg::bf16> o_c = co.download(), dq_c = cdq.download(), dk_c = cdk.download(), dv_c = cdv.download();
  const std::vector<float> lse_c = clse.download();

  // Packed run. dout's padding is NaN: a read past a row's H·D elements would poison delta.
  DeviceBuffer<tg::bf16> qkv(rows * w), dqkv(rows * w), po(rows * wo), pdout(rows * wo);
  DeviceBuffer<float> plse(n_lse);
  DeviceBuffer<unsigned char> pws(ws_bytes);
  qkv.upload(pack_rows({&q.bits, &k.bits, &v.bits}, rows, hd, w, nan_bf16));
  pdout.upload(pack_rows({&dout.bits}, rows, hd, wo, nan_bf16));
  po.poison();
  plse.poison();
  dqkv.poison();
  pws.poison();
  tg::cuda::FlashAttentionParams pp = p;
  pp.q = qkv.ptr, pp.k = qkv.ptr + hd, pp.v = qkv.ptr + 2 * hd, pp.o = po.ptr, pp.lse = plse.ptr;
  pp.dout = pdout.ptr, pp.dq = dqkv.ptr, pp.dk = dqkv.ptr + hd, pp.dv = dqkv.ptr + 2 * hd, pp.workspace = pws.ptr;
  pp.q_row_stride = pp.k_row_stride = pp.v_row_stride = int64_t(w);
  pp.dq_row_stride = pp.dk_row_stride = pp.dv_row_stride = int64_t(w);
  pp.o_row_stride = pp.do_row_stride = int64_t(wo);
  tg::cuda::flash_attention_forward(pp, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<tg::bf16> o_packed = po.download();
  const std::vector<float> lse_p = plse.download();
  tg::cuda::flash_attention_backward(pp, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<tg::bf16> g_packed = dqkv.download();

  // d(qkv) is exactly covered by dq | dk | dv: nothing of it may stay NaN.
  ASSERT_EQ(count_nonfinite(to_double(g_packed)), 0u) << "d(qkv) has NaN/inf (unwritten elements?)";
  const std::vector<tg::bf16> o_p = unpack_rows(o_packed, rows, hd, wo, 0);
  const std::vector<tg::bf16> g_p[3] = {unpack_rows(g_packed, rows, hd, w, 0), unpack_rows(g_packed, rows, hd, w, hd),
                                        unpack_rows(g_packed, rows, hd, w, 2 * hd)};
  const std::vector<double> o = to_double(o_p), lse = to_double(lse_p);
  ASSERT_EQ(count_nonfinite(o), 0u) << "O has NaN/inf (unwritten or overflowed elements)";
  ASSERT_EQ(count_nonfinite(lse), 0u) << "lse has NaN/inf";
  EXPECT_LE(rel_error(o, ref.o), 2e-2) << "O";
  EXPECT_LE(max_abs_diff(lse, ref.lse), 1e-3) << "lse";
  const char* names[3] = {"dQ", "dK", "dV"};
  const std::vector<double>* refs[3] = {&ref.dq, &ref.dk, &ref.dv};
  for (int t = 0; t < 3; ++t) EXPECT_LE(rel_error(to_double(g_p[t]), *refs[t]), 5e-2) << names[t];

  // Same arithmetic in the same order as the contiguous layout: identical bits.
  EXPECT_EQ(std::memcmp(o_p.data(), o_c.data(), n * sizeof(tg::bf16)), 0) << "O differs from contiguous";
  EXPECT_EQ(std::memcmp(lse_p.data(), lse_c.data(), n_lse * sizeof(float)), 0) << "lse differs from contiguous";
  const std::vector<tg::bf16>* g_c[3] = {&dq_c, &dk_c, &dv_c};
  for (int t = 0; t < 3; ++t)
    EXPECT_EQ(std::memcmp(g_p[t].data(), g_c[t]->data(), n * sizeof(tg::bf16)), 0) << names[t] << " differs from contiguous";

  // The opt-in atomic dQ (its kernel, kAtomicKernel) into the same strided d(qkv): every element
  // written, dQ within the bound, dK and dV the same bits as before (only dQ's summation order
  // changes).
  dqkv.poison();
  pws.poison();
  pp.dq_mode = tg::cuda::FlashDq::kAtomicKernel;
  tg::cuda::flash_attention_backward(pp, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<tg::bf16> g_atomic = dqkv.download();
  ASSERT_EQ(count_nonfinite(to_double(g_atomic)), 0u) << "d(qkv) (kAtomic) has NaN/inf (unwritten elements?)";
  EXPECT_LE(rel_error(to_double(unpack_rows(g_atomic, rows, hd, w, 0)), ref.dq), 5e-2) << "dQ (kAtomic)";
  for (int t = 1; t < 3; ++t)
    EXPECT_EQ(std::memcmp(unpack_rows(g_atomic, rows, hd, w, t * hd).data(), g_p[t].data(), n * sizeof(tg::bf16)), 0)
        << names[t] << " (kAtomic)";
}

std::vector<Case> packed_cases() {
  std::vector<Case> out;
  for (int64_t D : {32, 64, 96, 128})
    for (bool causal : {false, true})
      for (int64_t T : {17, 129}) out.push_back({2, T, 3, D, causal, 0.0});
  return out;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int64_t D : {32, 64, 96, 128})
    for (bool causal : {false, true})
      for (int64_t T : {1, 17, 127, 128, 129, 1000}) {
        // Small T: several batches and heads (indexing); large T: one batch, two heads (CPU time).
        if (T <= 129)
          out.push_back({2, T, 3, D, causal, 0.0});
        else
          out.push_back({1, T, 2, D, causal, 0.0});
      }
  // T = 4096, the longest test length, at both fast-path head dims and both masks: many
  // key tiles (the online rescale over a long row), every output poisoned first, the backward
  // bitwise repeated.
  for (int64_t D : {64, 128})
    for (bool causal : {false, true}) out.push_back({1, 4096, 1, D, causal, 0.0});
  // d 64's long-T dK/dV shape on sm_90a (three consumers, 192-key blocks, from T = 2048:
  // dkdv_d64_long_causal), causal, with a ragged last key block and query tile (4200 = 21 · 192 +
  // 168 = 65 · 64 + 40).
  out.push_back({1, 4200, 1, 64, true, 0.0});
  out.push_back({1, 2048, 1, 128, true, 0.0});
  // The atomic dQ kernels over longer items with a ragged end: d 128 causal, and d 64 non-causal
  // from 4096, where kAtomic takes it (sm90a_runs_atomic_dq; its dQ products by turns: 65 query
  // tiles per key block, the last of 34 rows, so the consumer that forms an item's first dQ tile
  // alternates from item to item).
  out.push_back({1, 2200, 1, 128, true, 0.0});
  out.push_back({1, 4130, 1, 64, false, 0.0});
  out.push_back({1, 300, 2, 64, true, 1.0});    // scale 1: peaked rows, large running-max jumps
  out.push_back({1, 300, 2, 128, false, 1.0});
  // More work items than an H200 has SMs (192 and 288 query tiles × heads × batches for 132):
  // the sm_90a forward's persistent grid gives each block several, in turn.
  out.push_back({8, 300, 12, 64, true, 0.0});
  out.push_back({8, 300, 12, 128, false, 0.0});
  out.push_back({1, 4096, 1, 32, true, 0.0});  // head dim 32: many key tiles, causal
  return out;
}

// Each case with each kernel family that has a kernel for its head dim (wgmma: 64, 96 and 128).
std::vector<KernelCase> with_families(const std::vector<Case>& shapes) {
  std::vector<KernelCase> out;
  for (const Case& c : shapes)
    for (FlashKernels k : {FlashKernels::kMmaSync, FlashKernels::kWgmma})
      if (k != FlashKernels::kWgmma || c.D != 32) out.emplace_back(c, k, "");
  return out;
}

// Each variant of the development registry (flash_attention_variants) on the wgmma kernels, at a
// case where it applies: its head dim, each mask it takes, a ragged T in its range. A test filter
// selects one (e.g. --gtest_filter='Variants/*fwd_d128_noncausal_128keys*'), so that an A/B of two
// variants (tools/attention_ab.sh) tests each from the same binary.
std::vector<KernelCase> variant_cases() {
  std::vector<KernelCase> out;
  for (const tg::cuda::FlashVariant& v : tg::cuda::flash_attention_variants())
    for (bool causal : {false, true}) {
      if ((v.mask == 1 && !causal) || (v.mask == 2 && causal)) continue;
      const int64_t T = std::min(std::max<int64_t>(v.min_t + 67, 1067), v.max_t);
      out.emplace_back(Case{1, T, 2, v.head_dim, causal, 0.0}, FlashKernels::kWgmma, v.name);
    }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s = "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" + std::to_string(c.H) + "_D" +
                  std::to_string(c.D) + (c.causal ? "_causal" : "_full");
  if (c.scale != 0) s += "_scale1";
  return s;
}

std::string kernel_case_name(const ::testing::TestParamInfo<KernelCase>& info) {
  const auto& [c, kernels, variant] = info.param;
  return case_name(::testing::TestParamInfo<Case>(c, info.index)) +
         (kernels == FlashKernels::kWgmma ? "_wgmma" : "_mma_sync") + (variant.empty() ? "" : "_" + variant);
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashAttentionTest, ::testing::ValuesIn(with_families(cases())), kernel_case_name);
INSTANTIATE_TEST_SUITE_P(Variants, FlashAttentionTest, ::testing::ValuesIn(variant_cases()), kernel_case_name);

INSTANTIATE_TEST_SUITE_P(Packed, FlashAttentionPackedTest, ::testing::ValuesIn(with_families(packed_cases())),
                         kernel_case_name);

// A problem's inputs uploaded, its outputs allocated (not poisoned), and params pointing at them:
// contiguous layout, default kernels and dQ mode, the workspace that mode needs.
struct DeviceProblem {
  DeviceBuffer<tg::bf16> q, k, v, dout, o, dq, dk, dv;
  DeviceBuffer<float> lse;
  DeviceBuffer<unsigned char> ws;
  tg::cuda::FlashAttentionParams p{};
  DeviceProblem(const Case& c, const Problem& pr)
      : q(pr.n), k(pr.n), v(pr.n), dout(pr.n), o(pr.n), dq(pr.n), dk(pr.n), dv(pr.n), lse(pr.n_lse),
        ws(tg::cuda::flash_attention_backward_workspace_bytes(c.B, c.T, c.H, c.D)) {
    q.upload(pr.q.bits), k.upload(pr.k.bits), v.upload(pr.v.bits), dout.upload(pr.dout.bits);
    p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.o = o.ptr, p.lse = lse.ptr;
    p.dout = dout.ptr, p.dq = dq.ptr, p.dk = dk.ptr, p.dv = dv.ptr, p.workspace = ws.ptr;
    p.B = c.B, p.T = c.T, p.H = c.H, p.D = c.D, p.scale = float(pr.scale), p.causal = c.causal;
  }
  // Forward and backward with `kernels`: O, dQ, dK, dV.
  std::vector<std::vector<tg::bf16>> run(FlashKernels kernels) {
    p.kernels = kernels;
    tg::cuda::flash_attention_forward(p, nullptr);
    tg::cuda::flash_attention_backward(p, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    return {o.download(), dq.download(), dk.download(), dv.download()};
  }
  // kAuto gives the same O, dQ, dK, dV bits as `family` asked for by name.
  void expect_auto_runs(FlashKernels family) {
    const auto by_name = run(family);
    const auto automatic = run(FlashKernels::kAuto);
    for (int t = 0; t < 4; ++t) EXPECT_EQ(std::memcmp(by_name[t].data(), automatic[t].data(), q.n * 2), 0) << t;
  }
};

// kAuto is the device's fastest family: on 9.0 the wgmma kernels, elsewhere mma.sync — the same
// bits as asking for that family by name, forward and backward; at head dim 96 too (on 9.0 the
// d 128 wgmma kernels, zero-padded).
TEST(FlashAttention, AutoPicksTheDevicesFamily) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  for (int64_t D : {64, 96}) {
    const Case c{2, 200, 2, D, true, 0.0};
    DeviceProblem d(c, make_problem(c));
    tg::cuda::FlashAttentionParams& p = d.p;
    d.expect_auto_runs(device_is_sm90() ? FlashKernels::kWgmma : FlashKernels::kMmaSync);
    if (!device_is_sm90()) {
      p.kernels = FlashKernels::kWgmma;
      EXPECT_THROW(tg::cuda::flash_attention_forward(p, nullptr), std::invalid_argument) << D;
    }
  }
}

// Head dim 32 has mma.sync kernels alone: kAuto runs them on every GPU (the same bits as asking
// for them by name), and asking for kWgmma is refused rather than run on a kernel built for
// another head dim.
class FlashAttentionMmaSyncOnly : public ::testing::TestWithParam<int64_t> {};

TEST_P(FlashAttentionMmaSyncOnly, AutoRunsTheMmaSyncKernels) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const Case c{2, 200, 2, GetParam(), true, 0.0};
  DeviceProblem d(c, make_problem(c));
  tg::cuda::FlashAttentionParams& p = d.p;
  d.expect_auto_runs(FlashKernels::kMmaSync);
  p.kernels = FlashKernels::kWgmma;
  EXPECT_THROW(tg::cuda::flash_attention_forward(p, nullptr), std::invalid_argument);
  EXPECT_THROW(tg::cuda::flash_attention_backward(p, nullptr), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, FlashAttentionMmaSyncOnly, ::testing::Values<int64_t>(32),
                         [](const ::testing::TestParamInfo<int64_t>& info) { return "D" + std::to_string(info.param); });

// The wgmma forward takes the row max of unscaled scores, valid for scale > 0 only: any other
// scale runs the mma.sync forward under kAuto (then the backward of the device's family) and
// still meets the reference; asking for kWgmma is refused.
TEST(FlashAttention, NonPositiveScaleMatchesReference) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const Case c{2, 150, 2, 64, true, -0.125};
  const Problem pr = make_problem(c);
  DeviceProblem d(c, pr);
  tg::cuda::FlashAttentionParams& p = d.p;
  d.o.poison(), d.lse.poison(), d.dq.poison(), d.dk.poison(), d.dv.poison();
  tg::cuda::flash_attention_forward(p, nullptr);
  tg::cuda::flash_attention_backward(p, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  const std::vector<double> got_o = to_double(d.o.download()), got_lse = to_double(d.lse.download());
  ASSERT_EQ(count_nonfinite(got_o), 0u);
  EXPECT_LE(rel_error(got_o, pr.ref.o), 2e-2) << "O";
  EXPECT_LE(max_abs_diff(got_lse, pr.ref.lse), 1e-3) << "lse";
  const std::vector<double> g[3] = {to_double(d.dq.download()), to_double(d.dk.download()), to_double(d.dv.download())};
  const std::vector<double>* want[3] = {&pr.ref.dq, &pr.ref.dk, &pr.ref.dv};
  for (int t = 0; t < 3; ++t) {
    ASSERT_EQ(count_nonfinite(g[t]), 0u) << t;
    EXPECT_LE(rel_error(g[t], *want[t]), 5e-2) << t;
  }
  if (device_is_sm90()) {
    p.kernels = FlashKernels::kWgmma;
    EXPECT_THROW(tg::cuda::flash_attention_forward(p, nullptr), std::invalid_argument);
  }
}

// The persistent kernels' causal order in groups of heads (sm90::item_tile: groups of 8 waves of
// the grid) on the GPU: with 128 heads at T 2048 every pass runs more than one group, and each
// head's O, lse, dQ, dK, dV are the bits of that head run alone (B = H = 1, read and written in
// place through the row strides) — the order decides which block takes which item, never the
// numbers; an item run twice or never would show (the outputs are poisoned first). Also with the
// atomic dK/dV kernel (kAtomicKernel; grouped at d 64, one group at d 128), whose dK and dV are
// deterministic too and whose dQ, added in a run-dependent order, agrees to its rounding.
TEST(FlashAttention, CausalHeadGroupsGiveEachHeadItsOwnBits) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  for (const tg::cuda::FlashDq mode : {tg::cuda::FlashDq::kRecompute, tg::cuda::FlashDq::kAtomicKernel})
  for (int64_t D : {64, 128}) {
    SCOPED_TRACE(mode == tg::cuda::FlashDq::kRecompute ? "deterministic dQ" : "atomic dQ kernel");
    const int64_t T = 2048, H = 2048 / D, B = 128 / H, hd = H * D;
    const size_t n = size_t(B * T * hd);
    DeviceBuffer<tg::bf16> q(n), k(n), v(n), dout(n), o(n), dq(n), dk(n), dv(n);
    DeviceBuffer<float> lse(size_t(B * H * T));
    DeviceBuffer<unsigned char> ws(tg::cuda::flash_attention_backward_workspace_bytes(B, T, H, D, mode));
    q.upload(random_input(n, 2.0, 11).bits), k.upload(random_input(n, 2.0, 12).bits);
    v.upload(random_input(n, 1.0, 13).bits), dout.upload(random_input(n, 1.0, 14).bits);
    o.poison(), lse.poison(), dq.poison(), dk.poison(), dv.poison();
    tg::cuda::FlashAttentionParams p{};
    p.q = q.ptr, p.k = k.ptr, p.v = v.ptr, p.o = o.ptr, p.lse = lse.ptr;
    p.dout = dout.ptr, p.dq = dq.ptr, p.dk = dk.ptr, p.dv = dv.ptr, p.workspace = ws.ptr;
    p.B = B, p.T = T, p.H = H, p.D = D, p.scale = float(1.0 / std::sqrt(double(D))), p.causal = true;
    p.dq_mode = mode;
    tg::cuda::flash_attention_forward(p, nullptr);
    tg::cuda::flash_attention_backward(p, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    const std::vector<tg::bf16> all[4] = {o.download(), dq.download(), dk.download(), dv.download()};
    const std::vector<float> all_lse = lse.download();
    for (const auto [b, h] : {std::pair<int64_t, int64_t>{0, 0}, {B / 2, H / 3}, {B - 1, H - 1}}) {
      tg::cuda::FlashAttentionParams one = p;
      const int64_t at = b * T * hd + h * D;  // the head's first element in every (B, T, H·D) tensor
      one.q = q.ptr + at, one.k = k.ptr + at, one.v = v.ptr + at, one.dout = dout.ptr + at;
      one.o = o.ptr + at, one.dq = dq.ptr + at, one.dk = dk.ptr + at, one.dv = dv.ptr + at;
      one.lse = lse.ptr + (b * H + h) * T;
      one.q_row_stride = one.k_row_stride = one.v_row_stride = one.o_row_stride = one.do_row_stride = hd;
      one.dq_row_stride = one.dk_row_stride = one.dv_row_stride = hd;
      one.B = 1, one.H = 1;
      tg::cuda::flash_attention_forward(one, nullptr);
      tg::cuda::flash_attention_backward(one, nullptr);
      CHECK_CUDA(cudaDeviceSynchronize());
      const std::vector<tg::bf16> again[4] = {o.download(), dq.download(), dk.download(), dv.download()};
      const char* names[4] = {"O", "dQ", "dK", "dV"};
      for (int t = 0; t < 4; ++t) {
        EXPECT_EQ(count_nonfinite(to_double(all[t])), 0u) << names[t] << " D " << D;
        if (t == 1 && mode != tg::cuda::FlashDq::kRecompute) {
          // Sums of the same terms in another order: within a few bf16 roundings of each other.
          EXPECT_LE(rel_error(to_double(again[t]), to_double(all[t])), 1e-2)
              << names[t] << " of head " << h << ", batch " << b << " alone differs, D " << D;
          continue;
        }
        EXPECT_EQ(std::memcmp(all[t].data(), again[t].data(), n * sizeof(tg::bf16)), 0)
            << names[t] << " of head " << h << ", batch " << b << " alone differs, D " << D;
      }
      EXPECT_EQ(std::memcmp(all_lse.data(), lse.download().data(), all_lse.size() * sizeof(float)), 0)
          << "lse of head " << h << ", batch " << b << " alone differs, D " << D;
    }
  }
}

// A row stride must be 0 (contiguous) or ≥ H·D and a multiple of 8 elements (16-byte rows).
TEST(FlashAttention, InvalidRowStrideIsRejected) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const int64_t B = 1, T = 8, H = 2, D = 64, hd = H * D;
  DeviceBuffer<tg::bf16> x(size_t(B * T * 3 * hd));
  DeviceBuffer<float> lse(size_t(B * H * T));
  DeviceBuffer<unsigned char> ws(
      tg::cuda::flash_attention_backward_workspace_bytes(B, T, H, D, tg::cuda::FlashDq::kAtomic));
  tg::cuda::FlashAttentionParams p{};
  p.q = p.k = p.v = p.dout = x.ptr;
  p.o = p.dq = p.dk = p.dv = x.ptr;
  p.lse = lse.ptr, p.workspace = ws.ptr;
  p.B = B, p.T = T, p.H = H, p.D = D, p.scale = 0.125f;
  for (int64_t bad : {hd - 8, hd + 4, int64_t(-8)}) {
    for (int which = 0; which < 8; ++which) {
      tg::cuda::FlashAttentionParams pb = p;
      int64_t* strides[8] = {&pb.q_row_stride,  &pb.k_row_stride,  &pb.v_row_stride,  &pb.o_row_stride,
                             &pb.do_row_stride, &pb.dq_row_stride, &pb.dk_row_stride, &pb.dv_row_stride};
      *strides[which] = bad;
      if (which < 4) EXPECT_THROW(tg::cuda::flash_attention_forward(pb, nullptr), std::invalid_argument) << which;
      EXPECT_THROW(tg::cuda::flash_attention_backward(pb, nullptr), std::invalid_argument) << which << " " << bad;
    }
  }
  // Misaligned pointer into a packed buffer (offset 4 elements = 8 bytes).
  tg::cuda::FlashAttentionParams pm = p;
  pm.k = x.ptr + 4;
  pm.k_row_stride = 3 * hd;
  EXPECT_THROW(tg::cuda::flash_attention_forward(pm, nullptr), std::invalid_argument);
}

TEST(FlashAttention, UnsupportedHeadDimIsRejected) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  EXPECT_TRUE(tg::cuda::flash_attention_supported(32));
  EXPECT_TRUE(tg::cuda::flash_attention_supported(64));
  EXPECT_TRUE(tg::cuda::flash_attention_supported(96));
  EXPECT_TRUE(tg::cuda::flash_attention_supported(128));
  EXPECT_FALSE(tg::cuda::flash_attention_supported(80));
  tg::cuda::FlashAttentionParams p{};
  p.B = 1, p.T = 8, p.H = 1, p.D = 80, p.scale = 1.0f;
  EXPECT_THROW(tg::cuda::flash_attention_forward(p, nullptr), std::invalid_argument);
  EXPECT_THROW(tg::cuda::flash_attention_backward(p, nullptr), std::invalid_argument);
}

// ─── Structured masks (window, documents) ───

// A mask: a sliding window (0: none) and documents whose lengths cycle through `lengths` (none if
// empty), the pattern rotated by the batch row so that the rows differ.
struct MaskSpec {
  const char* name;
  int64_t window;
  std::vector<int> lengths;
  // FlashAttentionParams::longest_document given, as the ops give it: the backward then chooses
  // its shapes by the documents' length rather than by T.
  bool longest_document = false;
};
void PrintTo(const MaskSpec& m, std::ostream* os) { *os << m.name; }
std::vector<int32_t> doc_starts(const MaskSpec& m, int64_t B, int64_t T) {
  std::vector<int32_t> out;
  if (m.lengths.empty()) return out;
  out.resize(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    size_t next = size_t(b) % m.lengths.size();
    int64_t start = 0, end = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (t == end) start = t, end = t + m.lengths[next], next = (next + 1) % m.lengths.size();
      out[size_t(b * T + t)] = int32_t(start);
    }
  }
  return out;
}

// Masked forward and backward on the device, outputs poisoned before every run.
struct MaskedRun {
  DeviceProblem d;
  DeviceBuffer<int32_t> doc;
  DeviceBuffer<unsigned char> ws_atomic;
  MaskedRun(const Case& c, const Problem& pr, const std::vector<int32_t>& starts, int64_t window,
            bool longest_document = false)
      : d(c, pr), doc(std::max<size_t>(starts.size(), 1)),
        ws_atomic(tg::cuda::flash_attention_backward_workspace_bytes(c.B, c.T, c.H, c.D, tg::cuda::FlashDq::kAtomic)) {
    if (!starts.empty()) doc.upload(starts);
    d.p.doc_start = starts.empty() ? nullptr : doc.ptr;
    if (longest_document && !starts.empty()) d.p.longest_document = tg::cpu::longest_document(starts.data(), c.B, c.T);
    d.p.window = window;
    d.p.workspace = ws_atomic.ptr;
  }
  struct Out {
    std::vector<tg::bf16> o, dq, dk, dv;
    std::vector<float> lse;
  };
  Out run(FlashKernels kernels, tg::cuda::FlashDq mode) {
    d.p.kernels = kernels;
    d.p.dq_mode = mode;
    d.o.poison(), d.lse.poison(), d.dq.poison(), d.dk.poison(), d.dv.poison(), ws_atomic.poison();
    tg::cuda::flash_attention_forward(d.p, nullptr);
    tg::cuda::flash_attention_backward(d.p, nullptr);
    CHECK_CUDA(cudaDeviceSynchronize());
    return {d.o.download(), d.dq.download(), d.dk.download(), d.dv.download(), d.lse.download()};
  }
};

using MaskCase = std::tuple<int64_t /*T*/, int64_t /*D*/, FlashKernels, MaskSpec>;
class FlashAttentionMaskTest : public ::testing::TestWithParam<MaskCase> {};

// O, lse, dQ, dK, dV of the masked kernels against the masked double reference, both dQ modes
// (the atomic one asked for as kAtomicKernel: it runs at every shape); the default backward
// bitwise reproducible; dK, dV the same bits in both modes.
TEST_P(FlashAttentionMaskTest, MatchesDoubleReference) {
  const auto& [T, D, kernels, mask] = GetParam();
  if (const std::string why = skip_reason(kernels); !why.empty()) GTEST_SKIP() << why;
  const int64_t B = T >= 4096 ? 1 : 2, H = 2;
  const Case c{B, T, H, D, true, 0.0};
  const Problem pr = make_problem(c);
  const std::vector<int32_t> starts = doc_starts(mask, B, T);
  const Reference ref =
      reference(c, pr.scale, pr.q.val, pr.k.val, pr.v.val, pr.dout.val, starts.empty() ? nullptr : starts.data(), mask.window);
  MaskedRun r(c, pr, starts, mask.window, mask.longest_document);
  const auto det = r.run(kernels, tg::cuda::FlashDq::kRecompute);
  const std::vector<double> o = to_double(det.o), lse = to_double(det.lse);
  ASSERT_EQ(count_nonfinite(o), 0u) << "O has NaN/inf (unwritten elements?)";
  ASSERT_EQ(count_nonfinite(lse), 0u) << "lse has NaN/inf";
  EXPECT_LE(rel_error(o, ref.o), 2e-2) << "O";
  EXPECT_LE(max_abs_diff(lse, ref.lse), 1e-3) << "lse";
  const char* names[3] = {"dQ", "dK", "dV"};
  const std::vector<tg::bf16>* got[3] = {&det.dq, &det.dk, &det.dv};
  const std::vector<double>* refs[3] = {&ref.dq, &ref.dk, &ref.dv};
  for (int t = 0; t < 3; ++t) {
    const std::vector<double> g = to_double(*got[t]);
    ASSERT_EQ(count_nonfinite(g), 0u) << names[t] << " has NaN/inf (unwritten elements?)";
    EXPECT_LE(rel_error(g, *refs[t]), 5e-2) << names[t];
  }
  const auto again = r.run(kernels, tg::cuda::FlashDq::kRecompute);
  const std::vector<tg::bf16>* got2[3] = {&again.dq, &again.dk, &again.dv};
  for (int t = 0; t < 3; ++t)
    EXPECT_EQ(std::memcmp(got[t]->data(), got2[t]->data(), pr.n * sizeof(tg::bf16)), 0) << names[t] << " not reproducible";
  const auto atomic = r.run(kernels, tg::cuda::FlashDq::kAtomicKernel);
  const std::vector<double> gq = to_double(atomic.dq);
  ASSERT_EQ(count_nonfinite(gq), 0u) << "dQ (kAtomic) has NaN/inf";
  EXPECT_LE(rel_error(gq, ref.dq), 5e-2) << "dQ (kAtomic)";
  EXPECT_EQ(std::memcmp(atomic.dk.data(), det.dk.data(), pr.n * sizeof(tg::bf16)), 0) << "dK (kAtomic)";
  EXPECT_EQ(std::memcmp(atomic.dv.data(), det.dv.data(), pr.n * sizeof(tg::bf16)), 0) << "dV (kAtomic)";
}

// Windows inside a fragment, past a tile and past most of the sequence; documents of length 1
// beside ones spanning tiles; both masks at once.
std::vector<MaskCase> mask_cases() {
  const std::vector<MaskSpec> masks = {
      {"window7", 7, {}},
      {"window300", 300, {}},
      {"docs", 0, {1, 1, 3, 70, 1, 150, 2, 400, 1, 1000, 29}},
      {"docs_window100", 100, {90, 1, 7, 700, 1, 1, 33}},
  };
  std::vector<MaskCase> out;
  for (int64_t T : {1, 17, 129, 1000, 4096})
    for (int64_t D : {64, 128})
      for (FlashKernels k : {FlashKernels::kMmaSync, FlashKernels::kWgmma})
        for (const MaskSpec& m : masks) out.emplace_back(T, D, k, m);
  // Documents of at most 1,000 tokens at T = 4096 with their longest given: d 64's backward runs
  // its short-T shapes there (flash_bwd_sm90a.cu, bwd_shape_t).
  for (int64_t D : {64, 128})
    out.emplace_back(4096, D, FlashKernels::kWgmma, MaskSpec{"docs_longest_given", 0, masks[2].lengths, true});
  // The other head dims (mma.sync everywhere; 96 on the d 128 wgmma kernels).
  out.emplace_back(1000, 32, FlashKernels::kMmaSync, masks[3]);
  out.emplace_back(1000, 96, FlashKernels::kMmaSync, masks[3]);
  out.emplace_back(1000, 96, FlashKernels::kWgmma, masks[3]);
  return out;
}
std::string mask_case_name(const ::testing::TestParamInfo<MaskCase>& info) {
  const auto& [T, D, kernels, mask] = info.param;
  return "T" + std::to_string(T) + "_D" + std::to_string(D) + (kernels == FlashKernels::kWgmma ? "_wgmma_" : "_mma_sync_") +
         mask.name;
}
INSTANTIATE_TEST_SUITE_P(Masks, FlashAttentionMaskTest, ::testing::ValuesIn(mask_cases()), mask_case_name);

// A mask that excludes nothing — one document over the whole sequence (doc_start all 0), or a
// window ≥ T — gives the unmasked causal outputs bit for bit, in both dQ modes.
// Once per shape and kernel family (MaskCase's spec only names it: the masks are the test's own).
class FlashAttentionNoOpMaskTest : public ::testing::TestWithParam<MaskCase> {};
TEST_P(FlashAttentionNoOpMaskTest, WholeSequenceDocumentIsCausalBitForBit) {
  const auto& [T, D, kernels, name] = GetParam();
  if (const std::string why = skip_reason(kernels); !why.empty()) GTEST_SKIP() << why;
  const Case c{2, T, 2, D, true, 0.0};
  const Problem pr = make_problem(c);
  MaskedRun causal(c, pr, {}, 0), whole(c, pr, std::vector<int32_t>(size_t(2 * T), 0), 0), wide(c, pr, {}, T);
  for (tg::cuda::FlashDq mode : {tg::cuda::FlashDq::kRecompute, tg::cuda::FlashDq::kAtomicKernel}) {
    const auto base = causal.run(kernels, mode);
    for (MaskedRun* m : {&whole, &wide}) {
      const auto got = m->run(kernels, mode);
      EXPECT_EQ(std::memcmp(got.o.data(), base.o.data(), pr.n * 2), 0) << "O";
      EXPECT_EQ(std::memcmp(got.lse.data(), base.lse.data(), pr.n_lse * 4), 0) << "lse";
      if (mode == tg::cuda::FlashDq::kRecompute) EXPECT_EQ(std::memcmp(got.dq.data(), base.dq.data(), pr.n * 2), 0) << "dQ";
      EXPECT_EQ(std::memcmp(got.dk.data(), base.dk.data(), pr.n * 2), 0) << "dK";
      EXPECT_EQ(std::memcmp(got.dv.data(), base.dv.data(), pr.n * 2), 0) << "dV";
    }
  }
}

std::vector<MaskCase> no_op_mask_cases() {
  std::vector<MaskCase> out;
  for (int64_t T : {1, 17, 129, 1000, 4096})
    for (int64_t D : {64, 128})
      for (FlashKernels k : {FlashKernels::kMmaSync, FlashKernels::kWgmma})
        out.emplace_back(T, D, k, MaskSpec{"whole_document", 0, {}});
  return out;
}
INSTANTIATE_TEST_SUITE_P(Masks, FlashAttentionNoOpMaskTest, ::testing::ValuesIn(no_op_mask_cases()), mask_case_name);

TEST(FlashAttention, MaskWithoutCausalIsRejected) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  tg::cuda::FlashAttentionParams p{};
  p.B = 1, p.T = 8, p.H = 1, p.D = 64, p.scale = 1.0f, p.window = 4;
  EXPECT_THROW(tg::cuda::flash_attention_forward(p, nullptr), std::invalid_argument);
  EXPECT_THROW(tg::cuda::flash_attention_backward(p, nullptr), std::invalid_argument);
  p.causal = true, p.window = -1;
  EXPECT_THROW(tg::cuda::flash_attention_forward(p, nullptr), std::invalid_argument);
}

}  // namespace

#else

TEST(FlashAttention, SkippedWithoutCuda) { GTEST_SKIP() << "built without CUDA"; }

#endif
