// FlashAttention forward on tensor cores: tiled online softmax over K/V tiles streamed through
// shared memory; writes O (bf16) and the per-row log-sum-exp (fp32) the backward recomputes P from.
// The portable (mma.sync) kernel; flash_attention_forward runs flash_fwd_sm90a.cu's wgmma twin on
// compute capability 9.0 instead (FlashKernels, use_wgmma below).
#include <cuda_runtime.h>

#include <atomic>
#include <climits>
#include <cmath>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/flash_attention/kernel_traits.cuh"
#include "kernels/cuda/flash_attention/mask.cuh"
#include "kernels/cuda/flash_attention/sm90_shapes.h"
#include "kernels/cuda/flash_attention/tile.cuh"

namespace tg::cuda {

// ───────────────────────────── kernels ─────────────────────────────

namespace flash {

// One block per (query block, head, batch). Warp w owns the R = kRowBlocks 16-row blocks of
// query rows q0 + 16R·w .. q0 + 16R·(w+1) − 1: their Q fragments stay in registers (or are re-read
// from smem, see kQInRegs), their S (16 × Bc) and O (16 × D) accumulators in registers, so the
// softmax statistics of a row never leave the 4 lanes that hold it. Each K/V fragment loaded from
// smem feeds the mmas of all R row blocks. kMasked: the structured masks (mask.cuh) are on.
template <class Tr, bool kMasked = false>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocks) flash_fwd_kernel(const FlashAttentionParams p) {
  constexpr int D = Tr::kD, Br = Tr::kBr, Bc = Tr::kBc, LDS = Tr::kLds, NT = Tr::kThreads, R = Tr::kRowBlocks;
  extern __shared__ __align__(16) unsigned char smem[];
  tg::bf16* sQ = reinterpret_cast<tg::bf16*>(smem);  // (Br, LDS)
  tg::bf16* sK = sQ + Tr::kTileQ;                      // (stage, Bc, LDS)
  tg::bf16* sV = sK + kStages * Tr::kTileKV;           // (stage, Bc, LDS)

  const int T = int(p.T), H = int(p.H);
  const bool causal = p.causal;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // Causal query blocks differ in cost (block i visits ~i key blocks): the grid is (head, batch,
  // tile) and blocks start in that order, so every head's heaviest tile starts before any lighter
  // one and the last wave holds the cheapest (longest-processing-time first).
  const int qb = causal ? int(gridDim.z) - 1 - int(blockIdx.z) : int(blockIdx.z);
  const int h = blockIdx.x, b = blockIdx.y;
  const int q0 = qb * Br;
  // Row strides (elements between consecutive tokens; already resolved from 0 to H·D by the
  // launcher) and this block's (b, 0, h, 0) base pointers: the only place the layout enters.
  const int ldq = int(p.q_row_stride), ldk = int(p.k_row_stride), ldv = int(p.v_row_stride);
  const int ldo = int(p.o_row_stride);
  const int64_t bt = int64_t(b) * T;
  const int hd = h * D;
  const tg::bf16* Q = p.q + bt * ldq + hd;
  const tg::bf16* K = p.k + bt * ldk + hd;
  const tg::bf16* V = p.v + bt * ldv + hd;
  tg::bf16* O = p.o + bt * ldo + hd;

  // Causal: key blocks starting after the last query row are wholly in the future, never loaded;
  // with a structured mask (mask.cuh) neither are those before the one holding lo(q0).
  const SeqMask mask = seq_mask_if<kMasked>(p, b);
  const int q_last = min(q0 + Br, T) - 1;
  const int kb0 = mask.lo(q0) / Bc;  // 0 without a mask
  const int n_kb = causal ? q_last / Bc + 1 : (T + Bc - 1) / Bc;  // (the end: tiles kb0 … n_kb − 1)

  load_tile<Br, D, LDS, NT>(sQ, Q, ldq, q0, T, tid);
  load_tile<Bc, D, LDS, NT>(sK, K, ldk, kb0 * Bc, T, tid);
  load_tile<Bc, D, LDS, NT>(sV, V, ldv, kb0 * Bc, T, tid);
  cp_async_commit();

  // Scores are kept in log2 units: x = S · scale · log2(e), so every exponential is one exp2.
  const float scale_log2 = p.scale * kLog2e;
  const int row0 = q0 + warp * Tr::kWarpRows;  // this warp's first query row
  float o[R][D / 8][4];                        // (16, D) accumulator per row block, unnormalised
  float m[R][2], l[R][2];  // running max of rows g, g+8 (log2 units); this lane's part of the sums
#pragma unroll
  for (int r = 0; r < R; ++r) {
    zero(o[r]);
    m[r][0] = m[r][1] = -INFINITY;
    l[r][0] = l[r][1] = 0.0f;
  }
  const tg::bf16* sQw = sQ + warp * Tr::kWarpRows * LDS;  // this warp's Q rows in smem
  uint32_t qf[R][Tr::kQInRegs ? D / 16 : 1][4];           // ... or as A fragments in registers

  for (int j = kb0; j < n_kb; ++j) {
    const int st = (j - kb0) & 1;
    if (j + 1 < n_kb) {  // prefetch tile j+1 into the other stage (freed by the last barrier)
      load_tile<Bc, D, LDS, NT>(sK + (st ^ 1) * Tr::kTileKV, K, ldk, (j + 1) * Bc, T, tid);
      load_tile<Bc, D, LDS, NT>(sV + (st ^ 1) * Tr::kTileKV, V, ldv, (j + 1) * Bc, T, tid);
    }
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning "tile j"
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (Tr::kQInRegs)
      if (j == kb0)
#pragma unroll
        for (int r = 0; r < R; ++r) load_a_frags<D>(qf[r], sQw + r * kRowsPerWarp * LDS, LDS, lane);
    const tg::bf16* Kj = sK + st * Tr::kTileKV;
    const tg::bf16* Vj = sV + st * Tr::kTileKV;

    float s[R][Bc / 8][4];  // S = Q Kᵀ, (16, Bc) per row block
#pragma unroll
    for (int r = 0; r < R; ++r) zero(s[r]);
    if constexpr (Tr::kQInRegs)
      mma_abt_rows<R, Bc, D>(s, qf, Kj, LDS, lane);
    else
      mma_abt_smem_a_rows<R, Bc, D>(s, sQw, LDS, Kj, LDS, lane);

    // Only tiles that reach past T, straddle the diagonal or (structured masks) reach before the
    // last row's first visible key pay for the mask.
    const int k0 = j * Bc;
    const bool need_mask = k0 + Bc > T || (causal && k0 + Bc - 1 > q0);
    const bool need_seq_mask = mask.needs_mask(q_last, k0);
    uint32_t pf[R][Bc / 16][4];  // P as bf16 A fragments
#pragma unroll
    for (int r = 0; r < R; ++r) {
      scale_tile<Bc>(s[r], scale_log2);
      if (need_seq_mask)
        mask_tile<Bc>(s[r], row0 + r * kRowsPerWarp, k0, lane,
                      [=](int q, int k) { return k >= T || k > q || mask.excluded(q, k); });
      else if (need_mask)
        mask_tile<Bc>(s[r], row0 + r * kRowsPerWarp, k0, lane,
                      [=](int q, int k) { return k >= T || (causal && k > q); });
      float m_new[2] = {m[r][0], m[r][1]};
      row_max<Bc>(m_new, s[r]);
      rescale<D>(o[r], l[r], m[r], m_new);
      m[r][0] = m_new[0], m[r][1] = m_new[1];
      exp2_row_sum<Bc>(s[r], m[r], l[r]);  // s is now P (relative to the running max)
      acc_to_a<Bc>(pf[r], s[r]);
    }
    mma_ab_rows<R, D, Bc>(o, pf, Vj, LDS, lane);  // O += P V
    __syncthreads();                               // stage st is overwritten by the next prefetch
  }

  // O = acc / l; lse = (m + log2 l)·ln 2 = max + log(sum) of the scaled scores in natural log.
  float* L = p.lse + (int64_t(b) * H + h) * T;  // (T,) of this head
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float inv_l[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      l[r][i] = quad_sum(l[r][i]);
      inv_l[i] = l[r][i] > 0.0f ? 1.0f / l[r][i] : 0.0f;  // l ≥ 1 for every real row; padding rows are not stored
    }
    const int rb0 = row0 + r * kRowsPerWarp;
    store_rows<D>(O, ldo, o[r], inv_l, rb0, T, lane);
    if ((lane & 3) == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int row = rb0 + (lane >> 2) + 8 * i;
        if (row < T) L[row] = m[r][i] * kLn2 + logf(l[r][i]);
      }
    }
  }
}

}  // namespace flash

// ───────────────────────────── launchers ─────────────────────────────

namespace {

template <int D>
void launch_fwd(const FlashAttentionParams& p, cudaStream_t stream) {
  using Tr = flash::FwdConfig<D>;
  flash::with_mask(p, [&](auto masked) {
    auto kernel = flash::flash_fwd_kernel<Tr, decltype(masked)::value>;
    TG_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Tr::kSmemBytes)));
    const dim3 grid(unsigned(p.H), unsigned(p.B), unsigned((p.T + Tr::kBr - 1) / Tr::kBr));  // tile index slowest
    kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, stream>>>(flash::with_resolved_row_strides(p));
    TG_CUDA_CHECK(cudaGetLastError());
  });
}

// Why these block sizes (reasoned, then measured on the H200 with `tilegrad bench attention`:
// docs/kernels.md §4.1; the 16-rows-per-warp alternatives are in the last line of each comment):
// A warp owns 2 row blocks (32 query rows), so every K or V fragment it loads with ldmatrix
// feeds 2 mmas. Shared memory delivers 128 B/clk per SM and an m16n8k16 B fragment is 256 B,
// so with one row block per warp the ldmatrix traffic alone capped the mmas at 0.5 per clock
// per SM, below the tensor cores' mma.sync rate; 2 row blocks halve the bytes per mma and give
// each warp two independent mma chains, which is what lets 8 warps per SM keep the tensor cores
// busy (FlashAttention-2's forward: 4 warps × 32 rows).
//
// D = 32: 4 warps × 2 row blocks (Br = 128), Bc = 64 keys, Q in registers, as at d 64. O is 32
// registers, S 64, Q 16: 112 long-lived, so __launch_bounds__(128, 3) (≤ 168 registers) lets 3
// blocks (12 warps) share an SM — at half d 64's products per score the exponentials and the
// row statistics weigh twice as much, and more warps hide their latency. smem 10 KiB Q +
// 2 × 2 × 5 KiB K/V = 30 KiB per block.
void flash_fwd_hdim32(const FlashAttentionParams& p, cudaStream_t stream) { launch_fwd<32>(p, stream); }

// D = 64 (measured 294.8 TF/s at T = 8192 full, 276.0 causal): 4 warps (Br = 128), Bc = 64 keys, Q fragments in registers. Per tile and warp: 32
// ldmatrix.x4 for 128 mmas (0.25 x4/mma, against 0.5 at 16 rows per warp). O and S are 64 registers each, Q 32: ptxas
// 244 regs (251 without the warp-uniform rescale skip), 0 spills under __launch_bounds__(128, 2); smem
// 18 KiB Q + 2 stages × 2 × 9 KiB K/V = 54 KiB, 2 blocks (8 warps) per SM. The 16-rows-per-warp alternative: 8 warps × 16 rows, Bc 64, 128 regs, 2 blocks/SM
// (measured 265.7 TF/s at T = 8192 full, 254.7 causal).
void flash_fwd_hdim64(const FlashAttentionParams& p, cudaStream_t stream) { launch_fwd<64>(p, stream); }

// D = 96: 4 warps × 2 row blocks (Br = 128), Bc = 64 keys (FlashAttention-2's d 96 tile), Q
// re-read from smem: O 2 × 48 registers, S 2 × 32; ptxas 255 registers, 0 spills; smem 26 KiB Q
// + 2 × 2 × 13 KiB K/V = 78 KiB, 2 blocks per SM. Faster than 32-key tiles at every benchmark
// shape taken together (docs/kernels.md §4.1).
void flash_fwd_hdim96(const FlashAttentionParams& p, cudaStream_t stream) { launch_fwd<96>(p, stream); }

// D = 128 (measured 317.1 TF/s at T = 8192 full, 284.1 causal): 4 warps (Br = 128), Bc = 32 keys,
// Q re-read from smem at every k-step. O alone is
// 2 × 64 registers; Q in registers would add 64 and Bc = 64 another 64, past 255. Per tile and
// warp: Q Kᵀ 8 k-steps × (2 Q + 2 K) x4, P V 2 × 8 x4 = 48 x4 for 128 mmas (0.375 x4/mma, against
// 0.625 with 16 rows per warp). ptxas: 245 regs (255 without the rescale skip), 0 spills under
// __launch_bounds__(128, 2); smem 34 KiB Q + 2 × 2 × 8.5 KiB K/V = 68 KiB, 2 blocks (8 warps) per SM. The 16-rows-per-warp alternative: 8 warps × 16
// rows, Bc 32, Q from smem, 128 regs, 2 blocks/SM (measured 275.0 TF/s at T = 8192 full, 247.1
// causal). Skipping the O rescale when no row of a warp moved its max (tile.cuh, rescale) pays at
// d 128, whose O rescale is twice d 64's work (docs/kernels.md §2.1).
void flash_fwd_hdim128(const FlashAttentionParams& p, cudaStream_t stream) { launch_fwd<128>(p, stream); }

}  // namespace

namespace flash {

bool device_is_sm90() {
  // 0 = not asked yet, 1 = no, 2 = yes; per device ordinal (more devices are simply asked each time).
  static std::atomic<int> known[64];
  int device = 0;
  TG_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 64 && known[device].load(std::memory_order_relaxed) != 0) return known[device] == 2;
  int major = 0, minor = 0;
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  const bool sm90 = major == 9 && minor == 0;
  if (device < 64) known[device].store(sm90 ? 2 : 1, std::memory_order_relaxed);
  return sm90;
}

bool use_wgmma(const FlashAttentionParams& p, const char* fn) {
  switch (p.kernels) {
    case FlashKernels::kMmaSync:
      return false;
    case FlashKernels::kWgmma:
      require(device_is_sm90(), fn,
              "FlashKernels::kWgmma needs compute capability 9.0 (H100/H200): its kernels are sm_90a code");
      require(wgmma_head_dim(p.D), fn,
              "FlashKernels::kWgmma has kernels for head dims 64, 96 and 128, not D = " + std::to_string(p.D) +
                  "; kAuto runs the mma.sync kernels there");
      return true;
    case FlashKernels::kAuto:
    default:
      return wgmma_head_dim(p.D) && device_is_sm90();
  }
}

}  // namespace flash

bool flash_attention_supported(int64_t D) { return D == 32 || D == 64 || D == 96 || D == 128; }

std::vector<FlashVariant> flash_attention_variants() {
  std::vector<FlashVariant> out;
  auto add = [&](const char* kernel) {
    return [&out, kernel](auto tag) {
      using S = typename decltype(tag)::type;
      out.push_back({S::name, kernel, S::head_dim, S::mask == flash::Mask::kAny ? 0 : S::mask == flash::Mask::kCausal ? 1 : 2,
                     S::min_t, S::max_t});
    };
  };
  // (In the order of flash::AllVariants: entry i is variant i + 1.)
  flash::for_each_shape(flash::FwdVariants{}, add("forward"));
  flash::for_each_shape(flash::DkdvVariants{}, add("dK/dV"));
  flash::for_each_shape(flash::DqVariants{}, add("dQ"));
  return out;
}
int flash_attention_variant(const std::string& name) { return flash::variant_id(name.c_str()); }

void flash_attention_forward(const FlashAttentionParams& p, cudaStream_t stream) {
  const char* fn = "flash_attention_forward";
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
  require(p.q && p.k && p.v && p.o && p.lse, fn, "null pointer");
  require(aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && aligned16(p.o), fn,
          "q, k, v, o must be 16-byte aligned (cp.async)");
  flash::require_row_strides(p, fn, /*backward=*/false);
  require(p.variant == 0 || flash::variant_name(p.variant) != nullptr, fn,
          "variant " + std::to_string(p.variant) + " is not in the registry (flash_attention_variants)");
  if (flash::use_wgmma(p, fn)) {
    if (p.scale > 0.0f) {
      flash::flash_fwd_sm90a(flash::with_resolved_row_strides(p), stream);
      return;
    }
    require(p.kernels != FlashKernels::kWgmma, fn,
            "the wgmma forward needs scale > 0 (it takes the row max of unscaled scores); kAuto runs the "
            "mma.sync forward for other scales");
  }
  switch (p.D) {
    case 32: flash_fwd_hdim32(p, stream); break;
    case 64: flash_fwd_hdim64(p, stream); break;
    case 96: flash_fwd_hdim96(p, stream); break;
    default: flash_fwd_hdim128(p, stream); break;
  }
}

}  // namespace tg::cuda
