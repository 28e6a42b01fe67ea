// Parity of cuda::gemm (cuBLASLt) with a double-precision CPU reference: transposes, batches, strides, epilogues, fp32/bf16, determinism;
// and of cuda::gemm_dgelu (the DGELU epilogues).
#include <gtest/gtest.h>

#include "tests/cuda/cuda_test_util.h"

#ifdef TILEGRAD_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/gemm.h"
#include "src/tensor/dtype.h"
#include "src/util/error.h"

using tg::testing::have_gpu;

namespace {

using tg::cuda::Epilogue;



template <typename T> float to_float(T x);
template <> float to_float(float x) { return x; }
template <> float to_float(tg::bf16 x) { return tg::bf16_to_float(x); }
template <typename T> T from_float(float x);
template <> float from_float(float x) { return x; }
template <> tg::bf16 from_float(float x) { return tg::float_to_bf16(x); }

// Deterministic inputs in [-1, 1) (splitmix64), so a failure reproduces exactly.
struct Rng {
  uint64_t s;
  float next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return float(double(z >> 11) / double(1ull << 53) * 2.0 - 1.0);
  }
};

template <typename T>
struct DeviceBuffer {
  T* p = nullptr;
  explicit DeviceBuffer(size_t n) { CHECK_CUDA(cudaMalloc(&p, (n ? n : 1) * sizeof(T))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

// One GEMM to check. Zero leading dimensions / strides mean "derive": row length + pad, and for
// batches a gap of 3·pad + 5 elements between matrices so strides are not the packed size.
// `offset` shifts A, B, C and bias by that many elements from their (256-byte aligned)
// allocations, to exercise misaligned pointers; `bias_offset` shifts only the bias.
struct Case {
  bool ta = false, tb = false;
  int64_t M = 1, N = 1, K = 1, batch = 1;
  float alpha = 1.f, beta = 0.f;
  Epilogue epi = Epilogue::none;
  int64_t pad = 0, lda = 0, ldb = 0, ldc = 0, sa = 0, sb = 0, sc = 0;
  int64_t offset = 0, bias_offset = 0;

  std::string str() const {
    static const char* epis[] = {"none", "bias", "gelu_bias"};
    std::ostringstream os;
    os << (ta ? "T" : "N") << (tb ? "T" : "N") << " M=" << M << " N=" << N << " K=" << K << " batch=" << batch
       << " alpha=" << alpha << " beta=" << beta << " epilogue=" << epis[int(epi)] << " lda=" << lda << " ldb=" << ldb
       << " ldc=" << ldc << " strides=" << sa << "/" << sb << "/" << sc << " offset=" << offset
       << " bias_offset=" << bias_offset;
    return os.str();
  }
};

// Fills in the derived leading dimensions and strides; returns the elements each buffer needs.
struct Sizes {
  size_t a, b, c;
};
Sizes resolve(Case& c) {
  const int64_t ra = c.ta ? c.K : c.M, ca = c.ta ? c.M : c.K;  // stored A (rows, cols)
  const int64_t rb = c.tb ? c.N : c.K, cb = c.tb ? c.K : c.N;  // stored B
  if (!c.lda) c.lda = std::max<int64_t>(1, ca + c.pad);  // cuBLAS wants ld ≥ 1 even for K = 0
  if (!c.ldb) c.ldb = std::max<int64_t>(1, cb + c.pad);
  if (!c.ldc) c.ldc = c.N + c.pad;
  const int64_t gap = 3 * c.pad + 5;
  if (c.batch > 1) {
    if (!c.sa) c.sa = ra * c.lda + gap;
    if (!c.sb) c.sb = rb * c.ldb + gap;
    if (!c.sc) c.sc = c.M * c.ldc + gap;
  }
  auto span = [&](int64_t rows, int64_t ld, int64_t stride) {
    return size_t((c.batch - 1) * stride + rows * ld + c.offset);
  };
  return {span(ra, c.lda, c.sa), span(rb, c.ldb, c.sb), span(c.M, c.ldc, c.sc)};
}

double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

double rel_norm_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::sqrt(den > 0 ? den : 1.0);
}

// Runs one case twice on the GPU and checks: the result against the double reference (inputs are
// the exact T values the GPU sees), that elements of C outside the product are left untouched,
// and that the two runs agree bit for bit. For beta == 0, C starts as NaN bytes.
template <typename T>
void run_case(Case c, uint64_t seed) {
  SCOPED_TRACE(std::string(std::is_same_v<T, float> ? "f32 " : "bf16 ") + c.str());
  const Sizes n = resolve(c);
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-2;

  Rng rng{seed};
  auto fill = [&](size_t count) {
    std::vector<T> v(count);
    for (auto& x : v) x = from_float<T>(rng.next());
    return v;
  };
  std::vector<T> a = fill(n.a), b = fill(n.b), bias = fill(size_t(c.N + c.bias_offset + c.offset));
  std::vector<T> c0 = fill(n.c);
  if (c.beta == 0.f) std::memset(static_cast<void*>(c0.data()), 0xff, c0.size() * sizeof(T));  // all-ones bytes: NaN in f32 and bf16

  // Reference, and which elements of C belong to the product.
  std::vector<double> want(n.c);
  std::vector<char> in_c(n.c, 0);
  std::vector<double> opa(size_t(c.M * c.K)), opb(size_t(c.K * c.N)), acc(size_t(c.N));
  const T* bias_h = bias.data() + c.offset + c.bias_offset;
  for (int64_t bi = 0; bi < c.batch; ++bi) {
    const T* A = a.data() + c.offset + bi * c.sa;
    const T* B = b.data() + c.offset + bi * c.sb;
    const int64_t c_base = c.offset + bi * c.sc;
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t k = 0; k < c.K; ++k) opa[size_t(i * c.K + k)] = to_float(c.ta ? A[k * c.lda + i] : A[i * c.lda + k]);
    for (int64_t k = 0; k < c.K; ++k)
      for (int64_t j = 0; j < c.N; ++j) opb[size_t(k * c.N + j)] = to_float(c.tb ? B[j * c.ldb + k] : B[k * c.ldb + j]);
    for (int64_t i = 0; i < c.M; ++i) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = 0; k < c.K; ++k) {
        const double x = opa[size_t(i * c.K + k)];
        const double* row = &opb[size_t(k * c.N)];
        for (int64_t j = 0; j < c.N; ++j) acc[size_t(j)] += x * row[j];
      }
      for (int64_t j = 0; j < c.N; ++j) {
        const size_t idx = size_t(c_base + i * c.ldc + j);
        ASSERT_FALSE(in_c[idx]) << "test layout error: C matrices overlap";
        double v = double(c.alpha) * acc[size_t(j)];
        if (c.beta != 0.f) v += double(c.beta) * to_float(c0[idx]);
        if (c.epi != Epilogue::none) v += to_float(bias_h[j]);
        if (c.epi == Epilogue::gelu_bias) v = gelu_tanh(v);
        want[idx] = v;
        in_c[idx] = 1;
      }
    }
  }

  DeviceBuffer<T> da(n.a), db(n.b), dc(n.c), dbias(bias.size());
  CHECK_CUDA(cudaMemcpy(da.p, a.data(), n.a * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(db.p, b.data(), n.b * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dbias.p, bias.data(), bias.size() * sizeof(T), cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  auto run = [&] {
    CHECK_CUDA(cudaMemcpy(dc.p, c0.data(), n.c * sizeof(T), cudaMemcpyHostToDevice));
    tg::cuda::gemm<T>(c.ta, c.tb, c.M, c.N, c.K, c.alpha, da.p + c.offset, c.lda, db.p + c.offset, c.ldb, c.beta,
                      dc.p + c.offset, c.ldc, c.batch, c.sa, c.sb, c.sc, c.epi,
                      c.epi == Epilogue::none ? nullptr : dbias.p + c.offset + c.bias_offset, stream);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    std::vector<T> out(n.c);
    CHECK_CUDA(cudaMemcpy(out.data(), dc.p, n.c * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  };
  const std::vector<T> first = run(), second = run();
  CHECK_CUDA(cudaStreamDestroy(stream));

  EXPECT_EQ(std::memcmp(first.data(), second.data(), n.c * sizeof(T)), 0) << "two runs differ bitwise";
  std::vector<double> got, ref;
  size_t touched_outside = 0;
  for (size_t i = 0; i < n.c; ++i) {
    if (in_c[i]) {
      got.push_back(to_float(first[i]));
      ref.push_back(want[i]);
    } else if (std::memcmp(&first[i], &c0[i], sizeof(T)) != 0) {
      ++touched_outside;
    }
  }
  EXPECT_EQ(touched_outside, 0u) << "elements of C outside the product were written";
  const double err = rel_norm_error(got, ref);
  EXPECT_LE(err, tol) << "relative-norm error " << err;  // NaN fails this too
}

const Epilogue kEpilogues[] = {Epilogue::none, Epilogue::bias, Epilogue::gelu_bias};

// Every transpose pair, plain and batched, beta 0 and 1, every epilogue, at sizes no tile divides.
template <typename T>
void odd_sizes() {
  uint64_t seed = 1;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t batch : {1, 3})
        for (float beta : {0.f, 1.f})
          for (Epilogue epi : kEpilogues) {
            Case c;
            c.ta = ta, c.tb = tb, c.M = 37, c.N = 51, c.K = 29, c.batch = batch, c.beta = beta, c.epi = epi;
            run_case<T>(c, seed++);
          }
}

// GPT-2 small's linear layers (x·Wᵀ forward, NN for dx, TN accumulating dW).
template <typename T>
void gpt2_sizes() {
  auto mk = [](bool ta, bool tb, int64_t M, int64_t N, int64_t K, float beta, Epilogue epi) {
    Case c;
    c.ta = ta, c.tb = tb, c.M = M, c.N = N, c.K = K, c.beta = beta, c.epi = epi;
    return c;
  };
  run_case<T>(mk(false, true, 1024, 2304, 768, 0.f, Epilogue::bias), 101);       // qkv
  run_case<T>(mk(false, true, 1024, 2304, 768, 0.f, Epilogue::gelu_bias), 102);  // fc-like, fused GELU
  run_case<T>(mk(false, true, 1024, 768, 3072, 0.f, Epilogue::bias), 103);       // mlp proj
  run_case<T>(mk(false, false, 1024, 768, 3072, 0.f, Epilogue::none), 104);      // dx of mlp proj
  run_case<T>(mk(true, false, 2304, 768, 1024, 1.f, Epilogue::none), 105);       // dW of qkv, accumulated
}

// Attention-shaped batches over heads interleaved in (T, H·D) rows: ld = H·D, head stride D.
template <typename T>
void attention_batches() {
  const int64_t Tn = 128, H = 12, D = 64;
  Case qk;  // S (H, T, T) = Q·Kᵀ / √D
  qk.tb = true, qk.M = Tn, qk.N = Tn, qk.K = D, qk.batch = H, qk.alpha = 0.125f;
  qk.lda = H * D, qk.ldb = H * D, qk.sa = D, qk.sb = D, qk.ldc = Tn, qk.sc = Tn * Tn;
  run_case<T>(qk, 201);
  Case pv;  // O (T, H·D) = P·V per head, written interleaved
  pv.M = Tn, pv.N = D, pv.K = Tn, pv.batch = H;
  pv.lda = Tn, pv.sa = Tn * Tn, pv.ldb = H * D, pv.sb = D, pv.ldc = H * D, pv.sc = D;
  run_case<T>(pv, 202);
  Case dq = pv;  // broadcast B over the batch (stride 0), beta = 1
  dq.sb = 0, dq.beta = 1.f;
  run_case<T>(dq, 203);
}

// Layouts and pointers that push cuBLASLt off its fast paths: padded leading dimensions,
// misaligned A/B/C, a misaligned bias (unfused epilogue kernel), alpha ≠ 1, beta ∉ {0, 1}, K = 0.
template <typename T>
void awkward_layouts() {
  uint64_t seed = 300;
  for (Epilogue epi : kEpilogues) {
    Case c;
    c.M = 64, c.N = 96, c.K = 80, c.pad = 7, c.epi = epi, c.alpha = 0.5f, c.beta = 0.25f, c.batch = 2;
    run_case<T>(c, seed++);
    c.pad = 0, c.offset = 1;
    run_case<T>(c, seed++);
    c.offset = 0, c.bias_offset = 1, c.tb = true;
    run_case<T>(c, seed++);
    c.bias_offset = 0, c.K = 0;
    run_case<T>(c, seed++);
    c.beta = 0.f;
    run_case<T>(c, seed++);
  }
}

TEST(CudaGemm, OddSizesF32) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  odd_sizes<float>();
}
TEST(CudaGemm, OddSizesBf16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  odd_sizes<tg::bf16>();
}
TEST(CudaGemm, Gpt2SizesF32) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  gpt2_sizes<float>();
}
TEST(CudaGemm, Gpt2SizesBf16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  gpt2_sizes<tg::bf16>();
}
TEST(CudaGemm, AttentionBatchesF32) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  attention_batches<float>();
}
TEST(CudaGemm, AttentionBatchesBf16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  attention_batches<tg::bf16>();
}
TEST(CudaGemm, AwkwardLayoutsF32) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  awkward_layouts<float>();
}
TEST(CudaGemm, AwkwardLayoutsBf16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  awkward_layouts<tg::bf16>();
}

// A caller's mistake is a tg::Error naming the bad value, before anything touches the GPU.
TEST(CudaGemm, RejectsBadArguments) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  float* p = nullptr;
  EXPECT_THROW(tg::cuda::gemm<float>(false, false, 4, 8, 2, 1.f, p, 2, p, 8, 0.f, p, 7, 1, 0, 0, 0, Epilogue::none,
                                     nullptr, nullptr),
               tg::Error);  // ldc < N
  EXPECT_THROW(tg::cuda::gemm<float>(true, false, 4, 8, 2, 1.f, p, 2, p, 8, 0.f, p, 8, 1, 0, 0, 0, Epilogue::none,
                                     nullptr, nullptr),
               tg::Error);  // lda < M for Aᵀ
  EXPECT_THROW(tg::cuda::gemm<float>(false, false, 4, 8, 2, 1.f, p, 2, p, 8, 0.f, p, 8, 1, 0, 0, 0, Epilogue::bias,
                                     nullptr, nullptr),
               tg::Error);  // bias epilogue without bias
}

// bf16 inputs into an fp32 C summed over calls (the chunked LM head's dW): C = Σ_k-chunks A_kᵀ·B_k
// in fp32, as close to the double-precision product as one fp32-accumulated GEMM is (far below
// bf16's rounding), and misaligned by an odd row count.
TEST(CudaGemm, AccumulatesBf16ProductsInFp32) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const int64_t M = 96, N = 40, K = 301, chunk = 97;  // C (M, N) = Aᵀ (M, K) · B (K, N), A stored (K, M)
  Rng rng{7};
  std::vector<tg::bf16> a(size_t(K * M)), b(size_t(K * N));
  for (auto& v : a) v = tg::float_to_bf16(rng.next());
  for (auto& v : b) v = tg::float_to_bf16(rng.next());
  std::vector<double> ref(size_t(M * N), 0.0);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        ref[size_t(i * N + j)] += double(tg::bf16_to_float(a[size_t(k * M + i)])) * tg::bf16_to_float(b[size_t(k * N + j)]);
  DeviceBuffer<tg::bf16> da(a.size()), db(b.size());
  DeviceBuffer<float> dc(ref.size());
  CHECK_CUDA(cudaMemcpy(da.p, a.data(), a.size() * sizeof(tg::bf16), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(db.p, b.data(), b.size() * sizeof(tg::bf16), cudaMemcpyHostToDevice));
  for (int64_t k0 = 0; k0 < K; k0 += chunk) {
    const int64_t n = std::min(chunk, K - k0);
    tg::cuda::gemm_accumulate_f32(true, false, M, N, n, 1.f, da.p + k0 * M, M, db.p + k0 * N, N, k0 == 0 ? 0.f : 1.f,
                                  dc.p, N, nullptr);
  }
  std::vector<float> c(ref.size());
  CHECK_CUDA(cudaMemcpy(c.data(), dc.p, c.size() * sizeof(float), cudaMemcpyDeviceToHost));
  double worst = 0;
  for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(double(c[i]) - ref[i]));
  EXPECT_LT(worst, 1e-4) << "fp32 accumulation over " << (K + chunk - 1) / chunk << " calls";
}

TEST(CudaGemm, WorkspaceIsAtLeast32MiB) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  EXPECT_GE(tg::cuda::gemm_workspace_bytes(), size_t(32) << 20);
}

// --- gemm_dgelu: C = gelu'(pre) ⊙ (A·B), dbias = Σ_rows C (cuBLASLt's DGELU / DGELU_BGRAD) ---

double gelu_tanh_grad(double x) {
  const double k = 0.7978845608028654, t = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}
double gelu_erf_grad(double x) {
  return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}

std::vector<tg::bf16> bf16_values(size_t n, uint64_t seed, float lo, float hi) {
  Rng rng{seed};
  std::vector<tg::bf16> v(n);
  for (auto& x : v) x = tg::float_to_bf16(lo + (hi - lo) * 0.5f * (rng.next() + 1.f));
  return v;
}

struct DgeluResult {
  bool ran = false;
  std::vector<tg::bf16> c, dbias;
};

// One gemm_dgelu call on packed (M, K)·(K, N) operands, pre shifted by pre_offset elements from its
// allocation; C and dbias start as NaN bytes, so what the call leaves unwritten shows.
DgeluResult run_dgelu(int64_t M, int64_t N, int64_t K, const std::vector<tg::bf16>& a, const std::vector<tg::bf16>& b,
                      const std::vector<tg::bf16>& pre, bool with_dbias, int64_t pre_offset = 0) {
  const size_t nc = size_t(M * N);
  DeviceBuffer<tg::bf16> da(a.size()), db(b.size()), dpre(pre.size() + size_t(pre_offset)), dc(nc), dbias{size_t(N)};
  CHECK_CUDA(cudaMemcpy(da.p, a.data(), a.size() * sizeof(tg::bf16), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(db.p, b.data(), b.size() * sizeof(tg::bf16), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dpre.p + pre_offset, pre.data(), pre.size() * sizeof(tg::bf16), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(dc.p, 0xff, nc * sizeof(tg::bf16)));
  CHECK_CUDA(cudaMemset(dbias.p, 0xff, size_t(N) * sizeof(tg::bf16)));
  DgeluResult r;
  r.ran = tg::cuda::gemm_dgelu(M, N, K, da.p, std::max<int64_t>(K, 1), db.p, N, dpre.p + pre_offset, dc.p,
                               with_dbias ? dbias.p : nullptr, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  r.c.resize(nc);
  r.dbias.resize(size_t(N));
  CHECK_CUDA(cudaMemcpy(r.c.data(), dc.p, nc * sizeof(tg::bf16), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(r.dbias.data(), dbias.p, size_t(N) * sizeof(tg::bf16), cudaMemcpyDeviceToHost));
  return r;
}

std::vector<double> to_doubles(const std::vector<tg::bf16>& v) {
  std::vector<double> d(v.size());
  for (size_t i = 0; i < v.size(); ++i) d[i] = tg::bf16_to_float(v[i]);
  return d;
}

// Checks gemm_dgelu on one shape against the double computation from the bf16 values it reads,
// with and without the bias gradient, and two runs for equal bits. Returns whether it ran
// (false: cuBLASLt had no algorithm, and nothing was written).
bool check_dgelu(int64_t M, int64_t N, int64_t K, uint64_t seed) {
  SCOPED_TRACE("gemm_dgelu M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
  const std::vector<tg::bf16> a = bf16_values(size_t(M * K), seed, -1.f, 1.f),
                              b = bf16_values(size_t(K * N), seed + 1, -1.f, 1.f),
                              pre = bf16_values(size_t(M * N), seed + 2, -4.f, 4.f);  // GELU's curve, both tails
  std::vector<double> want(size_t(M * N), 0.0), want_bias(size_t(N), 0.0);
  const std::vector<double> ad = to_doubles(a), bd = to_doubles(b);
  for (int64_t i = 0; i < M; ++i) {
    double* row = &want[size_t(i * N)];
    for (int64_t k = 0; k < K; ++k) {
      const double x = ad[size_t(i * K + k)];
      const double* brow = &bd[size_t(k * N)];
      for (int64_t j = 0; j < N; ++j) row[j] += x * brow[j];
    }
    for (int64_t j = 0; j < N; ++j) {
      row[j] *= gelu_tanh_grad(tg::bf16_to_float(pre[size_t(i * N + j)]));
      want_bias[size_t(j)] += row[j];
    }
  }
  bool ran = false;
  for (bool with_dbias : {false, true}) {
    SCOPED_TRACE(with_dbias ? "DGELU_BGRAD" : "DGELU");
    const DgeluResult first = run_dgelu(M, N, K, a, b, pre, with_dbias), second = run_dgelu(M, N, K, a, b, pre, with_dbias);
    EXPECT_EQ(first.ran, second.ran);
    if (!first.ran) {
      for (tg::bf16 v : first.c) EXPECT_TRUE(std::isnan(tg::bf16_to_float(v))) << "a declined call wrote C";
      continue;
    }
    ran = true;
    EXPECT_EQ(std::memcmp(first.c.data(), second.c.data(), first.c.size() * sizeof(tg::bf16)), 0)
        << "two runs differ bitwise in C";
    const double err = rel_norm_error(to_doubles(first.c), want);
    EXPECT_LE(err, 1e-2) << "C's relative-norm error " << err;  // NaN fails this too
    if (with_dbias) {
      EXPECT_EQ(std::memcmp(first.dbias.data(), second.dbias.data(), first.dbias.size() * sizeof(tg::bf16)), 0)
          << "two runs differ bitwise in dbias";
      const double err_bias = rel_norm_error(to_doubles(first.dbias), want_bias);
      EXPECT_LE(err_bias, 1e-2) << "dbias's relative-norm error " << err_bias;
    }
  }
  return ran;
}

// GPT-2 small's MLP backward at 512 rows: cuBLASLt has a DGELU(_BGRAD) algorithm for this shape
// on the GPUs tilegrad runs on (sm_80, sm_90), so declining here fails rather than skips; at
// 16384 rows (the GPT-2 step) the shape only grows along M.
TEST(CudaGemm, DgeluEpilogueGpt2Shape) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  EXPECT_TRUE(check_dgelu(512, 3072, 768, 401)) << "cuBLASLt has no DGELU algorithm for M=512 N=3072 K=768";
}

// Sizes no tile divides (N a multiple of 8, as the epilogue requires): either correct, or
// declined with nothing written; which one is reported.
TEST(CudaGemm, DgeluEpilogueOddSizes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  for (auto [M, N, K] : {std::array<int64_t, 3>{37, 40, 29}, std::array<int64_t, 3>{9, 24, 40}}) {
    const bool ran = check_dgelu(M, N, K, 500 + uint64_t(M));
    std::printf("gemm_dgelu M=%lld N=%lld K=%lld: %s\n", (long long)M, (long long)N, (long long)K,
                ran ? "cuBLASLt's epilogue" : "declined (no algorithm)");
  }
}

// cublasLt.h does not say which GELU the epilogue differentiates. With A·B = 1 exactly, C is
// gelu'(pre) rounded to bf16; at pre ∈ [-4, -1] the tanh form's derivative and the erf form's
// differ by 3e-4 to 9e-4, several times bf16's rounding of values below 0.13 there, so the
// squared errors against the two say which form it is.
TEST(CudaGemm, DgeluIsTheTanhFormsDerivative) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  const int64_t M = 64, N = 64, K = 8;
  std::vector<tg::bf16> a(size_t(M * K), tg::float_to_bf16(0.f)), b(size_t(K * N), tg::float_to_bf16(0.f));
  for (int64_t i = 0; i < M; ++i) a[size_t(i * K)] = tg::float_to_bf16(1.f);
  for (int64_t j = 0; j < N; ++j) b[size_t(j)] = tg::float_to_bf16(1.f);
  const std::vector<tg::bf16> pre = bf16_values(size_t(M * N), 601, -4.f, -1.f);
  const DgeluResult r = run_dgelu(M, N, K, a, b, pre, false);
  ASSERT_TRUE(r.ran) << "cuBLASLt has no DGELU algorithm for M=64 N=64 K=8";
  double sq_tanh = 0, sq_erf = 0;
  for (size_t i = 0; i < r.c.size(); ++i) {
    const double x = tg::bf16_to_float(pre[i]), c = tg::bf16_to_float(r.c[i]);
    sq_tanh += (c - gelu_tanh_grad(x)) * (c - gelu_tanh_grad(x));
    sq_erf += (c - gelu_erf_grad(x)) * (c - gelu_erf_grad(x));
  }
  const double rms_tanh = std::sqrt(sq_tanh / double(r.c.size())), rms_erf = std::sqrt(sq_erf / double(r.c.size()));
  std::printf("gemm_dgelu against gelu' at pre in [-4, -1]: rms error %.3g (tanh form), %.3g (erf form)\n", rms_tanh,
              rms_erf);
  EXPECT_LT(rms_tanh, 0.5 * rms_erf) << "the epilogue's derivative is not clearly the tanh form's";
  EXPECT_LT(rms_tanh, 3e-4);
}

// Declined, with nothing run or written: N not a multiple of 8 (the epilogue's leading-dimension
// rule), a pre-activation not 16-byte aligned, an empty product.
TEST(CudaGemm, DgeluDeclinesWhatTheEpilogueCannotTake) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  auto declined = [](int64_t M, int64_t N, int64_t K, int64_t pre_offset) {
    const DgeluResult r = run_dgelu(M, N, K, bf16_values(size_t(M * K), 1, -1.f, 1.f),
                                    bf16_values(size_t(K * N), 2, -1.f, 1.f), bf16_values(size_t(M * N), 3, -4.f, 4.f),
                                    true, pre_offset);
    bool untouched = true;
    for (tg::bf16 v : r.c) untouched = untouched && std::isnan(tg::bf16_to_float(v));
    for (tg::bf16 v : r.dbias) untouched = untouched && std::isnan(tg::bf16_to_float(v));
    return !r.ran && untouched;
  };
  EXPECT_TRUE(declined(64, 44, 32, 0)) << "N = 44";
  EXPECT_TRUE(declined(64, 64, 32, 1)) << "pre 2-byte aligned";
  EXPECT_TRUE(declined(64, 64, 0, 0)) << "K = 0";
}

}  // namespace

#else

TEST(CudaGemm, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#endif
