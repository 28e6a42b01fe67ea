// The MLP backward's GELU-derivative GEMM on Hopper (dgelu_gemm.h): dpre = gelu'(pre) ⊙ (g · W_proj)
// and the up-projection's bias gradient Σ_rows dpre, in one warp-specialised wgmma kernel.
//
// Why a kernel of our own: cuBLASLt's DGELU epilogue runs GPT-2's (16384 × 3072 × 768) product on
// an older kernel than its plain GEMM (166 against 104 µs a layer), and the bias gradient then
// reads dpre back in a column-sum pass (docs/performance.md, "Where a step's time goes").
//
// Work is in units of two row tiles (128 rows each) of one column tile (256 columns) of C. A
// cluster of two blocks takes every so many units, each block one of the unit's row tiles, and a
// block is a producer warpgroup and two consumer warpgroups of 64 rows:
//   producer     one thread streams A's (128 × 64) K steps by TMA and half of B's (64 × 256),
//                multicast into both blocks of the cluster, through kStages swizzled stage
//                buffers, on across the units; once a tile's first steps are queued it loads the
//                tile's pre (128 × 256, four 64-column panels) into a buffer of its own, as soon as
//                the last tile's stores have read that buffer;
//   products     each consumer forms its 64 rows with two wgmma m64n128k16 per 16 K, A K-major
//                and B MN-major (W_proj as stored, (K, N) row-major), one product group in flight,
//                and releases each stage in both blocks;
//   gelu'        while the last 8 K steps' products run, each thread turns its own positions of
//                the pre buffer into gelu'(pre) (gelu.cuh's expression) in place, as fp16 (2⁻¹¹
//                relative, against the output's bf16 2⁻⁸);
//   epilogue     each thread multiplies its accumulators by the gelu' at the same positions and
//                writes the bf16 products over them; the consumer's first thread stores its 64 rows
//                by TMA, and the consumer sums their columns on the tensor cores (ones · dpre)
//                into a partial row of its own, which a second pass (common.cuh's
//                column_sum_kernel) adds in row order. The first thread waits for the copy engine
//                to have read the rows during the next tile's first step, before the producer may
//                reload the buffer.
// Every order is fixed by the shape, so runs are bitwise reproducible.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dgelu_gemm.h"
#include "kernels/cuda/flash_attention/sm90_ptx.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/tma.h"

namespace tg::cuda {
namespace flash {
bool device_is_sm90();  // flash_fwd.cu
}
namespace {

using namespace flash::sm90;
using flash::smem_addr;

constexpr int kTileRows = 128;  // rows of C per tile: two consumer warpgroups of 64
constexpr int kTileCols = 256;  // columns of C per tile: four 64-column panels
constexpr int kPanels = kTileCols / 64;
constexpr int kDepth = 64;    // K per stage: one 128-byte swizzled row of A
constexpr int kStages = 3;    // 3 × 48 KB and the 64 KB pre buffer: one block per SM
constexpr int kCluster = 2;   // blocks per cluster: row tiles r, r + 1 of one column block share B
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (1 + kConsumers);  // warpgroup 0 is the producer
constexpr int kConsumerWarps = 4 * kConsumers;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(fits_launch_registers(kThreads, kProducerRegs, kConsumers, kConsumerRegs),
              "the register hand-over must fit the launch (sm90_ptx.cuh, setmaxnreg)");
// gelu' is formed in kSlices slices of kSliceGroups 8-column groups per thread, one slice per K
// step over the tile's last kSlices steps (the rest in the epilogue when K has fewer steps).
constexpr int kSliceGroups = 4;
constexpr int kSlices = kTileCols / 8 / kSliceGroups;

constexpr int kABytes = kTileRows * kSwizzleRowBytes;        // 16 KB
constexpr int kBPanelBytes = kDepth * kSwizzleRowBytes;       // 8 KB: 64 K-rows of 64 columns
constexpr int kBBytes = kPanels * kBPanelBytes;               // 32 KB, half of it loaded by each block
constexpr int kPrePanelBytes = kTileRows * kSwizzleRowBytes;  // 16 KB: 128 rows of 64 columns
constexpr int kPreBytes = kPanels * kPrePanelBytes;           // 64 KB
constexpr int kBarriers = 2 * kStages + 2;
constexpr size_t kSmemBytes =
    kSwizzleAtomBytes + kStages * (kABytes + kBBytes) + kPreBytes + kBarriers * sizeof(uint64_t);
static_assert(kSmemBytes <= 227 * 1024, "one block per SM");

struct DgeluGemmArgs {
  float* partial;  // null: no column sums; else (2 · row tiles rounded up to kCluster, N)
  int N, k_tiles, col_tiles, units;  // a unit: kCluster row tiles of one column tile
};

__device__ __forceinline__ float bf16_low(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_high(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // a → upper half, b → lower
  return r;
}
__device__ __forceinline__ float2 unpack_half2(uint32_t w) {
  __half2 h;
  static_assert(sizeof(h) == sizeof(w));
  memcpy(&h, &w, sizeof(w));
  return __half22float2(h);
}

// ── Thread-block clusters (PTX ISA: cluster, multicast, distributed shared memory) ──
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
// Every thread of every block of the cluster: the barriers initialised before any block's copies
// or arrivals reach them, and at the end no block exits while the other may still use its memory.
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// tma_load_4d into the same shared-memory offset of every block in `mask`, completing bytes on
// the mbarrier at bar's offset in each.
__device__ __forceinline__ void tma_load_4d_multicast(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                                      uint64_t* bar, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%2, "
      "%3, %4, %5}], [%6], %7;\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar)), "h"(mask)
      : "memory");
}
// One arrival on the mbarrier at bar's offset in block `rank` of the cluster (this one or another).
__device__ __forceinline__ void mbarrier_arrive_in(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
      "r"(rank)
      : "memory");
}
__device__ __forceinline__ void mbarrier_wait_cluster(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}

__global__ void __launch_bounds__(kThreads, 1)
    dgelu_gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                      const __grid_constant__ CUtensorMap pre_map, const __grid_constant__ CUtensorMap c_map,
                      const DgeluGemmArgs args) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sA = align_to_swizzle_atom(smem_raw);
  unsigned char* sB = sA + kStages * kABytes;
  unsigned char* sPre = sB + kStages * kBBytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(sPre + kPreBytes);
  uint64_t* empty = full + kStages;
  uint64_t* pre_full = empty + kStages;
  uint64_t* pre_empty = pre_full + 1;
  const int tid = int(threadIdx.x), wg = warpgroup_index();
  const uint32_t rank = cluster_rank();
  // The cluster's units: u = cluster, cluster + clusters, …; unit u is column tile u % col_tiles
  // of row tiles kCluster·(u / col_tiles) + rank (this block's).
  const int cluster = int(blockIdx.x) / kCluster, clusters = int(gridDim.x) / kCluster;
  auto unit_row0 = [&](int u) { return (kCluster * (u / args.col_tiles) + int(rank)) * kTileRows; };
  auto unit_panel0 = [&](int u) { return (u % args.col_tiles) * kPanels; };
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kCluster * kConsumerWarps);  // both blocks read the stage B is multicast to
    }
    mbarrier_init(pre_full, 1);
    mbarrier_init(pre_empty, kConsumers);
    fence_barrier_init();
  }
  cluster_sync();

  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (tid == 0) {
      const int pre_at = min(kStages, args.k_tiles);  // pre after the tile's first steps are queued
      for (int u = cluster, t = 0, q = 0; u < args.units; u += clusters, ++t) {
        const int row0 = unit_row0(u), panel0 = unit_panel0(u);
        auto load_pre = [&] {
          if (t > 0) mbarrier_wait(pre_empty, uint32_t(t - 1) & 1);  // the last tile's stores have read it
          mbarrier_arrive_expect_tx(pre_full, kPreBytes);              // rows past M arrive as zeros
          for (int p = 0; p < kPanels; ++p)
            tma_load_4d(sPre + p * kPrePanelBytes, &pre_map, 0, panel0 + p, row0, 0, pre_full);
        };
        for (int kt = 0; kt < args.k_tiles; ++kt, ++q) {
          if (kt == pre_at) load_pre();
          const int st = q % kStages;
          // Both blocks' consumers have read the stage's last use (this block multicasts into the other's).
          if (q >= kStages) mbarrier_wait_cluster(&empty[st], uint32_t(q / kStages - 1) & 1);
          mbarrier_arrive_expect_tx(&full[st], kABytes + kBBytes);
          tma_load_4d(sA + st * kABytes, &a_map, 0, kt, row0, 0, &full[st]);
          for (int p = int(rank) * kPanels / kCluster; p < (int(rank) + 1) * kPanels / kCluster; ++p)
            tma_load_4d_multicast(sB + st * kBBytes + p * kBPanelBytes, &b_map, 0, panel0 + p, kt * kDepth, 0,
                                  &full[st], uint16_t((1u << kCluster) - 1));
        }
        if (pre_at == args.k_tiles) load_pre();
      }
    }
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    const int c = wg - 1, warp = (tid % 128) / 32, lane = tid & 31;
    const bool issuer = tid % 128 == 0;
    // This thread's positions in the pre buffer: rows 64c + 16·warp + lane/4 and 8 below it (the
    // accumulator's rows, sm90_ptx.cuh's D layout), columns 8j + 2·(lane % 4) + {0, 1} of 8-column
    // group j, which is 16-byte chunk j % 8 of panel j / 8, swizzled by the row (lane/4 mod 8 for both).
    unsigned char* const my_rows = sPre + (64 * c + 16 * warp + (lane >> 2)) * kSwizzleRowBytes + 4 * (lane & 3);
    const uint32_t chunk_xor = 16u * uint32_t(lane >> 2);
    auto word = [&](int j, int half) {
      return reinterpret_cast<uint32_t*>(my_rows + (j / 8) * kPrePanelBytes +
                                         ((16u * uint32_t(j % 8)) ^ chunk_xor) + half * 8 * kSwizzleRowBytes);
    };
    auto gelu_grad_slice = [&](int s) {  // pre → gelu'(pre) in place at this thread's positions
#pragma unroll
      for (int i = 0; i < kSliceGroups; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          uint32_t* w = word(s * kSliceGroups + i, half);
          const uint32_t v = *w;
          *w = pack_half2(gelu_grad(bf16_low(v)), gelu_grad(bf16_high(v)));
        }
    };
    // Stream step q's stage read by this warp: one arrival in each block of the cluster.
    auto release = [&](int q) {
      __syncwarp();
      if (lane < kCluster) mbarrier_arrive_in(&empty[q % kStages], uint32_t(lane));
    };
    const int first_slice_step = max(args.k_tiles - kSlices, 1);
    // The column sums' A operand: a 64 × 16 tile of ones (register form, any fragment layout).
    const uint32_t ones[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};

    for (int u = cluster, t = 0, q = 0; u < args.units; u += clusters, ++t) {
      const int row0 = unit_row0(u), panel0 = unit_panel0(u);
      float acc[kTileCols / 8][4];  // columns 0–127 and 128–255: two m64n128 products per k-step
#pragma unroll
      for (int j = 0; j < kTileCols / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
      float(&acc_lo)[16][4] = *reinterpret_cast<float(*)[16][4]>(&acc[0][0]);
      float(&acc_hi)[16][4] = *reinterpret_cast<float(*)[16][4]>(&acc[16][0]);
      int slices = 0;
      for (int kt = 0; kt < args.k_tiles; ++kt, ++q) {
        const int st = q % kStages;
        mbarrier_wait(&full[st], uint32_t(q / kStages) & 1);
        wgmma_fence();
        const uint64_t da = k_major_descriptor(sA + st * kABytes + c * 64 * kSwizzleRowBytes);
        const uint64_t db = mn_major_descriptor(sB + st * kBBytes, kBPanelBytes);
#pragma unroll
        for (int ks = 0; ks < kDepth / 16; ++ks) {  // 16 K: 32 bytes along A's rows, 16 rows of B
          wgmma_m64n128k16_ss<1>(flat(acc_lo), da + uint64_t((32 * ks) >> 4),
                                 db + uint64_t((16 * ks * kSwizzleRowBytes) >> 4), true);
          wgmma_m64n128k16_ss<1>(flat(acc_hi), da + uint64_t((32 * ks) >> 4),
                                 db + uint64_t((2 * kBPanelBytes + 16 * ks * kSwizzleRowBytes) >> 4), true);
        }
        wgmma_commit();
        if (kt == 0 && t > 0 && issuer) {  // the last tile's stores have read the pre buffer: reload it
          bulk_wait_read<0>();
          mbarrier_arrive(pre_empty);
        }
        if (kt >= first_slice_step && slices < kSlices) {
          if (slices == 0) mbarrier_wait(pre_full, uint32_t(t) & 1);
          gelu_grad_slice(slices++);
        }
        wgmma_wait<1>();  // the step before has finished reading its stage
        if (kt > 0) release(q - 1);
      }
      wgmma_wait<0>();
      release(q - 1);
      if (slices == 0) mbarrier_wait(pre_full, uint32_t(t) & 1);
      while (slices < kSlices) gelu_grad_slice(slices++);

      // dpre = acc · gelu', rounded to bf16, over gelu' in the buffer; stored by the copy engine.
#pragma unroll
      for (int j = 0; j < kTileCols / 8; ++j)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          uint32_t* w = word(j, half);
          const float2 g = unpack_half2(*w);
          *w = pack_bf16x2(acc[j][2 * half] * g.x, acc[j][2 * half + 1] * g.y);
        }
      fence_async_shared();  // st.shared, read by the copy engine and by the column sums' products
      named_barrier_sync(1 + c, 128);
      if (issuer) {
        for (int p = 0; p < kPanels; ++p)
          tma_store_4d(&c_map, 0, panel0 + p, row0 + 64 * c, 0, sPre + p * kPrePanelBytes + 64 * c * kSwizzleRowBytes);
        bulk_commit();
      }
      if (args.partial) {
        // The column sums of the warpgroup's 64 stored rows on the tensor cores: acc = 1 · dpre
        // (ones (64 × 64) times the rows as a K = 64 operand, MN-major as stored), so that every
        // row of acc holds them; rows past M are 0 (A's zero fill). Warp w's first quad writes
        // columns 64w … 64w + 63 into this warpgroup's partial row.
        wgmma_fence();
        const uint64_t dd = mn_major_descriptor(sPre + 64 * c * kSwizzleRowBytes, kPrePanelBytes);
#pragma unroll
        for (int ks = 0; ks < 64 / 16; ++ks) {
          wgmma_m64n128k16_rs<1>(flat(acc_lo), ones, dd + uint64_t((16 * ks * kSwizzleRowBytes) >> 4), ks > 0);
          wgmma_m64n128k16_rs<1>(flat(acc_hi), ones,
                                 dd + uint64_t((2 * kPrePanelBytes + 16 * ks * kSwizzleRowBytes) >> 4), ks > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        if (lane < 4) {
          float* out = args.partial + int64_t(2 * (row0 / kTileRows) + c) * args.N + int64_t(panel0) * 64 + 2 * lane;
#pragma unroll
          for (int j = 0; j < kTileCols / 8; ++j)
            if (j / 8 == warp) *reinterpret_cast<float2*>(out + 8 * j) = make_float2(acc[j][0], acc[j][1]);
        }
      }
    }
    if (issuer) bulk_wait<0>();  // the stores' source is this block's shared memory
  }
  cluster_sync();
}

// Blocks: as many clusters as can be resident at once (one block per SM), each taking every
// so many units.
int cluster_count(const cudaLaunchConfig_t& config) {
  static int clusters = 0;  // per process: the kernel and its launch shape are fixed
  if (clusters == 0) {
    TG_CUDA_CHECK(cudaFuncSetAttribute(dgelu_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    TG_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, dgelu_gemm_kernel, &config));
    if (clusters < 1) throw std::runtime_error("dgelu_gemm_sm90: no cluster of 2 blocks fits this GPU");
  }
  return clusters;
}

int64_t row_tile_pairs(int64_t M) { return (M + kCluster * kTileRows - 1) / (kCluster * kTileRows); }

}  // namespace

size_t dgelu_gemm_partial_floats(int64_t M, int64_t N) {
  return M <= 0 || N < kTileCols ? 0 : size_t(row_tile_pairs(M) * kCluster * kConsumers * N);
}

bool dgelu_gemm_sm90(int64_t M, int64_t N, int64_t K, const tg::bf16* A, const tg::bf16* B, const tg::bf16* pre,
                     tg::bf16* C, tg::bf16* dbias, float* partial, cudaStream_t stream) {
  if (M <= 0 || N <= 0 || K <= 0 || N % kTileCols != 0 || K % kDepth != 0) return false;
  if (M > INT32_MAX - 2 * kCluster * kTileRows || N > INT32_MAX || K > INT32_MAX) return false;  // TMA coordinates are int32
  if (!aligned16(A) || !aligned16(B) || !aligned16(pre) || !aligned16(C)) return false;
  if (dbias && (!aligned16(dbias) || partial == nullptr || !aligned16(partial))) return false;
  if (!flash::device_is_sm90()) return false;
  // A (M, K) as 64-column panels of 128-row boxes; B (K, N) as 64-column panels of 64-row boxes;
  // pre (M, N) loaded as 128-row boxes, C (M, N) stored as each consumer's 64-row boxes.
  const CUtensorMap a_map = make_bf16_head_tensor_map(A, kDepth, uint64_t(K / kDepth), uint64_t(M), 1, uint64_t(K),
                                                      uint64_t(M * K), kTileRows);
  const CUtensorMap b_map = make_bf16_head_tensor_map(B, 64, uint64_t(N / 64), uint64_t(K), 1, uint64_t(N),
                                                      uint64_t(K * N), kDepth);
  const CUtensorMap pre_map = make_bf16_head_tensor_map(pre, 64, uint64_t(N / 64), uint64_t(M), 1, uint64_t(N),
                                                        uint64_t(M * N), kTileRows);
  const CUtensorMap c_map = make_bf16_head_tensor_map(C, 64, uint64_t(N / 64), uint64_t(M), 1, uint64_t(N),
                                                      uint64_t(M * N), 64);
  const int col_tiles = int(N / kTileCols);
  const int64_t units = row_tile_pairs(M) * col_tiles;
  if (units > INT32_MAX) return false;
  const DgeluGemmArgs args{dbias ? partial : nullptr, int(N), int(K / kDepth), col_tiles, int(units)};
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = kCluster;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(kCluster));
  config.blockDim = dim3(unsigned(kThreads));
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  config.gridDim = dim3(unsigned(kCluster * std::min<int64_t>(cluster_count(config), units)));
  TG_CUDA_CHECK(cudaLaunchKernelEx(&config, dgelu_gemm_kernel, a_map, b_map, pre_map, c_map, args));
  if (dbias) {
    column_sum_kernel<float, tg::bf16><<<unsigned((N + 31) / 32), dim3(32, 32), 0, stream>>>(
        partial, dbias, row_tile_pairs(M) * kCluster * kConsumers, N);
    TG_CUDA_CHECK(cudaGetLastError());
  }
  return true;
}

}  // namespace tg::cuda
