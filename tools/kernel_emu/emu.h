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
// Shared memory starts as 0xFF garbage, as on the hardware. The warp-specialised kernels'
// primitives are real waits between the emulated threads: TMA boxes (copied at once, with the
// swizzle and zero fill) counting down mbarriers, mbarrier phases, named barriers, and
// setmaxnreg's register account (within the launch allocation, as on the GPU); a wait that
// never completes aborts with a deadlock report naming it. A wgmma whose shared-memory operands,
// register A fragments or accumulator change between its issue and its wait aborts too
// (wgmma_wait, emu_wgmma_product), as does a bulk reduction
// whose shared source changes before the wait that retires it (emu_bulk_retire), and a thread
// that skips a phase of an mbarrier it waits on (mbarrier_wait).
//
// tools/kernel_emu/generate.py turns tile.cuh, flash_fwd.cu and flash_bwd.cu into headers that
// use these definitions instead of the PTX ones (tests/kernel_emu/ includes them).
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "src/tensor/dtype.h"

using std::max;
using std::min;

#define __global__
#define __host__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__
#define __align__(n) alignas(n)
#define __grid_constant__

struct EmuDim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline thread_local EmuDim3 threadIdx, blockIdx;
inline EmuDim3 gridDim, blockDim;

struct CUtensorMap {  // tma.h's map, emulated: what tma_load_4d needs (elements; boxes 64 × 1 × box_rows × 1)
  const unsigned char* base;
  uint64_t dims[4];     // head dim, heads, rows, depth
  uint64_t strides[3];  // of dims 1–3, elements
  uint32_t box_rows;
};

struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct float4 {
  float x, y, z, w;
};
struct int2 {
  int x, y;
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
struct EmuWarpgroupSlots {  // the A fragments the 128 threads of a warpgroup hand to a wgmma
  uint32_t a[128][4];
};
// An mbarrier (PTX "mbarrier"): a phase completes when its pending arrivals and its announced
// transaction bytes have both reached zero; the phase bit then flips and the arrivals re-arm.
struct EmuMbarrier {
  int count = 0, pending = 0;
  int64_t tx = 0;
  uint32_t phase = 0;
};
struct EmuNamedBarrier {  // bar.sync / bar.arrive: a generation completes when `threads` have arrived
  int arrived = 0;
  uint64_t generation = 0;
};
struct EmuBlock {
  std::unique_ptr<std::barrier<>> block_barrier;
  // The asynchronous barriers: one lock and condition for all of them (blocks are small).
  std::mutex async_mutex;
  std::condition_variable async_cv;
  std::map<uint32_t, EmuMbarrier> mbarriers;  // by shared-memory offset
  EmuNamedBarrier named[16];
  // setmaxnreg's account: each warpgroup's registers per thread, and the block's unassigned ones.
  std::vector<int> warpgroup_regs;
  int free_regs = 0;
  std::vector<std::unique_ptr<std::barrier<>>> warp_barrier;
  std::vector<EmuWarpSlots> slots;
  std::vector<std::unique_ptr<std::barrier<>>> warpgroup_barrier;  // blocks of a multiple of 128 threads
  std::vector<EmuWarpgroupSlots> warpgroup_slots;
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
inline int __shfl_sync(unsigned, int v, int src_lane) {  // the int's bits through the float slots
  std::memcpy(&emu_slots().f[emu_lane()], &v, sizeof v);
  emu_warp_barrier();
  int r;
  std::memcpy(&r, &emu_slots().f[src_lane], sizeof r);
  emu_warp_barrier();
  return r;
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
// Transposed, N matrices (lanes 0 to 8N − 1 supply the row addresses): lane l receives (rows
// 2(l%4), +1, column l/4) of each matrix.
template <int N>
inline void ldmatrix_trans(uint32_t (&r)[N], const void* p) {
  const int l = emu_lane();
  emu_slots().addr[l] = reinterpret_cast<uintptr_t>(p);
  emu_warp_barrier();
  for (int i = 0; i < N; ++i) {
    const uintptr_t r0 = emu_slots().addr[8 * i + 2 * (l % 4)], r1 = emu_slots().addr[8 * i + 2 * (l % 4) + 1];
    r[i] = uint32_t(emu_load_b16(r0 + 2 * (l / 4))) | (uint32_t(emu_load_b16(r1 + 2 * (l / 4))) << 16);
  }
  emu_warp_barrier();
}
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) { ldmatrix_trans<4>(r, p); }
inline void ldmatrix_x2_trans(uint32_t (&r)[2], const void* p) { ldmatrix_trans<2>(r, p); }

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
constexpr float kLog2e = 1.4426950408889634f;  // kernels/cuda/common.cuh's
inline uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(tg::float_to_bf16(lo).bits) | (uint32_t(tg::float_to_bf16(hi).bits) << 16);
}
// Blocks run one at a time and a block's threads add disjoint elements: a plain add is exact.
inline void red_add_f32x2(float* p, float a, float b) { p[0] += a, p[1] += b; }

}  // namespace tg::cuda::flash

// ── The sm_90a primitives of kernels/cuda/flash_attention/sm90_ptx.cuh ──
// Shared addresses are offsets into the block's emulated shared memory. wgmma follows the layouts
// tests/cuda/test_wgmma.cpp verified on the H200: 128-byte swizzle (address bits 4-6 ^= bits
// 7-9), K-major operand element (row, k) at start + (row/8)·SBO + (row%8)·128 + 2k, MN-major
// element (k, n) at start + (k/8)·SBO + (k%8)·128 + (n/64)·LBO + 2(n%64), accumulator and
// register-A fragments as mma.sync's per warp of 16 rows. Asynchrony is strict: a wgmma's results
// reach the accumulator registers only at the wgmma_wait that retires its group, so a read
// before the wait sees the old values (a missing wait shows up as a wrong result). And the
// hardware may read a wgmma's operands at any time until that wait: each product is computed at
// its issue and again when it retires, and if its shared-memory operands, register A fragments
// or accumulator changed in between (a tile reused, or registers written, while a product still
// reads them) the emulator aborts naming it.
inline uint32_t __cvta_generic_to_shared(const void* p) {
  return uint32_t(static_cast<const unsigned char*>(p) - emu_smem);
}

namespace tg::cuda::flash::sm90 {

struct EmuDescriptor {
  uint32_t start, leading, stride;
};
inline EmuDescriptor emu_decode(uint64_t d) {
  if ((d >> 62) != 1) std::abort();  // only the 128-byte swizzle is used (and emulated)
  return {uint32_t(d & 0x3FFF) << 4, uint32_t((d >> 16) & 0x3FFF) << 4, uint32_t((d >> 32) & 0x3FFF) << 4};
}
// The 128-byte swizzle of a shared offset (tiles 1024-byte aligned relative to the emulated shared
// memory): address bits 4-6 ^= bits 7-9.
inline uint32_t emu_swizzle128(uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }
inline float emu_swizzled_bf16(uint32_t addr) {
  uint16_t v;
  std::memcpy(&v, emu_smem + emu_swizzle128(addr), 2);
  return tg::bf16_to_float(tg::bf16{v});
}
inline float emu_k_major(const EmuDescriptor& d, int row, int k) {
  return emu_swizzled_bf16(d.start + uint32_t(row / 8) * d.stride + uint32_t(row % 8) * 128 + 2u * uint32_t(k));
}
inline float emu_mn_major(const EmuDescriptor& d, int k, int n) {
  return emu_swizzled_bf16(d.start + uint32_t(k / 8) * d.stride + uint32_t(k % 8) * 128 +
                           uint32_t(n / 64) * d.leading + 2u * uint32_t(n % 64));
}

// A wgmma's A operand: from shared memory (a descriptor, K- or MN-major), or this thread's two
// rows of the register fragments the warpgroup exchanged at the issue (read then, as the hardware
// reads registers).
struct EmuAOperand {
  bool in_smem;
  EmuDescriptor desc;
  bool mn_major;
  float rows[2][16];  // register A: rows 16·warp + lane/4 and + 8
};
struct EmuPending {
  float* d;
  std::vector<float> v;   // the result, computed at the issue
  std::vector<float> in;  // the accumulator it started from
  int n;
  EmuAOperand a;
  uint64_t desc_b;
  int trans_b;
  bool accumulate;
  const uint32_t* a_regs;  // register A: the caller's fragment, and its words at the issue
  uint32_t a_was[4];
};
inline thread_local std::vector<EmuPending> emu_wgmma_pending;   // issued, in order
inline thread_local std::vector<size_t> emu_wgmma_group_ends;    // committed groups: end index in pending

// The bulk copy engine's reduction, performed at once (blocks run one at a time, so nothing else
// adds to dst meanwhile). The hardware may read the shared source at any time until a
// bulk_wait_read (or bulk_wait) retires the reduction's group: the source is kept as it was at
// the issue and compared when the group retires, and the run aborts if it changed in between (a
// staging tile handed back before the copy engine had read it).
struct EmuBulkRead {
  const unsigned char* src;
  std::vector<unsigned char> was;
};
inline thread_local std::vector<EmuBulkRead> emu_bulk_open;                 // issued, not committed
inline thread_local std::vector<std::vector<EmuBulkRead>> emu_bulk_groups;  // committed, oldest first
inline void bulk_reduce_add_f32(float* dst, const void* src, uint32_t bytes) {
  const unsigned char* s = static_cast<const unsigned char*>(src);
  for (uint32_t i = 0; i < bytes / 4; ++i) {
    float v;
    std::memcpy(&v, s + 4 * i, 4);
    dst[i] += v;
  }
  emu_bulk_open.push_back({s, std::vector<unsigned char>(s, s + bytes)});
}
inline void bulk_commit() {
  emu_bulk_groups.push_back(std::move(emu_bulk_open));
  emu_bulk_open.clear();
}
inline void emu_bulk_retire(int keep) {
  // A moment for the other threads first: a source handed back too early (a barrier arrived on
  // before this wait) then has time to be overwritten, as the copy engine's read would lag.
  if (int(emu_bulk_groups.size()) > keep) std::this_thread::sleep_for(std::chrono::microseconds(200));
  while (int(emu_bulk_groups.size()) > keep) {
    for (const EmuBulkRead& r : emu_bulk_groups.front())
      if (std::memcmp(r.src, r.was.data(), r.was.size()) != 0) {
        std::fprintf(stderr,
                     "kernel_emu: thread %u: the shared source of a bulk reduction (shared offset %u, %zu bytes) "
                     "changed before the wait that retired it\n",
                     threadIdx.x, unsigned(r.src - emu_smem), r.was.size());
        std::abort();
      }
    emu_bulk_groups.erase(emu_bulk_groups.begin());
  }
}
inline uint64_t opaque_u64(uint64_t x) { return x; }
inline uint32_t opaque_u32(uint32_t x) { return x; }
template <int N>
inline void bulk_wait_read() {
  emu_bulk_retire(N);
}
template <int N>
inline void bulk_wait() {
  emu_bulk_retire(N);
}

inline void wgmma_fence() {}
inline void fence_async_shared() {}
inline void wgmma_commit() { emu_wgmma_group_ends.push_back(emu_wgmma_pending.size()); }
inline std::vector<float> emu_wgmma_product(const EmuPending& p);
// Hazards (here and in mbarrier_wait) abort the run, unless a test that provokes one on purpose
// counts them instead.
inline bool emu_abort_on_hazard = true;
inline std::atomic<int> emu_hazards{0};
template <int N>
inline void wgmma_wait() {
  while (int(emu_wgmma_group_ends.size()) > N) {
    const size_t end = emu_wgmma_group_ends.front();
    for (size_t i = 0; i < end; ++i) {
      const EmuPending& p = emu_wgmma_pending[i];
      // Its registers must be as they were too: the accumulator as the product started from it
      // (or as the product before it in the chain left it), register A untouched.
      const char* what = emu_wgmma_product(p) != p.v ? "shared-memory operands"
                         : std::memcmp(p.d, p.in.data(), p.in.size() * sizeof(float)) != 0 ? "accumulator registers"
                         : p.a_regs && std::memcmp(p.a_regs, p.a_was, sizeof(p.a_was)) != 0 ? "register A fragments"
                                                                                             : nullptr;
      if (what) {
        ++emu_hazards;
        if (emu_abort_on_hazard) {
          std::fprintf(stderr,
                       "kernel_emu: thread %u: the %s of a wgmma (m64n%dk16, B at shared offset %u) changed between "
                       "its issue and the wait that retired it\n",
                       threadIdx.x, what, p.n, unsigned(emu_decode(p.desc_b).start));
          std::abort();
        }
      }
      std::copy(p.v.begin(), p.v.end(), p.d);
    }
    emu_wgmma_pending.erase(emu_wgmma_pending.begin(), emu_wgmma_pending.begin() + long(end));
    emu_wgmma_group_ends.erase(emu_wgmma_group_ends.begin());
    for (size_t& e : emu_wgmma_group_ends) e -= end;
  }
}

// d (64 × N) = A (64 × 16) · B (16 × N) (+ d): this thread's N/2 elements, from the operands as
// they are in shared memory now.
inline std::vector<float> emu_wgmma_product(const EmuPending& p) {
  const EmuDescriptor b = emu_decode(p.desc_b);
  const int t = int(threadIdx.x % 128), warp = t / 32, lane = t % 32;
  std::vector<float> out(size_t(p.n / 2));
  for (int j = 0; j < p.n / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * warp + lane / 4 + 8 * (e / 2), col = 8 * j + 2 * (lane % 4) + e % 2;
      float acc = p.accumulate ? p.in[size_t(4 * j + e)] : 0.0f;
      for (int k = 0; k < 16; ++k) {
        const float a = !p.a.in_smem  ? p.a.rows[e / 2][k]
                        : p.a.mn_major ? emu_mn_major(p.a.desc, k, row)
                                       : emu_k_major(p.a.desc, row, k);
        acc += a * (p.trans_b ? emu_mn_major(b, k, col) : emu_k_major(b, col, k));
      }
      out[size_t(4 * j + e)] = acc;
    }
  return out;
}
template <int N>
inline void emu_wgmma(float* d, const EmuAOperand& a, uint64_t desc_b, int trans_b, bool accumulate,
                      const uint32_t* a_regs = nullptr) {
  EmuPending p{d, {}, std::vector<float>(d, d + N / 2), N, a, desc_b, trans_b, accumulate, a_regs, {}};
  if (a_regs) std::memcpy(p.a_was, a_regs, sizeof(p.a_was));
  for (auto it = emu_wgmma_pending.rbegin(); it != emu_wgmma_pending.rend(); ++it)
    if (it->d == d) {  // still in flight: the hardware chains it
      p.in = it->v;
      break;
    }
  p.v = emu_wgmma_product(p);
  emu_wgmma_pending.push_back(std::move(p));
}
inline EmuAOperand emu_a_smem(uint64_t desc_a, bool mn_major) {
  EmuAOperand a{};
  a.in_smem = true, a.desc = emu_decode(desc_a), a.mn_major = mn_major;
  return a;
}

template <int kTransB>
inline void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  emu_wgmma<128>(d, emu_a_smem(desc_a, false), desc_b, kTransB, accumulate);
}

template <int kTransB>
inline void wgmma_m64n96k16_ss(float (&d)[48], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  emu_wgmma<96>(d, emu_a_smem(desc_a, false), desc_b, kTransB, accumulate);
}

template <int kTransB>
inline void wgmma_m64n176k16_ss(float (&d)[88], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  emu_wgmma<176>(d, emu_a_smem(desc_a, false), desc_b, kTransB, accumulate);
}

template <int kTransB, int kTransA = 0>
inline void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  emu_wgmma<64>(d, emu_a_smem(desc_a, kTransA != 0), desc_b, kTransB, accumulate);
}

// The register-A forms: the warpgroup's threads exchange their fragments first.
template <int N, int kTransB>
inline void emu_wgmma_rs(float* d, const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  const int g = int(threadIdx.x / 128), t = int(threadIdx.x % 128);
  EmuWarpgroupSlots& S = g_emu_block->warpgroup_slots[size_t(g)];
  for (int i = 0; i < 4; ++i) S.a[t][i] = a[i];
  g_emu_block->warpgroup_barrier[size_t(g)]->arrive_and_wait();
  auto a_of = [&](int row, int k) {
    const int r = row % 16;
    return emu_bf16_half(S.a[32 * (row / 16) + (r % 8) * 4 + (k % 8) / 2][(r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], k % 2);
  };
  EmuAOperand op{};
  op.in_smem = false;
  const int warp = t / 32, lane = t % 32;
  for (int h = 0; h < 2; ++h)
    for (int k = 0; k < 16; ++k) op.rows[h][k] = a_of(16 * warp + lane / 4 + 8 * h, k);
  emu_wgmma<N>(d, op, desc_b, kTransB, accumulate, a);
  g_emu_block->warpgroup_barrier[size_t(g)]->arrive_and_wait();
}
template <int kTransB>
inline void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  emu_wgmma_rs<64, kTransB>(d, a, desc_b, accumulate);
}
template <int kTransB>
inline void wgmma_m64n96k16_rs(float (&d)[48], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  emu_wgmma_rs<96, kTransB>(d, a, desc_b, accumulate);
}
template <int kTransB>
inline void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, bool accumulate) {
  emu_wgmma_rs<128, kTransB>(d, a, desc_b, accumulate);
}

// ── TMA, mbarriers, named barriers (warp specialisation) ──
// Waits are real waits on the other emulated threads; one that lasts a minute is a deadlock in
// the kernel's protocol (a missing arrival, a wrong parity) and aborts with the barrier named.
inline uint32_t emu_offset(const void* p) { return uint32_t(static_cast<const unsigned char*>(p) - emu_smem); }
template <typename Ready>
inline void emu_wait_until(std::unique_lock<std::mutex>& lock, Ready ready, const char* what, uint32_t at,
                           int seconds = 60) {
  if (!g_emu_block->async_cv.wait_for(lock, std::chrono::seconds(seconds), ready)) {
    std::fprintf(stderr, "kernel_emu: %s %u never completed (thread %u): deadlock\n", what, at,
                 threadIdx.x);
    std::abort();
  }
}
inline void emu_mbarrier_complete_if_done(EmuMbarrier& m) {
  if (m.pending == 0 && m.tx == 0) {
    m.phase ^= 1u;
    m.pending = m.count;
    g_emu_block->async_cv.notify_all();
  }
}
inline void mbarrier_init(uint64_t* bar, uint32_t count) {
  std::lock_guard<std::mutex> lock(g_emu_block->async_mutex);
  EmuMbarrier& m = g_emu_block->mbarriers[emu_offset(bar)];
  m = EmuMbarrier{int(count), int(count), 0, 0};
}
inline void fence_barrier_init() {}
// The block's mbarrier at bar (the caller holds async_mutex); one never initialised aborts.
inline EmuMbarrier& emu_mbarrier(uint64_t* bar) {
  auto it = g_emu_block->mbarriers.find(emu_offset(bar));
  if (it == g_emu_block->mbarriers.end()) std::abort();
  return it->second;
}
inline void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  std::lock_guard<std::mutex> lock(g_emu_block->async_mutex);
  EmuMbarrier& m = emu_mbarrier(bar);
  m.tx += bytes;
  --m.pending;
  emu_mbarrier_complete_if_done(m);
}
inline void mbarrier_arrive(uint64_t* bar) { mbarrier_arrive_expect_tx(bar, 0); }
// A thread's waits on one mbarrier alternate parity, one per phase: a thread that skips a phase
// (two waits in a row for the same parity) could be let through by a phase two behind the one
// it means, as a wait tells phases apart by parity only; the emulator aborts on it.
inline thread_local std::map<uint32_t, uint32_t> emu_last_wait_parity;  // by shared offset
inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  const auto [last, first] = emu_last_wait_parity.try_emplace(emu_offset(bar), parity);
  if (!first && last->second == parity) {
    ++emu_hazards;
    if (emu_abort_on_hazard) {
      std::fprintf(stderr,
                   "kernel_emu: thread %u waits twice in a row for parity %u of the mbarrier at shared offset %u: a "
                   "phase skipped, which a parity wait cannot tell from the one two phases later\n",
                   threadIdx.x, parity, emu_offset(bar));
      std::abort();
    }
  }
  last->second = parity;
  std::unique_lock<std::mutex> lock(g_emu_block->async_mutex);
  EmuMbarrier& m = emu_mbarrier(bar);
  // The phase of parity `parity` has completed when the current phase's parity differs from it.
  emu_wait_until(lock, [&] { return (m.phase & 1u) != parity; }, "an mbarrier wait at shared offset", emu_offset(bar));
}
// The copy is made at once (the data is in place before the barrier can complete); its bytes
// then count down the barrier's transaction count. Elements out of range are zero; the 128-byte
// swizzle is applied to the destination's shared-memory offset, as the hardware applies it to the
// address (tiles are 1024-byte aligned relative to the emulated shared memory).
// f(the element's swizzled shared address, its global address or nullptr when out of range) for
// each element of the box of `map` at (c0, c1, c2, c3), whose shared tile starts at `tile`.
template <class F>
void emu_for_box(const CUtensorMap* map, int c0, int c1, int c2, int c3, const void* tile, F&& f) {
  const uint32_t base = emu_offset(tile);
  auto in = [&](int64_t x, int d) { return x >= 0 && uint64_t(x) < map->dims[d]; };
  for (uint32_t y = 0; y < map->box_rows; ++y)
    for (uint32_t x = 0; x < 64; ++x) {
      const int64_t c = int64_t(c0) + x, r = int64_t(c2) + y;
      unsigned char* global =
          in(c, 0) && in(c1, 1) && in(r, 2) && in(c3, 3)
              ? const_cast<unsigned char*>(map->base) + 2 * (uint64_t(c3) * map->strides[2] +
                                                             uint64_t(r) * map->strides[1] +
                                                             uint64_t(c1) * map->strides[0] + uint64_t(c))
              : nullptr;
      f(emu_smem + emu_swizzle128(base + y * 128 + 2 * x), global);
    }
}
inline void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3, uint64_t* bar) {
  uint32_t bytes = 0;
  emu_for_box(map, c0, c1, c2, c3, dst, [&](unsigned char* shared, const unsigned char* global) {
    static const uint16_t zero = 0;
    std::memcpy(shared, global ? global : reinterpret_cast<const unsigned char*>(&zero), 2);
    bytes += 2;
  });
  std::lock_guard<std::mutex> lock(g_emu_block->async_mutex);
  EmuMbarrier& m = emu_mbarrier(bar);
  m.tx -= bytes;
  emu_mbarrier_complete_if_done(m);
}
// The tensor copy engine's store, made at once (nothing else writes the box meanwhile): the box's
// elements in range ← the swizzled shared tile; the source is then held to the bulk group's
// retirement as a bulk reduction's (bulk_wait_read aborts the run if it changed before).
inline void tma_store_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3, const void* src) {
  emu_for_box(map, c0, c1, c2, c3, src, [](const unsigned char* shared, unsigned char* global) {
    if (global) std::memcpy(global, shared, 2);
  });
  const unsigned char* s = static_cast<const unsigned char*>(src);
  emu_bulk_open.push_back({s, std::vector<unsigned char>(s, s + map->box_rows * 128)});
}
// bar.arrive / bar.sync count warps: the emulated lanes of a warp meet first and its lane 0 counts
// the warp's 32 arrivals, as the hardware does.
inline void emu_named_arrive(int id, int threads, bool wait) {
  EmuNamedBarrier& nb = g_emu_block->named[id];
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(g_emu_block->async_mutex);
    gen = nb.generation;  // read by every lane before lane 0 can complete the generation
  }
  emu_warp_barrier();
  std::unique_lock<std::mutex> lock(g_emu_block->async_mutex);
  if (emu_lane() == 0) {
    nb.arrived += 32;
    if (nb.arrived == threads) {
      nb.arrived = 0;
      ++nb.generation;
      g_emu_block->async_cv.notify_all();
    }
  }
  if (wait) emu_wait_until(lock, [&] { return nb.generation != gen; }, "named barrier", uint32_t(id));
}
inline void named_barrier_sync(int id, int threads) { emu_named_arrive(id, threads, true); }
inline void named_barrier_arrive(int id, int threads) { emu_named_arrive(id, threads, false); }
// The dynamic item counter (sm90_scheduler.cuh): blocks run one at a time here, so the first block claims
// every item past the grid's first ones — the multi-item path, and each item claimed once.
inline int claim_item(unsigned* counter) { return int(gridDim.x + std::atomic_ref<unsigned>(*counter).fetch_add(1)); }
inline void release_items(unsigned* counter) {
  if (std::atomic_ref<unsigned>(counter[1]).fetch_add(1) == gridDim.x - 1) counter[0] = counter[1] = 0;
}
// Programmatic dependent launch (sm90_ptx.cuh): kernels run one after another here, so the previous
// one has always completed.
inline void launch_dependents() {}
inline void wait_previous_grid() {}
// setmaxnreg moves registers within what the block was launched with (threads × the launch-bounds
// cap: sm90_ptx.cuh): a dec gives the warpgroup's surplus back, an inc waits until enough is free —
// forever, on the GPU, if the split does not fit; here a deadlock report. One thread per
// warpgroup keeps the account.
inline void emu_setmaxnreg(int n, bool inc) {
  if (threadIdx.x % 128 != 0) return;
  EmuBlock& blk = *g_emu_block;
  std::unique_lock<std::mutex> lock(blk.async_mutex);
  int& cur = blk.warpgroup_regs[threadIdx.x / 128];
  if (inc)
    emu_wait_until(lock, [&] { return blk.free_regs >= (n - cur) * 128; },
                   "setmaxnreg.inc: no registers free for the count", uint32_t(n),
                   20);  // reported before the waits it holds up (the others' dec comes at once)
  blk.free_regs -= (n - cur) * 128;
  cur = n;
  blk.async_cv.notify_all();
}
template <int N>
inline void setmaxnreg_dec() {
  emu_setmaxnreg(N, false);
}
template <int N>
inline void setmaxnreg_inc() {
  emu_setmaxnreg(N, true);
}

}  // namespace tg::cuda::flash::sm90

namespace tg::cuda {
// tma.h's encoder: the emulated map keeps the geometry tma_load_4d reads.
inline CUtensorMap make_bf16_head_tensor_map(const void* base, uint64_t head_dim, uint64_t heads, uint64_t rows,
                                             uint64_t depth, uint64_t row_stride, uint64_t z_stride,
                                             uint32_t box_rows) {
  return CUtensorMap{static_cast<const unsigned char*>(base), {head_dim, heads, rows, depth},
                     {head_dim, row_stride, z_stride}, box_rows};
}
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
        if (threads % 128 == 0) {
          for (int g = 0; g < threads / 128; ++g)
            block.warpgroup_barrier.push_back(std::make_unique<std::barrier<>>(128));
          block.warpgroup_slots.resize(size_t(threads / 128));
        }
        // Launched with the __launch_bounds__(threads, 1) cap per thread, all of it assigned.
        block.warpgroup_regs.assign(size_t((threads + 127) / 128), (65536 / threads) & ~7);
        g_emu_block = &block;
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            threadIdx = {unsigned(t), 1, 1};
            blockIdx = {x, y, z};
            tg::cuda::flash::emu_groups.clear();
            tg::cuda::flash::emu_open_group.clear();
            tg::cuda::flash::sm90::emu_wgmma_pending.clear();
            tg::cuda::flash::sm90::emu_wgmma_group_ends.clear();
            tg::cuda::flash::sm90::emu_bulk_open.clear();
            tg::cuda::flash::sm90::emu_bulk_groups.clear();
            tg::cuda::flash::sm90::emu_last_wait_parity.clear();
            kernel();
          });
        for (std::thread& th : pool) th.join();
      }
}
