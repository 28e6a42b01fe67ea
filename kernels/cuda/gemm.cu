// Row-major batched GEMM through cuBLASLt, with cached plans and bias/GELU/dGELU kernels for what cuBLASLt cannot fuse.
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
// GELU backward epilogues (gemm_ex, batch 1). The aux matrix (GELU's input) has C's layout: row-major
// (M, N) with aux_ld is column-major (N, M), so CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = aux_ld. Its
// element type is left at cuBLASLt's default, the output type, which is T (setting
// EPILOGUE_AUX_DATA_TYPE is documented to fail at run time for unsupported combinations). For
// DGELU_BGRAD cuBLASLt writes the bias gradient through BIAS_POINTER: one value per row of its
// column-major D (its m = our N), summed over D's columns (our M rows): exactly the per-feature bias
// gradient. The fused path is only asked for when aux_ld is a multiple of 8 (cublasLt.h requires it)
// and aux, like the bias / bias_grad vector, is 16-byte aligned; otherwise, or when the heuristic
// has nothing, a plain GEMM is followed by gelu_aux_kernel (forward) or dgelu_kernel (+ a
// fixed-order two-pass column sum for bias_grad, partial sums in the cuBLASLt workspace, which the
// stream has finished with by then).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
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

// An internal cuBLASLt failure names the status, the call, file and line (DESIGN.md convention 6).
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
// The fused epilogues are only requested for bias / bias_grad / aux pointers at least this aligned,
// and an aux leading dimension that is a multiple of kFusedAuxLdMultiple (see top of file).
constexpr uintptr_t kFusedBiasAlignment = 16;
constexpr uintptr_t kFusedAuxAlignment = 16;
constexpr int64_t kFusedAuxLdMultiple = 8;
// Rows per block of the unfused bias_grad column sum: M / kBgradRowsPerChunk partial sums per column,
// enough blocks to fill the GPU at GPT shapes (M = 1024, N = 3072: 32 × 12 blocks).
constexpr int64_t kBgradRowsPerChunk = 32;

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

// d gelu_tanh / dx, as kernels/cpu/elementwise.h gelu_backward.
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float k = 0.7978845608028654f;
  const float th = tanhf(k * (x + 0.044715f * x * x * x));
  return 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * k * (1.f + 3.f * 0.044715f * x * x);
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

// Unfused gelu_aux_bias on one (M, N) matrix: aux = beta·C + bias, C = gelu(aux). Rounding aux to T
// first and taking GELU of the rounded value keeps C and the aux the backward will see consistent.
// beta == 0 does not read C. Grid as bias_act_kernel.
template <typename T>
__global__ void gelu_aux_kernel(T* C, int64_t ldc, T* aux, int64_t aux_ld, int64_t M, int64_t N, float beta,
                                const T* bias) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const float b = load_f(bias + n);
  for (int64_t r = blockIdx.y; r < M; r += gridDim.y) {
    T* c = C + r * ldc + n;
    T* x = aux + r * aux_ld + n;
    store_f(x, (beta == 0.f ? 0.f : beta * load_f(c)) + b);
    store_f(c, gelu_tanh(load_f(x)));
  }
}

// Unfused dgelu on one (M, N) matrix: C = C ∘ gelu'(aux), block (x, y) covering columns
// [x·blockDim, …) and rows [y·rows_per_chunk, …). With `partial`, each thread also sums the stored
// C values of its column over its rows, in row order, into partial[y·N + n]; with `bias_grad`
// (one chunk covers every row) that sum is the result and goes straight to bias_grad[n].
template <typename T>
__global__ void dgelu_kernel(T* C, int64_t ldc, const T* aux, int64_t aux_ld, int64_t M, int64_t N,
                             int64_t rows_per_chunk, float* partial, T* bias_grad) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < M ? r0 + rows_per_chunk : M;
  float sum = 0.f;
  for (int64_t r = r0; r < r1; ++r) {
    T* c = C + r * ldc + n;
    store_f(c, load_f(c) * gelu_tanh_grad(load_f(aux + r * aux_ld + n)));
    sum += load_f(c);
  }
  if (partial) partial[int64_t(blockIdx.y) * N + n] = sum;
  if (bias_grad) store_f(bias_grad + n, sum);
}

// bias_grad[n] = Σ_chunk partial[chunk·N + n], in chunk order (second pass of dgelu_kernel's sum).
template <typename T>
__global__ void column_sum_kernel(const float* partial, int64_t chunks, int64_t N, T* bias_grad) {
  const int64_t n = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= N) return;
  float sum = 0.f;
  for (int64_t i = 0; i < chunks; ++i) sum += partial[i * N + n];
  store_f(bias_grad + n, sum);
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

template <typename T>
void launch_gelu_aux(T* C, int64_t ldc, T* aux, int64_t aux_ld, int64_t M, int64_t N, float beta, const T* bias,
                     cudaStream_t stream) {
  using D = typename device_type<T>::type;
  const int threads = 256;
  dim3 grid(unsigned((N + threads - 1) / threads), unsigned(M < 65535 ? M : 65535));
  gelu_aux_kernel<D><<<grid, threads, 0, stream>>>(reinterpret_cast<D*>(C), ldc, reinterpret_cast<D*>(aux), aux_ld, M,
                                                   N, beta, reinterpret_cast<const D*>(bias));
  TG_CUDA_CHECK(cudaGetLastError());
}

// C = C ∘ gelu'(aux), and with bias_grad its column sums. The chunking depends only on M and N, so
// the summation order, and the bits, are fixed for a shape. `workspace` (workspace_bytes) holds the
// partial sums; when it cannot hold kBgradRowsPerChunk-row chunks, the chunks grow.
template <typename T>
void launch_dgelu(T* C, int64_t ldc, const T* aux, int64_t aux_ld, int64_t M, int64_t N, T* bias_grad,
                  void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  using D = typename device_type<T>::type;
  const int threads = 256;
  const unsigned col_blocks = unsigned((N + threads - 1) / threads);
  D* c = reinterpret_cast<D*>(C);
  const D* x = reinterpret_cast<const D*>(aux);
  if (!bias_grad) {
    const int64_t blocks_y = std::min<int64_t>((M + kBgradRowsPerChunk - 1) / kBgradRowsPerChunk, 65535);
    dim3 grid(col_blocks, unsigned(blocks_y));
    const int64_t rows = (M + blocks_y - 1) / blocks_y;
    dgelu_kernel<D><<<grid, threads, 0, stream>>>(c, ldc, x, aux_ld, M, N, rows, nullptr, nullptr);
    TG_CUDA_CHECK(cudaGetLastError());
    return;
  }
  int64_t max_chunks = int64_t(workspace_bytes / (sizeof(float) * size_t(N)));
  if (max_chunks > 65535) max_chunks = 65535;
  int64_t chunks = (M + kBgradRowsPerChunk - 1) / kBgradRowsPerChunk;
  if (chunks > max_chunks) chunks = max_chunks > 1 ? max_chunks : 1;
  const int64_t rows = (M + chunks - 1) / chunks;
  chunks = (M + rows - 1) / rows;
  D* bg = reinterpret_cast<D*>(bias_grad);
  if (chunks == 1) {
    dgelu_kernel<D><<<dim3(col_blocks, 1), threads, 0, stream>>>(c, ldc, x, aux_ld, M, N, rows, nullptr, bg);
    TG_CUDA_CHECK(cudaGetLastError());
    return;
  }
  float* partial = static_cast<float*>(workspace);
  dgelu_kernel<D><<<dim3(col_blocks, unsigned(chunks)), threads, 0, stream>>>(c, ldc, x, aux_ld, M, N, rows, partial,
                                                                               nullptr);
  TG_CUDA_CHECK(cudaGetLastError());
  column_sum_kernel<D><<<col_blocks, threads, 0, stream>>>(partial, chunks, N, bg);
  TG_CUDA_CHECK(cudaGetLastError());
}

// Everything that decides the heuristic's choice: dtype, transposes, sizes, leading dimensions,
// batch and strides (0 when batch == 1), epilogue, the aux leading dimension (0 without aux), and
// the pointer alignments (in bytes, capped at 256; 0 for an absent pointer) that the algorithm may
// rely on: A, B, C, the epilogue vector (bias or bias_grad) and aux.
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
// whether the epilogue runs inside cuBLASLt; if not, the epilogue kernels apply it afterwards.
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
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans;
};

// Guards the device map and the plan caches (the bias / aux pointers are set on a cached descriptor
// per call). Uncontended in training, so its cost is a few tens of nanoseconds per GEMM.
std::mutex g_mutex;
std::unordered_map<int, DeviceState*> g_devices;
thread_local bool t_last_fused = false;  // see gemm_last_call_fused

DeviceState& device_state(int device) {  // caller holds g_mutex
  auto it = g_devices.find(device);
  if (it != g_devices.end()) return *it->second;
  auto state = std::make_unique<DeviceState>();
  TG_CUBLAS_CHECK(cublasLtCreate(&state->handle));
  TG_CUDA_CHECK(cudaMalloc(&state->workspace, kWorkspaceBytes));
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
  cudaDataType_t type;
  bool trans_a, trans_b;
  int64_t M, N, K, lda, ldb, ldc, batch, stride_a, stride_b, stride_c;
  Epilogue epilogue;
  uint32_t align_a, align_b, align_c;
  const void* bias;  // the epilogue's vector: bias (read) or, for dgelu_bgrad, bias_grad (written)
  const void* aux;   // gelu_aux_bias / dgelu / dgelu_bgrad only
  int64_t aux_ld;
};

bool uses_aux(Epilogue e) { return e == Epilogue::gelu_aux_bias || e == Epilogue::dgelu || e == Epilogue::dgelu_bgrad; }
bool uses_vector(Epilogue e) { return e != Epilogue::none && e != Epilogue::dgelu; }

cublasLtEpilogue_t lt_epilogue(Epilogue e) {
  switch (e) {
    case Epilogue::none: return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::bias: return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::gelu_bias: return CUBLASLT_EPILOGUE_GELU_BIAS;
    case Epilogue::gelu_aux_bias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case Epilogue::dgelu: return CUBLASLT_EPILOGUE_DGELU;
    case Epilogue::dgelu_bgrad: return CUBLASLT_EPILOGUE_DGELU_BGRAD;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

// Sets the per-call epilogue pointers on a fused plan's descriptor (the heuristic also read them,
// for their alignment, when the plan was made).
void set_epilogue_pointers(cublasLtMatmulDesc_t desc, Epilogue e, const void* vec, const void* aux, int64_t aux_ld) {
  if (uses_vector(e))
    TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec, sizeof(vec)));
  if (uses_aux(e)) {
    TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
  }
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

// Builds the descriptors and asks the heuristic for its best algorithm; null when it has none
// (with `fused`, that sends the caller to the unfused plan).
std::unique_ptr<Plan> make_plan(cublasLtHandle_t handle, const Problem& p, bool fused) {
  auto plan = std::make_unique<Plan>();
  plan->fused = fused;
  // fp32 compute for both types: for fp32 inputs CUBLAS_COMPUTE_32F excludes TF32.
  TG_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  int32_t op_a = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  int32_t op_b = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our A
  TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (fused) {
    uint32_t epi = lt_epilogue(p.epilogue);
    TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (uses_vector(p.epilogue)) {  // bias, or the bias gradient: both of type T (cublasLt.h)
      int32_t bias_type = p.type;
      TG_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                     sizeof(bias_type)));
    }
    // The heuristic reads the bias and aux pointers' values for their alignment (cublasLt.h);
    // BIAS_BATCH_STRIDE stays 0, so every matrix of a batch gets the same bias.
    set_epilogue_pointers(plan->desc, p.epilogue, p.bias, p.aux, p.aux_ld);
  }
  // Stored shapes seen column-major: our B (K, N) row-major is (N, K) column-major, etc.
  plan->a = make_layout(p.type, p.trans_b ? p.K : p.N, p.trans_b ? p.N : p.K, p.ldb, p.batch, p.stride_b);
  plan->b = make_layout(p.type, p.trans_a ? p.M : p.K, p.trans_a ? p.K : p.M, p.lda, p.batch, p.stride_a);
  plan->c = make_layout(p.type, p.N, p.M, p.ldc, p.batch, p.stride_c);

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

  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1,
                                                     &result, &count);
  // NOT_SUPPORTED is how the heuristic says "nothing for this configuration".
  if (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && count == 0)) return nullptr;
  TG_CUBLAS_CHECK(st);
  TG_CUBLAS_CHECK(result.state);
  plan->algo = result.algo;
  return plan;
}

std::string describe(const Problem& p) {
  return ::tg::detail::concat(p.type == CUDA_R_16BF ? "bf16" : "f32", " gemm ", p.trans_a ? "T" : "N", p.trans_b ? "T" : "N",
                        " M=", p.M, " N=", p.N, " K=", p.K, " lda=", p.lda, " ldb=", p.ldb, " ldc=", p.ldc,
                        " batch=", p.batch, " strides=", p.stride_a, "/", p.stride_b, "/", p.stride_c,
                        " alignments=", p.align_a, "/", p.align_b, "/", p.align_c, " epilogue=",
                        int(p.epilogue), " aux_ld=", p.aux_ld);
}

// Best plan for a problem: fused epilogue if allowed and cuBLASLt has it, else a plain GEMM, else
// (batches only) a loop over single-matrix GEMMs. Alignments already hold for every matrix of the
// batch, so the single-matrix problem keeps them. No algorithm even for one matrix is an
// internal failure.
// Whether the fused epilogue may be asked for at all (see top of file); the heuristic still decides.
bool fusable(const Problem& p) {
  if (p.epilogue == Epilogue::none) return false;
  if (uses_vector(p.epilogue) && reinterpret_cast<uintptr_t>(p.bias) % kFusedBiasAlignment != 0) return false;
  if (uses_aux(p.epilogue) && (reinterpret_cast<uintptr_t>(p.aux) % kFusedAuxAlignment != 0 ||
                               p.aux_ld % kFusedAuxLdMultiple != 0 || p.batch > 1))
    return false;
  return true;
}

std::unique_ptr<Plan> build_plan(cublasLtHandle_t handle, const Problem& p, bool allow_fused) {
  if (allow_fused && fusable(p))
    if (auto plan = make_plan(handle, p, true)) return plan;
  if (auto plan = make_plan(handle, p, false)) return plan;
  if (p.batch > 1) {
    Problem one = p;
    one.batch = 1, one.stride_a = one.stride_b = one.stride_c = 0;
    auto plan = build_plan(handle, one, allow_fused);
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
    case Epilogue::gelu_aux_bias: return "gelu_aux_bias";
    case Epilogue::dgelu: return "dgelu";
    case Epilogue::dgelu_bgrad: return "dgelu_bgrad";
  }
  return "?";
}

// The GEMM behind gemm and gemm_ex, arguments already checked. aux / aux_ld / bias_grad are only
// read for the aux epilogues (batch 1). Picks (or builds and caches) the plan, runs cuBLASLt, then
// the unfused epilogue kernel when the plan is not fused.
template <typename T>
void run_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
              const T* B, int64_t ldb, float beta, T* C, int64_t ldc, int64_t batch, int64_t stride_a,
              int64_t stride_b, int64_t stride_c, Epilogue epilogue, const T* bias, T* aux, int64_t aux_ld,
              T* bias_grad, cudaStream_t stream) {
  const bool with_aux = uses_aux(epilogue);
  const bool with_bgrad = epilogue == Epilogue::dgelu_bgrad;
  t_last_fused = false;
  if (N == 0 || batch == 0) return;
  if (with_bgrad && (M == 0 || K == 0)) {  // the gradient of an empty sum: zeros (and C too, below)
    TG_CUDA_CHECK(cudaMemsetAsync(bias_grad, 0, size_t(N) * sizeof(T), stream));
  }
  if (M == 0) return;

  int device = 0;
  TG_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& state = device_state(device);
  const bool gelu = epilogue == Epilogue::gelu_bias;
  // The epilogue's vector: bias it reads, or the bias gradient dgelu_bgrad writes.
  const T* epi_vec = with_bgrad ? bias_grad : (uses_vector(epilogue) ? bias : nullptr);
  const T* epi_aux = with_aux ? aux : nullptr;
  const int64_t epi_aux_ld = with_aux ? aux_ld : 0;

  if (K == 0) {  // op(A)·op(B) is an empty sum, no cuBLASLt call
    switch (epilogue) {
      case Epilogue::none:
        if (beta == 1.f) return;
        [[fallthrough]];
      case Epilogue::bias:
      case Epilogue::gelu_bias:  // C = act(beta·C + bias)
        launch_bias_act(C, ldc, batch > 1 ? stride_c : 0, M, N, batch, beta, epi_vec, gelu, stream);
        return;
      case Epilogue::gelu_aux_bias:
        launch_gelu_aux(C, ldc, aux, aux_ld, M, N, beta, bias, stream);
        return;
      case Epilogue::dgelu:
      case Epilogue::dgelu_bgrad:  // C = 0 ∘ gelu'(aux) = 0 (beta is 0); bias_grad zeroed above
        TG_CUDA_CHECK(cudaMemset2DAsync(C, size_t(ldc) * sizeof(T), 0, size_t(N) * sizeof(T), size_t(M), stream));
        return;
    }
  }

  const bool batched = batch > 1;
  Problem p{};
  p.type = std::is_same<T, float>::value ? CUDA_R_32F : CUDA_R_16BF;
  p.trans_a = trans_a, p.trans_b = trans_b;
  p.M = M, p.N = N, p.K = K, p.lda = lda, p.ldb = ldb, p.ldc = ldc, p.batch = batch;
  p.stride_a = batched ? stride_a : 0, p.stride_b = batched ? stride_b : 0, p.stride_c = batched ? stride_c : 0;
  p.epilogue = epilogue;
  p.align_a = alignment_bytes(A, p.stride_a * int64_t(sizeof(T)));
  p.align_b = alignment_bytes(B, p.stride_b * int64_t(sizeof(T)));
  p.align_c = alignment_bytes(C, p.stride_c * int64_t(sizeof(T)));
  p.bias = epi_vec;
  p.aux = epi_aux;
  p.aux_ld = epi_aux_ld;
  const uint32_t align_vec = epi_vec ? alignment_bytes(epi_vec, 0) : 0;
  const uint32_t align_aux = epi_aux ? alignment_bytes(epi_aux, 0) : 0;

  const PlanKey key{int64_t(p.type), trans_a,    trans_b,    M,         N,         K,         lda,
                    ldb,             ldc,        batch,      p.stride_a, p.stride_b, p.stride_c, int64_t(epilogue),
                    p.align_a,       p.align_b,  p.align_c,  align_vec, epi_aux_ld, align_aux};
  auto it = state.plans.find(key);
  if (it == state.plans.end()) it = state.plans.emplace(key, build_plan(state.handle, p, true)).first;

  for (;;) {
    Plan& plan = *it->second;
    if (plan.fused) set_epilogue_pointers(plan.desc, epilogue, epi_vec, epi_aux, epi_aux_ld);
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
      it->second = build_plan(state.handle, p, false);
      continue;
    }
    TG_CUBLAS_CHECK(st);
    if (plan.fused) {
      t_last_fused = epilogue != Epilogue::none;
      return;
    }
    switch (epilogue) {  // C now holds alpha·op(A)op(B) + beta·C
      case Epilogue::none: break;
      case Epilogue::bias:
      case Epilogue::gelu_bias:
        launch_bias_act(C, ldc, p.stride_c, M, N, batch, 1.f, epi_vec, gelu, stream);
        break;
      case Epilogue::gelu_aux_bias: launch_gelu_aux(C, ldc, aux, aux_ld, M, N, 1.f, bias, stream); break;
      case Epilogue::dgelu:
      case Epilogue::dgelu_bgrad:
        // Stream order: cuBLASLt is done with the workspace before these kernels use it.
        launch_dgelu(C, ldc, aux, aux_ld, M, N, with_bgrad ? bias_grad : nullptr, state.workspace, kWorkspaceBytes,
                     stream);
        break;
    }
    return;
  }
}

// Checks shared by gemm and gemm_ex (a caller's mistake, so tg::Error with the offending values).
void check_common(const char* fn, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda,
                  int64_t ldb, int64_t ldc, int64_t batch) {
  TG_CHECK(M >= 0 && N >= 0 && K >= 0 && batch >= 0, fn, ": negative size M=", M, " N=", N, " K=", K,
           " batch=", batch);
  TG_CHECK(batch <= INT32_MAX, fn, ": batch ", batch, " exceeds cuBLASLt's int32 batch count");
  TG_CHECK(lda >= (trans_a ? M : K) && lda >= 1, fn, ": lda=", lda, " is less than the stored row length ",
           trans_a ? M : K, " of A", trans_a ? "ᵀ" : "");
  TG_CHECK(ldb >= (trans_b ? K : N) && ldb >= 1, fn, ": ldb=", ldb, " is less than the stored row length ",
           trans_b ? K : N, " of B", trans_b ? "ᵀ" : "");
  TG_CHECK(ldc >= N && ldc >= 1, fn, ": ldc=", ldc, " is less than N=", N);
}

}  // namespace

size_t gemm_workspace_bytes() { return kWorkspaceBytes; }

bool gemm_last_call_fused() { return t_last_fused; }

template <typename T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, float beta, T* C, int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b,
          int64_t stride_c, Epilogue epilogue, const T* bias, cudaStream_t stream) {
  check_common("cuda::gemm", trans_a, trans_b, M, N, K, lda, ldb, ldc, batch);
  TG_CHECK(batch <= 1 || (stride_a >= 0 && stride_b >= 0 && stride_c > 0), "cuda::gemm: batched strides must be ",
           "non-negative (C's positive), got ", stride_a, "/", stride_b, "/", stride_c);
  TG_CHECK(!uses_aux(epilogue), "cuda::gemm: epilogue ", epilogue_name(epilogue),
           " needs an aux matrix; call cuda::gemm_ex");
  TG_CHECK(epilogue == Epilogue::none || bias != nullptr, "cuda::gemm: epilogue ", epilogue_name(epilogue),
           " needs a bias pointer");
  run_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, stride_a, stride_b, stride_c,
           epilogue, bias, static_cast<T*>(nullptr), int64_t(0), static_cast<T*>(nullptr), stream);
}

template <typename T>
void gemm_ex(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
             const T* B, int64_t ldb, float beta, T* C, int64_t ldc, Epilogue epilogue, const T* bias, T* aux,
             int64_t aux_ld, T* bias_grad, cudaStream_t stream) {
  check_common("cuda::gemm_ex", trans_a, trans_b, M, N, K, lda, ldb, ldc, 1);
  const char* name = epilogue_name(epilogue);
  const bool needs_bias = epilogue == Epilogue::bias || epilogue == Epilogue::gelu_bias ||
                          epilogue == Epilogue::gelu_aux_bias;
  TG_CHECK(!needs_bias || bias != nullptr, "cuda::gemm_ex: epilogue ", name, " needs a bias pointer");
  if (uses_aux(epilogue)) {
    TG_CHECK(aux != nullptr, "cuda::gemm_ex: epilogue ", name, " needs an aux pointer");
    TG_CHECK(aux_ld >= N && aux_ld >= 1, "cuda::gemm_ex: aux_ld=", aux_ld, " is less than N=", N);
  }
  TG_CHECK(epilogue != Epilogue::dgelu_bgrad || bias_grad != nullptr, "cuda::gemm_ex: epilogue ", name,
           " needs a bias_grad pointer");
  TG_CHECK((epilogue != Epilogue::dgelu && epilogue != Epilogue::dgelu_bgrad) || beta == 0.f,
           "cuda::gemm_ex: epilogue ", name, " needs beta = 0 (got ", beta,
           "); accumulate into a separate buffer instead");
  run_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, 0, 0, 0, epilogue, bias, aux, aux_ld,
           bias_grad, stream);
}

template void gemm<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t,
                          float, float*, int64_t, int64_t, int64_t, int64_t, int64_t, Epilogue, const float*,
                          cudaStream_t);
template void gemm<tg::bf16>(bool, bool, int64_t, int64_t, int64_t, float, const tg::bf16*, int64_t, const tg::bf16*,
                             int64_t, float, tg::bf16*, int64_t, int64_t, int64_t, int64_t, int64_t, Epilogue,
                             const tg::bf16*, cudaStream_t);
template void gemm_ex<float>(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*,
                             int64_t, float, float*, int64_t, Epilogue, const float*, float*, int64_t, float*,
                             cudaStream_t);
template void gemm_ex<tg::bf16>(bool, bool, int64_t, int64_t, int64_t, float, const tg::bf16*, int64_t,
                                const tg::bf16*, int64_t, float, tg::bf16*, int64_t, Epilogue, const tg::bf16*,
                                tg::bf16*, int64_t, tg::bf16*, cudaStream_t);

}  // namespace tg::cuda
