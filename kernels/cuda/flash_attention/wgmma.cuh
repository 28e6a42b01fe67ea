// Hopper (sm_90a) warpgroup matrix multiply: the primitives the sm_90a attention kernels are
// built from (docs/kernels.md §5.1). A warpgroup (4 warps, 128
// threads) issues wgmma.mma_async on operands in shared memory, described by 64-bit matrix
// descriptors, or with A from registers; the fp32 accumulator stays in registers.
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

#include "kernels/cuda/flash_attention/tile.cuh"  // load_rows_async

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "wgmma.cuh needs sm_90a (compile for arch=compute_90a,code=sm_90a)"
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

// count arrivals (plus, per phase, the bytes announced with mbarrier_arrive_expect_tx) complete
// a phase. One thread initialises; fence_barrier_init and a block barrier publish it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// One arrival for the whole warp, once __syncwarp has ordered every lane's earlier accesses
// before it: for barriers that count warps rather than threads.
__device__ __forceinline__ void mbarrier_arrive_warp(uint64_t* bar) {
  __syncwarp();
  if ((threadIdx.x & 31) == 0) mbarrier_arrive(bar);
}
// One arrival that also announces `bytes` more to come from the copy engine in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)),
               "r"(bytes)
               : "memory");
}
// Returns once the phase of parity `parity` has completed (a fresh barrier is in phase 0, so
// waiting for parity 1 returns at once).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
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
// A persistent grid's dynamic item counter (two words in global memory, zero at launch): the
// calling block's next work item is gridDim.x + the count of items claimed so far
// (claim_item); a block that has run out calls release_items once, and the last of them
// zeroes both words, so the next launch on the stream finds them zero again.
__device__ __forceinline__ int claim_item(unsigned* counter) { return int(gridDim.x + atomicAdd(counter, 1u)); }
__device__ __forceinline__ void release_items(unsigned* counter) {
  if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {  // every block is past its last claim
    atomicExch(counter, 0u);
    atomicExch(counter + 1, 0u);
  }
}
// The item slot of such a block: the producer writes (item, next claimed item) before the
// mbarrier arrival that publishes the item's own tiles; after waiting on that barrier a warp's
// lane 0 reads it and broadcasts it, so that the thread that later releases the tiles (and with
// them the slot) is the one that read it (the ordering compute-sanitizer's racecheck follows).
struct ItemSlot {
  int item, next;
};
__device__ __forceinline__ ItemSlot read_item_slot(const int* slot, int lane) {
  int v[2] = {0, 0};
  if (lane == 0) v[0] = slot[0], v[1] = slot[1];
  return {__shfl_sync(0xffffffffu, v[0], 0), __shfl_sync(0xffffffffu, v[1], 0)};
}
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

// ── The products of the flash kernels, over 128-byte-swizzled tiles of 64-column panels ──
// acc (64 × N per warpgroup, N = 64, 96, 128 or 176) = A Bᵀ over the D columns of two K-major swizzled
// tiles: A the warpgroup's 64 rows (panels panel_a bytes apart), B the other tile's N rows
// (panels panel_b apart). k-steps of 16 along D are 32 bytes along a panel's rows. The k-steps'
// descriptors are one opaque base each plus immediate offsets (the address field counts 16-byte
// units from bit 0): hoisted as 16 loop-invariant 64-bit values, they made the d 128 dK/dV
// consumers spill 116 bytes inside their loop; computed per call, 0 (the same below).
template <int D, int N = 64>
__device__ __forceinline__ void wgmma_abt_ss(float (&acc)[N / 8][4], const unsigned char* a, int panel_a,
                                             const unsigned char* b, int panel_b) {
  static_assert(N == 64 || N == 96 || N == 128 || N == 176, "the wgmma shapes wrapped above");
  const uint64_t da0 = opaque_u64(k_major_descriptor(a));
  const uint64_t db0 = opaque_u64(k_major_descriptor(b));
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const int at = 32 * (ks % 4);
    const uint64_t da = da0 + uint64_t(((ks / 4) * panel_a + at) >> 4);
    const uint64_t db = db0 + uint64_t(((ks / 4) * panel_b + at) >> 4);
    if constexpr (N == 176)
      wgmma_m64n176k16_ss<0>(flat(acc), da, db, ks > 0);
    else if constexpr (N == 96)
      wgmma_m64n96k16_ss<0>(flat(acc), da, db, ks > 0);
    else if constexpr (N == 128)
      wgmma_m64n128k16_ss<0>(flat(acc), da, db, ks > 0);
    else
      wgmma_m64n64k16_ss<0>(flat(acc), da, db, ks > 0);
  }
}

// The same with A from registers: the warpgroup's 64 rows as D/16 k-steps of A fragments
// (load_a_frags_swizzled, below), B read from shared memory as above.
template <int D, int N>
__device__ __forceinline__ void wgmma_abt_rs(float (&acc)[N / 8][4], const uint32_t (&a)[D / 16][4],
                                             const unsigned char* b, int panel_b) {
  static_assert(N == 64 || N == 96 || N == 128, "the wgmma shapes wrapped above");
  const uint64_t db0 = opaque_u64(k_major_descriptor(b));
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const uint64_t db = db0 + uint64_t(((ks / 4) * panel_b + 32 * (ks % 4)) >> 4);
    if constexpr (N == 128)
      wgmma_m64n128k16_rs<0>(flat(acc), a[ks], db, ks > 0);
    else if constexpr (N == 96)
      wgmma_m64n96k16_rs<0>(flat(acc), a[ks], db, ks > 0);
    else
      wgmma_m64n64k16_rs<0>(flat(acc), a[ks], db, ks > 0);
  }
}

// acc (64 × D per warpgroup, D = 64, 96 or 128) += A B: A (64 × K, K = 64, 96, 128 or 176) from
// registers as K/16 k-steps of A fragments, B the (K, D) streamed or owned tile at b read MN-major
// (rows are K; 64-column panels panel_b bytes apart): a k-step of 16 rows starts 16·128 bytes
// further.
template <int D, int K = 64>
__device__ __forceinline__ void wgmma_ab_rs(float (&acc)[D / 8][4], const uint32_t (&a)[K / 16][4], const unsigned char* b,
                                            int panel_b) {
  static_assert(D == 64 || D == 96 || D == 128, "the wgmma shapes wrapped above");
  const uint64_t desc0 = opaque_u64(mn_major_descriptor(b, panel_b));
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const uint64_t desc = desc0 + uint64_t(kk * 16 * kSwizzleRowBytes / 16);
    if constexpr (D == 64)
      wgmma_m64n64k16_rs<1>(flat(acc), a[kk], desc, true);
    else if constexpr (D == 96)
      wgmma_m64n96k16_rs<1>(flat(acc), a[kk], desc, true);
    else
      wgmma_m64n128k16_rs<1>(flat(acc), a[kk], desc, true);
  }
}

// dst ← rows [t0, t0 + ROWS) of one head (row t at src + t·ld, D contiguous bf16) as D/64
// swizzled panels of ROWS × 64 (panel p at dst + p·ROWS·128 bytes); rows ≥ T zero-filled. The
// same tile serves as a K-major operand (rows are M or N) and as an MN-major one (rows are K).
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_swizzled(unsigned char* dst, const tg::bf16* src, int ld, int t0, int T,
                                                   int tid) {
  load_rows_async<ROWS, D, THREADS>(
      [=](int r, int col) { return dst + (col / 64) * ROWS * kSwizzleRowBytes + swizzled_offset(r, col % 64); },
      src, ld, t0, T, tid);
}

// The warp's 16 × 64 tile held as A fragments (bf16, 4 k-steps; tile.cuh's store_a_frags layout)
// → rows [row0, row0 + 16) (row0 a multiple of 8) of a 64-column swizzled tile at dst. Each lane
// stores bf16x2 words; the 8 rows of one store hit 8 distinct 16-byte chunks (the swizzle), so no
// bank conflicts. Both of a lane's rows are lane/4 mod 8, so one XOR term serves all 16 stores
// (opaque: recomputed per call, not hoisted as 16 offsets).
__device__ __forceinline__ void store_a_frags_swizzled(unsigned char* dst, const uint32_t (&a)[4][4], int row0,
                                                       int lane) {
  unsigned char* base = dst + (row0 + (lane >> 2)) * kSwizzleRowBytes + 4 * (lane & 3);
  const uint32_t chunk_xor = opaque_u32(16 * (lane >> 2));
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int e = 0; e < 4; ++e)  // a[kk][e]: row + 8·(e % 2), 16-byte chunk 2kk + e / 2
      *reinterpret_cast<uint32_t*>(base + 8 * kSwizzleRowBytes * (e & 1) + ((32 * kk + 16 * (e >> 1)) ^ chunk_xor)) =
          a[kk][e];
}

// The warp's (16, Dh) fp32 accumulator (m64nDh rows [row0, row0 + 16) of its warpgroup), its
// rows g and g + 8 scaled by f[0] and f[1] (store_rows's factors) and rounded to bf16 → those
// rows of a swizzled tile at dst (64-column panels panel_bytes apart), the layout tma_store_4d
// reads. Each store is a lane's bf16x2 of one row; a store's 8
// rows hit 8 distinct 16-byte chunks (the swizzle), so no bank conflicts; both of a lane's rows
// are lane/4 mod 8 (row0 a multiple of 8), so one XOR term serves every store.
template <int Dh>
__device__ __forceinline__ void store_acc_swizzled(unsigned char* dst, int panel_bytes, const float (&acc)[Dh / 8][4],
                                                   const float (&f)[2], int row0, int lane) {
  unsigned char* base = dst + (row0 + (lane >> 2)) * kSwizzleRowBytes + 4 * (lane & 3);
  const uint32_t chunk_xor = opaque_u32(16 * (lane >> 2));
#pragma unroll
  for (int nt = 0; nt < Dh / 8; ++nt) {
    unsigned char* at = base + (nt / 8) * panel_bytes + ((16 * (nt % 8)) ^ chunk_xor);
    *reinterpret_cast<uint32_t*>(at) = pack_bf16x2(acc[nt][0] * f[0], acc[nt][1] * f[0]);
    *reinterpret_cast<uint32_t*>(at + 8 * kSwizzleRowBytes) = pack_bf16x2(acc[nt][2] * f[1], acc[nt][3] * f[1]);
  }
}

// A consumer warpgroup's output rows through the copy engine (the epilogues' kStoreByTma): its
// staging tiles are rewritten only once the copy engine has read the last item's (their issuer,
// the warpgroup's first thread, waits; the warpgroup's named barrier `barrier_id` holds the
// others), written by `stage` (each thread its accumulator fragments: store_acc_swizzled), made
// visible to the async proxy, and stored by the issuer (`store`: tma_store_tile per tile) as one
// bulk group, not waited for here; none when the rows all lie past T (`any_row` false). The block
// waits for its last groups before it exits (bulk_wait<0>): its shared memory is their source.
constexpr int kStagingBarrier = 8;  // + the consumer index: named barrier ids above the turns' (1 … 3)
template <class Stage, class Store>
__device__ __forceinline__ void store_staged_by_tma(int barrier_id, bool issuer, bool any_row, Stage&& stage,
                                                    Store&& store) {
  if (issuer) bulk_wait_read<0>();
  named_barrier_sync(barrier_id, 128);
  stage();
  fence_async_shared();  // st.shared, read by the copy engine
  named_barrier_sync(barrier_id, 128);
  if (issuer && any_row) {
    store();
    bulk_commit();
  }
}
// A staged tile at src (64 rows, Panels 64-column panels, as store_acc_swizzled writes it) → rows
// [row0, row0 + 64) of head h, batch b of `map` (64-row boxes), one tensor store per panel.
template <int Panels>
__device__ __forceinline__ void tma_store_tile(const CUtensorMap* map, int h, int row0, int b, const unsigned char* src) {
#pragma unroll
  for (int panel = 0; panel < Panels; ++panel) tma_store_4d(map, 64 * panel, h, row0, b, src + panel * 64 * kSwizzleRowBytes);
}
// One output tile the common way (the forward's O, the dQ kernel's dQ): consumer `consumer`'s
// (64, Dh) accumulator, rows scaled by f as store_acc_swizzled's, staged at st and stored to rows
// [row0, row0 + 64) of head h, batch b of `map`. (The dK/dV kernel stages two tiles per bulk
// group and calls store_staged_by_tma itself.)
template <int Dh, int Panels>
__device__ __forceinline__ void store_tile_by_tma(int consumer, bool issuer, unsigned char* st, const float (&acc)[Dh / 8][4],
                                                  const float (&f)[2], const CUtensorMap* map, int h, int row0, int b,
                                                  int T, int warp, int lane) {
  store_staged_by_tma(
      kStagingBarrier + consumer, issuer, row0 < T,
      [&] { store_acc_swizzled<Dh>(st, 64 * kSwizzleRowBytes, acc, f, 16 * warp, lane); },
      [&] { tma_store_tile<Panels>(map, h, row0, b, st); });
}

// The inverse, for a tile that stays in registers as a wgmma A operand: rows [row0, row0 + 16)
// of a D-column swizzled tile at src (64-column panels panel_bytes apart) → the warp's A
// fragments for D/16 k-steps. The same addresses as the stores, so no bank conflicts either.
template <int D>
__device__ __forceinline__ void load_a_frags_swizzled(uint32_t (&a)[D / 16][4], const unsigned char* src,
                                                      int panel_bytes, int row0, int lane) {
  const unsigned char* base = src + (row0 + (lane >> 2)) * kSwizzleRowBytes + 4 * (lane & 3);
  const uint32_t chunk_xor = opaque_u32(16 * (lane >> 2));
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      a[ks][e] = *reinterpret_cast<const uint32_t*>(base + (ks / 4) * panel_bytes + 8 * kSwizzleRowBytes * (e & 1) +
                                                    ((32 * (ks % 4) + 16 * (e >> 1)) ^ chunk_xor));
}

// ── Work items of the persistent kernels ──
// Item w of H · B · n_tiles, in one of two orders (blocks claim items in increasing w):
//   causal — heaviest first within groups of heads: the (head, batch) pairs hb = b·H + h in
//     groups of G consecutive ones, group after group; within a group head fastest, then the
//     tile, heaviest first — reversed (last tile first) when the heaviest tiles are the last ones
//     (heaviest_last: the forward's and the dQ pass's query tiles; the dK/dV pass's key blocks are
//     heaviest first as they are). G is the fewest heads whose tiles fill kCausalGroupWaves waves
//     of the grid, so that the blocks running at once share few heads — each streamed K/V (Q/dO)
//     tile, and the atomic mode's dQ rows, are reused while in L2 —, and a group's last, lightest
//     items still overlap the next group's heaviest (the dynamic scheduler keeps the order
//     whatever the items' lengths; only the last group's tail is not filled, and it is its
//     lightest items). With every head in one group the blocks running at once at T 4k would
//     work on 128 different heads. The groups pay in the deterministic kernels and the d 64
//     atomic one; the d 128 atomic kernel runs slower grouped and keeps one group (8 waves kept
//     of 2, 4 and 8, which measured alike, as the safer tail; docs/kernels.md §5.3).
//   non-causal — every item equally long, so head-major: tile w % n_tiles, head (w / n_tiles) % H,
//     batch w / (n_tiles · H). The blocks running at once then work on few heads, and each K/V (or
//     Q/dO) tile they stream is read by many of them while it is in L2 (docs/kernels.md §5.3:
//     1.05–1.11× the tile-major order).
// row0: the tile's first row.
struct ItemTile {
  int h, b, row0;
};
constexpr int kCausalGroupWaves = 8;
// The causal order, with groups of at least group_items items (all heads in one group if ≤ 0).
__device__ __forceinline__ ItemTile causal_item_tile(int w, int H, int B, int n_tiles, int rows, bool heaviest_last,
                                                     int group_items) {
  const int HB = H * B;
  const int G = group_items > 0 ? min(HB, max(1, (group_items + n_tiles - 1) / n_tiles)) : HB;
  const int per_group = G * n_tiles, group = w / per_group, r = w - group * per_group;
  const int group_heads = min(G, HB - group * G);  // the last group may have fewer
  const int z = r / group_heads, hb = group * G + r % group_heads;
  return {hb % H, hb / H, (heaviest_last ? n_tiles - 1 - z : z) * rows};
}
// grouped = false: every head in one group (the d 128 atomic dK/dV kernel's order, see
// DkdvAtomicSm90aConfig).
__device__ __forceinline__ ItemTile item_tile(int w, int H, int B, int n_tiles, int rows, bool causal,
                                              bool heaviest_last, bool grouped = true) {
  if (!causal) return {(w / n_tiles) % H, w / (n_tiles * H), (w % n_tiles) * rows};
  return causal_item_tile(w, H, B, n_tiles, rows, heaviest_last, grouped ? kCausalGroupWaves * int(gridDim.x) : 0);
}

// ── The producer of the warp-specialised kernels ──
// A stream of tile pairs through NS stage buffers — K/V tiles in the forward and the dQ kernel,
// Q/dO tiles in the dK/dV kernel (the fields keep the K/V names): the j-th pair (tiles first + j),
// Rows rows of Panels swizzled 64-column panels each, is the stream's pair seq0 + j (a persistent
// block's stream runs on across its work items) and goes to stage (seq0 + j) % NS once the consumers
// have released the pair that stage held (its "empty" barriers' phase ((seq0 + j) / NS − 1) & 1), and
// completes the stage's "full" barriers with its bytes. Tiles past the sequence's end are
// zero-filled.
struct KvStream {
  unsigned char* sK;
  unsigned char* sV;
  uint64_t* k_full;
  uint64_t* k_empty;
  uint64_t* v_full;
  uint64_t* v_empty;
};
// The mbarriers of a warp-specialised block, at `at` (8-byte aligned, after the tiles): *own_full
// for the block's own tiles, then per stage K full, K empty, V full, V empty (8·(1 + 4·NS) bytes).
// With init (one thread), initialises them: full ones for one arrival (the producer's, with the
// bytes; K's also for k_full_extra more, from producer threads that stage something beside the
// tile), empty ones for consumer_warps (K's for k_empty_count instead where that is not 0: where
// consumer threads release what they read with plain loads each, see flash_bwd_sm90a.cu); a
// block barrier must follow before anyone uses them.
template <int NS>
__device__ __forceinline__ KvStream kv_stream_barriers(unsigned char* at, unsigned char* sK, unsigned char* sV,
                                                       uint64_t** own_full, int consumer_warps, bool init,
                                                       int k_full_extra = 0, int k_empty_count = 0) {
  uint64_t* bars = reinterpret_cast<uint64_t*>(at);
  *own_full = bars;
  const KvStream kv{sK, sV, bars + 1, bars + 1 + NS, bars + 1 + 2 * NS, bars + 1 + 3 * NS};
  if (init) {
    mbarrier_init(bars, 1);
    for (int st = 0; st < NS; ++st) {
      mbarrier_init(&kv.k_full[st], 1 + k_full_extra);
      mbarrier_init(&kv.v_full[st], 1);
      mbarrier_init(&kv.k_empty[st], k_empty_count ? k_empty_count : consumer_warps);
      mbarrier_init(&kv.v_empty[st], consumer_warps);
    }
    fence_barrier_init();
  }
  return kv;
}
template <int Panels, int Rows, int NS>
__device__ __forceinline__ void produce_kv(const KvStream& s, const CUtensorMap* k_map, const CUtensorMap* v_map,
                                           int head, int b, int n_tiles, int first = 0, int seq0 = 0) {
  constexpr int kPanel = Rows * kSwizzleRowBytes, kTile = Panels * kPanel;
  for (int j = 0; j < n_tiles; ++j) {
    const int st = (seq0 + j) % NS;
    const uint32_t use = uint32_t((seq0 + j) / NS);  // the stage's use count: its barriers' phase
    if (use > 0) mbarrier_wait(&s.k_empty[st], (use - 1) & 1);
    mbarrier_arrive_expect_tx(&s.k_full[st], kTile);
    for (int pn = 0; pn < Panels; ++pn)
      tma_load_4d(s.sK + st * kTile + pn * kPanel, k_map, 64 * pn, head, (first + j) * Rows, b, &s.k_full[st]);
    if (use > 0) mbarrier_wait(&s.v_empty[st], (use - 1) & 1);
    mbarrier_arrive_expect_tx(&s.v_full[st], kTile);
    for (int pn = 0; pn < Panels; ++pn)
      tma_load_4d(s.sV + st * kTile + pn * kPanel, v_map, 64 * pn, head, (first + j) * Rows, b, &s.v_full[st]);
  }
}
// A consumer's turns on tiles j_from … n_kb − 1 of an item without products (kSkipIdle: none of
// those tiles reaches its rows): each still takes its turn on the ring and releases the stage's K
// and V once their loads have landed (so that the releases count towards this use of the stage),
// which keeps the ring and the K/V stream going. hand_on_last: whether the item's last turn hands
// on (all but the ring's very last turn do). seq: the item's first tile's place in the stream.
template <int NS>
__device__ __forceinline__ void idle_turns(const KvStream& kv, int seq, int j_from, int n_kb, int my_turn,
                                           int next_turn, bool hand_on_last) {
  for (int j = j_from; j < n_kb; ++j) {
    const int st = (seq + j) % NS;
    const uint32_t phase = uint32_t((seq + j) / NS) & 1;
    named_barrier_sync(my_turn, 256);
    mbarrier_wait(&kv.k_full[st], phase);
    mbarrier_wait(&kv.v_full[st], phase);
    if (j + 1 < n_kb || hand_on_last) named_barrier_arrive(next_turn, 256);
    mbarrier_arrive_warp(&kv.k_empty[st]);
    mbarrier_arrive_warp(&kv.v_empty[st]);
  }
}
// Rows [row0, row0 + rows) of a tensor as Panels panels (panel_bytes apart) on one barrier.
template <int Panels>
__device__ __forceinline__ void produce_tile(unsigned char* dst, int panel_bytes, const CUtensorMap* map, int head,
                                             int row0, int b, uint64_t* full) {
  for (int pn = 0; pn < Panels; ++pn) tma_load_4d(dst + pn * panel_bytes, map, 64 * pn, head, row0, b, full);
}

// The first byte of `smem` at or after it on a 1024-byte boundary: the swizzle works on absolute
// shared addresses, so every tile starts on one (the kernels allocate kSwizzleAtomBytes of slack).
__device__ __forceinline__ unsigned char* align_to_swizzle_atom(unsigned char* smem) {
  return smem + ((kSwizzleAtomBytes - (smem_addr(smem) & (kSwizzleAtomBytes - 1))) & (kSwizzleAtomBytes - 1));
}

}  // namespace tg::cuda::flash::sm90
