// Prints every sm_90a FlashAttention kernel shape the launchers run, with its threads and its
// dynamic shared memory (the traits' kSmemBytes), for the registers-and-spills table in
// docs/kernels.md §4.2, then the mma.sync kernels' shapes (mma_shapes.h's tables, §4.1) alike:
// ptxas -v gives the registers and spills of each kernel, but not the
// dynamic shared memory, which the traits compute. Reads the kernels' source through the
// emulator's generated headers, so it needs no GPU and no CUDA headers:
//
//   cmake --build build --target kernel_smem_table && build/kernel_smem_table
#include <cstdio>

#include "emu.h"
#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/flash_attention/kernel_traits.cuh"
#include "kernels/cuda/flash_attention/mask.cuh"
#include "tile_emu.cuh"
#include "sm90_emu.cuh"
#include "flash_fwd_sm90a_emu.h"
#include "flash_bwd_sm90a_emu.h"

namespace {

using namespace tg::cuda::flash;

template <class Tr>
void row(const char* kernel, const char* where) {
  std::printf("| %s | %s | %d | %.1f KiB |\n", kernel, where, Tr::kThreads, double(Tr::kSmemBytes) / 1024.0);
}

// The mma.sync shapes of one table, each with its traits' threads and dynamic shared memory (the
// dK/dV kernel's also with FlashDq::kAtomic's dS tile where that kernel runs).
template <class... S>
void fwd_rows(MmaShapeList<S...>) {
  (std::printf("| forward d %d | `%s` | %d | %.1f KiB |\n", S::head_dim, S::name, FwdTraits<S>::kThreads,
               double(FwdTraits<S>::kSmemBytes) / 1024.0),
   ...);
}
template <class... S>
void dkdv_rows(MmaShapeList<S...>) {
  (std::printf("| dK/dV d %d | `%s` | %d | %.1f KiB%s |\n", S::head_dim, S::name, BwdTraits<S>::kThreads,
               double(BwdTraits<S>::kSmemBytes) / 1024.0,
               S::atomic_dq ? "" : " (no atomic kernel)"),
   ...);
}
template <class... S>
void dkdv_atomic_rows(MmaShapeList<S...>) {
  ((S::atomic_dq ? (void)std::printf("| dK/dV + atomic dQ d %d | `%s` | %d | %.1f KiB |\n", S::head_dim, S::name,
                                     BwdTraits<S>::kThreads, double(BwdTraits<S>::kSmemDkdvBytes) / 1024.0)
                 : (void)0),
   ...);
}
template <class... S>
void dq_rows(MmaShapeList<S...>) {
  (std::printf("| dQ d %d | `%s` | %d | %.1f KiB |\n", S::head_dim, S::name, BwdTraits<S>::kThreads,
               double(BwdTraits<S>::kSmemBytes) / 1024.0),
   ...);
}

}  // namespace

int main() {
  std::printf("| kernel | where (launcher) | threads | shared memory |\n|---|---|---|---|\n");
  row<FwdSm90aTraits<FwdD64ShortCausal>>("forward d 64", "causal T ≤ kFwdShortCausalMaxT");
  row<FwdSm90aTraits<FwdD64>>("forward d 64", "otherwise");
  row<FwdSm90aTraits<FwdD128Causal>>("forward d 128", "causal");
  row<FwdSm90aTraits<FwdD128NonCausal>>("forward d 128", "non-causal (176-key tiles)");
  row<FwdSm90aTraits<FwdD96Causal>>("forward d 96", "causal");
  row<FwdSm90aTraits<FwdD96NonCausal>>("forward d 96", "non-causal");
  row<DkdvWsSm90aTraits<DkdvD64>>("dK/dV d 64", "T < kBwdSm90aLongT");
  row<DkdvWsSm90aTraits<DkdvD64LongCausal>>("dK/dV d 64", "T ≥ kBwdSm90aLongT, causal");
  row<DkdvWsSm90aTraits<DkdvD64LongNonCausal>>("dK/dV d 64", "T ≥ kBwdSm90aLongT, non-causal");
  row<DkdvWsSm90aTraits<DkdvD128>>("dK/dV d 128", "every T");
  row<DkdvWsSm90aTraits<DkdvD96>>("dK/dV d 96", "every T");
  row<DkdvWsSm90aTraits<DkdvAtomicD64>>("dK/dV + atomic dQ d 64", "FlashDq::kAtomic, where it runs");
  row<DkdvWsSm90aTraits<DkdvAtomicD128>>("dK/dV + atomic dQ d 128", "FlashDq::kAtomic, where it runs");
  row<DqSm90aTraits<DqD64>>("dQ d 64", "T < kBwdSm90aLongT");
  row<DqSm90aTraits<DqD64Long>>("dQ d 64", "T ≥ kBwdSm90aLongT");
  row<DqSm90aTraits<DqD128>>("dQ d 128", "every T");
  row<DqSm90aTraits<DqD96>>("dQ d 96", "every T");
  std::printf("\n| mma.sync kernel | shape (every mask and T) | threads | shared memory |\n|---|---|---|---|\n");
  fwd_rows(MmaFwdTable{});
  dkdv_rows(MmaDkdvTable{});
  dkdv_atomic_rows(MmaDkdvTable{});
  dq_rows(MmaDqTable{});
  return 0;
}
