// Hopper (sm_90a) PTX primitives the attention kernels are built from (docs/kernels.md §5.1), each
// a thin wrapper: swizzle and matrix descriptors, the wgmma forms and fences, bulk and tensor copies,
// mbarriers, named barriers, setmaxnreg. A warpgroup (4 warps, 128 threads) issues wgmma.mma_async
// on operands in shared memory, described by 64-bit matrix descriptors, or with A from registers;
// the fp32 accumulator stays in registers.
//
// Shared-memory tiles use the 128-byte swizzle: a tile is rows of 64 bf16 (128 bytes), and the
// 16-byte chunk c of row r is stored at chunk c ^ (r % 8), so the 8 rows of a 1024-byte atom
// spread a column over all 32 banks. The swizzle is applied by the hardware to the address bits,
// so every tile must start 1024-byte aligned. One layout serves both operand roles here:
//   K-major (imm-trans 0): rows are M or N, the 64 contiguous elements are K — Q and K for S = QKᵀ;
//   MN-major (imm-trans 1): rows are K, the 64 contiguous elements are N — V for O = PV.
// Descriptor fields (PTX ISA, "Matrix Descriptor Format"): bits 0-13 start address >> 4, 16-29
// leading-dimension byte offset >> 4, 32-45 stride-dimension byte offset >> 4, 62-63 swizzle
// (1 = 128 B). With the 128-byte swizzle the stride byte offset is the distance between groups of
// 8 rows (1024 bytes for a dense tile); the leading byte offset is unused in the K-major case and,
// MN-major, the distance between 64-element panels along N.
//
// Register layouts (verified on the GPU by tests/cuda/test_wgmma.cpp):
//   D, m64nN fp32: warp w of the warpgroup holds rows 16w … 16w + 15; d[4j + e] is row
//     16w + lane/4 + 8·(e/2), column 8j + 2·(lane%4) + e%2 — mma.sync's C layout, N/8 times.
//   A, m64k16 bf16 (register form): a[0..3] as mma.sync m16n8k16's A fragment of the warp's 16
//     rows, so an S accumulator packs into P's A operand with no shuffles (FA2's trick).
#pragma once
#include <cuda.h>  // CUtensorMap (the type only: maps are encoded through the runtime, tma.h)

#include <cstdint>

#include "kernels/cuda/bulk_copy.cuh"  // mbarrier_init, mbarrier_arrive_expect_tx, mbarrier_wait
#include "kernels/cuda/flash_attention/tile.cuh"  // smem_addr

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "sm90_ptx.cuh needs sm_90a (compile for arch=compute_90a,code=sm_90a)"
#endif

namespace tg::cuda::flash::sm90 {

constexpr int kSwizzleRowBytes = 128;   // one row of a swizzled tile: 64 bf16
constexpr int kSwizzleAtomBytes = 1024;  // 8 rows: the alignment every tile needs

// Byte offset of element (row, col) (col < 64) in a 128-byte-swizzled tile of bf16 rows.
__host__ __device__ constexpr uint32_t swizzled_offset(uint32_t row, uint32_t col) {
  return row * kSwizzleRowBytes + ((((col * 2) >> 4) ^ (row & 7)) << 4) + ((col * 2) & 15);
}

__device__ __forceinline__ uint64_t matrix_descriptor(const void* smem_tile, uint32_t leading_bytes,
                                                      uint32_t stride_bytes) {
  const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(smem_tile));
  uint64_t d = 0;
  d |= uint64_t((addr & 0x3FFFF) >> 4);
  d |= uint64_t((leading_bytes & 0x3FFFF) >> 4) << 16;
  d |= uint64_t((stride_bytes & 0x3FFFF) >> 4) << 32;
  d |= uint64_t(1) << 62;  // 128-byte swizzle
  return d;
}

// K-major operand (rows = M or N, 64 K-elements per row) starting at `tile` (the 16 K-elements of
// one k-step start 32 bytes further along the row: pass tile + 32·step bytes).
__device__ __forceinline__ uint64_t k_major_descriptor(const void* tile) {
  return matrix_descriptor(tile, 16, kSwizzleAtomBytes);
}
// MN-major operand (rows = K, 64 N-elements per row), panels of 64 N-columns `panel_bytes` apart.
// A k-step of 16 rows starts 16·128 bytes further: pass tile + 2048·step bytes.
__device__ __forceinline__ uint64_t mn_major_descriptor(const void* tile, uint32_t panel_bytes) {
  return matrix_descriptor(tile, panel_bytes, kSwizzleAtomBytes);
}

// Orders this thread's earlier register and shared-memory writes before the wgmma that follows.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Makes generic-proxy writes to shared memory (st.shared) visible to wgmma's async proxy.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// x, hidden from the optimiser: a loop-invariant value laundered through this at the top of a loop
// body is recomputed there instead of hoisted. At 255 registers, ptxas hoists the 8 descriptors
// and 16 swizzled offsets of the dQ product out of the backward's main loop and spills them.
__device__ __forceinline__ uint64_t opaque_u64(uint64_t x) {
  asm volatile("mov.b64 %0, %0;\n" : "+l"(x));
  return x;
}
__device__ __forceinline__ uint32_t opaque_u32(uint32_t x) {
  asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
  return x;
}

// The bulk copy engine, shared → global with reduction: dst[0 .. bytes/4) += src[...] (fp32), one
// instruction for a whole contiguous range, performed at L2 (both addresses 16-byte aligned,
// bytes a multiple of 16). Completion is tracked per thread in bulk groups: after
// bulk_wait_read<N>() at most N groups may still be reading their shared source (which may then
// be overwritten); after bulk_wait<N>() at most N are still writing.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
               "r"(static_cast<uint32_t>(__cvta_generic_to_shared(src))), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ── The tensor copy engine (TMA), mbarriers and warp specialisation ──
// A producer thread starts a tile's copies with tma_load_4d, each signalling an mbarrier in shared
// memory that counts bytes; consumers wait on the barrier's phase (one phase per use: the parity
// of the use count), and hand the buffer back through a second barrier the producer waits on.
// Verified on the H200 by tests/cuda/test_tma.cpp (tensor map, swizzle, zero fill, two phases).
// The barriers' set-up, expect_tx and wait are the bulk copy's (kernels/cuda/bulk_copy.cuh).
using ::tg::cuda::fence_barrier_init;
using ::tg::cuda::mbarrier_arrive_expect_tx;
using ::tg::cuda::mbarrier_init;
using ::tg::cuda::mbarrier_wait;
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// One arrival for the whole warp, once __syncwarp has ordered every lane's earlier accesses
// before it: for barriers that count warps rather than threads.
__device__ __forceinline__ void mbarrier_arrive_warp(uint64_t* bar) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbarrier_arrive(bar);
}
// dst (shared, 1024-byte aligned for the 128-byte swizzle) ← the box of `map` at coordinates
// (c0, c1, c2, c3), innermost first (tma.h's maps: column, head, row, sequence); completes
// `bytes of the box` on bar. Out-of-range elements are 0.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                           uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}
// The reverse, by the tensor copy engine: the box of `map` at (c0, c1, c2, c3) ← src (shared,
// 1024-byte aligned, in the layout tma_load_4d writes: 128-byte swizzled rows of 64 columns).
// Elements out of range (rows past T, columns past the head's) are not written. Tracked in bulk
// groups as bulk_reduce_add_f32: src may be rewritten after bulk_wait_read; the writing threads'
// st.shared must be made visible to the copy engine first (fence_async_shared, then a barrier).
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, int c0, int c1, int c2, int c3, const void* src) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(smem_addr(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
// Named block barriers (ids 1–15; 0 is __syncthreads) among `threads` threads (a multiple of 32):
// sync waits for all of them, arrive counts this warp in and goes on.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Programmatic dependent launch (sm_90; launch.cuh, launch_item_kernel's Overlap::kPrevious): a
// kernel launched with it may start on SMs the previous kernel in the stream has left, once every
// block of that kernel has called launch_dependents (or exited). Such a kernel may read only what
// the kernels before the previous one wrote; wait_previous_grid blocks until the previous kernel
// has completed and its writes are visible (without the launch attribute both return at once).
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void wait_previous_grid() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// This thread's warpgroup (threadIdx.x / 128), read from lane 0 so that the compiler knows every
// lane of the warp holds the same value: what is derived from it (the consumer index, its rows'
// shared-memory addresses in the wgmma descriptors, its loop bounds) then lives in uniform
// registers and branches on it are uniform. With plain threadIdx.x / 128 the consumers' main
// loops re-derived descriptors each tile (R2UR) under WARPSYNCs, 4-10 % more instructions, and
// the d 64 kernels' SkipIdle loops, whose trip counts depend on the consumer, compiled longer
// than the plain ones (docs/kernels.md §2.3).
__device__ __forceinline__ int warpgroup_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0); }
// Moves registers between warpgroups (all 128 threads of a warpgroup execute it): the producer
// gives most of its registers back, the consumers take them. The block keeps the registers it was
// launched with — threads × the count ptxas gives a setmaxnreg kernel, the __launch_bounds__ cap
// (64 Ki / threads, rounded down to a multiple of 8) — so the warpgroups' counts after the
// hand-over must sum to at most (warpgroups) × that cap: an inc beyond what the decs freed waits
// for registers forever: a hang, not an error — the likely cause of the one seen on the H200 (a
// kernel with 32 + 2 × 240 at 384 threads, cap 168, never finished its first test; the
// FlashAttention-3 / CUTLASS splits fill the allocation exactly: 24 + 2 × 240, 40 + 2 × 232,
// 32 + 3 × 160). fits_launch_registers checks a split at compile time.
constexpr bool fits_launch_registers(int threads, int producer_regs, int consumers, int consumer_regs) {
  return producer_regs + consumers * consumer_regs <= (threads / 128) * ((65536 / threads) & ~7);
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// The accumulator operands of the wgmma wrappers below: d[0] … d[31] or d[0] … d[63], each
// read and written ("+f"), in the order of the instruction's register list {%0, %1, …}.
#define TG_WGMMA_ACC8(d, i)                                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define TG_WGMMA_ACC32(d) TG_WGMMA_ACC8(d, 0), TG_WGMMA_ACC8(d, 8), TG_WGMMA_ACC8(d, 16), TG_WGMMA_ACC8(d, 24)
#define TG_WGMMA_ACC64(d) TG_WGMMA_ACC32(d), TG_WGMMA_ACC8(d, 32), TG_WGMMA_ACC8(d, 40), TG_WGMMA_ACC8(d, 48), \
                          TG_WGMMA_ACC8(d, 56)
#define TG_WGMMA_ACC48(d) TG_WGMMA_ACC32(d), TG_WGMMA_ACC8(d, 32), TG_WGMMA_ACC8(d, 40)
#define TG_WGMMA_ACC88(d) TG_WGMMA_ACC64(d), TG_WGMMA_ACC8(d, 64), TG_WGMMA_ACC8(d, 72), TG_WGMMA_ACC8(d, 80)

// d (64 × 64 fp32) = A·B (+ d when accumulate): A (64 × 16) and B (16 × 64) from descriptors,
// imm-trans-b as given (0: B K-major, i.e. the rows of Bᵀ; 1: B MN-major), likewise imm-trans-a
// (0: A K-major, rows are M; 1: A MN-major, rows are K — a tile stored transposed).
template <int kTransB, int kTransA = 0>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                   bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %36, %35;\n}\n"
      : TG_WGMMA_ACC32(d)
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(kTransB), "n"(kTransA));
}

// The same with A (64 × 16 bf16) from registers, 4 words per thread in mma.sync's A layout.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                   bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "
      "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : TG_WGMMA_ACC32(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)), "n"(kTransB));
}

// S = Q Kᵀ with N = 128 keys per tile: d (64 × 128 fp32, 64 registers per thread) = A·B (+ d), A
// and B from descriptors as in wgmma_m64n64k16_ss (the forward reads Q once per 128 keys, not twice).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                    bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, %67;\n}\n"
      : TG_WGMMA_ACC64(d)
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(kTransB));
}

// S = Q K_jᵀ, dP = dO V_jᵀ with N = 96 keys per tile (48 accumulator registers per thread): the
// d 128 dQ kernel's tile, between 64 (more turns and waits per FLOP) and 128 (spills).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n96k16_ss(float (&d)[48], uint64_t desc_a, uint64_t desc_b,
                                                   bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %50, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, %48, %49, p, 1, 1, 0, %51;\n}\n"
      : TG_WGMMA_ACC48(d)
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(kTransB));
}

// S = Q Kᵀ with N = 176 keys per tile (88 accumulator registers per thread): the d 128 non-causal
// forward's tile, FlashAttention-3's for that shape (one Q read per 176 keys; fewer softmax
// reductions and turns per FLOP).
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n176k16_ss(float (&d)[88], uint64_t desc_a, uint64_t desc_b,
                                                    bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n176k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, "
      "%30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, "
      "%60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, %91;\n}\n"
      : TG_WGMMA_ACC88(d)
      : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(kTransB));
}

// The register-A form with N = 96 (48 accumulator registers per thread): O = P V, dV, dK and dQ
// at head dim 96 over the d 128 tiles, B MN-major across V's first 64-column panel and half of
// its second (panel_bytes apart in the descriptor), the zero padding past column 96 not read.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n96k16_rs(float (&d)[48], const uint32_t (&a)[4], uint64_t desc_b,
                                                   bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %53, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, {%48, %49, %50, %51}, %52, p, 1, 1, %54;\n}\n"
      : TG_WGMMA_ACC48(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)), "n"(kTransB));
}

// The register-A form with N = 128 (64 accumulator registers per thread): O = P V at head dim
// 128, V's two 64-column panels `panel_bytes` apart in the MN-major descriptor.
template <int kTransB>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                    bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : TG_WGMMA_ACC64(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)), "n"(kTransB));
}

// A (R, 4) fragment array as the flat register list wgmma takes.
template <int R>
__device__ __forceinline__ float (&flat(float (&a)[R][4]))[4 * R] {
  return reinterpret_cast<float(&)[4 * R]>(a);
}

// The first byte of `smem` at or after it on a 1024-byte boundary: the swizzle works on absolute
// shared addresses, so every tile starts on one (the kernels allocate kSwizzleAtomBytes of slack).
__device__ __forceinline__ unsigned char* align_to_swizzle_atom(unsigned char* smem) {
  return smem + ((kSwizzleAtomBytes - (smem_addr(smem) & (kSwizzleAtomBytes - 1))) & (kSwizzleAtomBytes - 1));
}

}  // namespace tg::cuda::flash::sm90
