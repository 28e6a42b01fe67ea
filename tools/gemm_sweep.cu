// gemm_sweep: times every cuBLASLt algorithm candidate for the GEMMs of one GPT-2-small training step.
//
// What it measures
//   For each GEMM of a GPT-2-small (124M) bf16 training step at batch 16 × 1024 tokens (the
//   forward linears, their dX and dW products, and the LM head), it builds the cuBLASLt problem
//   exactly as kernels/cuda/gemm.cu does (make_plan: same operand swap, layouts, compute/scale
//   types, epilogue, workspace and alignment preferences), asks the heuristic for up to 8
//   algorithms instead of the 1 that gemm.cu asks for, and times each of them. Candidate 0 is what
//   gemm.cu runs today (the tool checks that a 1-result query returns the same algorithm), so
//   "best/0" is the speed-up available from picking a different heuristic candidate.
//   Each dW shape is also swept with C/D in fp32 and beta = 1 (accumulating straight into an fp32
//   gradient buffer, as gemm_accumulate_f32 does), or beta = 0 with --f32-beta 0 (the step's first
//   write of that buffer), as an alternative to the bf16 dW with beta = 0.
//   Extra shapes, swept only when named with --only: the LM head computed in row chunks of 4096
//   or 8192 rows ("fwd lm_head c4096", "dX lm_head c4096", "dW lm_head c4096 f32", and the same
//   with c8192), run 4 or 2 times per step; they are left out of the step totals.
//
// How it times (robust against clock drift: the H200 runs at its power cap, so its clocks change
// while the sweep runs, and one candidate timed after another would carry that drift)
//   Each shape is timed in R interleaved rounds (--rounds N; default 5). A round times every
//   candidate once: 2 warm-up calls, then 20 calls between one pair of events, giving the mean µs
//   per call. Round r visits the candidates in rotated order, starting at candidate r mod count,
//   so no candidate is always first (or always last). Per candidate the tool reports the MINIMUM
//   over the rounds (the figure every decision uses) and the median, TFLOP/s from the minimum,
//   min/min(candidate 0) and median/median(candidate 0), and max/min over the rounds (its noise).
//   "best" is the candidate with the lowest minimum; "sure" says whether best beats candidate 0
//   by more than 2 % in BOTH its minimum and its median (so "sure = no" also when best is 0).
//
// Run time
//   Default: 5 rounds over the 20 default shapes; estimated (not measured) at about 25-35 s on an
//   H200. One round is 20 shapes × 8 candidates × 22 calls: summing the earlier single-pass run's
//   per-call times gives about 1.55 s of GEMMs per round (mostly the four 16384-row LM-head
//   shapes at about 1.6-2.2 ms a call), so 5 rounds are about 8 s of GEMMs. The rest is one-time
//   start-up: CUDA context, cuBLASLt, the heuristic queries and the first load of each kernel
//   (untimed, in round 0's warm-up), which made up most of the earlier single pass's ~20 s; it
//   does not grow with the rounds. The tool prints the set-up time, each shape's time and the
//   total. Should a run take longer than 90 s, use --rounds 3.
//
// How to run (on the GPU machine; the binary is built for Hopper only):
//   nvcc -O2 -std=c++17 -arch=sm_90a tools/gemm_sweep.cu -lcublasLt -o /tmp/gemm_sweep && /tmp/gemm_sweep
// Options:
//   --rounds N              rounds per shape (default 5, at least 1)
//   --only NAME[,NAME...]   sweep only these shapes (in the tool's order); a name may be written
//                           with spaces (quote it) or with '_' for each space, as the TABLE lines
//                           print it: --only "fwd qkv,dX lm_head c4096" or --only fwd_qkv,dX_lm_head_c4096
//   --f32-beta B            beta of the shapes with an fp32 C: 1 (default) times a weight gradient
//                           added into the fp32 gradient, 0 one written there (its first write
//                           in a step: ParameterStore::zero_grad_at_first_write)
//   --list                  print the shape names (default set and extras) and exit
//
// Output
//   Per shape: one line per candidate with its index, min and median µs per call over the
//   rounds, TFLOP/s (2·M·N·K / min), min/min0 and med/med0 (< 1 is faster than candidate 0),
//   max/min over the rounds, the algorithm's configuration from
//   cublasLtMatmulAlgoConfigGetAttribute plus the heuristic's wavesCount and workspace size, and
//   the per-round µs (in round order). Tile, stages and cluster ids are the raw enum values of
//   cublasLtMatmulTile_t, cublasLtMatmulStages_t and cublasLtClusterShape_t; decode them with e.g.
//     grep -n "= 24,$" /usr/local/cuda/include/cublasLt.h
//   A summary lists candidate 0 vs the best candidate per shape and the step totals, each shape
//   weighted by how often it runs per step (12 layers, or once for the LM head): with candidate
//   0 everywhere, with the best everywhere, and with the best only where it is "sure".
//   Then one machine-readable line per shape (grep '^TABLE '):
//     TABLE <name> <transa> <transb> <M> <N> <K> <ctype> <epilogue> <best> <best min us> <cand0 min us> <sure>
//   name: the shape's name with '_' for each space; transa/transb: N or T, the row-major
//   trans_a/trans_b of gemm.h (not cuBLASLt's swapped ones); M N K: gemm.h's; ctype: f32 or bf16
//   (C/D type; f32 means beta = 1 or --f32-beta's, bf16 beta = 0); epilogue: bias when the fused bias epilogue was
//   swept, none otherwise (also for a bias shape whose heuristic offers no fused algorithm);
//   best: the candidate index (-1: none ran); times in µs with two decimals, '-' where there is
//   none (candidate 0 failed, or nothing ran; sure is then no); sure: yes or no.
//   Last, the total run time.
//
// Candidates that cublasLtMatmul refuses are reported and dropped. Any other CUDA or cuBLASLt
// failure names the call and line and exits.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// ---------------------------------------------------------------------------------------------
// Error checks: a failing call prints itself, the status and the line, then exits.
// ---------------------------------------------------------------------------------------------

#define CHECK_CUDA(call)                                                                              \
  do {                                                                                                \
    cudaError_t err_ = (call);                                                                        \
    if (err_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "CUDA error %s (%s) in %s at %s:%d\n", cudaGetErrorName(err_),             \
                   cudaGetErrorString(err_), #call, __FILE__, __LINE__);                              \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

#define CHECK_CUBLAS(call)                                                                            \
  do {                                                                                                \
    cublasStatus_t st_ = (call);                                                                      \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                               \
      std::fprintf(stderr, "cuBLASLt error %s (%s) in %s at %s:%d\n", cublasLtGetStatusName(st_),     \
                   cublasLtGetStatusString(st_), #call, __FILE__, __LINE__);                          \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace {

// ---------------------------------------------------------------------------------------------
// Settings (the first two match kernels/cuda/gemm.cu)
// ---------------------------------------------------------------------------------------------

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // gemm.cu's kWorkspaceBytes
// gemm.cu passes each pointer's actual alignment, capped at 256 bytes. cudaMalloc'd buffers (and
// the training step's tensors) are 256-byte aligned, so every MIN_ALIGNMENT_* is 256 here.
constexpr uint32_t kAlignmentBytes = 256;
constexpr int kMaxCandidates = 8;  // heuristic results requested (gemm.cu requests 1)
constexpr int kWarmupCalls = 2;    // per candidate and round
constexpr int kTimedCalls = 20;    // per candidate and round, between one pair of events
constexpr int kDefaultRounds = 5;
constexpr double kSureMargin = 0.02;  // "sure": best is faster than candidate 0 by more than this, min and median

// GPT-2 small at batch 16 × sequence 1024.
constexpr int64_t kRows = 16 * 1024;  // B·T, the M (or K, for dW) of every GEMM
constexpr int64_t kC = 768;           // d_model
constexpr int64_t kV = 50304;         // padded vocabulary
constexpr int kLayers = 12;

// ---------------------------------------------------------------------------------------------
// The GEMMs of one step
// ---------------------------------------------------------------------------------------------

// Which step total a shape belongs to: forward and dX shapes count in both, and the dW shapes
// count in the total for their C type (bf16 dW with beta = 0 as today, or fp32 dW with beta = 1).
// Extra shapes (the chunked LM head) count in neither.
enum class Role { fwd_dx, dw_bf16, dw_f32, extra };

// Row-major C (M, N) = op(A) (M, K) · op(B) (K, N), gemm.h's convention, with bf16 A and B.
// Leading dimensions are the stored row lengths: lda = trans_a ? M : K, ldb = trans_b ? K : N,
// ldc = N (what src/ops/linear.cpp passes for contiguous tensors).
struct Shape {
  std::string name;
  bool trans_a, trans_b;
  int64_t M, N, K;
  bool bias;   // fused CUBLASLT_EPILOGUE_BIAS with a bf16 bias of N (linear forward with bias)
  bool c_f32;  // C/D in fp32 with beta = 1; otherwise C/D in bf16 with beta = 0
  int count;   // times per training step
  Role role;
  bool by_default;  // swept without --only

  int64_t lda() const { return trans_a ? M : K; }
  int64_t ldb() const { return trans_b ? K : N; }
  int64_t ldc() const { return N; }
  // Elements of the stored matrices (rows × leading dimension).
  int64_t a_elems() const { return (trans_a ? K : M) * lda(); }
  int64_t b_elems() const { return (trans_b ? N : K) * ldb(); }
  size_t c_bytes() const { return size_t(M * ldc()) * (c_f32 ? sizeof(float) : sizeof(__nv_bfloat16)); }
  double flops() const { return 2.0 * double(M) * double(N) * double(K); }
};

// The name with '_' for each space: one token, as the TABLE lines print it and --only accepts it.
std::string token_name(const std::string& name) {
  std::string t = name;
  std::replace(t.begin(), t.end(), ' ', '_');
  return t;
}

// All shapes: the default set (one step), then the extras that only --only selects.
std::vector<Shape> all_shapes() {
  std::vector<Shape> s;
  // Forward: out (rows, N) = x (rows, K) · Wᵀ, W stored (N, K).
  s.push_back({"fwd qkv", false, true, kRows, 3 * kC, kC, true, false, kLayers, Role::fwd_dx, true});
  s.push_back({"fwd attn.proj", false, true, kRows, kC, kC, true, false, kLayers, Role::fwd_dx, true});
  s.push_back({"fwd mlp.fc", false, true, kRows, 4 * kC, kC, true, false, kLayers, Role::fwd_dx, true});
  s.push_back({"fwd mlp.proj", false, true, kRows, kC, 4 * kC, true, false, kLayers, Role::fwd_dx, true});
  s.push_back({"fwd lm_head", false, true, kRows, kV, kC, false, false, 1, Role::fwd_dx, true});
  // Backward dX (rows, in) = g (rows, out) · W (out, in).
  s.push_back({"dX qkv", false, false, kRows, kC, 3 * kC, false, false, kLayers, Role::fwd_dx, true});
  s.push_back({"dX attn.proj", false, false, kRows, kC, kC, false, false, kLayers, Role::fwd_dx, true});
  s.push_back({"dX mlp.fc", false, false, kRows, kC, 4 * kC, false, false, kLayers, Role::fwd_dx, true});
  s.push_back({"dX mlp.proj", false, false, kRows, 4 * kC, kC, false, false, kLayers, Role::fwd_dx, true});
  s.push_back({"dX lm_head", false, false, kRows, kC, kV, false, false, 1, Role::fwd_dx, true});
  // Backward dW (out, in) = gᵀ (out, rows) · x (rows, in), g stored (rows, out): bf16 C with
  // beta = 0 (today), then the same products into an fp32 C with beta = 1.
  struct Dw { const char* bf16_name; const char* f32_name; int64_t out, in; int count; };
  const Dw dws[] = {{"dW qkv", "dW qkv f32", 3 * kC, kC, kLayers},
                    {"dW attn.proj", "dW attn.proj f32", kC, kC, kLayers},
                    {"dW mlp.fc", "dW mlp.fc f32", 4 * kC, kC, kLayers},
                    {"dW mlp.proj", "dW mlp.proj f32", kC, 4 * kC, kLayers},
                    {"dW lm_head", "dW lm_head f32", kV, kC, 1}};
  for (const Dw& d : dws)
    s.push_back({d.bf16_name, true, false, d.out, d.in, kRows, false, false, d.count, Role::dw_bf16, true});
  for (const Dw& d : dws)
    s.push_back({d.f32_name, true, false, d.out, d.in, kRows, false, true, d.count, Role::dw_f32, true});
  // Extras: the LM head in row chunks (logits of `rows` rows at a time), kRows / rows chunks per
  // step; the chunk's dW accumulates into the fp32 gradient (beta = 1).
  for (int64_t rows : {int64_t(4096), int64_t(8192)}) {
    const std::string c = " c" + std::to_string(rows);
    const int chunks = int(kRows / rows);
    s.push_back({"fwd lm_head" + c, false, true, rows, kV, kC, false, false, chunks, Role::extra, false});
    s.push_back({"dX lm_head" + c, false, false, rows, kC, kV, false, false, chunks, Role::extra, false});
    s.push_back({"dW lm_head" + c + " f32", true, false, kV, kC, rows, false, true, chunks, Role::extra, false});
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// cuBLASLt problem, built as kernels/cuda/gemm.cu's make_plan builds it
// ---------------------------------------------------------------------------------------------

// Descriptors of one matmul; destroyed with the object.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulPreference_t pref = nullptr;
  bool fused = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

// gemm.cu's make_layout for batch == 1 (no batch attributes are set).
cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t layout = nullptr;
  CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
  return layout;
}

// Row-major C = op(A)·op(B) is column-major Cᵀ = op(B)ᵀ·op(A)ᵀ: cuBLASLt's A is our B (TRANSA =
// our trans_b), its B is our A (TRANSB = our trans_a), and its (m, n, k) is our (N, M, K).
void build_plan(Plan& plan, const Shape& s, bool fused, const void* bias) {
  const cudaDataType_t type = CUDA_R_16BF;
  const cudaDataType_t c_type = s.c_f32 ? CUDA_R_32F : CUDA_R_16BF;
  plan.fused = fused;
  CHECK_CUBLAS(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  int32_t op_a = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our B
  int32_t op_b = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our A
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (fused) {
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    int32_t bias_type = type;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    CHECK_CUBLAS(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    // Set before the heuristic call, as gemm.cu does: the heuristic reads the pointer's alignment.
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }
  plan.a = make_layout(type, s.trans_b ? s.K : s.N, s.trans_b ? s.N : s.K, s.ldb());
  plan.b = make_layout(type, s.trans_a ? s.M : s.K, s.trans_a ? s.K : s.M, s.lda());
  plan.c = make_layout(c_type, s.N, s.M, s.ldc());

  CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&plan.pref));
  uint64_t ws = kWorkspaceBytes;
  CHECK_CUBLAS(
      cublasLtMatmulPreferenceSetAttribute(plan.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  uint32_t al = kAlignmentBytes;  // A, B, C and D alike (gemm.cu swaps A's and B's, equal here)
  for (cublasLtMatmulPreferenceAttributes_t attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(plan.pref, attr, &al, sizeof(al)));
}

// Up to `wanted` heuristic results for the plan; none when the heuristic has nothing (it says so
// with NOT_SUPPORTED or a count of 0, which gemm.cu treats alike).
std::vector<cublasLtMatmulHeuristicResult_t> heuristic(cublasLtHandle_t handle, const Plan& plan, int wanted) {
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(wanted));
  int count = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, plan.desc, plan.a, plan.b, plan.c, plan.c, plan.pref,
                                                     wanted, results.data(), &count);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED) count = 0;
  else CHECK_CUBLAS(st);
  results.resize(size_t(count));
  for (const auto& r : results) CHECK_CUBLAS(r.state);
  return results;
}

// ---------------------------------------------------------------------------------------------
// Algorithm configuration
// ---------------------------------------------------------------------------------------------

// One configuration attribute of an algorithm, read into a value of the type cublasLt.h documents
// for it; -1 if cuBLASLt does not report it.
template <typename V>
long long algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  V v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return -1;
  return (long long)v;
}

const char* reduction_name(long long scheme) {
  switch (scheme) {
    case CUBLASLT_REDUCTION_SCHEME_NONE: return "none";
    case CUBLASLT_REDUCTION_SCHEME_INPLACE: return "inplace";
    case CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE: return "compute";
    case CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE: return "output";
    default: return "?";
  }
}

// "algo=… tile=… stages=… splitK=… red=… swizzle=… custom=… cluster=… waves=… ws=…KiB".
void print_config(const cublasLtMatmulHeuristicResult_t& r) {
  const cublasLtMatmulAlgo_t& a = r.algo;
  std::printf("algo=%-3lld tile=%-4lld stages=%-3lld splitK=%-2lld red=%-7s swizzle=%lld custom=%lld cluster=%-3lld "
              "waves=%.2f ws=%zuKiB",
              algo_attr<int32_t>(a, CUBLASLT_ALGO_CONFIG_ID), algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
              algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
              algo_attr<int32_t>(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
              reduction_name(algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)),
              algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
              algo_attr<uint32_t>(a, CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION),
              algo_attr<uint16_t>(a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), double(r.wavesCount),
              r.workspaceSize >> 10);
}

// ---------------------------------------------------------------------------------------------
// Device buffers and timing
// ---------------------------------------------------------------------------------------------

// Small pseudo-random bf16 values, uniform in [-scale, scale), from a hash of the index (so the
// data is the same on every run).
__global__ void fill_random_bf16(__nv_bfloat16* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t h = uint64_t(i) * 0x9E3779B97F4A7C15ull + seed;  // splitmix64 finaliser
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    const float u = float(uint32_t(h >> 40)) * (1.0f / 16777216.0f);  // [0, 1)
    p[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * scale);
  }
}

void fill(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  fill_random_bf16<<<1024, 256>>>(p, n, seed, 0.1f);
  CHECK_CUDA(cudaGetLastError());
}

// Everything a timed call needs.
struct Context {
  cublasLtHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  void* workspace = nullptr;
  __nv_bfloat16 *A = nullptr, *B = nullptr, *bias = nullptr;
  void* C = nullptr;
  float f32_beta = 1.0f;  // beta of the fp32-C shapes (--f32-beta)
};

// One GEMM with the given algorithm, operands swapped as in gemm.cu's gemm_impl; C is both the
// input and the output.
cublasStatus_t matmul(const Context& ctx, const Shape& s, const Plan& plan, const cublasLtMatmulAlgo_t& algo) {
  const float alpha = 1.0f, beta = s.c_f32 ? ctx.f32_beta : 0.0f;
  return cublasLtMatmul(ctx.handle, plan.desc, &alpha, ctx.B, plan.a, ctx.A, plan.b, &beta, ctx.C, plan.c, ctx.C,
                        plan.c, &algo, ctx.workspace, kWorkspaceBytes, ctx.stream);
}

// Mean µs per call over kTimedCalls calls after kWarmupCalls warm-up calls. Returns the first
// failing cublasLtMatmul status (the candidate is then dropped) or CUBLAS_STATUS_SUCCESS.
cublasStatus_t time_algo(const Context& ctx, const Shape& s, const Plan& plan, const cublasLtMatmulAlgo_t& algo,
                         double* us) {
  for (int i = 0; i < kWarmupCalls; ++i) {
    cublasStatus_t st = matmul(ctx, s, plan, algo);
    if (st != CUBLAS_STATUS_SUCCESS) {
      CHECK_CUDA(cudaStreamSynchronize(ctx.stream));
      return st;
    }
  }
  CHECK_CUDA(cudaStreamSynchronize(ctx.stream));
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaEventRecord(ctx.start, ctx.stream));
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  for (int i = 0; i < kTimedCalls && st == CUBLAS_STATUS_SUCCESS; ++i) st = matmul(ctx, s, plan, algo);
  CHECK_CUDA(cudaEventRecord(ctx.stop, ctx.stream));
  CHECK_CUDA(cudaEventSynchronize(ctx.stop));
  CHECK_CUDA(cudaGetLastError());
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  float ms = 0.0f;
  CHECK_CUDA(cudaEventElapsedTime(&ms, ctx.start, ctx.stop));
  *us = double(ms) * 1000.0 / kTimedCalls;
  return CUBLAS_STATUS_SUCCESS;
}

// ---------------------------------------------------------------------------------------------
// One shape's sweep
// ---------------------------------------------------------------------------------------------

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double tflops(const Shape& s, double us) { return s.flops() / (us * 1e-6) / 1e12; }

// Median of a non-empty list (the mean of the middle two for an even count).
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One candidate's times over the rounds.
struct Candidate {
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // the first failing status: the candidate is dropped
  std::vector<double> us;                         // µs per call, one per round, in round order
  double min = 0, med = 0, max = 0;
  bool ok() const { return status == CUBLAS_STATUS_SUCCESS && !us.empty(); }
};

struct ShapeResult {
  int candidates = 0;
  bool fused = false;  // the bias rode in the epilogue (only for bias shapes)
  bool ok0 = false;    // candidate 0 ran in every round
  double min0 = 0, med0 = 0, spread0 = 0;  // candidate 0: min, median, max/min over the rounds
  int best = -1;       // the candidate with the lowest minimum (-1: none ran)
  double best_min = 0, best_med = 0;
  bool sure = false;   // best != 0 and faster than candidate 0 by > kSureMargin in min and median
  double seconds = 0;  // wall time of this shape's sweep
};

ShapeResult sweep(const Context& ctx, const Shape& s, int rounds) {
  const auto t0 = std::chrono::steady_clock::now();
  ShapeResult res;
  std::printf("\n=== %s: %s%s M=%lld N=%lld K=%lld lda=%lld ldb=%lld ldc=%lld, bf16 A/B, %s C (beta=%d), epilogue %s, "
              "x%d per step%s ===\n",
              s.name.c_str(), s.trans_a ? "T" : "N", s.trans_b ? "T" : "N", (long long)s.M, (long long)s.N,
              (long long)s.K, (long long)s.lda(), (long long)s.ldb(), (long long)s.ldc(), s.c_f32 ? "fp32" : "bf16",
              s.c_f32 ? int(ctx.f32_beta) : 0, s.bias ? "bias" : "none", s.count, s.role == Role::extra ? " (extra)" : "");

  // Fresh C for every shape: zeros, so an fp32 C accumulated with beta = 1 starts from a valid value.
  CHECK_CUDA(cudaMemsetAsync(ctx.C, 0, s.c_bytes(), ctx.stream));

  // gemm.cu's build_plan: the fused bias epilogue first, a plain GEMM if the heuristic has no
  // fused algorithm (gemm.cu then adds the bias with its own kernel, which is not timed here).
  Plan fused_plan, plain_plan;
  Plan* plan = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> results;
  if (s.bias) {
    build_plan(fused_plan, s, true, ctx.bias);
    results = heuristic(ctx.handle, fused_plan, kMaxCandidates);
    if (!results.empty()) plan = &fused_plan;
    else std::printf("  heuristic offers no fused-bias algorithm: sweeping the unfused GEMM (gemm.cu adds the bias "
                     "with bias_act_kernel, not timed here)\n");
  }
  if (!plan) {
    build_plan(plain_plan, s, false, nullptr);
    results = heuristic(ctx.handle, plain_plan, kMaxCandidates);
    plan = &plain_plan;
  }
  res.fused = plan->fused;
  const int n = int(results.size());
  res.candidates = n;
  if (n == 0) {
    std::printf("  heuristic offers no algorithm at all (gemm.cu would throw)\n");
    res.seconds = seconds_since(t0);
    return res;
  }

  // gemm.cu asks for 1 result; check that it is candidate 0 of the list.
  const std::vector<cublasLtMatmulHeuristicResult_t> one = heuristic(ctx.handle, *plan, 1);
  const bool same = !one.empty() && std::memcmp(&one[0].algo, &results[0].algo, sizeof(cublasLtMatmulAlgo_t)) == 0;
  std::printf("  %d candidates; the 1-result query (gemm.cu's) %s candidate 0\n", n,
              same ? "returns" : "does NOT return");

  // Interleaved rounds: round r times every candidate once, starting at candidate r mod n.
  std::vector<Candidate> cands(static_cast<size_t>(n));
  for (int r = 0; r < rounds; ++r) {
    for (int j = 0; j < n; ++j) {
      Candidate& c = cands[size_t((r + j) % n)];
      if (c.status != CUBLAS_STATUS_SUCCESS) continue;  // dropped in an earlier round
      double us = 0;
      const cublasStatus_t st = time_algo(ctx, s, *plan, results[size_t((r + j) % n)].algo, &us);
      if (st != CUBLAS_STATUS_SUCCESS) {
        c.status = st;
        c.us.clear();
        continue;
      }
      c.us.push_back(us);
    }
  }
  for (Candidate& c : cands) {
    if (!c.ok()) continue;
    c.min = *std::min_element(c.us.begin(), c.us.end());
    c.max = *std::max_element(c.us.begin(), c.us.end());
    c.med = median(c.us);
  }

  if (cands[0].ok()) {
    res.ok0 = true;
    res.min0 = cands[0].min, res.med0 = cands[0].med, res.spread0 = cands[0].max / cands[0].min;
  }
  for (int i = 0; i < n; ++i)
    if (cands[size_t(i)].ok() && (res.best < 0 || cands[size_t(i)].min < res.best_min))
      res.best = i, res.best_min = cands[size_t(i)].min, res.best_med = cands[size_t(i)].med;

  std::printf("  %d rounds of %d warm-up + %d timed calls per candidate; round r starts at candidate r mod %d\n",
              rounds, kWarmupCalls, kTimedCalls, n);
  std::printf("  %4s %10s %10s %9s %7s %7s %7s  %s  |  %s\n", "cand", "min us", "med us", "TFLOP/s", "min/0", "med/0",
              "max/min", "configuration", "us per round");
  for (int i = 0; i < n; ++i) {
    const Candidate& c = cands[size_t(i)];
    std::printf("  [%2d] ", i);
    if (!c.ok()) {
      std::printf("%10s %10s %9s %7s %7s %7s  ", "-", "-", "-", "-", "-", "-");
      print_config(results[size_t(i)]);
      std::printf("  DROPPED: cublasLtMatmul returned %s\n", cublasLtGetStatusName(c.status));
      continue;
    }
    std::printf("%10.1f %10.1f %9.1f ", c.min, c.med, tflops(s, c.min));
    if (res.ok0) std::printf("%7.3f %7.3f ", c.min / res.min0, c.med / res.med0);
    else std::printf("%7s %7s ", "-", "-");
    std::printf("%7.3f  ", c.max / c.min);
    print_config(results[size_t(i)]);
    std::printf("  |");
    for (double us : c.us) std::printf(" %.1f", us);
    std::printf("%s\n", i == res.best ? "  <- best" : "");
  }

  if (res.best >= 0 && res.ok0) {
    res.sure = res.best != 0 && res.best_min < (1.0 - kSureMargin) * res.min0 &&
               res.best_med < (1.0 - kSureMargin) * res.med0;
    std::printf("  best: candidate %d, min %.1f us (%.3f x candidate 0), median %.1f us (%.3f x), %.1f TFLOP/s; "
                "sure: %s\n",
                res.best, res.best_min, res.best_min / res.min0, res.best_med, res.best_med / res.med0,
                tflops(s, res.best_min), res.sure ? "yes" : "no");
  } else if (res.best >= 0) {
    std::printf("  best: candidate %d, min %.1f us, median %.1f us, %.1f TFLOP/s (candidate 0 failed); sure: no\n",
                res.best, res.best_min, res.best_med, tflops(s, res.best_min));
  } else {
    std::printf("  no candidate ran\n");
  }
  res.seconds = seconds_since(t0);
  std::printf("  (%.1f s)\n", res.seconds);
  return res;
}

// ---------------------------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------------------------

struct Options {
  int rounds = kDefaultRounds;
  float f32_beta = 1.0f;  // --f32-beta
  std::vector<std::string> only;  // names as given (spaces or '_'); empty: the default set
  bool list = false;
};

[[noreturn]] void usage_error(const char* prog, const std::string& why) {
  std::fprintf(stderr, "%s: %s\nusage: %s [--rounds N] [--only NAME[,NAME...]] [--f32-beta 0|1] [--list]\n", prog,
               why.c_str(), prog);
  std::exit(2);
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    bool has_value = false;
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1), arg = arg.substr(0, eq), has_value = true;
    }
    auto next_value = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) usage_error(argv[0], arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--rounds") {
      const std::string v = next_value();
      char* end = nullptr;
      const long r = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || r < 1 || r > 1000) usage_error(argv[0], "--rounds wants an integer 1..1000");
      o.rounds = int(r);
    } else if (arg == "--only") {
      const std::string v = next_value();
      size_t pos = 0;
      while (pos <= v.size()) {
        const size_t comma = std::min(v.find(',', pos), v.size());
        const std::string name = trim(v.substr(pos, comma - pos));
        if (!name.empty()) o.only.push_back(name);
        pos = comma + 1;
      }
      if (o.only.empty()) usage_error(argv[0], "--only wants at least one shape name");
    } else if (arg == "--f32-beta") {
      const std::string v = next_value();
      if (v != "0" && v != "1") usage_error(argv[0], "--f32-beta wants 0 or 1");
      o.f32_beta = v == "0" ? 0.0f : 1.0f;
    } else if (arg == "--list" && !has_value) {
      o.list = true;
    } else if ((arg == "--help" || arg == "-h") && !has_value) {
      std::printf("usage: %s [--rounds N] [--only NAME[,NAME...]] [--f32-beta 0|1] [--list]\n", argv[0]);
      std::exit(0);
    } else {
      usage_error(argv[0], "unknown argument " + std::string(argv[i]));
    }
  }
  return o;
}

// The shapes to sweep, in the tool's order: the default set, or those --only names.
std::vector<Shape> select_shapes(const std::vector<Shape>& all, const Options& o, const char* prog) {
  std::vector<Shape> chosen;
  if (o.only.empty()) {
    for (const Shape& s : all)
      if (s.by_default) chosen.push_back(s);
    return chosen;
  }
  std::vector<bool> wanted(all.size(), false);
  for (const std::string& name : o.only) {
    bool found = false;
    for (size_t i = 0; i < all.size(); ++i)
      if (token_name(all[i].name) == token_name(name)) wanted[i] = true, found = true;
    if (!found) {
      std::string known;
      for (const Shape& s : all) known += "\n  " + s.name + (s.by_default ? "" : "  (extra)");
      usage_error(prog, "no shape named \"" + name + "\"; the shapes are:" + known);
    }
  }
  for (size_t i = 0; i < all.size(); ++i)
    if (wanted[i]) chosen.push_back(all[i]);
  return chosen;
}

}  // namespace

int main(int argc, char** argv) {
  const auto t_start = std::chrono::steady_clock::now();
  const Options opt = parse_options(argc, argv);
  const std::vector<Shape> all = all_shapes();
  if (opt.list) {
    for (const Shape& s : all)
      std::printf("%-24s %-24s %s\n", s.name.c_str(), token_name(s.name).c_str(), s.by_default ? "default" : "extra");
    return 0;
  }
  const std::vector<Shape> shapes = select_shapes(all, opt, argv[0]);
  const bool subset = !opt.only.empty();

  // Versions and device first.
  int device = 0, runtime = 0, driver = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  CHECK_CUDA(cudaDriverGetVersion(&driver));
  std::printf("gemm_sweep: cuBLASLt heuristic candidates for one GPT-2-small step (B*T=%lld, C=%lld, V=%lld)\n",
              (long long)kRows, (long long)kC, (long long)kV);
  std::printf("cuBLASLt version %zu (built against %d), CUDA runtime %d, driver %d\n", cublasLtGetVersion(),
              CUBLAS_VERSION, runtime, driver);
  std::printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB\n", device, prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, double(prop.totalGlobalMem) / double(1ull << 30));
  std::printf("%d interleaved rounds per shape; per round and candidate %d warm-up + %d timed calls; up to %d "
              "candidates; workspace %zu MiB, alignment %u B\n",
              opt.rounds, kWarmupCalls, kTimedCalls, kMaxCandidates, kWorkspaceBytes >> 20, kAlignmentBytes);
  std::printf("%zu shapes%s\n", shapes.size(), subset ? " (--only)" : " (the default set)");

  // One buffer per operand, sized for the largest chosen shape (the LM head's, about 1.6 GB for A and C).
  int64_t a_elems = 0, b_elems = 0, bias_elems = 0;
  size_t c_bytes = 0;
  for (const Shape& s : shapes) {
    a_elems = std::max(a_elems, s.a_elems());
    b_elems = std::max(b_elems, s.b_elems());
    c_bytes = std::max(c_bytes, s.c_bytes());
    if (s.bias) bias_elems = std::max(bias_elems, s.N);
  }
  Context ctx;
  ctx.f32_beta = opt.f32_beta;
  CHECK_CUBLAS(cublasLtCreate(&ctx.handle));
  CHECK_CUDA(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaEventCreate(&ctx.start));
  CHECK_CUDA(cudaEventCreate(&ctx.stop));
  CHECK_CUDA(cudaMalloc(&ctx.workspace, kWorkspaceBytes));
  CHECK_CUDA(cudaMalloc(&ctx.A, size_t(a_elems) * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaMalloc(&ctx.B, size_t(b_elems) * sizeof(__nv_bfloat16)));
  CHECK_CUDA(cudaMalloc(&ctx.C, c_bytes));
  CHECK_CUDA(cudaMalloc(&ctx.bias, size_t(std::max<int64_t>(bias_elems, 1)) * sizeof(__nv_bfloat16)));
  fill(ctx.A, a_elems, 1);
  fill(ctx.B, b_elems, 2);
  if (bias_elems > 0) fill(ctx.bias, bias_elems, 3);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::printf("set-up: %.1f s\n", seconds_since(t_start));

  std::vector<ShapeResult> results;
  for (const Shape& s : shapes) results.push_back(sweep(ctx, s, opt.rounds));

  // Summary: per shape, then the step totals weighted by count per step.
  std::printf("\n=== summary (us per call: minimum over %d rounds; ratios best / candidate 0; sure: > %.0f%% faster "
              "in min and median) ===\n",
              opt.rounds, 100.0 * kSureMargin);
  std::printf("%-22s %5s %5s %9s %9s %4s %9s %9s %6s %6s %4s %7s %10s %10s\n", "shape", "count", "cands", "cand0 min",
              "cand0 med", "best", "best min", "best med", "min r", "med r", "sure", "c0 m/m", "step cand0",
              "step best");
  // Step totals (µs, from the minima): [0] with bf16 dW (today), [1] with fp32 dW (beta = 1);
  // candidate 0 everywhere, the best everywhere, and the best only where it is sure.
  double total0[2] = {0, 0}, total_best[2] = {0, 0}, total_sure[2] = {0, 0};
  bool complete[2] = {true, true};
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    const ShapeResult& r = results[i];
    const bool in_total[2] = {s.role == Role::fwd_dx || s.role == Role::dw_bf16,
                              s.role == Role::fwd_dx || s.role == Role::dw_f32};
    const char* note = s.role == Role::extra ? "  (extra: not in the step totals)"
                       : s.bias && !r.fused  ? "  (unfused: bias kernel not timed)"
                                             : "";
    if (!r.ok0) {  // candidate 0 (gemm.cu's choice) did not run: no ratio, left out of the totals
      char best[16] = "-", best_min[16] = "-", best_med[16] = "-";
      if (r.best >= 0) {
        std::snprintf(best, sizeof best, "%d", r.best);
        std::snprintf(best_min, sizeof best_min, "%.1f", r.best_min);
        std::snprintf(best_med, sizeof best_med, "%.1f", r.best_med);
      }
      std::printf("%-22s %5d %5d %9s %9s %4s %9s %9s %6s %6s %4s %7s %10s %10s%s\n", s.name.c_str(), s.count,
                  r.candidates, "failed", "-", best, best_min, best_med, "-", "-", "no", "-", "-", "-", note);
      for (int t = 0; t < 2; ++t) complete[t] = complete[t] && !in_total[t];
      continue;
    }
    const double step0 = s.count * r.min0, step_best = s.count * r.best_min;
    const double step_sure = r.sure ? step_best : step0;
    for (int t = 0; t < 2; ++t)
      if (in_total[t]) total0[t] += step0, total_best[t] += step_best, total_sure[t] += step_sure;
    std::printf("%-22s %5d %5d %9.1f %9.1f %4d %9.1f %9.1f %6.3f %6.3f %4s %7.3f %10.1f %10.1f%s\n", s.name.c_str(),
                s.count, r.candidates, r.min0, r.med0, r.best, r.best_min, r.best_med, r.best_min / r.min0,
                r.best_med / r.med0, r.sure ? "yes" : "no", r.spread0, step0, step_best, note);
  }
  const char* total_name[2] = {"step GEMMs, dW in bf16 (beta=0, today)", "step GEMMs, dW into fp32 (beta=1)"};
  std::printf("\n");
  for (int t = 0; t < 2; ++t) {
    auto pct = [&](double x) { return total0[t] > 0 ? 100.0 * (total0[t] - x) / total0[t] : 0.0; };
    std::printf("%-40s candidate 0: %9.1f us   best: %9.1f us (saving %.1f%%)   best where sure: %9.1f us (saving "
                "%.1f%%)%s%s\n",
                total_name[t], total0[t], total_best[t], pct(total_best[t]), total_sure[t], pct(total_sure[t]),
                complete[t] ? "" : "  [incomplete: a shape failed]", subset ? "  [only the --only shapes]" : "");
  }

  // Machine-readable: one line per shape.
  std::printf("\n=== table (grep '^TABLE '): name transa transb M N K ctype epilogue best best_min_us cand0_min_us "
              "sure ===\n");
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    const ShapeResult& r = results[i];
    char best_min[32] = "-", min0[32] = "-";
    if (r.best >= 0) std::snprintf(best_min, sizeof best_min, "%.2f", r.best_min);
    if (r.ok0) std::snprintf(min0, sizeof min0, "%.2f", r.min0);
    std::printf("TABLE %s %s %s %lld %lld %lld %s %s %d %s %s %s\n", token_name(s.name).c_str(), s.trans_a ? "T" : "N",
                s.trans_b ? "T" : "N", (long long)s.M, (long long)s.N, (long long)s.K, s.c_f32 ? "f32" : "bf16",
                r.fused ? "bias" : "none", r.best, best_min, min0, r.sure ? "yes" : "no");
  }

  CHECK_CUDA(cudaFree(ctx.bias));
  CHECK_CUDA(cudaFree(ctx.C));
  CHECK_CUDA(cudaFree(ctx.B));
  CHECK_CUDA(cudaFree(ctx.A));
  CHECK_CUDA(cudaFree(ctx.workspace));
  CHECK_CUDA(cudaEventDestroy(ctx.stop));
  CHECK_CUDA(cudaEventDestroy(ctx.start));
  CHECK_CUDA(cudaStreamDestroy(ctx.stream));
  CHECK_CUBLAS(cublasLtDestroy(ctx.handle));
  std::printf("\ntotal runtime: %.1f s (%zu shapes, %d rounds)\n", seconds_since(t_start), shapes.size(), opt.rounds);
  return 0;
}
