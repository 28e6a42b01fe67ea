// Parity of cuda::gemm / gemm_ex (cuBLASLt) with a double-precision CPU reference: transposes, batches, strides, epilogues (incl. GELU aux/backward), fp32/bf16, determinism.
#include <gtest/gtest.h>

#ifdef TILEGRAD_HAVE_CUDA

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda/gemm.h"
#include "src/tensor/dtype.h"
#include "src/util/error.h"

namespace {

using tg::cuda::Epilogue;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// Throws so that gtest reports the failing call (helpers below return values, so no ASSERT_*).
#define CHECK_CUDA(call)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess)                                                                       \
      throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_) + " at line " + \
                               std::to_string(__LINE__));                                        \
  } while (0)

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
    static const char* epis[] = {"none", "bias", "gelu_bias", "gelu_aux_bias", "dgelu", "dgelu_bgrad"};
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

// d gelu_tanh / dx, as kernels/cpu/elementwise.h gelu_backward.
double gelu_tanh_grad(double x) {
  const double k = 0.7978845608028654;
  const double th = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

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

// ---------------------------------------------------------------------------------------------
// gemm_ex: the GELU epilogues with an aux matrix (single matrix, beta 0 for the backward ones).
// ---------------------------------------------------------------------------------------------

// One gemm_ex to check. aux_ld 0 means N; aux_offset shifts aux (and bias_grad) from their
// 256-byte aligned allocations, which takes the fused path off the table by construction.
struct ExCase {
  bool ta = false, tb = false;
  int64_t M = 1, N = 1, K = 1;
  float alpha = 1.f, beta = 0.f;
  Epilogue epi = Epilogue::gelu_aux_bias;
  int64_t aux_ld = 0, aux_offset = 0;

  std::string str() const {
    static const char* epis[] = {"none", "bias", "gelu_bias", "gelu_aux_bias", "dgelu", "dgelu_bgrad"};
    std::ostringstream os;
    os << (ta ? "T" : "N") << (tb ? "T" : "N") << " M=" << M << " N=" << N << " K=" << K << " alpha=" << alpha
       << " beta=" << beta << " epilogue=" << epis[int(epi)] << " aux_ld=" << aux_ld << " aux_offset=" << aux_offset;
    return os.str();
  }
};

// What one gemm_ex run produced (host copies of the whole buffers) and what it should have.
template <typename T>
struct ExResult {
  std::vector<T> c, aux, bias_grad;
  bool fused = false;  // gemm_last_call_fused after the run
};

// Runs an ExCase twice and checks C, aux (gelu_aux_bias) and bias_grad (dgelu_bgrad) against the
// double reference, that nothing outside C's / aux's (M, N) views is written, and that the two runs
// are bitwise equal. Inputs come from `seed` only (not from the layout), so cases that differ only in
// aux_ld / aux_offset see the same values and their results can be compared; returns the first run.
template <typename T>
ExResult<T> run_ex_case(ExCase c, uint64_t seed) {
  SCOPED_TRACE(std::string(std::is_same_v<T, float> ? "f32 " : "bf16 ") + c.str());
  if (!c.aux_ld) c.aux_ld = c.N;
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-2;
  const bool fwd = c.epi == Epilogue::gelu_aux_bias, bgrad = c.epi == Epilogue::dgelu_bgrad;
  // cuBLAS wants ld ≥ 1 even for K = 0.
  const int64_t lda = std::max<int64_t>(1, c.ta ? c.M : c.K), ldb = std::max<int64_t>(1, c.tb ? c.K : c.N), ldc = c.N;
  const size_t na = size_t(c.M * c.K), nb = size_t(c.K * c.N), nc = size_t(c.M * c.N);
  const size_t naux = size_t(c.aux_offset + c.M * c.aux_ld), nbg = size_t(c.aux_offset + c.N);

  Rng rng{seed};
  auto fill = [&](size_t count, float scale) {
    std::vector<T> v(count);
    for (auto& x : v) x = from_float<T>(scale * rng.next());
    return v;
  };
  const std::vector<T> a = fill(na, 1.f), b = fill(nb, 1.f), bias = fill(size_t(c.N), 1.f);
  std::vector<T> c0 = fill(nc, 1.f);
  if (c.beta == 0.f) std::memset(static_cast<void*>(c0.data()), 0xff, c0.size() * sizeof(T));  // NaN bytes
  // aux: the (M, N) view holds pre-activations in [-3, 3) for the backward (GELU' varies most
  // there), NaN bytes elsewhere and, for the forward, everywhere (it must all be overwritten).
  std::vector<T> aux0(naux);
  std::memset(static_cast<void*>(aux0.data()), 0xff, naux * sizeof(T));
  {
    const std::vector<T> pre = fill(nc, 3.f);
    if (!fwd)
      for (int64_t i = 0; i < c.M; ++i)
        for (int64_t j = 0; j < c.N; ++j) aux0[size_t(c.aux_offset + i * c.aux_ld + j)] = pre[size_t(i * c.N + j)];
  }
  std::vector<T> bg0(nbg);
  std::memset(static_cast<void*>(bg0.data()), 0xff, nbg * sizeof(T));

  // Reference.
  std::vector<double> want_c(nc), want_aux, want_bg(size_t(c.N), 0.0);
  if (fwd) want_aux.resize(nc);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double acc = 0;
      for (int64_t k = 0; k < c.K; ++k)
        acc += double(to_float(c.ta ? a[size_t(k * lda + i)] : a[size_t(i * lda + k)])) *
               double(to_float(c.tb ? b[size_t(j * ldb + k)] : b[size_t(k * ldb + j)]));
      const size_t idx = size_t(i * c.N + j);
      double v = double(c.alpha) * acc;
      if (fwd) {
        if (c.beta != 0.f) v += double(c.beta) * to_float(c0[idx]);
        v += to_float(bias[size_t(j)]);
        want_aux[idx] = v;
        want_c[idx] = gelu_tanh(v);
      } else {
        want_c[idx] = v * gelu_tanh_grad(to_float(aux0[size_t(c.aux_offset + i * c.aux_ld + j)]));
        want_bg[size_t(j)] += want_c[idx];
      }
    }

  DeviceBuffer<T> da(na), db(nb), dc(nc), dbias(size_t(c.N)), daux(naux), dbg(nbg);
  CHECK_CUDA(cudaMemcpy(da.p, a.data(), na * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(db.p, b.data(), nb * sizeof(T), cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dbias.p, bias.data(), size_t(c.N) * sizeof(T), cudaMemcpyHostToDevice));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  auto run = [&] {
    CHECK_CUDA(cudaMemcpy(dc.p, c0.data(), nc * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(daux.p, aux0.data(), naux * sizeof(T), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dbg.p, bg0.data(), nbg * sizeof(T), cudaMemcpyHostToDevice));
    tg::cuda::gemm_ex<T>(c.ta, c.tb, c.M, c.N, c.K, c.alpha, da.p, lda, db.p, ldb, c.beta, dc.p, ldc, c.epi,
                         fwd ? dbias.p : nullptr, daux.p + c.aux_offset, c.aux_ld, bgrad ? dbg.p + c.aux_offset : nullptr,
                         stream);
    const bool fused = tg::cuda::gemm_last_call_fused();
    CHECK_CUDA(cudaStreamSynchronize(stream));
    ExResult<T> r{std::vector<T>(nc), std::vector<T>(naux), std::vector<T>(nbg), fused};
    CHECK_CUDA(cudaMemcpy(r.c.data(), dc.p, nc * sizeof(T), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(r.aux.data(), daux.p, naux * sizeof(T), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(r.bias_grad.data(), dbg.p, nbg * sizeof(T), cudaMemcpyDeviceToHost));
    return r;
  };
  const ExResult<T> first = run(), second = run();
  CHECK_CUDA(cudaStreamDestroy(stream));

  EXPECT_EQ(first.fused, second.fused) << "two runs took different paths";
  if (c.aux_offset != 0 || c.aux_ld % 8 != 0) {
    EXPECT_FALSE(first.fused) << "misaligned aux must take the unfused path";
  }
  EXPECT_EQ(std::memcmp(first.c.data(), second.c.data(), nc * sizeof(T)), 0) << "two runs differ bitwise in C";
  EXPECT_EQ(std::memcmp(first.aux.data(), second.aux.data(), naux * sizeof(T)), 0) << "two runs differ in aux";
  EXPECT_EQ(std::memcmp(first.bias_grad.data(), second.bias_grad.data(), nbg * sizeof(T)), 0)
      << "two runs differ bitwise in bias_grad";

  std::vector<double> got(nc);
  for (size_t i = 0; i < nc; ++i) got[i] = to_float(first.c[i]);
  const double err_c = rel_norm_error(got, want_c);
  EXPECT_LE(err_c, tol) << "C relative-norm error " << err_c;

  // aux: the forward writes exactly the (M, N) view; the backward never writes it.
  std::vector<double> got_aux;
  size_t aux_outside = 0;
  for (size_t idx = 0; idx < naux; ++idx) {
    const int64_t e = int64_t(idx) - c.aux_offset;
    if (fwd && e >= 0 && e % c.aux_ld < c.N) {
      got_aux.push_back(to_float(first.aux[idx]));
      continue;
    }
    if (std::memcmp(&first.aux[idx], &aux0[idx], sizeof(T)) != 0) ++aux_outside;
  }
  EXPECT_EQ(aux_outside, 0u) << "aux elements outside what the epilogue writes were changed";
  if (fwd) {
    const double err_aux = rel_norm_error(got_aux, want_aux);
    EXPECT_LE(err_aux, tol) << "aux relative-norm error " << err_aux;
  }

  // bias_grad: written for dgelu_bgrad (all N entries), untouched otherwise.
  if (bgrad) {
    std::vector<double> got_bg(size_t(c.N));
    for (int64_t j = 0; j < c.N; ++j) got_bg[size_t(j)] = to_float(first.bias_grad[size_t(c.aux_offset + j)]);
    const double err_bg = rel_norm_error(got_bg, want_bg);
    EXPECT_LE(err_bg, tol) << "bias_grad relative-norm error " << err_bg;
    for (int64_t j = 0; j < c.aux_offset; ++j)
      EXPECT_EQ(std::memcmp(&first.bias_grad[size_t(j)], &bg0[size_t(j)], sizeof(T)), 0) << "bias_grad[-1] written";
  } else {
    EXPECT_EQ(std::memcmp(first.bias_grad.data(), bg0.data(), nbg * sizeof(T)), 0) << "bias_grad written";
  }
  return first;
}

const Epilogue kAuxEpilogues[] = {Epilogue::gelu_aux_bias, Epilogue::dgelu, Epilogue::dgelu_bgrad};

// Every transpose pair and aux epilogue at sizes no tile divides; aux_ld = N (51, not a multiple of
// 8: unfused by construction) and padded to 56 (the fused path may take it).
template <typename T>
void ex_odd_sizes() {
  uint64_t seed = 400;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (Epilogue epi : kAuxEpilogues)
        for (int64_t aux_ld : {int64_t(51), int64_t(56)}) {
          ExCase c;
          c.ta = ta, c.tb = tb, c.M = 37, c.N = 51, c.K = 29, c.epi = epi, c.aux_ld = aux_ld, c.alpha = 0.75f;
          run_ex_case<T>(c, seed++);
          if (epi == Epilogue::gelu_aux_bias) {  // beta folds into the pre-activation
            c.beta = 0.5f;
            run_ex_case<T>(c, seed++);
          }
        }
}

// GPT-2 small's MLP: c_fc forward h = gelu(x·W_fcᵀ + b) with W_fc stored (3072, 768), and the dx of
// c_proj, dpre = (dy·W_proj) ∘ gelu'(pre) with W_proj stored (768, 3072), plus db_fc.
template <typename T>
void ex_gpt2_sizes() {
  ExCase fwd;
  fwd.tb = true, fwd.M = 1024, fwd.N = 3072, fwd.K = 768, fwd.epi = Epilogue::gelu_aux_bias;
  run_ex_case<T>(fwd, 501);
  ExCase bwd;
  bwd.M = 1024, bwd.N = 3072, bwd.K = 768, bwd.epi = Epilogue::dgelu;
  run_ex_case<T>(bwd, 502);
  bwd.epi = Epilogue::dgelu_bgrad;
  run_ex_case<T>(bwd, 503);
}

// The same problems with aux (and bias_grad) one element off their aligned allocation: the unfused
// kernels by construction. Each must match the reference and the aligned (fused if cuBLASLt has it)
// run to the dtype's tolerance.
template <typename T>
void ex_forced_fallback() {
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-2;
  auto compare = [&](const std::vector<T>& x, const std::vector<T>& y, size_t x0, size_t y0, int64_t rows,
                     int64_t cols, int64_t ldx, int64_t ldy, const char* what) {
    std::vector<double> gx, gy;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        gx.push_back(to_float(x[x0 + size_t(i * ldx + j)]));
        gy.push_back(to_float(y[y0 + size_t(i * ldy + j)]));
      }
    const double err = rel_norm_error(gx, gy);
    EXPECT_LE(err, tol) << what << ": fallback vs aligned relative-norm difference " << err;
  };
  uint64_t seed = 600;
  for (Epilogue epi : kAuxEpilogues) {
    ExCase c;
    c.tb = epi == Epilogue::gelu_aux_bias, c.M = 1024, c.N = 3072, c.K = 768, c.epi = epi;
    SCOPED_TRACE(c.str());
    const ExResult<T> aligned = run_ex_case<T>(c, seed);
    c.aux_offset = 1;
    const ExResult<T> fallback = run_ex_case<T>(c, seed);  // same seed: same inputs
    ++seed;
    // Which path the aligned call took depends on cuBLASLt; say it, so a log shows what was compared.
    std::cout << "[ INFO     ] " << (std::is_same_v<T, float> ? "f32 " : "bf16 ") << c.str() << ": aligned aux "
              << (aligned.fused ? "fused in cuBLASLt" : "unfused (no cuBLASLt algorithm)") << "\n";
    EXPECT_FALSE(fallback.fused);
    compare(fallback.c, aligned.c, 0, 0, c.M, c.N, c.N, c.N, "C");
    if (epi == Epilogue::gelu_aux_bias) compare(fallback.aux, aligned.aux, 1, 0, c.M, c.N, c.N, c.N, "aux");
    if (epi == Epilogue::dgelu_bgrad) compare(fallback.bias_grad, aligned.bias_grad, 1, 0, 1, c.N, c.N, c.N, "bias_grad");
  }
}

// K = 0 (empty product) and M = 0: the epilogue of zero, and a zero bias gradient.
template <typename T>
void ex_empty() {
  ExCase c;
  c.M = 16, c.N = 24, c.K = 0, c.epi = Epilogue::gelu_aux_bias, c.beta = 0.5f;
  run_ex_case<T>(c, 701);
  c.beta = 0.f, c.epi = Epilogue::dgelu_bgrad;
  run_ex_case<T>(c, 702);
  // M = 0: bias_grad must still be zeroed (a sum over no rows).
  const int64_t N = 24;
  DeviceBuffer<T> dbg(static_cast<size_t>(N)), daux(1), dc(1), dab(1);
  std::vector<T> bg(static_cast<size_t>(N));
  std::memset(static_cast<void*>(bg.data()), 0xff, bg.size() * sizeof(T));
  CHECK_CUDA(cudaMemcpy(dbg.p, bg.data(), bg.size() * sizeof(T), cudaMemcpyHostToDevice));
  tg::cuda::gemm_ex<T>(false, false, 0, N, 8, 1.f, dab.p, 8, dab.p, N, 0.f, dc.p, N, Epilogue::dgelu_bgrad, nullptr,
                       daux.p, N, dbg.p, nullptr);
  CHECK_CUDA(cudaDeviceSynchronize());
  CHECK_CUDA(cudaMemcpy(bg.data(), dbg.p, bg.size() * sizeof(T), cudaMemcpyDeviceToHost));
  for (int64_t j = 0; j < N; ++j) EXPECT_EQ(to_float(bg[size_t(j)]), 0.f) << "bias_grad[" << j << "] with M = 0";
}

TEST(CudaGemmEx, OddSizesF32) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  ex_odd_sizes<float>();
}
TEST(CudaGemmEx, OddSizesBf16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  ex_odd_sizes<tg::bf16>();
}
TEST(CudaGemmEx, Gpt2MlpF32) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  ex_gpt2_sizes<float>();
}
TEST(CudaGemmEx, Gpt2MlpBf16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  ex_gpt2_sizes<tg::bf16>();
}
TEST(CudaGemmEx, ForcedFallbackMatchesF32) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  ex_forced_fallback<float>();
}
TEST(CudaGemmEx, ForcedFallbackMatchesBf16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  ex_forced_fallback<tg::bf16>();
}
TEST(CudaGemmEx, EmptyProductsF32) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  ex_empty<float>();
}
TEST(CudaGemmEx, EmptyProductsBf16) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  ex_empty<tg::bf16>();
}

// A caller's mistake is a tg::Error naming the bad value, before anything touches the GPU.
TEST(CudaGemmEx, RejectsBadArguments) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  float* p = nullptr;
  float* q = reinterpret_cast<float*>(uintptr_t(256));  // never dereferenced: the checks come first
  EXPECT_THROW(tg::cuda::gemm<float>(false, false, 4, 8, 2, 1.f, q, 2, q, 8, 0.f, q, 8, 1, 0, 0, 0,
                                     Epilogue::gelu_aux_bias, q, nullptr),
               tg::Error);  // aux epilogue through gemm
  EXPECT_THROW(tg::cuda::gemm_ex<float>(false, false, 4, 8, 2, 1.f, q, 2, q, 8, 0.f, q, 8, Epilogue::dgelu, nullptr, p,
                                        8, nullptr, nullptr),
               tg::Error);  // dgelu without aux
  EXPECT_THROW(tg::cuda::gemm_ex<float>(false, false, 4, 8, 2, 1.f, q, 2, q, 8, 0.f, q, 8, Epilogue::gelu_aux_bias, q,
                                        q, 7, nullptr, nullptr),
               tg::Error);  // aux_ld < N
  EXPECT_THROW(tg::cuda::gemm_ex<float>(false, false, 4, 8, 2, 1.f, q, 2, q, 8, 0.f, q, 8, Epilogue::gelu_aux_bias,
                                        nullptr, q, 8, nullptr, nullptr),
               tg::Error);  // gelu_aux_bias without bias
  EXPECT_THROW(tg::cuda::gemm_ex<float>(false, false, 4, 8, 2, 1.f, q, 2, q, 8, 0.f, q, 8, Epilogue::dgelu_bgrad,
                                        nullptr, q, 8, nullptr, nullptr),
               tg::Error);  // dgelu_bgrad without bias_grad
  EXPECT_THROW(tg::cuda::gemm_ex<float>(false, false, 4, 8, 2, 1.f, q, 2, q, 8, 1.f, q, 8, Epilogue::dgelu, nullptr, q,
                                        8, nullptr, nullptr),
               tg::Error);  // dgelu with beta ≠ 0
}

TEST(CudaGemm, WorkspaceIsAtLeast32MiB) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine";
  EXPECT_GE(tg::cuda::gemm_workspace_bytes(), size_t(32) << 20);
}

}  // namespace

#else

TEST(CudaGemm, Skipped) { GTEST_SKIP() << "built without CUDA"; }

#endif
