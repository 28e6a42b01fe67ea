// FlashAttention backward on tensor cores: delta = rowsum(dO ∘ O), then dK/dV parallel over key
// blocks and dQ parallel over query blocks, each recomputing P = exp(S·scale − lse) from the
// forward's lse. No atomics: every gradient element is summed by one warp in a fixed order.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/flash_attention/kernel_traits.cuh"
#include "kernels/cuda/flash_attention/tile.cuh"

namespace tg::cuda {

// ───────────────────────────── kernels ─────────────────────────────

namespace flash {

// delta (B, H, T) = Σ_d dO ∘ O over each row of (B, T, H, D). G = D/8 consecutive lanes share one
// row, each with one 16-byte load of each tensor, and fold by butterfly (fixed order).
template <int D>
__global__ void flash_bwd_delta_kernel(const tg::bf16* __restrict__ o, const tg::bf16* __restrict__ dout,
                                       float* __restrict__ delta, int64_t rows, int T, int H) {
  constexpr int G = D / 8;
  static_assert(32 % G == 0, "a row's lanes must sit in one warp");
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = idx / G;  // (b·T + t)·H + h
  const int part = int(idx % G);
  float acc = 0.0f;
  if (row < rows) {
    float a[8], c[8];
    load_vec<8>(o + row * D + part * 8, a);
    load_vec<8>(dout + row * D + part * 8, c);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc += a[k] * c[k];
  }
#pragma unroll
  for (int m = G / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (row < rows && part == 0) {
    const int64_t h = row % H, bt = row / H, t = bt % T, b = bt / T;
    delta[(b * H + h) * T + t] = acc;
  }
}

// dK, dV for one key block: one block per (key block, head, batch). Warp w owns keys
// k0 + 16w .. k0 + 16w + 15 and computes everything transposed (rows = keys, columns = queries):
// Sᵀ = K Qᵀ lands in registers as a C fragment whose layout is the A fragment of Pᵀ, so
// dV += Pᵀ dO and dK += dSᵀ Q need no shared-memory transpose. The query tiles (Q, dO and their
// lse, delta) stream through smem double-buffered; dK, dV accumulate in fp32 registers.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) flash_bwd_dkdv_kernel(const FlashAttentionParams p,
                                                                       const float* __restrict__ delta) {
  constexpr int D = Tr::kD, Bc = Tr::kOwn, Br = Tr::kStream, LDS = Tr::kLds, NT = Tr::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  tg::bf16* sK = reinterpret_cast<tg::bf16*>(smem);  // (Bc, LDS)
  tg::bf16* sV = sK + Tr::kTileOwn;                    // (Bc, LDS)
  tg::bf16* sQ = sV + Tr::kTileOwn;                    // (stage, Br, LDS)
  tg::bf16* sdO = sQ + kStages * Tr::kTileStream;      // (stage, Br, LDS)
  float* sL = reinterpret_cast<float*>(smem + Tr::kSmemBf16Bytes);  // (stage, Br) lse
  float* sDelta = sL + kStages * Br;                                  // (stage, Br) delta

  const int T = int(p.T), H = int(p.H);
  const bool causal = p.causal;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h = blockIdx.y, b = blockIdx.z;
  const int k0 = int(blockIdx.x) * Bc;  // causal: low key blocks see the most queries and go first
  const int64_t ld = int64_t(H) * D;
  const int64_t head = (int64_t(b) * T * H + h) * D;
  const tg::bf16* Q = p.q + head;
  const tg::bf16* K = p.k + head;
  const tg::bf16* V = p.v + head;
  const tg::bf16* dO = p.dout + head;
  const float* lse = p.lse + (int64_t(b) * H + h) * T;  // (T,)
  const float* dlt = delta + (int64_t(b) * H + h) * T;   // (T,)

  // Causal: query blocks ending before k0 only see keys in their future, never visited.
  const int i_begin = causal ? k0 / Br : 0;
  const int n_qb = (T + Br - 1) / Br;

  load_tile<Bc, D, LDS, NT>(sK, K, ld, k0, T, tid);
  load_tile<Bc, D, LDS, NT>(sV, V, ld, k0, T, tid);
  load_tile<Br, D, LDS, NT>(sQ, Q, ld, i_begin * Br, T, tid);
  load_tile<Br, D, LDS, NT>(sdO, dO, ld, i_begin * Br, T, tid);
  load_row_stats<Br, NT>(sL, lse, i_begin * Br, T, tid);
  load_row_stats<Br, NT>(sDelta, dlt, i_begin * Br, T, tid);
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  const int key0 = k0 + warp * kRowsPerWarp;  // this warp's first key
  const tg::bf16* Kw = sK + warp * kRowsPerWarp * LDS;
  const tg::bf16* Vw = sV + warp * kRowsPerWarp * LDS;
  float dk[D / 8][4], dv[D / 8][4];  // (16, D) each
  zero(dk);
  zero(dv);

  for (int i = i_begin; i < n_qb; ++i) {
    const int st = (i - i_begin) & 1;
    if (i + 1 < n_qb) {  // prefetch query tile i+1 into the other stage
      const int q1 = (i + 1) * Br;
      load_tile<Br, D, LDS, NT>(sQ + (st ^ 1) * Tr::kTileStream, Q, ld, q1, T, tid);
      load_tile<Br, D, LDS, NT>(sdO + (st ^ 1) * Tr::kTileStream, dO, ld, q1, T, tid);
      load_row_stats<Br, NT>(sL + (st ^ 1) * Br, lse, q1, T, tid);
      load_row_stats<Br, NT>(sDelta + (st ^ 1) * Br, dlt, q1, T, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const tg::bf16* Qi = sQ + st * Tr::kTileStream;
    const tg::bf16* dOi = sdO + st * Tr::kTileStream;
    const float* Li = sL + st * Br;
    const float* Di = sDelta + st * Br;
    const int q0 = i * Br;

    float s[Br / 8][4];  // Sᵀ = K Qᵀ, (16 keys, Br queries)
    zero(s);
    mma_abt_smem_a<Br, D>(s, Kw, LDS, Qi, LDS, lane);
    scale_tile<Br>(s, scale_log2);
    if (q0 + Br > T || (causal && k0 + Bc - 1 > q0))
      mask_tile<Br>(s, key0, q0, lane, [=](int k, int q) { return q >= T || (causal && k > q); });
    exp2_minus_col<Br>(s, Li, lane);  // Pᵀ = exp(S·scale − lse), masked entries exactly 0

    uint32_t pf[Br / 16][4];
    acc_to_a<Br>(pf, s);
    mma_ab<D, Br>(dv, pf, dOi, LDS, lane);  // dV += Pᵀ dO

    float dp[Br / 8][4];  // dPᵀ = V dOᵀ, (16 keys, Br queries)
    zero(dp);
    mma_abt_smem_a<Br, D>(dp, Vw, LDS, dOi, LDS, lane);
    softmax_grad_col<Br>(dp, s, Di, lane);  // dSᵀ = Pᵀ ∘ (dPᵀ − delta), without the scale

    uint32_t dsf[Br / 16][4];
    acc_to_a<Br>(dsf, dp);
    mma_ab<D, Br>(dk, dsf, Qi, LDS, lane);  // dK += dSᵀ Q
    __syncthreads();                         // stage st is overwritten by the next prefetch
  }

  // dK = scale · Σ dSᵀ Q: the softmax scale applied once, in fp32.
  const float fk[2] = {p.scale, p.scale}, fv[2] = {1.0f, 1.0f};
  store_rows<D>(p.dk + head, ld, dk, fk, key0, T, lane);
  store_rows<D>(p.dv + head, ld, dv, fv, key0, T, lane);
}

// dQ for one query block: one block per (query block, head, batch). Warp w owns query rows
// q0 + 16w ..; Q_i and dO_i stay in smem, K and V tiles stream double-buffered, and dQ accumulates
// in fp32 registers in key-block order: deterministic without atomics, at the price of
// recomputing S and dP a second time.
template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads) flash_bwd_dq_kernel(const FlashAttentionParams p,
                                                                     const float* __restrict__ delta) {
  constexpr int D = Tr::kD, Br = Tr::kOwn, Bc = Tr::kStream, LDS = Tr::kLds, NT = Tr::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  tg::bf16* sQ = reinterpret_cast<tg::bf16*>(smem);  // (Br, LDS)
  tg::bf16* sdO = sQ + Tr::kTileOwn;                   // (Br, LDS)
  tg::bf16* sK = sdO + Tr::kTileOwn;                   // (stage, Bc, LDS)
  tg::bf16* sV = sK + kStages * Tr::kTileStream;       // (stage, Bc, LDS)

  const int T = int(p.T), H = int(p.H);
  const bool causal = p.causal;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int qb = causal ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x);  // heaviest first
  const int h = blockIdx.y, b = blockIdx.z;
  const int q0 = qb * Br;
  const int64_t ld = int64_t(H) * D;
  const int64_t head = (int64_t(b) * T * H + h) * D;
  const tg::bf16* Q = p.q + head;
  const tg::bf16* K = p.k + head;
  const tg::bf16* V = p.v + head;
  const tg::bf16* dO = p.dout + head;

  const int q_last = min(q0 + Br, T) - 1;
  const int n_kb = causal ? q_last / Bc + 1 : (T + Bc - 1) / Bc;

  load_tile<Br, D, LDS, NT>(sQ, Q, ld, q0, T, tid);
  load_tile<Br, D, LDS, NT>(sdO, dO, ld, q0, T, tid);
  load_tile<Bc, D, LDS, NT>(sK, K, ld, 0, T, tid);
  load_tile<Bc, D, LDS, NT>(sV, V, ld, 0, T, tid);
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  const int row0 = q0 + warp * kRowsPerWarp;
  // Per-row statistics of this lane's rows g and g+8 (0 past T: those rows are never stored).
  float lse2[2], dlt[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + (lane >> 2) + 8 * i;
    const int64_t at = (int64_t(b) * H + h) * T + row;
    lse2[i] = row < T ? p.lse[at] * kLog2e : 0.0f;
    dlt[i] = row < T ? delta[at] : 0.0f;
  }
  const tg::bf16* Qw = sQ + warp * kRowsPerWarp * LDS;
  const tg::bf16* dOw = sdO + warp * kRowsPerWarp * LDS;
  float dq[D / 8][4];  // (16, D)
  zero(dq);

  for (int j = 0; j < n_kb; ++j) {
    const int st = j & 1;
    if (j + 1 < n_kb) {
      load_tile<Bc, D, LDS, NT>(sK + (st ^ 1) * Tr::kTileStream, K, ld, (j + 1) * Bc, T, tid);
      load_tile<Bc, D, LDS, NT>(sV + (st ^ 1) * Tr::kTileStream, V, ld, (j + 1) * Bc, T, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const tg::bf16* Kj = sK + st * Tr::kTileStream;
    const tg::bf16* Vj = sV + st * Tr::kTileStream;
    const int k0 = j * Bc;

    float s[Bc / 8][4];  // S = Q Kᵀ, (16, Bc)
    zero(s);
    mma_abt_smem_a<Bc, D>(s, Qw, LDS, Kj, LDS, lane);
    scale_tile<Bc>(s, scale_log2);
    if (k0 + Bc > T || (causal && k0 + Bc - 1 > q0))
      mask_tile<Bc>(s, row0, k0, lane, [=](int q, int k) { return k >= T || (causal && k > q); });
    exp2_minus_row<Bc>(s, lse2);  // P

    float dp[Bc / 8][4];  // dP = dO Vᵀ, (16, Bc)
    zero(dp);
    mma_abt_smem_a<Bc, D>(dp, dOw, LDS, Vj, LDS, lane);
    softmax_grad_row<Bc>(dp, s, dlt);  // dS = P ∘ (dP − delta), without the scale

    uint32_t dsf[Bc / 16][4];
    acc_to_a<Bc>(dsf, dp);
    mma_ab<D, Bc>(dq, dsf, Kj, LDS, lane);  // dQ += dS K
    __syncthreads();
  }

  const float fq[2] = {p.scale, p.scale};
  store_rows<D>(p.dq + head, ld, dq, fq, row0, T, lane);
}

}  // namespace flash

// ───────────────────────────── launchers ─────────────────────────────

namespace {

template <class Tr, typename Kernel>
void launch_bwd_kernel(Kernel kernel, const FlashAttentionParams& p, const float* delta, cudaStream_t stream) {
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::kSmemBytes)));
  const dim3 grid(unsigned((p.T + Tr::kOwn - 1) / Tr::kOwn), unsigned(p.H), unsigned(p.B));
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p, delta);
  TG_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void launch_bwd(const FlashAttentionParams& p, cudaStream_t stream) {
  float* delta = static_cast<float*>(p.workspace);  // (B, H, T)
  const int64_t rows = p.B * p.T * p.H;
  constexpr int kThreads = 256;
  const int64_t blocks = (rows * (D / 8) + kThreads - 1) / kThreads;
  flash::flash_bwd_delta_kernel<D><<<unsigned(blocks), kThreads, 0, stream>>>(p.o, p.dout, delta, rows, int(p.T),
                                                                              int(p.H));
  TG_CUDA_CHECK(cudaGetLastError());

  using Dkdv = typename flash::DkdvConfig<D>::type;
  launch_bwd_kernel<Dkdv>(flash::flash_bwd_dkdv_kernel<Dkdv>, p, delta, stream);
  using Dq = typename flash::DqConfig<D>::type;
  launch_bwd_kernel<Dq>(flash::flash_bwd_dq_kernel<Dq>, p, delta, stream);
}

// D = 64. dK/dV: 4 warps own 64 keys, query tiles of 64 stream through smem; per thread dK, dV
// (2 × 32 regs) plus Sᵀ and dPᵀ (2 × 32 regs) stay in registers (ptxas: 168 regs, 0 spills, so
// 3 blocks per SM); smem 2 × 9 KiB owned + 2 stages × 2 × 9 KiB streamed + 1 KiB lse/delta =
// 55 KiB. dQ: 4 warps own 64 queries, key tiles of 64; dQ, S, dP 32 regs each (168 regs, 0
// spills); 54 KiB smem. Small blocks so several co-reside per SM and hide each other's barriers.
// Not yet measured on the H200.
void flash_bwd_hdim64(const FlashAttentionParams& p, cudaStream_t stream) { launch_bwd<64>(p, stream); }

// D = 128. dK/dV: 4 warps own 64 keys; dK and dV take 2 × 64 registers per thread, so query
// tiles are only 32 wide (Sᵀ, dPᵀ 16 regs each) to stay under 255 registers (ptxas: 228 regs,
// 0 spills, 2 blocks per SM); smem 2 × 17 KiB + 2 × 2 × 8.5 KiB + 0.5 KiB = 69 KiB. dQ: 4 warps
// own 64 queries, key tiles of 64 (dQ 64 regs, S and dP 32 each; ptxas: 254 regs, 0 spills,
// 2 blocks per SM); smem 2 × 17 + 2 × 2 × 17 = 102 KiB. Not yet measured on the H200.
void flash_bwd_hdim128(const FlashAttentionParams& p, cudaStream_t stream) { launch_bwd<128>(p, stream); }

}  // namespace

size_t flash_attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t /*D*/) {
  const size_t bytes = size_t(B) * size_t(T) * size_t(H) * sizeof(float);  // delta (B, H, T)
  return (bytes + 255) / 256 * 256;
}

void flash_attention_backward(const FlashAttentionParams& p, cudaStream_t stream) {
  const char* fn = "flash_attention_backward";
  require(flash_attention_supported(p.D), fn, "head dim D = " + std::to_string(p.D) + " has no kernel (64, 128)");
  require(p.B >= 0 && p.T >= 0 && p.H >= 0, fn, "negative size");
  require(p.T < INT_MAX / 2, fn, "T must be < 2^30");
  require(p.H <= 65535 && p.B <= 65535, fn, "B and H must be ≤ 65535 (grid dimensions)");
  if (p.B == 0 || p.T == 0 || p.H == 0) return;
  require(p.q && p.k && p.v && p.o && p.lse && p.dout && p.dq && p.dk && p.dv && p.workspace, fn, "null pointer");
  require(aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned16(p.o) && aligned16(p.dout) &&
              aligned16(p.dq) && aligned16(p.dk) && aligned16(p.dv) && aligned16(p.workspace),
          fn, "q, k, v, o, dout, dq, dk, dv, workspace must be 16-byte aligned");
  if (p.D == 64)
    flash_bwd_hdim64(p, stream);
  else
    flash_bwd_hdim128(p, stream);
}

}  // namespace tg::cuda
