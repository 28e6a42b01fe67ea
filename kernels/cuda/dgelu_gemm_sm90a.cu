// The MLP backward's GELU-derivative GEMM on Hopper (dgelu_gemm.h): dpre = g ⊙ (dout · W_proj),
// g = gelu'(pre) as the forward kept it (fp16), and the up-projection's bias gradient Σ_rows dpre,
// in one warp-specialised wgmma kernel.
//
// Why a kernel of our own: cuBLASLt's DGELU epilogue runs GPT-2's (16384 × 3072 × 768) product on
// an older kernel than its plain GEMM (166 against 104 µs a layer), and the bias gradient then
// reads dpre back in a column-sum pass (docs/performance.md, "Where a step's time goes", which
// also holds the measurements behind the choices below).
//
// Work is in units of two row tiles (128 rows each) of one column tile (256 columns) of C. A
// cluster of two blocks takes every so many units, each block one of the unit's row tiles, and a
// block is a producer warpgroup and two consumer warpgroups of 64 rows:
//   producer     one thread streams A's (128 × 64) K steps by TMA and half of B's (64 × 256),
//                multicast into both blocks of the cluster, through kStages swizzled stage
//                buffers, on across the units, so the next tile's first steps arrive under this
//                one's epilogue;
//   products     each consumer forms its 64 rows with two wgmma m64n128k16 per 16 K, A K-major
//                and B MN-major (W_proj as stored, (K, N) row-major), one product group in flight,
//                and releases each stage in both blocks (the stage hand-over at CTA scope: at
//                cluster scope the product loop ran 1.3× slower);
//   g            each thread loads its positions of g into registers while the tile's last K
//                steps run;
//   epilogue     by halves of 128 columns: each thread writes acc · g, rounded to bf16, into its
//                consumer's staging tile; the consumer's first thread stores it by TMA, and the
//                consumer sums its columns on the tensor cores (ones · dpre, the staged rows as
//                the K operand) into a partial row of its own, which a second pass (common.cuh's
//                column_sum_kernel) adds in row order.
// Every order is fixed by the shape, so runs are bitwise reproducible.
#include <cuda_bf16.h>

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
constexpr int kDepth = 64;   // K per stage: one 128-byte swizzled row of A
constexpr int kStages = 4;   // 4 × 48 KB and the 32 KB of staging: one block per SM
constexpr int kCluster = 2;  // blocks per cluster: row tiles 2p, 2p + 1 of one column tile share B
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (1 + kConsumers);  // warpgroup 0 is the producer
constexpr int kConsumerWarps = 4 * kConsumers;
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(fits_launch_registers(kThreads, kProducerRegs, kConsumers, kConsumerRegs),
              "the register hand-over must fit the launch (sm90_ptx.cuh, setmaxnreg)");

constexpr int kABytes = kTileRows * kSwizzleRowBytes;   // 16 KB
constexpr int kBPanelBytes = kDepth * kSwizzleRowBytes;  // 8 KB: 64 K-rows of 64 columns
constexpr int kBBytes = kPanels * kBPanelBytes;          // 32 KB, half of it loaded by each block
constexpr int kOutPanelBytes = 64 * kSwizzleRowBytes;    // 8 KB: a consumer's 64 rows of 64 columns
constexpr int kOutBytes = 2 * kOutPanelBytes;            // a consumer's half tile: 128 columns
constexpr size_t kSmemBytes = kSwizzleAtomBytes + kStages * (kABytes + kBBytes) + kConsumers * kOutBytes +
                              2 * kStages * sizeof(uint64_t);
static_assert(kSmemBytes <= 227 * 1024, "one block per SM");

struct DgeluGemmArgs {
  const uint32_t* g;  // (M, N) fp16 pairs
  float* partial;     // null: no column sums; else (4 · units / col_tiles, N)
  int M, N, k_tiles, col_tiles, units;  // a unit: kCluster row tiles of one column tile
};

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
// One arrival on the mbarrier at bar's offset in block `rank` of the cluster (this one or the other).
__device__ __forceinline__ void mbarrier_arrive_in(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n" ::"r"(smem_addr(bar)),
      "r"(rank)
      : "memory");
}

__global__ void __launch_bounds__(kThreads, 1)
    dgelu_gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                      const __grid_constant__ CUtensorMap c_map, const DgeluGemmArgs args) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sA = align_to_swizzle_atom(smem_raw);
  unsigned char* sB = sA + kStages * kABytes;
  unsigned char* sOut = sB + kStages * kBBytes;  // (consumer) staging tiles of 2 panels
  uint64_t* full = reinterpret_cast<uint64_t*>(sOut + kConsumers * kOutBytes);
  uint64_t* empty = full + kStages;
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
    fence_barrier_init();
  }
  cluster_sync();

  if (wg == 0) {
    setmaxnreg_dec<kProducerRegs>();
    if (tid == 0) {
      for (int u = cluster, q = 0; u < args.units; u += clusters) {
        const int row0 = unit_row0(u), panel0 = unit_panel0(u);
        for (int kt = 0; kt < args.k_tiles; ++kt, ++q) {
          const int st = q % kStages;
          if (q >= kStages) mbarrier_wait(&empty[st], uint32_t(q / kStages - 1) & 1);
          mbarrier_arrive_expect_tx(&full[st], kABytes + kBBytes);  // rows past M arrive as zeros
          tma_load_4d(sA + st * kABytes, &a_map, 0, kt, row0, 0, &full[st]);
          for (int p = int(rank) * kPanels / kCluster; p < (int(rank) + 1) * kPanels / kCluster; ++p)
            tma_load_4d_multicast(sB + st * kBBytes + p * kBPanelBytes, &b_map, 0, panel0 + p, kt * kDepth, 0,
                                  &full[st], uint16_t((1u << kCluster) - 1));
        }
      }
    }
  } else {
    setmaxnreg_inc<kConsumerRegs>();
    const int c = wg - 1, warp = (tid % 128) / 32, lane = tid & 31;
    const bool issuer = tid % 128 == 0;
    unsigned char* const out_tile = sOut + c * kOutBytes;
    // This thread's rows of the staging tile: 16·warp + lane/4 and 8 below it (the accumulator's
    // rows, sm90_ptx.cuh's D layout); its columns in 8-column group jj are 8jj + 2·(lane % 4) + {0, 1},
    // 16-byte chunk jj % 8 of panel jj / 8, swizzled by the row (lane/4 mod 8 for both).
    unsigned char* const my_rows = out_tile + (16 * warp + (lane >> 2)) * kSwizzleRowBytes + 4 * (lane & 3);
    const uint32_t chunk_xor = 16u * uint32_t(lane >> 2);
    auto release = [&](int q) {  // stream step q's stage read by this warp: one arrival in each block
      __syncwarp();
      if (lane < kCluster) mbarrier_arrive_in(&empty[q % kStages], uint32_t(lane));
    };
    const int g_step = max(args.k_tiles - 3, 0);  // g's loads under the tile's last K steps
    // The column sums' A operand: a 64 × 16 tile of ones (register form, any fragment layout).
    const uint32_t ones[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};

    for (int u = cluster, q = 0; u < args.units; u += clusters) {
      const int row0 = unit_row0(u), panel0 = unit_panel0(u);
      const int r0 = row0 + 64 * c + 16 * warp + (lane >> 2);  // this thread's first row of C
      float acc[kTileCols / 8][4];  // columns 0–127 and 128–255: two m64n128 products per k-step
#pragma unroll
      for (int j = 0; j < kTileCols / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
      float(&acc_lo)[16][4] = *reinterpret_cast<float(*)[16][4]>(&acc[0][0]);
      float(&acc_hi)[16][4] = *reinterpret_cast<float(*)[16][4]>(&acc[16][0]);
      uint32_t gw[kTileCols / 8][2];  // g at this thread's positions: rows r0, r0 + 8 of group j
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
        if (kt == g_step) {
          const uint32_t* g0 = args.g + (int64_t(r0) * args.N + panel0 * 64 + 2 * (lane & 3)) / 2;
          const bool in0 = r0 < args.M, in1 = r0 + 8 < args.M;
#pragma unroll
          for (int j = 0; j < kTileCols / 8; ++j) {
            gw[j][0] = in0 ? __ldg(g0 + 4 * j) : 0u;
            gw[j][1] = in1 ? __ldg(g0 + 4 * args.N + 4 * j) : 0u;
          }
        }
        wgmma_wait<1>();  // the step before has finished reading its stage
        if (kt > 0) release(q - 1);
      }
      wgmma_wait<0>();
      release(q - 1);

      // By halves: dpre = acc · g → staging → TMA store; then the staged rows' column sums.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (issuer) bulk_wait_read<0>();  // the copy engine has read the staging tile's last use
        named_barrier_sync(1 + c, 128);
#pragma unroll
        for (int jj = 0; jj < 16; ++jj) {
          const int j = 16 * h + jj;
          unsigned char* at = my_rows + (jj / 8) * kOutPanelBytes + ((16u * uint32_t(jj % 8)) ^ chunk_xor);
          *reinterpret_cast<uint32_t*>(at) =
              pack_bf16x2(acc[j][0] * half_low(gw[j][0]), acc[j][1] * half_high(gw[j][0]));
          *reinterpret_cast<uint32_t*>(at + 8 * kSwizzleRowBytes) =
              pack_bf16x2(acc[j][2] * half_low(gw[j][1]), acc[j][3] * half_high(gw[j][1]));
        }
        fence_async_shared();  // st.shared, read by the copy engine and by the column sums' products
        named_barrier_sync(1 + c, 128);
        if (issuer) {
          for (int p = 0; p < 2; ++p)
            tma_store_4d(&c_map, 0, panel0 + 2 * h + p, row0 + 64 * c, 0, out_tile + p * kOutPanelBytes);
          bulk_commit();
        }
        if (args.partial) {
          // The staged rows' column sums on the tensor cores into the half's (now spent)
          // accumulator: ones (64 × 64) · dpre (the 64 rows as the K = 64 operand, MN-major as
          // staged), so every row holds them; rows past M are 0 (A's zero fill, g's zero loads).
          float(&sum)[16][4] = h == 0 ? acc_lo : acc_hi;
          wgmma_fence();
          const uint64_t dd = mn_major_descriptor(out_tile, kOutPanelBytes);
#pragma unroll
          for (int ks = 0; ks < 64 / 16; ++ks)
            wgmma_m64n128k16_rs<1>(flat(sum), ones, dd + uint64_t((16 * ks * kSwizzleRowBytes) >> 4), ks > 0);
          wgmma_commit();
          wgmma_wait<0>();
          if (lane < 4) {  // warp w writes the half's columns 32w … 32w + 31 of its consumer's row
            float* out = args.partial + int64_t(2 * (row0 / kTileRows) + c) * args.N + (panel0 + 2 * h) * 64 + 2 * lane;
#pragma unroll
            for (int jj = 0; jj < 16; ++jj)
              if (jj / 4 == warp) *reinterpret_cast<float2*>(out + 8 * jj) = make_float2(sum[jj][0], sum[jj][1]);
          }
        }
      }
    }
    if (issuer) bulk_wait<0>();  // the stores' source is this block's shared memory
  }
  cluster_sync();
}

// As many clusters as can be resident at once (one block per SM), each taking every so many units.
int cluster_count(cudaLaunchConfig_t config) {
  static int clusters = 0;  // per process: the kernel and its launch shape are fixed
  if (clusters == 0) {
    TG_CUDA_CHECK(cudaFuncSetAttribute(dgelu_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    config.gridDim = dim3(unsigned(kCluster));
    TG_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&clusters, dgelu_gemm_kernel, &config));
    if (clusters < 1) throw std::runtime_error("dgelu_gemm_sm90: no cluster of two blocks fits on this GPU");
  }
  return clusters;
}

int64_t row_tile_pairs(int64_t M) { return (M + kCluster * kTileRows - 1) / (kCluster * kTileRows); }

}  // namespace

bool dgelu_gemm_sm90_takes(int64_t M, int64_t N, int64_t K) {
  if (M <= 0 || N <= 0 || K <= 0 || N % kTileCols != 0 || K % kDepth != 0) return false;
  if (M > INT32_MAX - 2 * kCluster * kTileRows || M * N > INT64_MAX / 2 || N > INT32_MAX || K > INT32_MAX) return false;
  if (row_tile_pairs(M) * (N / kTileCols) > INT32_MAX) return false;
  return flash::device_is_sm90();
}

size_t dgelu_gemm_partial_floats(int64_t M, int64_t N) {
  return M <= 0 || N < kTileCols ? 0 : size_t(row_tile_pairs(M) * kCluster * kConsumers * N);
}

bool dgelu_gemm_sm90(int64_t M, int64_t N, int64_t K, const tg::bf16* A, const tg::bf16* B, const uint16_t* g,
                     tg::bf16* C, tg::bf16* dbias, float* partial, cudaStream_t stream) {
  if (!dgelu_gemm_sm90_takes(M, N, K)) return false;
  if (!aligned16(A) || !aligned16(B) || !aligned16(g) || !aligned16(C)) return false;
  if (dbias && (!aligned16(dbias) || partial == nullptr || !aligned16(partial))) return false;
  // A (M, K) as 64-column panels of 128-row boxes; B (K, N) as 64-column panels of 64-row boxes;
  // C (M, N) stored as each consumer's 64-row boxes.
  const CUtensorMap a_map = make_bf16_head_tensor_map(A, kDepth, uint64_t(K / kDepth), uint64_t(M), 1, uint64_t(K),
                                                      uint64_t(M * K), kTileRows);
  const CUtensorMap b_map = make_bf16_head_tensor_map(B, 64, uint64_t(N / 64), uint64_t(K), 1, uint64_t(N),
                                                      uint64_t(K * N), kDepth);
  const CUtensorMap c_map = make_bf16_head_tensor_map(C, 64, uint64_t(N / 64), uint64_t(M), 1, uint64_t(N),
                                                      uint64_t(M * N), 64);
  const int col_tiles = int(N / kTileCols);
  const int64_t units = row_tile_pairs(M) * col_tiles;
  const DgeluGemmArgs args{reinterpret_cast<const uint32_t*>(g), dbias ? partial : nullptr, int(M), int(N),
                           int(K / kDepth), col_tiles, int(units)};
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = kCluster;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.blockDim = dim3(unsigned(kThreads));
  config.dynamicSmemBytes = kSmemBytes;
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  config.gridDim = dim3(unsigned(kCluster * std::min<int64_t>(cluster_count(config), units)));
  TG_CUDA_CHECK(cudaLaunchKernelEx(&config, dgelu_gemm_kernel, a_map, b_map, c_map, args));
  if (dbias) {
    column_sum_kernel<float, tg::bf16><<<unsigned((N + 31) / 32), dim3(32, 32), 0, stream>>>(
        partial, dbias, row_tile_pairs(M) * kCluster * kConsumers, N);
    TG_CUDA_CHECK(cudaGetLastError());
  }
  return true;
}

}  // namespace tg::cuda
