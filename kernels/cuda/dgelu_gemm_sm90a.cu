// The MLP backward's GELU-derivative GEMM on Hopper (dgelu_gemm.h): dpre = gelu'(pre) ⊙ (g · W_proj)
// and the up-projection's bias gradient Σ_rows dpre, in one warp-specialised wgmma kernel.
//
// Why a kernel of our own: cuBLASLt's DGELU epilogue runs GPT-2's (16384 × 3072 × 768) product on
// an older kernel than its plain GEMM (166 against 104 µs a layer), and the bias gradient then
// reads dpre back in a column-sum pass; its DGELU_BGRAD epilogue, which forms both, made the step
// 8 % slower (docs/performance.md, "Where a step's time goes").
//
// A block (two warpgroups) owns a 128 × 128 tile of C and walks K in steps of 64:
//   the ring     A's (128 × 64) and B's (64 × 128) step tiles arrive by TMA in kStages swizzled
//                stage buffers (sm90_ptx.cuh's layout), each guarded by a "full" mbarrier (bytes)
//                and an "empty" one (the 8 warps' releases); thread 0 refills a stage with the
//                step kStages further on as soon as both warpgroups have released it;
//   products     each warpgroup forms its 64 rows × 128 columns with wgmma m64n128k16, A K-major
//                and B MN-major from shared memory (B is W_proj as stored, (K, N) row-major),
//                keeps one product group in flight and releases the stage the one before read;
//   epilogue     from the accumulator registers: reads pre at the same positions (prefetched to
//                L2 while the tile's products run, then loaded 8 column groups at a time),
//                multiplies by gelu' (gelu.cuh: the elementwise kernels' expression), rounds to
//                bf16 and stores; the stored values' column sums go through warp shuffles into
//                the block's per-warp sums in shared memory.
// Two blocks share an SM (128 registers a thread, 101 KiB of shared memory each; a producer warp
// of its own would make 9 warps a block, and 18 warps of 112 registers do not fit an SM's four
// register files), so one block's epilogue runs under the other's products. The grid is two
// blocks per SM: a block takes every R-th row tile of its column block (R rows of blocks; the
// ring runs on across its tiles, so the next tile's first steps stream in under the epilogue),
// and its column sums run on across them: R rows of partial sums, which a second pass
// (common.cuh's column_sum_kernel) adds in row order. The sums' order is fixed by the shape and
// the GPU's SM count, so runs are bitwise reproducible.
#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cstdint>

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

constexpr int kTileRows = 128;     // rows of C per block: two consumer warpgroups of 64
constexpr int kTileCols = 256;     // columns of C per block: four 64-column panels of B
constexpr int kDepth = 64;         // K per stage: one 128-byte swizzled row of A
constexpr int kStages = 4;         // 4 × 48 KB: one block per SM
constexpr int kWarps = 8;          // two warpgroups
constexpr int kThreads = 32 * kWarps;

constexpr int kABytes = kTileRows * kSwizzleRowBytes;     // 16 KB
constexpr int kBPanelBytes = kDepth * kSwizzleRowBytes;   // 8 KB: 64 K-rows of 64 columns
constexpr int kBBytes = (kTileCols / 64) * kBPanelBytes;  // 16 KB
constexpr size_t kSmemBytes = kSwizzleAtomBytes + kStages * (kABytes + kBBytes) + 2 * kStages * sizeof(uint64_t) +
                              kWarps * kTileCols * sizeof(float);
static_assert(kSmemBytes <= 227 * 1024, "one block per SM");

struct DgeluGemmArgs {
  const tg::bf16* pre;
  tg::bf16* c;
  float* partial;  // null: no column sums
  int64_t M, N;
  int k_tiles, row_tiles;
};

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}
__device__ __forceinline__ float bf16_low(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_high(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return float_to_bf16_bits(lo) | (float_to_bf16_bits(hi) << 16);
}

__global__ void __launch_bounds__(kThreads, 1)
    dgelu_gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                      const DgeluGemmArgs args) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sA = align_to_swizzle_atom(smem_raw);
  unsigned char* sB = sA + kStages * kABytes;
  uint64_t* full = reinterpret_cast<uint64_t*>(sB + kStages * kBBytes);
  uint64_t* empty = full + kStages;
  float(*sums)[kTileCols] = reinterpret_cast<float(*)[kTileCols]>(empty + kStages);
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int n0 = int(blockIdx.x) * kTileCols;
  // The block's steps: step q is step q % k_tiles of its (q / k_tiles)-th row tile.
  const int my_tiles = (args.row_tiles - int(blockIdx.y) + int(gridDim.y) - 1) / int(gridDim.y);
  const int steps = my_tiles * args.k_tiles;
  // Thread 0 only: step q into stage q % kStages, once its previous use has been released.
  auto load_step = [&](int q) {
    const int st = q % kStages;
    const uint32_t use = uint32_t(q / kStages);
    if (use > 0) mbarrier_wait(&empty[st], (use - 1) & 1);
    const int rt = int(blockIdx.y) + (q / args.k_tiles) * int(gridDim.y), kt = q % args.k_tiles;
    mbarrier_arrive_expect_tx(&full[st], kABytes + kBBytes);  // rows past M arrive as zeros
    tma_load_4d(sA + st * kABytes, &a_map, 0, kt, rt * kTileRows, 0, &full[st]);
    for (int pn = 0; pn < kTileCols / 64; ++pn)
      tma_load_4d(sB + st * kBBytes + pn * kBPanelBytes, &b_map, 0, n0 / 64 + pn, kt * kDepth, 0, &full[st]);
  };
  // Every warp: step q's stage read; thread 0 then refills it with step q + kStages.
  auto release_step = [&](int q) {
    mbarrier_arrive_warp(&empty[q % kStages]);
    if (threadIdx.x == 0 && q + kStages < steps) load_step(q + kStages);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], kWarps);
    }
    fence_barrier_init();
  }
  for (int i = int(threadIdx.x); i < kWarps * kTileCols; i += kThreads) (&sums[0][0])[i] = 0.0f;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int q = 0; q < kStages && q < steps; ++q) load_step(q);

  const int wg = warpgroup_index();  // rows 64·wg … of the tile
  int seq = 0;
  for (int rt = int(blockIdx.y); rt < args.row_tiles; rt += int(gridDim.y)) {
    // pre's tile (128 rows of 512 bytes) on its way to L2 while the products run: a line a thread, twice
    for (int line = int(threadIdx.x); line < kTileRows * kTileCols / 64; line += kThreads) {
      const int64_t r = int64_t(rt) * kTileRows + line / (kTileCols / 64);
      if (r < args.M) prefetch_l2(args.pre + r * args.N + n0 + 64 * (line % (kTileCols / 64)));
    }
    float acc[kTileCols / 8][4];  // columns 0–127 and 128–255: two m64n128 products per k-step
#pragma unroll
    for (int j = 0; j < kTileCols / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    float(&acc_lo)[16][4] = *reinterpret_cast<float(*)[16][4]>(&acc[0][0]);
    float(&acc_hi)[16][4] = *reinterpret_cast<float(*)[16][4]>(&acc[16][0]);
    for (int kt = 0; kt < args.k_tiles; ++kt, ++seq) {
      const int st = seq % kStages;
      mbarrier_wait(&full[st], uint32_t(seq / kStages) & 1);
      wgmma_fence();
      const uint64_t da = k_major_descriptor(sA + st * kABytes + wg * 64 * kSwizzleRowBytes);
      const uint64_t db = mn_major_descriptor(sB + st * kBBytes, kBPanelBytes);
#pragma unroll
      for (int ks = 0; ks < kDepth / 16; ++ks) {  // 16 K: 32 bytes along A's rows, 16 rows of B
        wgmma_m64n128k16_ss<1>(flat(acc_lo), da + uint64_t((32 * ks) >> 4),
                               db + uint64_t((16 * ks * kSwizzleRowBytes) >> 4), true);
        wgmma_m64n128k16_ss<1>(flat(acc_hi), da + uint64_t((32 * ks) >> 4),
                               db + uint64_t((2 * kBPanelBytes + 16 * ks * kSwizzleRowBytes) >> 4), true);
      }
      wgmma_commit();
      wgmma_wait<1>();  // the step before has finished reading its stage
      if (kt > 0) release_step(seq - 1);
    }
    wgmma_wait<0>();
    release_step(seq - 1);

    // acc[j][e]: row r0 + 8·(e / 2), column c0 + 8j + e % 2 (sm90_ptx.cuh's D layout).
    const int64_t r0 = int64_t(rt) * kTileRows + 64 * wg + 16 * (warp % 4) + lane / 4;
    const int64_t c0 = n0 + 2 * (lane % 4);
    const bool in0 = r0 < args.M, in1 = r0 + 8 < args.M;
    const uint32_t* pre0 = reinterpret_cast<const uint32_t*>(args.pre + r0 * args.N + c0);
    const uint32_t* pre1 = reinterpret_cast<const uint32_t*>(args.pre + (r0 + 8) * args.N + c0);
    uint32_t* out0 = reinterpret_cast<uint32_t*>(args.c + r0 * args.N + c0);
    uint32_t* out1 = reinterpret_cast<uint32_t*>(args.c + (r0 + 8) * args.N + c0);
    // In batches of kBatch column groups, each batch's loads issued together (one L2 latency per
    // batch, not per group).
    constexpr int kBatch = 8;
    uint32_t pw[kBatch][2];
#pragma unroll
    for (int j = 0; j < kTileCols / 8; ++j) {  // columns 8j … 8j + 7: 4 words apart
      if (j % kBatch == 0) {
#pragma unroll
        for (int b = 0; b < kBatch; ++b) {
          pw[b][0] = in0 ? __ldg(pre0 + 4 * (j + b)) : 0u;
          pw[b][1] = in1 ? __ldg(pre1 + 4 * (j + b)) : 0u;
        }
      }
      const uint32_t p0 = pw[j % kBatch][0], p1 = pw[j % kBatch][1];
      const uint32_t d0 = pack_bf16x2(acc[j][0] * gelu_grad(bf16_low(p0)), acc[j][1] * gelu_grad(bf16_high(p0)));
      const uint32_t d1 = pack_bf16x2(acc[j][2] * gelu_grad(bf16_low(p1)), acc[j][3] * gelu_grad(bf16_high(p1)));
      if (in0) out0[4 * j] = d0;
      if (in1) out1[4 * j] = d1;
      if (args.partial) {  // rows past M are 0 (A's zero fill times gelu'(0))
        float s0 = bf16_low(d0) + bf16_low(d1), s1 = bf16_high(d0) + bf16_high(d1);
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {  // the 8 lanes of a column pair: the warp's 16 rows
          s0 += __shfl_xor_sync(0xffffffffu, s0, o);
          s1 += __shfl_xor_sync(0xffffffffu, s1, o);
        }
        if (lane < 4) {
          sums[warp][8 * j + 2 * lane] += s0;
          sums[warp][8 * j + 2 * lane + 1] += s1;
        }
      }
    }
  }
  if (args.partial) {  // the warps' sums in warp order: this row of blocks' partial row
    __syncthreads();
    if (threadIdx.x < kTileCols) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += sums[w][threadIdx.x];
      args.partial[int64_t(blockIdx.y) * args.N + n0 + threadIdx.x] = s;
    }
  }
}

// Rows of blocks: as many as fill the GPU twice over with the column blocks (two blocks per SM),
// each taking every so many row tiles, so that every block stays resident and its ring streams
// the next tile's first stages under the epilogue; at most one per row tile.
int64_t row_blocks(int64_t M, int64_t N) {
  int dev = 0, sms = 0;
  TG_CUDA_CHECK(cudaGetDevice(&dev));
  TG_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return std::clamp<int64_t>(int64_t(sms) / (N / kTileCols), 1, (M + kTileRows - 1) / kTileRows);
}

}  // namespace

size_t dgelu_gemm_partial_floats(int64_t M, int64_t N) {
  return M <= 0 || N < kTileCols ? 0 : size_t(row_blocks(M, N) * N);
}

bool dgelu_gemm_sm90(int64_t M, int64_t N, int64_t K, const tg::bf16* A, const tg::bf16* B, const tg::bf16* pre,
                     tg::bf16* C, tg::bf16* dbias, float* partial, cudaStream_t stream) {
  if (M <= 0 || N <= 0 || K <= 0 || N % kTileCols != 0 || K % kDepth != 0) return false;
  if (M > INT32_MAX - kTileRows || N > INT32_MAX || K > INT32_MAX) return false;  // TMA coordinates are int32
  if (!aligned16(A) || !aligned16(B) || !aligned16(pre) || !aligned16(C)) return false;
  if (dbias && (!aligned16(dbias) || partial == nullptr || !aligned16(partial))) return false;
  if (!flash::device_is_sm90()) return false;
  // A (M, K) as 64-column panels of 128-row boxes; B (K, N) as 64-column panels of 64-row boxes.
  const CUtensorMap a_map = make_bf16_head_tensor_map(A, kDepth, uint64_t(K / kDepth), uint64_t(M), 1, uint64_t(K),
                                                      uint64_t(M * K), kTileRows);
  const CUtensorMap b_map = make_bf16_head_tensor_map(B, 64, uint64_t(N / 64), uint64_t(K), 1, uint64_t(N),
                                                      uint64_t(K * N), kDepth);
  const DgeluGemmArgs args{pre, C, dbias ? partial : nullptr, M, N, int(K / kDepth),
                           int((M + kTileRows - 1) / kTileRows)};
  const dim3 grid(unsigned(N / kTileCols), unsigned(row_blocks(M, N)));
  TG_CUDA_CHECK(cudaFuncSetAttribute(dgelu_gemm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
  // All of L1's carve-out as shared memory, or the driver may leave room for one block per SM.
  TG_CUDA_CHECK(cudaFuncSetAttribute(dgelu_gemm_kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)));
  dgelu_gemm_kernel<<<grid, kThreads, kSmemBytes, stream>>>(a_map, b_map, args);
  TG_CUDA_CHECK(cudaGetLastError());
  if (dbias) {
    column_sum_kernel<float, tg::bf16><<<unsigned((N + 31) / 32), dim3(32, 32), 0, stream>>>(partial, dbias,
                                                                                             int64_t(grid.y), N);
    TG_CUDA_CHECK(cudaGetLastError());
  }
  return true;
}

}  // namespace tg::cuda
