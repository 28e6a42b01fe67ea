// FlashAttention forward on Hopper's warpgroup MMA (sm_90a; built for that architecture alone, see
// CMakeLists.txt). The algorithm is flash_fwd.cu's — online softmax in log2 units, heaviest causal
// tiles first, mask only where a tile reaches past T or straddles the diagonal — with the two
// products moved from warp-level mma.sync to wgmma (wgmma.cuh): each warpgroup of a block owns 64
// query rows and forms S = Q Kᵀ from shared memory (Q and K K-major) and O += P V with P from
// registers (the S accumulator repacked, as the layouts coincide) and V MN-major. Tiles are
// 128-byte swizzled 64-column panels, loaded by all threads with cp.async. Two refinements over
// flash_fwd.cu: the scale is folded into the exponent's FFMA (tile.cuh, "raw scores"), and the
// pipelined shape issues S for tile j+1 before P_j V_j and runs tile j+1's softmax while that
// product does (FlashAttention-3's intra-warpgroup overlap), with a third K/V stage.
//
// flash_attention_forward runs it on compute capability 9.0 (FlashKernels::kAuto) for scale > 0;
// flash_fwd.cu's kernel is the fallback elsewhere and the tests' second opinion. Next
// (docs/flash-attention.md): TMA loads from a producer warpgroup, 128-key tiles.
#include <cuda_runtime.h>

#include <climits>
#include <cmath>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/flash_attention/kernel_traits.cuh"
#include "kernels/cuda/flash_attention/tile.cuh"
#include "kernels/cuda/flash_attention/wgmma.cuh"

namespace tg::cuda {

// ───────────────────────────── kernels ─────────────────────────────

namespace flash {

template <int D_, int Warpgroups, int MinBlocks, bool Pipelined>
struct FwdSm90aTraits {
  static constexpr int kD = D_;
  static constexpr int kWarpgroups = Warpgroups;  // each owns 64 query rows
  static constexpr int kMinBlocks = MinBlocks;    // blocks per SM the registers must allow
  // Pipelined: S for tile j+1 is issued before P_j V_j, and tile j+1's softmax runs while that
  // product does; K/V then need 3 stages (tile j+2 loads while j and j+1 are in use).
  static constexpr bool kPipelined = Pipelined;
  static constexpr int kKvStages = kPipelined ? 3 : kStages;
  static constexpr int kThreads = 128 * kWarpgroups;
  static constexpr int kBr = 64 * kWarpgroups;    // query rows per block
  static constexpr int kBc = 64;                  // keys per streamed tile: S is one m64n64 per warpgroup
  static constexpr int kPanels = kD / 64;         // 64-column swizzled panels per row
  static constexpr int kPanelQ = kBr * sm90::kSwizzleRowBytes, kPanelKV = kBc * sm90::kSwizzleRowBytes;
  static constexpr int kTileQ = kPanels * kPanelQ, kTileKV = kPanels * kPanelKV;  // bytes
  // Q, then K and V in kKvStages stages each, plus the slack that aligns them to a swizzle atom.
  static constexpr size_t kSmemBytes = size_t(kTileQ + 2 * kKvStages * kTileKV + sm90::kSwizzleAtomBytes);
  static_assert(kD == 64 || kD == 128, "head dims 64 and 128");
  static_assert(kMinBlocks * kSmemBytes <= 228 * 1024, "MinBlocks blocks must fit an SM's shared memory");
};

// Block shapes per head dim, each measured against the others on the H200 with `tilegrad bench
// attention` (2026-11-30, docs/BENCHMARKS.md, fourth session; TF/s at T = 8192 causal):
//   d 64:  2 warpgroups, 1 block per SM, pipelined (117 registers, 0 spills, 65 KiB): 400, and
//          5–10 % over the unpipelined kernel at every T (366 here); two blocks per SM: 396
//          pipelined, 375 not; 1 warpgroup × 1–3 blocks: 375 but 10–20 % lower non-causal.
//          At d 64 a tile's exp2/softmax work is as long as its wgmmas, so hiding it under the
//          P V product pays.
//   d 128: 2 warpgroups, 2 blocks per SM, not pipelined (__launch_bounds__ caps the registers
//          at 128: 32 bytes of spills; 97 KiB each): 477, against 335–349 with 1 block per SM
//          (161 registers), 388 pipelined with 1 block (171; two pipelined blocks do not fit
//          the shared memory) and 360–369 with 1 warpgroup × 1–3 blocks. The two warpgroups of a
//          block move in lockstep (a __syncthreads per tile), so their softmax phases coincide;
//          a second, independent block is what keeps the tensor cores fed.
template <int D> struct FwdSm90aConfig;
template <> struct FwdSm90aConfig<64> { using type = FwdSm90aTraits<64, 2, 1, true>; };
template <> struct FwdSm90aConfig<128> { using type = FwdSm90aTraits<128, 2, 2, false>; };

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) flash_fwd_sm90a_kernel(const FlashAttentionParams p) {
  constexpr int D = Tr::kD, Br = Tr::kBr, Bc = Tr::kBc, NT = Tr::kThreads, NS = Tr::kKvStages;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* sQ = sm90::align_to_swizzle_atom(smem);
  unsigned char* sK = sQ + Tr::kTileQ;  // (stage) tiles of Tr::kTileKV bytes
  unsigned char* sV = sK + NS * Tr::kTileKV;

  const int T = int(p.T), H = int(p.H);
  const bool causal = p.causal;
  const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid & 31;
  const int qb = causal ? int(gridDim.z) - 1 - int(blockIdx.z) : int(blockIdx.z);  // heaviest first
  const int h = blockIdx.x, b = blockIdx.y;
  const int q0 = qb * Br;
  const int ldq = int(p.q_row_stride), ldk = int(p.k_row_stride), ldv = int(p.v_row_stride);
  const int ldo = int(p.o_row_stride);
  const int64_t bt = int64_t(b) * T;
  const int hd = h * D;
  const tg::bf16* Q = p.q + bt * ldq + hd;
  const tg::bf16* K = p.k + bt * ldk + hd;
  const tg::bf16* V = p.v + bt * ldv + hd;
  tg::bf16* O = p.o + bt * ldo + hd;

  const int q_last = min(q0 + Br, T) - 1;
  const int n_kb = causal ? q_last / Bc + 1 : (T + Bc - 1) / Bc;
  const float scale2 = p.scale * kLog2e;  // > 0: the launcher sends other scales to flash_fwd.cu
  const int row0 = q0 + 64 * wg + 16 * warp;  // this warp's first query row
  const unsigned char* sQw = sQ + 64 * wg * sm90::kSwizzleRowBytes;  // the warpgroup's rows, in each panel

  // K/V tile j into stage j % NS.
  auto load_kv = [&](int j) {
    const int st = j % NS;
    sm90::load_tile_swizzled<Bc, D, NT>(sK + st * Tr::kTileKV, K, ldk, j * Bc, T, tid);
    sm90::load_tile_swizzled<Bc, D, NT>(sV + st * Tr::kTileKV, V, ldv, j * Bc, T, tid);
  };
  // Issues S = Q K_jᵀ, (64, Bc) per warpgroup, as one commit group: k-steps of 16 along D, 32
  // bytes along a panel's rows.
  auto issue_s = [&](float (&s)[Bc / 8][4], int j) {
    const unsigned char* Kj = sK + (j % NS) * Tr::kTileKV;
    sm90::wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      const int at = 32 * (ks % 4);
      sm90::wgmma_m64n64k16_ss<0>(sm90::flat(s), sm90::k_major_descriptor(sQw + (ks / 4) * Tr::kPanelQ + at),
                                  sm90::k_major_descriptor(Kj + (ks / 4) * Tr::kPanelKV + at), ks > 0);
    }
    sm90::wgmma_commit();
  };
  // Issues O += P V_j as one commit group: k-steps of 16 keys (16 rows of V, 2048 bytes), V's D
  // columns in 64-wide panels.
  auto issue_pv = [&](float (&o)[D / 8][4], const uint32_t (&pf)[Bc / 16][4], int j) {
    const unsigned char* Vj = sV + (j % NS) * Tr::kTileKV;
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Bc / 16; ++kk) {
      const uint64_t desc_v = sm90::mn_major_descriptor(Vj + kk * 16 * sm90::kSwizzleRowBytes, Tr::kPanelKV);
      if constexpr (D == 64)
        sm90::wgmma_m64n64k16_rs<1>(sm90::flat(o), pf[kk], desc_v, true);
      else
        sm90::wgmma_m64n128k16_rs<1>(sm90::flat(o), pf[kk], desc_v, true);
    }
    sm90::wgmma_commit();
  };
  // Raw scores of tile j → P (relative to the updated running max m), with the factor alpha that
  // re-bases O and l and this tile's row sums. Masks only where the tile reaches past T or
  // straddles the diagonal (uniform per warp).
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  auto softmax = [&](float (&s)[Bc / 8][4], int j, float (&alpha)[2], float (&sum)[2]) {
    const int k0 = j * Bc;
    if (k0 + Bc > T || (causal && k0 + Bc - 1 > row0))
      mask_tile<Bc>(s, row0, k0, lane, [=](int q, int k) { return k >= T || (causal && k > q); });
    update_row_max_raw<Bc>(m, alpha, s, scale2);
    exp2_rows_raw<Bc>(s, m, sum, scale2);
  };

  float o[D / 8][4];  // (16, D) per warp: the warpgroup's (64, D) accumulator
  zero(o);
  float s[Bc / 8][4], alpha[2], sum[2];
  uint32_t pf[Bc / 16][4];
  sm90::load_tile_swizzled<Br, D, NT>(sQ, Q, ldq, q0, T, tid);
  load_kv(0);
  cp_async_commit();

  if constexpr (!Tr::kPipelined) {
    for (int j = 0; j < n_kb; ++j) {
      if (j + 1 < n_kb) load_kv(j + 1);  // into the other stage (freed by the last barrier)
      cp_async_commit();
      cp_async_wait<1>();
      sm90::fence_async_shared();  // cp.async wrote through the generic proxy; wgmma reads through the async one
      __syncthreads();
      issue_s(s, j);
      sm90::wgmma_wait<0>();
      softmax(s, j, alpha, sum);
      rescale_accumulate<D>(o, l, alpha, sum);
      acc_to_a<Bc>(pf, s);
      issue_pv(o, pf, j);
      sm90::wgmma_wait<0>();
      __syncthreads();  // this stage is overwritten by the next prefetch
    }
  } else {
    // Tile 0's S and softmax first; then each step issues S for tile j+1 and P_j V_j together
    // and runs tile j+1's softmax while P_j V_j is in flight.
    if (n_kb > 1) load_kv(1);
    cp_async_commit();
    cp_async_wait<1>();
    sm90::fence_async_shared();
    __syncthreads();
    issue_s(s, 0);
    sm90::wgmma_wait<0>();
    softmax(s, 0, alpha, sum);
    rescale_accumulate<D>(o, l, alpha, sum);
    acc_to_a<Bc>(pf, s);
    for (int j = 0; j + 1 < n_kb; ++j) {
      cp_async_wait<0>();  // tile j+1 (this thread's copies)
      sm90::fence_async_shared();
      __syncthreads();  // tile j+1 visible to all, and every warpgroup is done with tile j-1's stage
      if (j + 2 < n_kb) load_kv(j + 2);
      cp_async_commit();
      issue_s(s, j + 1);
      issue_pv(o, pf, j);
      sm90::wgmma_wait<1>();  // S of tile j+1 has landed; P_j V_j may still run
      softmax(s, j + 1, alpha, sum);
      sm90::wgmma_wait<0>();  // P_j V_j has landed: O may be rescaled and pf rewritten
      rescale_accumulate<D>(o, l, alpha, sum);
      acc_to_a<Bc>(pf, s);
    }
    issue_pv(o, pf, n_kb - 1);  // the last tile (visible since the last barrier)
    sm90::wgmma_wait<0>();
  }

  // O = acc / l; lse = m·scale + ln l (m is a raw score), natural-log units as the CPU defines it.
  float* L = p.lse + (int64_t(b) * H + h) * T;
  float inv_l[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = quad_sum(l[i]);
    inv_l[i] = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
  }
  store_rows<D>(O, ldo, o, inv_l, row0, T, lane);
  if ((lane & 3) == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = row0 + (lane >> 2) + 8 * i;
      if (row < T) L[row] = m[i] * p.scale + logf(l[i]);
    }
  }
}

}  // namespace flash

// ───────────────────────────── launchers ─────────────────────────────

namespace {

// Block shapes: FwdSm90aConfig (above), with the measurements that chose them.
template <int D>
void launch_fwd_sm90a(const FlashAttentionParams& p, cudaStream_t stream) {
  using Tr = typename flash::FwdSm90aConfig<D>::type;
  auto kernel = flash::flash_fwd_sm90a_kernel<Tr>;
  TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::kSmemBytes)));
  const dim3 grid(unsigned(p.H), unsigned(p.B), unsigned((p.T + Tr::kBr - 1) / Tr::kBr));  // tile index slowest
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  TG_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

namespace flash {

void flash_fwd_sm90a(const FlashAttentionParams& p, cudaStream_t stream) {
  if (p.D == 64)
    launch_fwd_sm90a<64>(p, stream);
  else
    launch_fwd_sm90a<128>(p, stream);
}

}  // namespace flash

}  // namespace tg::cuda
