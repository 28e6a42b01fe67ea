// Runs the FlashAttention CUDA kernels' own source on the CPU, for checking their logic (tiling,
// indexing, masks, fragment layouts, cp.async ordering) where there is no GPU: in CI and before
// spending GPU time. Not a simulator of performance, nor of the hardware's rounding inside an mma.
//
// One std::thread per CUDA thread, blocks run one after another (in linear block order, as a GPU
// launches them). Warp collectives (shuffles, votes, ldmatrix, mma) meet at a per-warp barrier
// and exchange values through per-warp slots; ldmatrix and mma follow the PTX ISA's fragment
// definitions element by element. cp.async is strict: the destination is poisoned (0xFF, a bf16
// NaN) when the copy is issued and filled only when cp.async.wait_group retires its group, so a
// read before the wait, or a prefetch into a stage another warp still reads, shows up as NaN.
// Shared memory starts as 0xFF garbage, as on the hardware.
//
// tools/kernel_emu/generate.py turns tile.cuh, flash_fwd.cu and flash_bwd.cu into headers that
// use these definitions instead of the PTX ones (tests/kernel_emu/ includes them).
#pragma once
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "src/tensor/dtype.h"

using std::max;
using std::min;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __align__(n) alignas(n)

struct EmuDim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local EmuDim3 threadIdx, blockIdx;
inline EmuDim3 gridDim, blockDim;

struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct float4 {
  float x, y, z, w;
};
struct uint4 {
  uint32_t x, y, z, w;
};
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ── One block's threads ──

struct EmuWarpSlots {  // what the lanes of one warp exchange in a collective
  uintptr_t addr[32];
  uint32_t a[32][4];
  uint32_t b[32][2];
  float c[32][4];
  float f[32];
};
struct EmuBlock {
  std::unique_ptr<std::barrier<>> block_barrier;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barrier;
  std::vector<EmuWarpSlots> slots;
};
inline EmuBlock* g_emu_block;
inline unsigned char* emu_smem;  // the running block's dynamic shared memory

inline int emu_lane() { return int(threadIdx.x & 31); }
inline int emu_warp() { return int(threadIdx.x >> 5); }
inline void emu_warp_barrier() { g_emu_block->warp_barrier[size_t(emu_warp())]->arrive_and_wait(); }
inline EmuWarpSlots& emu_slots() { return g_emu_block->slots[size_t(emu_warp())]; }

inline void __syncthreads() { g_emu_block->block_barrier->arrive_and_wait(); }
inline void __syncwarp() { emu_warp_barrier(); }
inline bool __any_sync(unsigned, bool v) {
  emu_slots().f[emu_lane()] = v ? 1.0f : 0.0f;
  emu_warp_barrier();
  bool any = false;
  for (int l = 0; l < 32; ++l) any = any || emu_slots().f[l] != 0.0f;
  emu_warp_barrier();
  return any;
}
inline float __shfl_xor_sync(unsigned, float v, int mask) {
  emu_slots().f[emu_lane()] = v;
  emu_warp_barrier();
  const float r = emu_slots().f[emu_lane() ^ mask];
  emu_warp_barrier();
  return r;
}

// ── The primitives of kernels/cuda/flash_attention/tile.cuh ──

namespace tg::cuda::flash {

inline uint32_t smem_addr(const void*) { return 0; }

struct EmuCopy {
  void* dst;
  const void* src;
  int bytes;
  bool valid;
};
inline thread_local std::vector<EmuCopy> emu_open_group;
inline thread_local std::vector<std::vector<EmuCopy>> emu_groups;
inline void emu_cp_async(void* dst, const void* src, int bytes, bool valid) {
  std::memset(dst, 0xFF, size_t(bytes));
  emu_open_group.push_back({dst, src, bytes, valid});
}
inline void cp_async_16(void* dst, const void* src, bool valid) { emu_cp_async(dst, src, 16, valid); }
inline void cp_async_4(void* dst, const void* src, bool valid) { emu_cp_async(dst, src, 4, valid); }
inline void cp_async_commit() {
  emu_groups.push_back(std::move(emu_open_group));
  emu_open_group.clear();
}
template <int N>
inline void cp_async_wait() {
  while (int(emu_groups.size()) > N) {
    for (const EmuCopy& c : emu_groups.front()) {
      if (c.valid)
        std::memcpy(c.dst, c.src, size_t(c.bytes));
      else
        std::memset(c.dst, 0, size_t(c.bytes));
    }
    emu_groups.erase(emu_groups.begin());
  }
}

inline uint16_t emu_load_b16(uintptr_t a) {
  uint16_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(a), 2);
  return v;
}
// Lane l supplies row l%8 of matrix l/8 and receives (row l/4, columns 2(l%4), +1) of each.
inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  const int l = emu_lane();
  emu_slots().addr[l] = reinterpret_cast<uintptr_t>(p);
  emu_warp_barrier();
  for (int i = 0; i < 4; ++i) {
    const uintptr_t row = emu_slots().addr[8 * i + l / 4];
    r[i] = uint32_t(emu_load_b16(row + 2 * (2 * (l % 4)))) |
           (uint32_t(emu_load_b16(row + 2 * (2 * (l % 4) + 1))) << 16);
  }
  emu_warp_barrier();
}
// Transposed: lane l receives (rows 2(l%4), +1, column l/4) of each matrix.
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  const int l = emu_lane();
  emu_slots().addr[l] = reinterpret_cast<uintptr_t>(p);
  emu_warp_barrier();
  for (int i = 0; i < 4; ++i) {
    const uintptr_t r0 = emu_slots().addr[8 * i + 2 * (l % 4)], r1 = emu_slots().addr[8 * i + 2 * (l % 4) + 1];
    r[i] = uint32_t(emu_load_b16(r0 + 2 * (l / 4))) | (uint32_t(emu_load_b16(r1 + 2 * (l / 4))) << 16);
  }
  emu_warp_barrier();
}

inline float emu_bf16_half(uint32_t reg, int high) {
  return tg::bf16_to_float(tg::bf16{uint16_t(high ? reg >> 16 : reg & 0xffffu)});
}
// c (16×8) += a (16×16) · b (16×8), fragments as in tile.cuh's comment (PTX m16n8k16 .bf16).
inline void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  const int l = emu_lane();
  EmuWarpSlots& S = emu_slots();
  for (int i = 0; i < 4; ++i) S.a[l][i] = a[i], S.c[l][i] = c[i];
  S.b[l][0] = b0, S.b[l][1] = b1;
  emu_warp_barrier();
  auto A = [&](int r, int k) {
    return emu_bf16_half(S.a[(r % 8) * 4 + (k % 8) / 2][(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
  };
  auto B = [&](int k, int n) { return emu_bf16_half(S.b[n * 4 + (k % 8) / 2][k >= 8 ? 1 : 0], k % 2); };
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int row = l / 4 + (e >= 2 ? 8 : 0), col = 2 * (l % 4) + (e % 2);
    float acc = S.c[(row % 8) * 4 + col / 2][(row >= 8 ? 2 : 0) + col % 2];
    for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
    out[e] = acc;
  }
  emu_warp_barrier();
  for (int e = 0; e < 4; ++e) c[e] = out[e];
}

inline float fast_exp2(float x) { return std::exp2(x); }
inline uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(tg::float_to_bf16(lo).bits) | (uint32_t(tg::float_to_bf16(hi).bits) << 16);
}
// Blocks run one at a time and a block's threads add disjoint elements: a plain add is exact.
inline void red_add_f32x2(float* p, float a, float b) { p[0] += a, p[1] += b; }

}  // namespace tg::cuda::flash

namespace tg::cuda {
template <int V, typename T>
inline void load_vec(const T* p, float (&f)[V]) {
  for (int k = 0; k < V; ++k) f[k] = tg::bf16_to_float(p[k]);
}
}  // namespace tg::cuda

// Runs kernel() over the grid: blocks one after another in linear order (x fastest), each with
// `threads` std::threads and smem_bytes of 0xFF-filled, 16-byte aligned shared memory.
template <typename Kernel>
void emu_launch(EmuDim3 grid, int threads, size_t smem_bytes, Kernel kernel) {
  gridDim = grid;
  blockDim = EmuDim3{unsigned(threads), 1, 1};
  std::vector<unsigned char> smem(smem_bytes + 16);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        std::memset(smem.data(), 0xFF, smem.size());
        emu_smem = reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem.data()) + 15) & ~uintptr_t(15));
        EmuBlock block;
        block.block_barrier = std::make_unique<std::barrier<>>(threads);
        for (int w = 0; w < threads / 32; ++w) block.warp_barrier.push_back(std::make_unique<std::barrier<>>(32));
        block.slots.resize(size_t(threads / 32));
        g_emu_block = &block;
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            threadIdx = {unsigned(t), 1, 1};
            blockIdx = {x, y, z};
            tg::cuda::flash::emu_groups.clear();
            tg::cuda::flash::emu_open_group.clear();
            kernel();
          });
        for (std::thread& th : pool) th.join();
      }
}
