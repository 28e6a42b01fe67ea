// FlashAttention backward on tensor cores: delta = rowsum(dO ∘ O), then dK/dV parallel over key
// blocks and dQ parallel over query blocks, each recomputing P = exp(S·scale − lse) from the
// forward's lse. By default (FlashDq::kRecompute) there are no atomics: every gradient element
// is summed by one warp in a fixed order. The opt-in FlashDq::kAtomic folds dQ into the dK/dV
// kernel instead (fp32 atomics, then a convert kernel). These are the portable (mma.sync)
// kernels; on compute capability 9.0 the default mode runs flash_bwd_sm90a.cu's wgmma twins after
// the same delta kernel (FlashKernels).
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/flash_attention/kernel_traits.cuh"
#include "kernels/cuda/flash_attention/launch.cuh"
#include "kernels/cuda/flash_attention/mask.cuh"
#include "kernels/cuda/flash_attention/sm90_shapes.h"
#include "kernels/cuda/flash_attention/tile.cuh"

namespace tg::cuda {

// ───────────────────────────── kernels ─────────────────────────────

namespace flash {

// The delta kernel's lanes per row: the largest power of two that divides D/8 (D/8 itself at
// D = 32, 64, 128; 4 at D = 96, each lane then taking 3 of the row's 8-element chunks).
template <int D>
constexpr int kDeltaLanes = (D / 8) % 16 == 0 ? 16 : (D / 8) % 8 == 0 ? 8 : (D / 8) % 4 == 0 ? 4 : (D / 8) % 2 == 0 ? 2 : 1;

// delta (B, H, T) = Σ_d dO ∘ O over each (token, head) row of (B, T, H, D), O and dO with token
// strides ldo, lddo (elements). G = kDeltaLanes<D> consecutive lanes share one row, each with one
// 16-byte load of each tensor per 8-element chunk (chunks part, part + G, …), and fold by
// butterfly (fixed order).
template <int D>
__global__ void flash_bwd_delta_kernel(const tg::bf16* __restrict__ o, int64_t ldo, const tg::bf16* __restrict__ dout,
                                       int64_t lddo, float* __restrict__ delta, int64_t rows, int T, int H) {
  constexpr int G = kDeltaLanes<D>;
  static_assert(D % 8 == 0 && 32 % G == 0, "a row's lanes must sit in one warp");
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = idx / G;  // (b·T + t)·H + h
  const int part = int(idx % G);
  const int64_t bt = row / H;   // token b·T + t
  const int h = int(row - bt * H);
  float acc = 0.0f;
  if (row < rows) {
#pragma unroll
    for (int chunk = part; chunk < D / 8; chunk += G) {
      float a[8], c[8];
      load_vec<8>(o + bt * ldo + h * D + chunk * 8, a);
      load_vec<8>(dout + bt * lddo + h * D + chunk * 8, c);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc += a[k] * c[k];
    }
  }
#pragma unroll
  for (int m = G / 2; m > 0; m >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, m);
  if (row < rows && part == 0) {
    const int64_t t = bt % T, b = bt / T;
    delta[(b * H + h) * T + t] = acc;
  }
}

// dK, dV for one key block: one block per (key block, head, batch). Warp w owns the R =
// kRowBlocks 16-key blocks starting at k0 + 16R·w and computes everything transposed (rows =
// keys, columns = queries): Sᵀ = K Qᵀ lands in registers as a C fragment whose layout is the A
// fragment of Pᵀ, so dV += Pᵀ dO and dK += dSᵀ Q need no shared-memory transpose. The query
// tiles (Q, dO and their lse, delta) stream through smem double-buffered, each fragment read
// from them feeding R mmas; dK, dV accumulate in fp32 registers.
//
// With Mode kAtomic the block also forms this key block's share of dQ: dSᵀ goes through smem,
// the block computes dQ_i += dS K_j and adds it into the fp32 buffer dq_accum with unordered
// atomics (kept unscaled; flash_bwd_dq_convert_kernel scales and rounds it). With kRecompute it
// does not: flash_bwd_dq_kernel forms dQ in a deterministic pass of its own.
template <class Tr, FlashDq Mode, bool kMasked = false>
__global__ void __launch_bounds__(Tr::kThreads) flash_bwd_dkdv_kernel(const FlashAttentionParams p,
                                                                       const float* __restrict__ delta,
                                                                       float* __restrict__ dq_accum,
                                                                       int accum_rows) {
  constexpr int D = Tr::kD, Bc = Tr::kOwn, Br = Tr::kStream, LDS = Tr::kLds, NT = Tr::kThreads, R = Tr::kRowBlocks;
  constexpr bool kFormDq = Mode == FlashDq::kAtomic;
  static_assert(!kFormDq || (D % Tr::kWarps == 0 && Tr::kDqCols % 8 == 0),
                "kAtomic: dQ's columns must split over the warps in whole 8-column n-tiles");
  static_assert(Tr::kDkdvAccRegs + 32 <= 255, "dK, dV, Sᵀ, dPᵀ plus ~32 working registers must fit 255");
  extern __shared__ __align__(16) unsigned char smem[];
  tg::bf16* sK = reinterpret_cast<tg::bf16*>(smem);  // (Bc, LDS)
  tg::bf16* sV = sK + Tr::kTileOwn;                    // (Bc, LDS)
  tg::bf16* sQ = sV + Tr::kTileOwn;                    // (stage, Br, LDS)
  tg::bf16* sdO = sQ + kStages * Tr::kTileStream;      // (stage, Br, LDS)
  float* sL = reinterpret_cast<float*>(smem + Tr::kSmemBf16Bytes);  // (stage, Br) lse
  float* sDelta = sL + kStages * Br;                                  // (stage, Br) delta
  tg::bf16* sdSt = reinterpret_cast<tg::bf16*>(smem + Tr::kSmemBytes);  // (Bc, kLdsDs) dSᵀ, kFormDq only

  const int T = int(p.T), H = int(p.H);
  const bool causal = p.causal;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int h = blockIdx.x, b = blockIdx.y;
  const int k0 = int(blockIdx.z) * Bc;  // causal: low key blocks see the most queries and start first
  // Row strides (resolved from 0 to H·D by the launcher) and this block's (b, 0, h, 0) pointers.
  const int ldq = int(p.q_row_stride), ldk = int(p.k_row_stride), ldv = int(p.v_row_stride);
  const int lddo = int(p.do_row_stride);
  const int64_t bt = int64_t(b) * T;
  const int hd = h * D;
  const tg::bf16* Q = p.q + bt * ldq + hd;
  const tg::bf16* K = p.k + bt * ldk + hd;
  const tg::bf16* V = p.v + bt * ldv + hd;
  const tg::bf16* dO = p.dout + bt * lddo + hd;
  tg::bf16* dK = p.dk + bt * p.dk_row_stride + hd;
  tg::bf16* dV = p.dv + bt * p.dv_row_stride + hd;
  const float* lse = p.lse + (int64_t(b) * H + h) * T;  // (T,)
  const float* dlt = delta + (int64_t(b) * H + h) * T;   // (T,)

  // Causal: query blocks ending before k0 only see keys in their future, never visited; with a
  // structured mask (mask.cuh) neither are those past the last query that sees this key block.
  const SeqMask mask = seq_mask_if<kMasked>(p, b);
  const int i_begin = causal ? k0 / Br : 0;
  const int n_qb = mask.on ? mask.query_tiles(k0, Bc, Br).end : (T + Br - 1) / Br;  // (the end of the loop)
  float* dQacc = dq_accum + (int64_t(b) * H + h) * accum_rows * D;  // this head's rows: ≥ n_qb·Br

  load_tile<Bc, D, LDS, NT>(sK, K, ldk, k0, T, tid);
  load_tile<Bc, D, LDS, NT>(sV, V, ldv, k0, T, tid);
  load_tile<Br, D, LDS, NT>(sQ, Q, ldq, i_begin * Br, T, tid);
  load_tile<Br, D, LDS, NT>(sdO, dO, lddo, i_begin * Br, T, tid);
  load_row_stats<Br, NT>(sL, lse, i_begin * Br, T, tid);
  load_row_stats<Br, NT>(sDelta, dlt, i_begin * Br, T, tid);
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  const int key0 = k0 + warp * Tr::kWarpRows;  // this warp's first key
  const tg::bf16* Kw = sK + warp * Tr::kWarpRows * LDS;
  const tg::bf16* Vw = sV + warp * Tr::kWarpRows * LDS;
  float dk[R][D / 8][4], dv[R][D / 8][4];  // (16, D) each, per row block
#pragma unroll
  for (int r = 0; r < R; ++r) {
    zero(dk[r]);
    zero(dv[r]);
  }

  for (int i = i_begin; i < n_qb; ++i) {
    const int st = (i - i_begin) & 1;
    if (i + 1 < n_qb) {  // prefetch query tile i+1 into the other stage
      const int q1 = (i + 1) * Br;
      load_tile<Br, D, LDS, NT>(sQ + (st ^ 1) * Tr::kTileStream, Q, ldq, q1, T, tid);
      load_tile<Br, D, LDS, NT>(sdO + (st ^ 1) * Tr::kTileStream, dO, lddo, q1, T, tid);
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

    float s[R][Br / 8][4];  // Sᵀ = K Qᵀ, (16 keys, Br queries) per row block
#pragma unroll
    for (int r = 0; r < R; ++r) zero(s[r]);
    mma_abt_smem_a_rows<R, Br, D>(s, Kw, LDS, Qi, LDS, lane);
    const bool need_mask = q0 + Br > T || (causal && k0 + Bc - 1 > q0);
    const bool need_seq_mask = mask.needs_mask(min(q0 + Br, T) - 1, k0);
    uint32_t pf[R][Br / 16][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      exp2_scaled_minus_col<Br>(s[r], scale_log2, Li, lane);  // Pᵀ = exp(S·scale − lse)
      if (need_seq_mask)  // masked entries exactly 0
        mask_tile<Br>(s[r], key0 + r * kRowsPerWarp, q0, lane,
                      [=](int k, int q) { return q >= T || k > q || mask.excluded(q, k); }, 0.0f);
      else if (need_mask)
        mask_tile<Br>(s[r], key0 + r * kRowsPerWarp, q0, lane,
                      [=](int k, int q) { return q >= T || (causal && k > q); }, 0.0f);
      acc_to_a<Br>(pf[r], s[r]);
    }
    mma_ab_rows<R, D, Br>(dv, pf, dOi, LDS, lane);  // dV += Pᵀ dO

    float dp[R][Br / 8][4];  // dPᵀ = V dOᵀ, (16 keys, Br queries) per row block
#pragma unroll
    for (int r = 0; r < R; ++r) zero(dp[r]);
    mma_abt_smem_a_rows<R, Br, D>(dp, Vw, LDS, dOi, LDS, lane);
    uint32_t dsf[R][Br / 16][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      softmax_grad_col_bf16p<Br>(dp[r], pf[r], Di, lane);  // dSᵀ = Pᵀ ∘ (dPᵀ − delta), without the scale
      acc_to_a<Br>(dsf[r], dp[r]);
      if constexpr (kFormDq) store_a_frags<Br>(sdSt + (warp * Tr::kWarpRows + r * kRowsPerWarp) * Tr::kLdsDs,
                                               Tr::kLdsDs, dsf[r], lane);
    }
    mma_ab_rows<R, D, Br>(dk, dsf, Qi, LDS, lane);  // dK += dSᵀ Q

    if constexpr (kFormDq) {
      __syncthreads();  // the whole dSᵀ tile is in smem
      constexpr int QR = Br / kRowsPerWarp, DQC = Tr::kDqCols;
      const int c0 = warp * DQC;
      float dq[QR][DQC / 8][4];  // dQ_i (Br, D) columns [c0, c0 + DQC): this key block's share
#pragma unroll
      for (int r = 0; r < QR; ++r) zero(dq[r]);
      mma_ab_smem_at_rows<QR, DQC, Bc>(dq, sdSt, Tr::kLdsDs, sK + c0, LDS, lane);  // dS K
      float* dst = dQacc + int64_t(q0) * D;
#pragma unroll
      for (int r = 0; r < QR; ++r) accumulate_rows_f32<DQC>(dst, D, dq[r], r * kRowsPerWarp, c0, lane);
    }
    __syncthreads();  // stage st (and the dSᵀ tile) is overwritten next
  }

  // dK = scale · Σ dSᵀ Q: the softmax scale applied once, in fp32.
  const float fk[2] = {p.scale, p.scale}, fv[2] = {1.0f, 1.0f};
#pragma unroll
  for (int r = 0; r < R; ++r) {
    store_rows<D>(dK, int(p.dk_row_stride), dk[r], fk, key0 + r * kRowsPerWarp, T, lane);
    store_rows<D>(dV, int(p.dv_row_stride), dv[r], fv, key0 + r * kRowsPerWarp, T, lane);
  }
}

// dQ (B, T, H, D) bf16 = scale · dq_accum (B, H, Tpad, D) fp32, the dK/dV kernel's sums. One
// thread per 8 elements of a (token, head) row: two 16-byte loads, one 16-byte store.
template <int D>
__global__ void flash_bwd_dq_convert_kernel(const float* __restrict__ dq_accum, int64_t t_pad, tg::bf16* dq,
                                            int64_t lddq, int64_t rows, int T, int H, float scale) {
  constexpr int G = D / 8;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t row = idx / G;  // (b·T + t)·H + h
  if (row >= rows) return;
  const int part = int(idx % G);
  const int64_t bt = row / H;
  const int h = int(row - bt * H);
  const int64_t t = bt % T, b = bt / T;
  // Chunk `part` of row t sits at part ^ (t % 8) (t % 4 at D = 32: dq_accum_offset's layout).
  const float4* src = reinterpret_cast<const float4*>(dq_accum + ((b * H + h) * t_pad + t) * D +
                                                      ((part ^ dq_accum_chunk_xor(int(t), D)) * 8));
  const float4 x = src[0], y = src[1];
  uint4 out;
  out.x = pack_bf16x2(x.x * scale, x.y * scale);
  out.y = pack_bf16x2(x.z * scale, x.w * scale);
  out.z = pack_bf16x2(y.x * scale, y.y * scale);
  out.w = pack_bf16x2(y.z * scale, y.w * scale);
  *reinterpret_cast<uint4*>(dq + bt * lddq + h * D + part * 8) = out;
}

// dQ for one query block: one block per (query block, head, batch). Warp w owns the R 16-row
// blocks of query rows starting at q0 + 16R·w; Q_i and dO_i stay in smem, K and V tiles stream
// double-buffered, and dQ accumulates in fp32 registers in key-block order: deterministic
// without atomics, at the price of recomputing S and dP a second time.
template <class Tr, bool kMasked = false>
__global__ void __launch_bounds__(Tr::kThreads) flash_bwd_dq_kernel(const FlashAttentionParams p,
                                                                     const float* __restrict__ delta) {
  constexpr int D = Tr::kD, Br = Tr::kOwn, Bc = Tr::kStream, LDS = Tr::kLds, NT = Tr::kThreads, R = Tr::kRowBlocks;
  static_assert(Tr::kDqAccRegs + 32 <= 255, "dQ, S, dP plus ~32 working registers must fit 255");
  extern __shared__ __align__(16) unsigned char smem[];
  tg::bf16* sQ = reinterpret_cast<tg::bf16*>(smem);  // (Br, LDS)
  tg::bf16* sdO = sQ + Tr::kTileOwn;                   // (Br, LDS)
  tg::bf16* sK = sdO + Tr::kTileOwn;                   // (stage, Bc, LDS)
  tg::bf16* sV = sK + kStages * Tr::kTileStream;       // (stage, Bc, LDS)

  const int T = int(p.T), H = int(p.H);
  const bool causal = p.causal;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int qb = causal ? int(gridDim.z) - 1 - int(blockIdx.z) : int(blockIdx.z);  // heaviest first
  const int h = blockIdx.x, b = blockIdx.y;
  const int q0 = qb * Br;
  // Row strides (resolved from 0 to H·D by the launcher) and this block's (b, 0, h, 0) pointers.
  const int ldq = int(p.q_row_stride), ldk = int(p.k_row_stride), ldv = int(p.v_row_stride);
  const int lddo = int(p.do_row_stride);
  const int64_t bt = int64_t(b) * T;
  const int hd = h * D;
  const tg::bf16* Q = p.q + bt * ldq + hd;
  const tg::bf16* K = p.k + bt * ldk + hd;
  const tg::bf16* V = p.v + bt * ldv + hd;
  const tg::bf16* dO = p.dout + bt * lddo + hd;
  tg::bf16* dQ = p.dq + bt * p.dq_row_stride + hd;

  // The key tiles kb0 … n_kb − 1, as in the forward.
  const SeqMask mask = seq_mask_if<kMasked>(p, b);
  const int q_last = min(q0 + Br, T) - 1;
  const int kb0 = mask.lo(q0) / Bc;  // 0 without a mask
  const int n_kb = causal ? q_last / Bc + 1 : (T + Bc - 1) / Bc;

  load_tile<Br, D, LDS, NT>(sQ, Q, ldq, q0, T, tid);
  load_tile<Br, D, LDS, NT>(sdO, dO, lddo, q0, T, tid);
  load_tile<Bc, D, LDS, NT>(sK, K, ldk, kb0 * Bc, T, tid);
  load_tile<Bc, D, LDS, NT>(sV, V, ldv, kb0 * Bc, T, tid);
  cp_async_commit();

  const float scale_log2 = p.scale * kLog2e;
  const int row0 = q0 + warp * Tr::kWarpRows;
  // Per-row statistics of this lane's rows g and g+8 of each row block (0 past T: those rows are
  // never stored).
  float lse2[R][2], dlt[R][2];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = row0 + r * kRowsPerWarp + (lane >> 2) + 8 * i;
      const int64_t at = (int64_t(b) * H + h) * T + row;
      lse2[r][i] = row < T ? p.lse[at] * kLog2e : 0.0f;
      dlt[r][i] = row < T ? delta[at] : 0.0f;
    }
  const tg::bf16* Qw = sQ + warp * Tr::kWarpRows * LDS;
  const tg::bf16* dOw = sdO + warp * Tr::kWarpRows * LDS;
  float dq[R][D / 8][4];  // (16, D) per row block
#pragma unroll
  for (int r = 0; r < R; ++r) zero(dq[r]);

  for (int j = kb0; j < n_kb; ++j) {
    const int st = (j - kb0) & 1;
    if (j + 1 < n_kb) {
      load_tile<Bc, D, LDS, NT>(sK + (st ^ 1) * Tr::kTileStream, K, ldk, (j + 1) * Bc, T, tid);
      load_tile<Bc, D, LDS, NT>(sV + (st ^ 1) * Tr::kTileStream, V, ldv, (j + 1) * Bc, T, tid);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const tg::bf16* Kj = sK + st * Tr::kTileStream;
    const tg::bf16* Vj = sV + st * Tr::kTileStream;
    const int k0 = j * Bc;

    float s[R][Bc / 8][4];  // S = Q Kᵀ, (16, Bc) per row block
#pragma unroll
    for (int r = 0; r < R; ++r) zero(s[r]);
    mma_abt_smem_a_rows<R, Bc, D>(s, Qw, LDS, Kj, LDS, lane);
    const bool need_mask = k0 + Bc > T || (causal && k0 + Bc - 1 > q0);
    const bool need_seq_mask = mask.needs_mask(q_last, k0);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      exp2_scaled_minus_row<Bc>(s[r], scale_log2, lse2[r]);  // P
      if (need_seq_mask)
        mask_tile<Bc>(s[r], row0 + r * kRowsPerWarp, k0, lane,
                      [=](int q, int k) { return k >= T || k > q || mask.excluded(q, k); }, 0.0f);
      else if (need_mask)
        mask_tile<Bc>(s[r], row0 + r * kRowsPerWarp, k0, lane,
                      [=](int q, int k) { return k >= T || (causal && k > q); }, 0.0f);
    }

    float dp[R][Bc / 8][4];  // dP = dO Vᵀ, (16, Bc) per row block
#pragma unroll
    for (int r = 0; r < R; ++r) zero(dp[r]);
    mma_abt_smem_a_rows<R, Bc, D>(dp, dOw, LDS, Vj, LDS, lane);
    uint32_t dsf[R][Bc / 16][4];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      softmax_grad_row<Bc>(dp[r], s[r], dlt[r]);  // dS = P ∘ (dP − delta), without the scale
      acc_to_a<Bc>(dsf[r], dp[r]);
    }
    mma_ab_rows<R, D, Bc>(dq, dsf, Kj, LDS, lane);  // dQ += dS K
    __syncthreads();
  }

  const float fq[2] = {p.scale, p.scale};
#pragma unroll
  for (int r = 0; r < R; ++r)
    store_rows<D>(dQ, int(p.dq_row_stride), dq[r], fq, row0 + r * kRowsPerWarp, T, lane);
}

// The backward's scratch, carved out of p.workspace in this order (each part 256-byte aligned):
// delta (B, H, T) fp32; with kAtomic (at head dims with an atomic-dQ kernel), the dQ accumulator
// (B, H, accum_rows(T), D) fp32, T padded to whole query tiles of both families' dK/dV kernels
// (32 rows mma.sync, 64 wgmma) so that their adds need no bounds test.
template <int D>
struct BwdWorkspace {
  static constexpr int kPadRows = 64;
  static_assert(kPadRows % flash::DkdvConfig<D>::kStream == 0, "whole mma.sync query tiles");
  static size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }
  static int64_t accum_rows(int64_t T) { return (T + kPadRows - 1) / kPadRows * kPadRows; }
  static size_t delta_bytes(int64_t B, int64_t T, int64_t H) { return round_up(size_t(B * H * T) * sizeof(float)); }
  static size_t accum_bytes(int64_t B, int64_t T, int64_t H) {
    return round_up(size_t(B * H) * size_t(accum_rows(T)) * D * sizeof(float));
  }
  static bool has_accum(FlashDq mode) { return mode != FlashDq::kRecompute && kMmaSyncAtomicDq<D>; }
  static size_t bytes(int64_t B, int64_t T, int64_t H, FlashDq mode) {
    return delta_bytes(B, T, H) + (has_accum(mode) ? accum_bytes(B, T, H) : 0);
  }

  float* delta;
  float* dq_accum;
  explicit BwdWorkspace(const FlashAttentionParams& p) {
    unsigned char* base = static_cast<unsigned char*>(p.workspace);
    delta = reinterpret_cast<float*>(base);
    dq_accum = has_accum(p.dq_mode) ? reinterpret_cast<float*>(base + delta_bytes(p.B, p.T, p.H)) : nullptr;
  }
};

}  // namespace flash

// ───────────────────────────── launchers ─────────────────────────────

namespace {

template <int D>
void launch_bwd(const FlashAttentionParams& p_in, cudaStream_t stream) {
  const FlashAttentionParams p = flash::with_resolved_row_strides(p_in);  // 0 strides → H·D
  const bool wgmma = flash::use_wgmma(p, "flash_attention_backward");     // may throw: before any launch
  using Ws = flash::BwdWorkspace<D>;
  const Ws ws(p);
  const int64_t rows = p.B * p.T * p.H;
  constexpr int kThreads = 256;
  const unsigned delta_blocks = unsigned((rows * flash::kDeltaLanes<D> + kThreads - 1) / kThreads);
  flash::flash_bwd_delta_kernel<D><<<delta_blocks, kThreads, 0, stream>>>(p.o, p.o_row_stride, p.dout, p.do_row_stride,
                                                                        ws.delta, rows, int(p.T), int(p.H));
  TG_CUDA_CHECK(cudaGetLastError());

  // kAtomic runs an atomic-dQ kernel only where one exists and is the faster (kAtomicKernel
  // wherever one exists); elsewhere the deterministic kernels serve both modes. On compute
  // capability 9.0 the wgmma ones (flash_bwd_sm90a.cu, sm90a_runs_atomic_dq), on the mma.sync
  // kernels every head dim but 96 (kMmaSyncAtomicDq).
  const bool atomic_dq = p.dq_mode != FlashDq::kRecompute &&
                         (wgmma ? flash::sm90a_runs_atomic_dq(p) : flash::kMmaSyncAtomicDq<D>);
  const int accum_rows = int(Ws::accum_rows(p.T));
  if (atomic_dq)  // every key block adds
    TG_CUDA_CHECK(cudaMemsetAsync(ws.dq_accum, 0, Ws::accum_bytes(p.B, p.T, p.H), stream));
  using Dkdv = flash::DkdvConfig<D>;
  if (wgmma) {
    FlashAttentionParams pw = p;
    pw.dq_mode = atomic_dq ? FlashDq::kAtomic : FlashDq::kRecompute;
    flash::flash_bwd_sm90a(pw, ws.delta, ws.dq_accum, accum_rows, stream);
  } else {
    flash::with_mask(p, [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;
      if (!atomic_dq) {
        using Dq = flash::DqConfig<D>;
        flash::launch_tile_kernel<Dkdv>(flash::flash_bwd_dkdv_kernel<Dkdv, FlashDq::kRecompute, kMasked>,
                                        Dkdv::kSmemBytes, p, stream, static_cast<const float*>(ws.delta), ws.dq_accum,
                                        accum_rows);
        flash::launch_tile_kernel<Dq>(flash::flash_bwd_dq_kernel<Dq, kMasked>, Dq::kSmemBytes, p, stream,
                                      static_cast<const float*>(ws.delta));
      } else if constexpr (flash::kMmaSyncAtomicDq<D>) {
        flash::launch_tile_kernel<Dkdv>(flash::flash_bwd_dkdv_kernel<Dkdv, FlashDq::kAtomic, kMasked>,
                                        Dkdv::kSmemDkdvBytes, p, stream, static_cast<const float*>(ws.delta),
                                        ws.dq_accum, accum_rows);
      }
    });
  }
  if (atomic_dq) {
    const unsigned row_blocks = unsigned((rows * (D / 8) + kThreads - 1) / kThreads);  // a thread per 8 elements
    flash::flash_bwd_dq_convert_kernel<D><<<row_blocks, kThreads, 0, stream>>>(
        ws.dq_accum, accum_rows, p.dq, p.dq_row_stride, rows, int(p.T), int(p.H), p.scale);
    TG_CUDA_CHECK(cudaGetLastError());
  }
}

// Why these block sizes (reasoned, then measured on the H200 with `tilegrad bench attention`:
// docs/kernels.md §4.1; the alternatives named at the end of each comment ran slower). As in
// the forward, a
// warp owning 2 row blocks (R = 2) reads each streamed fragment once for 2 mmas; the owned rows'
// A fragments (K, V in dK/dV; Q, dO in dQ) are re-read from smem per k-step, R x4 per k-step.
// ldmatrix.x4 per mma, per streamed tile: dK/dV (S, dV, dP, dK) and dQ (S, dP, dQ).
//
// D = 32 (no wgmma kernels: these run on every GPU). dK/dV: 4 warps × 2 row blocks own 128
// keys, as at d 64 — kAtomic's dQ product gives each warp D / 4 = 8 columns, the last n-tile
// loaded with ldmatrix.x2.trans —, query tiles of 32; dK, dV 2 × 32 registers, Sᵀ and dPᵀ
// 2 × 32; ptxas 159 registers (atomic 164), 0 spills. Twice the keys per streamed Q/dO tile of
// 2 warps (64 keys), which pays most in the atomic mode, whose dQ reductions are per streamed tile
// (docs/kernels.md §4.1). dQ: 4 warps × 2 row blocks own 128 queries, key tiles of 32, as at d 64.
void flash_bwd_hdim32(const FlashAttentionParams& p, cudaStream_t stream) { launch_bwd<32>(p, stream); }

// D = 64. dK/dV: 4 warps × 2 row blocks own 128 keys, query tiles of 32 stream through smem:
// 48 x4 per 128 mmas (0.375; 72 per 128 with 64 keys × 64 queries). dK, dV 2 × 64 regs, Sᵀ
// and dPᵀ 2 × 32; Pᵀ is kept only as bf16 fragments across the dPᵀ mma (dS reads it back) to
// fit: ptxas 255 regs (234 before row strides), 0 spills, 2 blocks (8 warps) per SM; smem
// 2 × 18 KiB owned + 2 stages × 2 × 4.5 KiB streamed + 0.5 KiB lse/delta = 55 KiB. dQ: 4 warps × 2 row blocks own 128
// queries, key tiles of 32: 40 x4 per 96 mmas (0.42; 0.58 at 16 rows per warp); 198 regs, 0 spills, 2 blocks
// per SM; 54 KiB smem. The 16-rows-per-warp alternative: both 4 warps × 16 rows, 64-row tiles, 168 regs, 3 blocks/SM.
void flash_bwd_hdim64(const FlashAttentionParams& p, cudaStream_t stream) { launch_bwd<64>(p, stream); }

// D = 96 (on GPUs other than the H100/H200, which run the d 128 wgmma kernels zero-padded:
// flash_bwd_sm90a). dK/dV: 6 warps × 1 row block own 96 keys, query tiles of 32; dK, dV 2 × 48
// registers, Sᵀ and dPᵀ 2 × 16; ptxas 167 registers, 2 blocks per SM. FA2's shape (8 warps, 128
// keys, 64-query tiles; 255 registers, one block per SM) hides less latency with one block per SM
// than two of 6 warps (docs/kernels.md §9). dQ: 4 warps × 2 row blocks own 128 queries, key tiles
// of 32, dQ 2 × 48 registers. kAtomic runs this pair too (kMmaSyncAtomicDq).
void flash_bwd_hdim96(const FlashAttentionParams& p, cudaStream_t stream) { launch_bwd<96>(p, stream); }

// D = 128. dK/dV: 4 warps own 64 keys (one row block each: dK and dV alone are 2 × 64 registers
// per row block, so R = 2 cannot fit 255), query tiles of 32 (Sᵀ, dPᵀ 16 regs each); ptxas 251
// regs, 0 spills, 2 blocks per SM; smem 2 × 17 KiB + 2 × 2 × 8.5 KiB + 0.5 KiB = 69 KiB.
// dQ: 4 warps × 2 row blocks own 128 queries (dQ 2 × 64 regs), key tiles of 32 (S, dP 2 × 16
// each): 80 x4 per 192 mmas (0.42; 0.58 at 16 rows × 64 keys); ptxas 255 regs, 0 spills,
// 2 blocks per SM; smem 2 × 34 + 2 × 2 × 8.5 = 102 KiB.
//
// kAtomic adds the dSᵀ tile to smem (own × (32 + 8) bf16: 10 KiB at d64, 5 KiB at d128; 254 and
// 255 regs, 0 spills) and the dQ mma, warp w the columns [w·D/4, (w+1)·D/4) of the 32 query rows.
// Faster than the default at d64, slower at d128, where the 64-key tiles double the atomic traffic
// per FLOP (docs/kernels.md §4.1). The FA2-like d128 alternative, 8 warps owning 128 keys (1
// block/SM: 115 KiB smem), is faster atomic but slower for the default's dK/dV kernel, so d128
// keeps 4 warps × 64 keys (docs/kernels.md §4.1, §9).
void flash_bwd_hdim128(const FlashAttentionParams& p, cudaStream_t stream) { launch_bwd<128>(p, stream); }

}  // namespace

size_t flash_attention_backward_workspace_bytes(int64_t B, int64_t T, int64_t H, int64_t D, FlashDq dq_mode) {
  // Any other D has no kernel: the backward rejects it before touching the workspace.
  switch (D) {
    case 32: return flash::BwdWorkspace<32>::bytes(B, T, H, dq_mode);
    case 64: return flash::BwdWorkspace<64>::bytes(B, T, H, dq_mode);
    case 96: return flash::BwdWorkspace<96>::bytes(B, T, H, dq_mode);
    default: return flash::BwdWorkspace<128>::bytes(B, T, H, dq_mode);
  }
}

void flash_attention_backward(const FlashAttentionParams& p, cudaStream_t stream) {
  const char* fn = "flash_attention_backward";
  require(flash_attention_supported(p.D), fn, "head dim D = " + std::to_string(p.D) + " has no kernel (32, 64, 96, 128)");
  require(p.B >= 0 && p.T >= 0 && p.H >= 0, fn, "negative size");
  // The grid is (H, B, tiles of ≥ 64 rows): B and the tile count are limited to 65535.
  require(p.T <= 65535LL * 64, fn, "T must be ≤ 4194240 (65535 tiles of 64 rows)");
  require(p.B <= 65535, fn, "B must be ≤ 65535 (a grid dimension)");
  // The persistent kernels count their work items, (head, batch row, 64-row tile), in int.
  require(p.H <= 65535 && p.H * p.B * ((p.T + 63) / 64) <= INT32_MAX, fn,
          "H ≤ 65535 and H·B·⌈T/64⌉ < 2^31 (work items are counted in int)");
  flash::require_mask(p, fn);
  if (p.B == 0 || p.T == 0 || p.H == 0) return;
  require(p.q && p.k && p.v && p.o && p.lse && p.dout && p.dq && p.dk && p.dv && p.workspace, fn, "null pointer");
  require(aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned16(p.o) && aligned16(p.dout) &&
              aligned16(p.dq) && aligned16(p.dk) && aligned16(p.dv) && aligned16(p.workspace),
          fn, "q, k, v, o, dout, dq, dk, dv, workspace must be 16-byte aligned");
  flash::require_row_strides(p, fn, /*backward=*/true);
  require(p.variant == 0 || flash::variant_name(p.variant) != nullptr, fn,
          "variant " + std::to_string(p.variant) + " is not in the registry (flash_attention_variants)");
  switch (p.D) {
    case 32: flash_bwd_hdim32(p, stream); break;
    case 64: flash_bwd_hdim64(p, stream); break;
    case 96: flash_bwd_hdim96(p, stream); break;
    default: flash_bwd_hdim128(p, stream); break;
  }
}

}  // namespace tg::cuda
