// Prints every sm_90a FlashAttention kernel shape the launchers run, with its threads and its
// dynamic shared memory (the traits' kSmemBytes), for the registers-and-spills table in
// docs/kernels.md §4.2: ptxas -v gives the registers and spills of each kernel, but not the
// dynamic shared memory, which the traits compute. Reads the kernels' source through the
// emulator's generated headers, so it needs no GPU and no CUDA headers:
//
//   cmake --build build --target kernel_smem_table && build/kernel_smem_table
#include <cstdio>

#include "emu.h"
#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/flash_attention/kernel_traits.cuh"
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
  return 0;
}
