// What `bench train` and `bench memory` share: training steps of a config's model on random
// tokens, timed, with the peak memory by category.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "src/dist/communicator.h"
#include "src/io/config.h"
#include "src/tensor/memory.h"
#include "src/tensor/tensor.h"

namespace tg {
#ifdef TILEGRAD_HAVE_CUDA
void cuda_mem_get_info(size_t* free_bytes, size_t* total_bytes);  // kernels/cuda/runtime.cu
#endif
}  // namespace tg

namespace tg::bench {

// What `warmup` untimed and then `steps` timed training steps of a config's model measured.
struct StepFigures {
  double seconds_per_step = 0, loss = 0, flops_per_token = 0;
  bool cuda_graph = false;                   // the forward and backward replayed as a recorded CUDA graph
  double host_seconds_per_step = 0;          // the host's time to queue a step (≈ the step's when it bounds it)
  double exposed_comm_seconds_per_step = 0;  // data parallel: reduction time the backward did not hide
  int64_t params = 0;
  MemoryStats memory;  // peak over the timed steps, or from before the model (peak_from_start)
};

// Training steps (forward, backward, clipped AdamW) of cfg's model on random tokens, data loading
// excluded. The peak memory covers the timed steps or, with peak_from_start, everything from
// before the model is built (its parameters and AdamW's state included, as torch_gpt.py memory
// measures it).
// With a communicator of W > 1 ranks, each rank trains on its own batch and the gradients are
// reduced as in training (buckets overlapped with the backward, ZeRO-0 or 1 from the config).
StepFigures run_training_steps(const Config& cfg, Device device, int64_t warmup, int64_t steps, bool peak_from_start,
                               dist::Communicator* comm = nullptr);

double gib(int64_t bytes);
std::string fmt_ms(double ms);  // "12.34"

}  // namespace tg::bench
