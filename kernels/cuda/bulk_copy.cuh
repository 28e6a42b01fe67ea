// Hopper's (sm_90) bulk copy engine and the mbarriers that count its bytes: a whole contiguous range
// copied global → shared by one instruction, without the threads' registers, while the threads
// work on what the previous copy brought. Used by the attention kernels' tensor copies
// (flash_attention/sm90_ptx.cuh) and the cross-entropy rows (softmax.cu). Only kernels built for
// sm_90 or later may call these; verified on the H200 by tests/cuda/test_tma.cpp and the kernel
// parity table's cross-entropy rows.
#pragma once
#include <cstdint>

namespace tg::cuda {

// count arrivals (plus, per phase, the bytes announced with mbarrier_arrive_expect_tx) complete
// a phase. One thread initialises; fence_barrier_init and a block barrier publish it.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(count)
               : "memory");
}
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` more to come from the copy engine in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
               "r"(bytes)
               : "memory");
}
// Returns once the phase of parity `parity` has completed (a fresh barrier is in phase 0, so
// waiting for parity 1 returns at once).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar))),
      "r"(parity)
      : "memory");
}
// dst (shared) ← src (global), `bytes` contiguous bytes (both 16-byte aligned, bytes a multiple
// of 16 and below 2^20); completes `bytes` on bar, whose phase the issuing thread announced them to
// (mbarrier_arrive_expect_tx).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(src), "r"(bytes), "r"(static_cast<uint32_t>(__cvta_generic_to_shared(bar)))
      : "memory");
}

}  // namespace tg::cuda
