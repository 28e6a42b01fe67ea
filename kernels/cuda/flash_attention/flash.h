// Fused FlashAttention on tensor cores (bf16 in, fp32 accumulation): the CUDA twin of
// kernels/cpu/flash_attention.h, with the same lse convention (natural log of the scaled scores).
#pragma once
#include "kernels/cuda/stream.h"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// Layout of q, k, v, o, dout, dq, dk, dv: (B, T, H, D) with a per-tensor token (row) stride:
// element (b, t, h, d) of X is at X + (b·T + t)·X_row_stride + h·D + d. A stride of 0 means H·D,
// i.e. (B, T, H, D) contiguous (a (B, T, C) tensor viewed as (B, T, H, C/H)); a stride of 3·H·D
// with q, k, v at column offsets 0, H·D, 2·H·D reads straight out of a fused (B, T, 3C) qkv
// projection (and dq, dk, dv likewise write one (B, T, 3C) d(qkv) buffer). lse: (B, H, T) float, lse = max + log(sum) of each row of scale · q kᵀ [masked],
// in natural-log units exactly as cpu::flash_attention_forward defines it.
// How the backward forms dQ = scale · Σ_j dS_ij K_j (a sum over key blocks j):
//   kRecompute (default) a kernel parallel over query blocks recomputes S and dP to form dQ in
//              registers, summing over j in a fixed order: deterministic, 7 matmuls per
//              (query tile, key tile) pair.
//   kAtomic    the dK/dV kernel, which already holds dS, adds dS_ij K_j into an fp32 buffer
//              with unordered atomics (mma.sync: vector red.global; wgmma: the bulk copy
//              engine's reductions): 5 matmuls per pair, but the rounding, and so the last bits
//              of dQ, depend on the order the GPU happens to run them. Opt-in. Where the
//              deterministic kernels are the faster they serve this mode too: on compute
//              capability 9.0 everywhere but d 128 from T = 16384 and d 64 non-causal from
//              T = 4096 (flash_bwd_sm90a.cu, sm90a_runs_atomic_dq), and at d 96.
//   kAtomicKernel  kAtomic's kernel wherever one is built (every head dim but 96), even where
//              the deterministic pair is the faster: for tests and benchmarks.
// (A fourth way, the same adds admitted in key-block order by per-tile semaphores, is slower than
// kRecompute: each key block waits for every lower one at its first tile; docs/kernels.md §9.)
enum class FlashDq { kRecompute, kAtomic, kAtomicKernel };

// Which kernels run. kAuto (default) picks the fastest this GPU has: on compute capability 9.0
// (H100/H200) the wgmma kernels (flash_fwd_sm90a.cu, flash_bwd_sm90a.cu, built for sm_90a),
// elsewhere the mma.sync ones (flash_fwd.cu, flash_bwd.cu; sm_80 and later). The explicit choices
// are for tests and benchmarks; kWgmma on another GPU is std::invalid_argument.
enum class FlashKernels { kAuto, kMmaSync, kWgmma };

struct FlashAttentionParams {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  bf16* o;
  float* lse;  // forward: written; backward: read
  // Backward (ignored by the forward).
  const bf16* dout;
  bf16* dq;
  bf16* dk;
  bf16* dv;
  void* workspace;  // flash_attention_backward_workspace_bytes(B, T, H, D, dq_mode) bytes, 16-byte aligned
  FlashDq dq_mode = FlashDq::kRecompute;
  FlashKernels kernels = FlashKernels::kAuto;
  int64_t B, T, H, D;
  float scale;  // applied to q kᵀ; usually 1/sqrt(D)
  bool causal;  // key index > query index is excluded
  // Development: a variant of the wgmma kernels' development registry to run instead of the shape
  // the launchers' table selects, wherever it applies (its kernel, head dim, mask and range of T;
  // elsewhere the table's shape runs): flash_attention_variant(name), 1 + its index in
  // flash_attention_variants(). 0: the tables' shapes. Beyond the registry std::invalid_argument;
  // the mma.sync kernels ignore it. (A byte in the padding after `causal`, so that the kernels'
  // parameter layout is that of the struct without it.)
  uint8_t variant = 0;
  // Token (row) strides in elements: X_row_stride elements between tokens t and t+1 of X (also
  // between the last token of batch b and the first of b+1). 0 → H·D (contiguous). A nonzero
  // stride must be ≥ H·D and a multiple of 8 (16-byte rows for cp.async / vector access).
  int64_t q_row_stride = 0, k_row_stride = 0, v_row_stride = 0;    // elements between tokens t and t+1; 0 → H·D
  int64_t o_row_stride = 0, do_row_stride = 0;                      // 0 → H·D
  int64_t dq_row_stride = 0, dk_row_stride = 0, dv_row_stride = 0;  // 0 → H·D
  // Structured masks (causal only; kernels/cpu/flash_attention.h has the rule): query i of
  // sequence b sees key j iff lo ≤ j ≤ i, lo = max(doc_start[b·T + i], i − window + 1), each term
  // only when its mask is on. window: 0 (or ≥ T) for none. doc_start: (B, T) int32 in device
  // memory, each token's document's first position (non-decreasing along a sequence, ≤ its own
  // position); null for none. The kernels take the mask as block ranges (mask.cuh): key tiles
  // wholly outside a query tile's range are never loaded, tiles wholly inside run without mask
  // logic. (After the strides, so that the fields before keep their offsets.)
  int64_t window = 0;
  const int32_t* doc_start = nullptr;
  // With doc_start: the most tokens any document of the batch holds (cpu::longest_document of the
  // host's starts) — the backward's launchers choose their kernel shapes by it, as documents make
  // the items as short as a sequence that long would (docs/kernels.md §2.4). 0: not given.
  int64_t longest_document = 0;
};

// A variant of the development registry (kernels/cuda/flash_attention/sm90_shapes.h): a wgmma
// kernel shape kept for A/Bs against the one the launchers select (docs/kernels.md §4.4).
struct FlashVariant {
  std::string name;
  std::string kernel;  // "forward", "dK/dV" or "dQ"
  int64_t head_dim;
  int mask;  // 0: both, 1: causal only, 2: non-causal only
  int64_t min_t, max_t;
};
std::vector<FlashVariant> flash_attention_variants();
// FlashAttentionParams::variant of the variant named `name`; 0 if the registry has none.
int flash_attention_variant(const std::string& name);

// Head dims with a compiled kernel. Other D must take the composite fallback (with a warning).
bool flash_attention_supported(int64_t D);  // D ∈ {32, 64, 96, 128} (wgmma on sm_90: 64, 128)

// Writes o and lse. Requires a supported D, 16-byte aligned q, k, v, o, T ≤ 4,194,240 (65,535
// tiles of 64 rows, a grid dimension), B ≤ 65,535, H·B·⌈T/64⌉ < 2^31, and the q, k, v, o row
// strides valid (0, or ≥ H·D and a multiple of 8); std::invalid_argument otherwise.
void flash_attention_forward(const FlashAttentionParams& p, cudaStream_t stream);

// Scratch the backward needs: delta = rowsum(dO ∘ O), (B, H, T) floats, and for kAtomic also the
// fp32 dQ accumulator, (B, H, T rounded up to the query tile, D) floats — twice the bytes of q,
// which the default mode does not spend. A workspace sized for kAtomic serves both modes.
size_t flash_attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t D,
                                                FlashDq dq_mode = FlashDq::kRecompute);

// dq, dk, dv are overwritten (bf16), given the forward's o and lse. Requires every pointer 16-byte
// aligned and all eight row strides valid (as for the forward); std::invalid_argument otherwise.
// Only the H·D elements of each token row are written: with strided dq, dk, dv the rest of the
// row (e.g. the other two thirds of a d(qkv) buffer) is left untouched. With dq_mode kRecompute
// every reduction runs in a fixed order, so two calls give bitwise equal gradients; kAtomic gives
// that up for dQ (dK and dV stay deterministic).
void flash_attention_backward(const FlashAttentionParams& p, cudaStream_t stream);

}  // namespace tg::cuda
