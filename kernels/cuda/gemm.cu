// Row-major batched GEMM through cuBLASLt, with cached plans and a bias/GELU kernel for what cuBLASLt cannot fuse.
//
// Row-major ↔ column-major: a row-major (r, c) matrix with leading dimension ld is, byte for byte,
// the column-major (c, r) matrix with the same ld. So row-major C = op(A)·op(B) is column-major
// Cᵀ = op(B)ᵀ·op(A)ᵀ, and cuBLASLt is called with the operands swapped: its "A" is our B (with
// our trans_b), its "B" is our A (with our trans_a), and its (m, n, k) is our (N, M, K). The
// epilogue bias runs along cuBLASLt's m, i.e. our N: one bias value per output feature.
//
// Epilogue alignment: the fused cuBLASLt epilogue is only asked for when the bias pointer is
// 16-byte aligned (cuBLASLt's bias loads are vectorised; projects that fed it 8-byte aligned bias
// saw failures on A100, e.g. marian's prod.cpp). A less aligned bias, a case for which the
// heuristic offers no fused algorithm, or a fused call that cuBLASLt refuses at run time, all take
// the unfused path: a plain GEMM, then bias_act_kernel over C. Matrix pointers may have any
// element alignment: their actual alignment (capped at 256 bytes, and including the batch stride)
// is passed to the heuristic as MIN_ALIGNMENT_*, so it never picks a kernel that needs more. If no
// strided-batch algorithm exists for a layout, the batch runs as a loop of single-matrix calls.
//
// gemm_dgelu (an MLP's backward): cuBLASLt's DGELU epilogue multiplies the product by GELU's
// derivative at an auxiliary input (the saved pre-activation) laid out like D, i.e. column-major
// (N, M) with ld N in cuBLASLt's terms; DGELU_BGRAD also writes the bias gradient, a vector along
// cuBLASLt's m (our N) summed over its n (our rows). There is no unfused path inside gemm.cu for
// it: where cuBLASLt has no algorithm (or refuses the call) gemm_dgelu says so and the caller
// runs a plain GEMM and its own GELU-backward kernel. cublasLt.h does not say which GELU its
// epilogues compute; CudaGemm.DgeluIsTheTanhFormsDerivative checks that DGELU's derivative is the
// tanh form's (GPT-2's, gelu_tanh below), at inputs where bf16 tells it apart from the erf form's.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <array>
#include <climits>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/gemm.h"
#include "src/util/error.h"

// An internal cuBLASLt failure names the status, the call, file and line (docs/architecture.md, "Conventions").
#define TG_CUBLAS_CHECK(call)                                                                              \
  do {                                                                                                     \
    cublasStatus_t st_ = (call);                                                                           \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                      \
      throw std::runtime_error(std::string("cuBLASLt error: ") + cublasLtGetStatusName(st_) + " (" +      \
                               cublasLtGetStatusString(st_) + ") in " #call " at " __FILE__ ":" +         \
                               std::to_string(__LINE__));                                                  \
  } while (0)

namespace tg::cuda {

namespace {

static_assert(sizeof(tg::bf16) == sizeof(__nv_bfloat16), "tg::bf16 must be layout-identical to __nv_bfloat16");

// Hopper's cuBLASLt kernels want ≥ 32 MiB for their split-K / stream-K reductions.
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
// The fused bias epilogue is only requested for a bias at least this aligned (see top of file);
// gemm_dgelu asks the same of its bias gradient and of the pre-activation it reads.
constexpr uintptr_t kFusedBiasAlignment = 16;
// cuBLASLt's rule for the GELU epilogues' auxiliary matrix: its leading dimension (elements) is a
// multiple of 8 (cublasLt.h, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD).
constexpr int64_t kAuxLdMultiple = 8;

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

template <typename T> struct device_type { using type = T; };
template <> struct device_type<tg::bf16> { using type = __nv_bfloat16; };

__device__ __forceinline__ float load_f(const float* p) { return *p; }
__device__ __forceinline__ float load_f(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store_f(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_f(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// GPT-2's GELU, tanh form, in fp32 (what cuBLASLt's GELU epilogue computes).
__device__ __forceinline__ float gelu_tanh(float x) {
  const float k = 0.7978845608028654f;  // √(2/π)
  return 0.5f * x * (1.f + tanhf(k * (x + 0.044715f * x * x * x)));
}

// C = act(beta·C + bias) over `rows` = batch·M rows of N columns; beta == 0 does not read C (it
// may be NaN), bias (N,) may be null. Used after an unfused GEMM (beta = 1) and for K == 0,
// where the product is an empty sum. x covers columns so bias and C reads coalesce; y strides
// over rows because batch·M can exceed gridDim.y's 65535.
template <typename T, bool kGelu>
__global__ void bias_act_kernel(T* C, int64_t ldc, int64_t stride_c, int64_t M, int64_t N, int64_t rows, float beta,
                                const T* bias) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float b = bias ? load_f(bias + n) : 0.f;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    T* c = C + (r / M) * stride_c + (r % M) * ldc + n;
    float v = (beta == 0.f ? 0.f : beta * load_f(c)) + b;
    store_f(c, kGelu ? gelu_tanh(v) : v);
  }
}

// ---------------------------------------------------------------------------------------------
// Launchers and cuBLASLt state
// ---------------------------------------------------------------------------------------------

template <typename T>
void launch_bias_act(T* C, int64_t ldc, int64_t stride_c, int64_t M, int64_t N, int64_t batch, float beta,
                     const T* bias, bool gelu, cudaStream_t stream) {
  using D = typename device_type<T>::type;
  const int threads = 256;
  const int64_t rows = batch * M;
  dim3 grid(unsigned((N + threads - 1) / threads), unsigned(rows < 65535 ? rows : 65535));
  D* c = reinterpret_cast<D*>(C);
  const D* b = reinterpret_cast<const D*>(bias);
  if (gelu)
    bias_act_kernel<D, true><<<grid, threads, 0, stream>>>(c, ldc, stride_c, M, N, rows, beta, b);
  else
    bias_act_kernel<D, false><<<grid, threads, 0, stream>>>(c, ldc, stride_c, M, N, rows, beta, b);
  TG_CUDA_CHECK(cudaGetLastError());
}

// The epilogue a plan is built for: gemm()'s three (Epilogue), and gemm_dgelu's GELU derivative
// without and with the bias gradient.
enum class PlanEpilogue { none, bias, gelu_bias, dgelu, dgelu_bgrad };

PlanEpilogue plan_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::none: return PlanEpilogue::none;
    case Epilogue::bias: return PlanEpilogue::bias;
    case Epilogue::gelu_bias: return PlanEpilogue::gelu_bias;
  }
  return PlanEpilogue::none;
}

bool is_dgelu(PlanEpilogue e) { return e == PlanEpilogue::dgelu || e == PlanEpilogue::dgelu_bgrad; }

// Everything that decides the heuristic's choice: dtypes (inputs and C), transposes, sizes, leading dimensions,
// batch and strides (0 when batch == 1), epilogue, and the pointer alignments (in bytes, capped at
// 256) that the algorithm may rely on: A, B, C, the bias (or bias gradient) and the DGELU
// epilogue's auxiliary input (0 where there is none).
using PlanKey = std::array<int64_t, 20>;

struct PlanKeyHash {
  size_t operator()(const PlanKey& k) const {
    uint64_t h = 1469598103934665603ull;  // FNV-1a over the fields
    for (int64_t v : k) {
      h ^= uint64_t(v);
      h *= 1099511628211ull;
    }
    return size_t(h);
  }
};

// One cached matmul: descriptors plus the algorithm the heuristic chose for them. `fused` says
// whether the epilogue runs inside cuBLASLt; if not, bias_act_kernel applies it afterwards
// (gemm_dgelu's plans are always fused).
// `per_matrix` says the descriptors describe one matrix of the batch and the batch is a loop of
// calls (only when cuBLASLt offers no strided-batch algorithm for the layout).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo{};
  bool fused = false;
  bool per_matrix = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {  // destructors must not throw; a failing destroy only leaks a descriptor
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// One per device, created on the device's first GEMM and deliberately never destroyed: static
// destructors run after the CUDA runtime may have torn the context down, and destroying a handle
// or freeing the workspace then fails. The process exit releases both.
struct DeviceState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  int cc = 0, sms = 0;  // compute capability (major·10 + minor) and multiprocessors: kTunedGemms' key
  // Null only for a gemm_dgelu key: cuBLASLt has no algorithm for it, or refused it at run time.
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
};

// Guards the device map and the plan caches (the bias and aux pointers are set on a cached
// descriptor per call). Uncontended in training, so its cost is a few tens of nanoseconds per GEMM.
std::mutex g_mutex;
std::unordered_map<int, DeviceState*> g_devices;

DeviceState& device_state(int device) {  // caller holds g_mutex
  auto it = g_devices.find(device);
  if (it != g_devices.end()) return *it->second;
  auto state = std::make_unique<DeviceState>();
  TG_CUBLAS_CHECK(cublasLtCreate(&state->handle));
  TG_CUDA_CHECK(cudaMalloc(&state->workspace, kWorkspaceBytes));
  int major = 0, minor = 0;
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&state->sms, cudaDevAttrMultiProcessorCount, device));
  state->cc = major * 10 + minor;
  DeviceState* s = state.release();
  g_devices.emplace(device, s);
  return *s;
}

// Largest power of two (≤ 256) dividing the address of every matrix of the batch.
uint32_t alignment_bytes(const void* p, int64_t stride_bytes) {
  uint64_t bits = uint64_t(reinterpret_cast<uintptr_t>(p)) | uint64_t(stride_bytes) | 256u;
  return uint32_t(bits & (~bits + 1));  // lowest set bit
}

struct Problem {
  cudaDataType_t type;    // A and B (and the bias)
  cudaDataType_t c_type;  // C: the same as type, or fp32 under bf16 inputs (gemm_accumulate_f32)
  bool trans_a, trans_b;
  int64_t M, N, K, lda, ldb, ldc, batch, stride_a, stride_b, stride_c;
  PlanEpilogue epilogue;
  uint32_t align_a, align_b, align_c;
  const void* bias;  // the bias, or DGELU_BGRAD's bias gradient (written)
  const void* aux;   // DGELU's pre-activation, (M, N) row-major with ld aux_ld
  int64_t aux_ld;
};

// Problems where another of the heuristic's candidates than its first ran faster: GPT-2 small's
// GEMMs (batch 16 × 1024) on the H200, measured by tools/gemm_sweep.cu in interleaved rounds
// (docs/performance.md, "cuBLASLt's candidates"). The choice is a fixed index into the
// heuristic's list for the problem, so a run takes the same algorithms — and its results the same
// bits — every time. Another device, cuBLASLt version or problem takes the heuristic's first.
struct TunedGemm {
  int cc, sms;              // the device: compute capability (major·10 + minor), multiprocessors
  size_t cublaslt_version;  // cublasLtGetVersion()
  bool c_f32, trans_a, trans_b;
  int64_t M, N, K;
  bool bias;      // the fused bias epilogue
  int candidate;  // index into the heuristic's results (at most kTunedCandidates)
};
constexpr int kTunedCandidates = 8;
// {cc, sms, version, c_f32, trans_a, trans_b, M, N, K, bias, candidate}, with the best of 3
// interleaved rounds of the heuristic's first candidate against the one chosen.
constexpr TunedGemm kTunedGemms[] = {
    {90, 132, 130100, false, false, true, 16384, 2304, 768, true, 1},  // forward qkv: 87.99 → 85.25 µs
    {90, 132, 130100, false, false, true, 16384, 768, 768, true, 7},  // forward attn.proj: 32.54 → 30.44 µs
    {90, 132, 130100, false, false, true, 16384, 768, 3072, true, 7},  // forward mlp.proj: 107.94 → 104.43 µs
    {90, 132, 130100, false, false, true, 16384, 50304, 768, false, 6},  // forward LM head: 1929.85 → 1635.79 µs
    {90, 132, 130100, false, false, false, 16384, 768, 768, false, 7},  // input gradient attn.proj: 34.12 → 30.87 µs
    {90, 132, 130100, false, false, false, 16384, 768, 3072, false, 7},  // input gradient mlp.fc: 109.87 → 104.77 µs
    {90, 132, 130100, false, false, false, 16384, 3072, 768, false, 6},  // input gradient mlp.proj: 122.97 → 104.17 µs
    {90, 132, 130100, true, true, false, 768, 768, 16384, false, 1},  // weight gradient attn.proj into fp32: 39.43 → 37.55 µs
    {90, 132, 130100, true, true, false, 3072, 768, 16384, false, 1},  // weight gradient mlp.fc into fp32: 109.43 → 105.62 µs
    {90, 132, 130100, true, true, false, 768, 3072, 16384, false, 1},  // weight gradient mlp.proj into fp32: 116.59 → 106.50 µs
};

// The candidate index for a bf16 problem of one matrix on this device (0: the heuristic's first).
// The table holds plain and bias GEMMs only: any other epilogue takes the heuristic's first.
int tuned_candidate(int cc, int sms, const Problem& p, bool fused) {
  if (p.epilogue != PlanEpilogue::none && p.epilogue != PlanEpilogue::bias) return 0;
  if (p.type != CUDA_R_16BF || p.batch != 1 || p.lda != (p.trans_a ? p.M : p.K) ||
      p.ldb != (p.trans_b ? p.K : p.N) || p.ldc != p.N)
    return 0;
  static const size_t version = cublasLtGetVersion();
  for (const TunedGemm& t : kTunedGemms)
    if (t.cc == cc && t.sms == sms && t.cublaslt_version == version && t.c_f32 == (p.c_type == CUDA_R_32F) &&
        t.trans_a == p.trans_a && t.trans_b == p.trans_b && t.M == p.M && t.N == p.N && t.K == p.K &&
        t.bias == (fused && p.epilogue == PlanEpilogue::bias) && (t.bias || p.epilogue == PlanEpilogue::none))
      return t.candidate;
  return 0;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  TG_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    int32_t count = int32_t(batch);
    TG_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    TG_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return layout;
}

// Builds the descriptors and asks the heuristic for its best algorithm (or the kTunedGemms
// candidate for the problem on this device); null when it has none (with `fused`, that sends the
// caller to the unfused plan).
std::unique_ptr<Plan> make_plan(const DeviceState& state, const Problem& p, bool fused) {
  const cublasLtHandle_t handle = state.handle;
  auto plan = std::make_unique<Plan>();
  plan->fused = fused;
  // fp32 compute for both types: for fp32 inputs CUBLAS_COMPUTE_32F excludes TF32.
  TG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  int32_t op_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  int32_t op_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our A
  TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (fused) {
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    switch (p.epilogue) {
      case PlanEpilogue::none:  // never fused
      case PlanEpilogue::bias: epi = CUBLASLT_EPILOGUE_BIAS; break;
      case PlanEpilogue::gelu_bias: epi = CUBLASLT_EPILOGUE_GELU_BIAS; break;
      case PlanEpilogue::dgelu: epi = CUBLASLT_EPILOGUE_DGELU; break;
      case PlanEpilogue::dgelu_bgrad: epi = CUBLASLT_EPILOGUE_DGELU_BGRAD; break;
    }
    TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (p.epilogue != PlanEpilogue::dgelu) {  // a bias, or DGELU_BGRAD's bias gradient (C's type)
      int32_t bias_type = p.type;
      TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                     sizeof(bias_type)));
      // The heuristic reads the bias pointer's value for its alignment (cublasLt.h); BIAS_BATCH_STRIDE
      // stays 0, so every matrix of a batch gets the same bias.
      TG_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias, sizeof(p.bias)));
    }
    if (is_dgelu(p.epilogue)) {
      // The pre-activation, laid out like D. Its type is left unset: it then defaults to D's
      // (bf16), and setting it is an error for some type combinations (cublasLt.h,
      // CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE). Its pointer's value, like the bias's,
      // tells the heuristic its alignment.
      TG_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux, sizeof(p.aux)));
      TG_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &p.aux_ld, sizeof(p.aux_ld)));
    }
  }
  // Stored shapes seen column-major: our B (K, N) row-major is (N, K) column-major, etc.
  plan->a = make_layout(p.type, p.trans_b ? p.K : p.N, p.trans_b ? p.N : p.K, p.ldb, p.batch, p.stride_b);
  plan->b = make_layout(p.type, p.trans_a ? p.M : p.K, p.trans_a ? p.K : p.M, p.lda, p.batch, p.stride_a);
  plan->c = make_layout(p.c_type, p.N, p.M, p.ldc, p.batch, p.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  TG_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  // Destroy the preference on every path out, including a throwing check.
  std::unique_ptr<void, void (*)(void*)> pref_guard(
      pref, [](void* q) { cublasLtMatmulPreferenceDestroy(static_cast<cublasLtMatmulPreference_t>(q)); });
  uint64_t ws = kWorkspaceBytes;
  TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  uint32_t al_a = p.align_b, al_b = p.align_a, al_c = p.align_c;  // swapped operands, swapped alignments
  TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a)));
  TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b)));
  TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c)));
  TG_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c)));

  const int want = tuned_candidate(state.cc, state.sms, p, fused);
  std::array<cublasLtMatmulHeuristicResult_t, kTunedCandidates> results{};
  int count = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->c, plan->c, pref,
                                                     want + 1, results.data(), &count);
  // NOT_SUPPORTED is how the heuristic says "nothing for this configuration".
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && count == 0)) return nullptr;
  TG_CUBLAS_CHECK(st);
  const cublasLtMatmulHeuristicResult_t& result = results[size_t(want < count ? want : 0)];
  TG_CUBLAS_CHECK(result.state);
  plan->algo = result.algo;
  return plan;
}

std::string describe(const Problem& p) {
  return ::tg::detail::concat(p.type == CUDA_R_16BF ? "bf16" : "f32", p.c_type == p.type ? "" : "→f32", " gemm ", p.trans_a ? "T" : "N", p.trans_b ? "T" : "N",
                        " M=", p.M, " N=", p.N, " K=", p.K, " lda=", p.lda, " ldb=", p.ldb, " ldc=", p.ldc,
                        " batch=", p.batch, " strides=", p.stride_a, "/", p.stride_b, "/", p.stride_c,
                        " alignments=", p.align_a, "/", p.align_b, "/", p.align_c);
}

// Best plan for a problem: fused epilogue if allowed and cuBLASLt has it, else a plain GEMM, else
// (batches only) a loop over single-matrix GEMMs. Alignments already hold for every matrix of the
// batch, so the single-matrix problem keeps them. No algorithm even for one matrix is an
// internal failure.
std::unique_ptr<Plan> build_plan(const DeviceState& state, const Problem& p, bool allow_fused) {
  if (allow_fused && p.epilogue != PlanEpilogue::none && reinterpret_cast<uintptr_t>(p.bias) % kFusedBiasAlignment == 0)
    if (auto plan = make_plan(state, p, true)) return plan;
  if (auto plan = make_plan(state, p, false)) return plan;
  if (p.batch > 1) {
    Problem one = p;
    one.batch = 1, one.stride_a = one.stride_b = one.stride_c = 0;
    auto plan = build_plan(state, one, allow_fused);
    plan->per_matrix = true;
    return plan;
  }
  throw std::runtime_error("cuBLASLt heuristic found no algorithm for " + describe(p) + " at " __FILE__);
}

const char* epilogue_name(Epilogue e) {
  switch (e) {
    case Epilogue::none: return "none";
    case Epilogue::bias: return "bias";
    case Epilogue::gelu_bias: return "gelu_bias";
  }
  return "?";
}

}  // namespace

size_t gemm_workspace_bytes() { return kWorkspaceBytes; }

namespace {

// The one GEMM path: inputs of type T, C of type TC (T, or float under bf16 inputs).
template <typename T, typename TC>
void gemm_impl(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
               const T* B, int64_t ldb, float beta, TC* C, int64_t ldc, int64_t batch, int64_t stride_a,
               int64_t stride_b, int64_t stride_c, Epilogue epilogue, const T* bias, cudaStream_t stream) {
  static_assert(std::is_same_v<T, TC> || (std::is_same_v<T, tg::bf16> && std::is_same_v<TC, float>),
                "C is the inputs' type, or fp32 under bf16 inputs");
  // Preconditions (a caller's mistake, so tg::Error with the offending values).
  TG_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0, "cuda::gemm: negative size M=", M, " N=", N, " K=", K,
           " batch=", batch);
  TG_CHECK(batch <= INT32_MAX, "cuda::gemm: batch ", batch, " exceeds cuBLASLt's int32 batch count");
  TG_CHECK(lda >= (trans_a ? M : K) && lda >= 1, "cuda::gemm: lda=", lda, " is less than the stored row length ",
           trans_a ? M : K, " of A", trans_a ? "ᵀ" : "");
  TG_CHECK(ldb >= (trans_b ? K : N) && ldb >= 1, "cuda::gemm: ldb=", ldb, " is less than the stored row length ",
           trans_b ? K : N, " of B", trans_b ? "ᵀ" : "");
  TG_CHECK(ldc >= N && ldc >= 1, "cuda::gemm: ldc=", ldc, " is less than N=", N);
  TG_CHECK(batch <= 1 || (stride_a >= 0 && stride_b >= 0 && stride_c > 0), "cuda::gemm: batched strides must be ",
           "non-negative (C's positive), got ", stride_a, "/", stride_b, "/", stride_c);
  TG_CHECK(epilogue == Epilogue::none || bias != nullptr, "cuda::gemm: epilogue ", epilogue_name(epilogue),
           " needs a bias pointer");
  TG_CHECK((std::is_same_v<T, TC>) || epilogue == Epilogue::none,
           "cuda::gemm: an epilogue needs C in the inputs' type (the bias has that type)");
  if (M == 0 || N == 0 || batch == 0) return;

  int device = 0;
  TG_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& state = device_state(device);
  const bool gelu = epilogue == Epilogue::gelu_bias;
  const T* epi_bias = epilogue == Epilogue::none ? nullptr : bias;

  if (K == 0) {  // op(A)·op(B) is an empty sum: C = act(beta·C + bias), no cuBLASLt call
    if (beta == 1.f && epilogue == Epilogue::none) return;
    launch_bias_act<TC>(C, ldc, batch > 1 ? stride_c : 0, M, N, batch, beta, reinterpret_cast<const TC*>(epi_bias),
                        gelu, stream);  // a bias only when TC is T (checked above)
    return;
  }

  const bool batched = batch > 1;
  Problem p{};
  p.type = std::is_same<T, float>::value ? CUDA_R_32F : CUDA_R_16BF;
  p.c_type = std::is_same<TC, float>::value ? CUDA_R_32F : CUDA_R_16BF;
  p.trans_a = trans_a, p.trans_b = trans_b;
  p.M = M, p.N = N, p.K = K, p.lda = lda, p.ldb = ldb, p.ldc = ldc, p.batch = batch;
  p.stride_a = batched ? stride_a : 0, p.stride_b = batched ? stride_b : 0, p.stride_c = batched ? stride_c : 0;
  p.epilogue = plan_epilogue(epilogue);
  p.align_a = alignment_bytes(A, p.stride_a * int64_t(sizeof(T)));
  p.align_b = alignment_bytes(B, p.stride_b * int64_t(sizeof(T)));
  p.align_c = alignment_bytes(C, p.stride_c * int64_t(sizeof(TC)));
  p.bias = epi_bias;
  const uint32_t align_bias = epi_bias ? alignment_bytes(epi_bias, 0) : 0;

  const PlanKey key{int64_t(p.type), int64_t(p.c_type), trans_a, trans_b, M, N, K, lda, ldb, ldc, batch, p.stride_a, p.stride_b,
                    p.stride_c, int64_t(p.epilogue), p.align_a, p.align_b, p.align_c, align_bias, 0};
  auto it = state.plans.find(key);
  if (it == state.plans.end()) it = state.plans.emplace(key, build_plan(state, p, true)).first;

  for (;;) {
    Plan& plan = *it->second;
    if (plan.fused)
      TG_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &epi_bias, sizeof(epi_bias)));
    // Operands swapped for the row-major mapping (top of file); C is both input and output.
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    const int64_t calls = plan.per_matrix ? batch : 1;
    for (int64_t i = 0; i < calls && st == CUBLAS_STATUS_SUCCESS; ++i)
      st = cublasLtMatmul(state.handle, plan.desc, &alpha, B + i * p.stride_b, plan.a, A + i * p.stride_a, plan.b,
                          &beta, C + i * p.stride_c, plan.c, C + i * p.stride_c, plan.c, &plan.algo, state.workspace,
                          kWorkspaceBytes, stream);
    if (st == CUBLAS_STATUS_NOT_SUPPORTED && plan.fused) {
      // A fused algorithm the heuristic offered but the call refuses (it refuses before launching,
      // and every call of a loop has the same configuration, so nothing ran): keep the unfused
      // plan for this key so the refusal is paid once, and run it.
      it->second = build_plan(state, p, false);
      continue;
    }
    TG_CUBLAS_CHECK(st);
    if (!plan.fused && epilogue != Epilogue::none)
      launch_bias_act<TC>(C, ldc, p.stride_c, M, N, batch, 1.f, reinterpret_cast<const TC*>(epi_bias), gelu, stream);
    return;
  }
}

}  // namespace

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, float beta, T* C, int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b,
          int64_t stride_c, Epilogue epilogue, const T* bias, cudaStream_t stream) {
  gemm_impl<T, T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, stride_a, stride_b, stride_c,
                  epilogue, bias, stream);
}

void gemm_accumulate_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const tg::bf16* A,
                         int64_t lda, const tg::bf16* B, int64_t ldb, float beta, float* C, int64_t ldc,
                         cudaStream_t stream) {
  gemm_impl<tg::bf16, float>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, 0, 0, 0,
                             Epilogue::none, nullptr, stream);
}

bool gemm_dgelu(int64_t M, int64_t N, int64_t K, const tg::bf16* A, int64_t lda, const tg::bf16* B, int64_t ldb,
                const tg::bf16* pre, tg::bf16* C, tg::bf16* dbias, cudaStream_t stream) {
  TG_CHECK(M >= 0 && N >= 0 && K >= 0, "cuda::gemm_dgelu: negative size M=", M, " N=", N, " K=", K);
  TG_CHECK(lda >= K && lda >= 1, "cuda::gemm_dgelu: lda=", lda, " is less than the row length K=", K, " of A");
  TG_CHECK(ldb >= N && ldb >= 1, "cuda::gemm_dgelu: ldb=", ldb, " is less than the row length N=", N, " of B");
  TG_CHECK(pre != nullptr && C != nullptr, "cuda::gemm_dgelu: needs the pre-activation and C");
  // An empty product, or operands outside cuBLASLt's rules for the epilogue: the caller's path.
  if (M == 0 || N == 0 || K == 0) return false;
  if (N % kAuxLdMultiple != 0 || reinterpret_cast<uintptr_t>(pre) % kFusedBiasAlignment != 0 ||
      reinterpret_cast<uintptr_t>(dbias) % kFusedBiasAlignment != 0)
    return false;

  int device = 0;
  TG_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& state = device_state(device);
  Problem p{};
  p.type = p.c_type = CUDA_R_16BF;
  p.trans_a = p.trans_b = false;
  p.M = M, p.N = N, p.K = K, p.lda = lda, p.ldb = ldb, p.ldc = N, p.batch = 1;
  p.epilogue = dbias ? PlanEpilogue::dgelu_bgrad : PlanEpilogue::dgelu;
  p.align_a = alignment_bytes(A, 0), p.align_b = alignment_bytes(B, 0), p.align_c = alignment_bytes(C, 0);
  p.bias = dbias;
  p.aux = pre;
  p.aux_ld = N;
  const PlanKey key{int64_t(p.type), int64_t(p.c_type), false, false, M, N, K, lda, ldb, N, 1, 0, 0, 0,
                    int64_t(p.epilogue), p.align_a, p.align_b, p.align_c, dbias ? alignment_bytes(dbias, 0) : 0,
                    alignment_bytes(pre, 0)};
  auto it = state.plans.find(key);
  // A null plan (no algorithm) is kept too, so the heuristic is asked once per key.
  if (it == state.plans.end()) it = state.plans.emplace(key, make_plan(state, p, true)).first;
  if (!it->second) return false;
  Plan& plan = *it->second;
  if (dbias)
    TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &dbias, sizeof(dbias)));
  TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &pre, sizeof(pre)));
  const float alpha = 1.f, beta = 0.f;  // beta = 0: C is not read
  // Operands swapped for the row-major mapping (top of file).
  const cublasStatus_t st = cublasLtMatmul(state.handle, plan.desc, &alpha, B, plan.a, A, plan.b, &beta, C, plan.c, C,
                                           plan.c, &plan.algo, state.workspace, kWorkspaceBytes, stream);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) {  // refused before launching: nothing ran
    it->second.reset();
    return false;
  }
  TG_CUBLAS_CHECK(st);
  return true;
}


template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t, int64_t, int64_t, int64_t, int64_t, Epilogue, const float*,
                          cudaStream_t);
template void gemm<tg::bf16>(bool, bool, int64_t, int64_t, int64_t, float, const tg::bf16*, int64_t, const tg::bf16*,
                             int64_t, float, tg::bf16*, int64_t, int64_t, int64_t, int64_t, int64_t, Epilogue,
                             const tg::bf16*, cudaStream_t);

}  // namespace tg::cuda
