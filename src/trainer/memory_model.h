// The peak memory of one training step, predicted from the config alone, category by category,
// as the memory accounting (src/tensor/memory.h) will count it. Unlike the footprint's coarse
// upper estimate (footprint.h), every term is a buffer the code allocates: what each op keeps for
// its backward and in which dtype, what the recomputed block holds while it runs again, the LM
// head's chunk, and when each is freed. docs/memory.md derives it term by term.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "src/io/config.h"

namespace tg {

// Where the step reaches its peak; each phase's figure is computed and the largest is the peak.
struct MemoryPhase {
  std::string name;         // "head forward", "last block backward", …
  int64_t activations = 0;  // bytes charged to activations at that moment
  int64_t workspace = 0;    // bytes charged to workspace at that moment
};

struct MemoryPrediction {
  // Bytes by category at the moment of the peak (params, grads and optimizer are constant through
  // a step, so they are also those categories' own peaks).
  int64_t params = 0;       // fp32 master weights
  int64_t grads = 0;        // fp32 gradients
  int64_t optimizer = 0;    // AdamW's two moments (this rank's share under ZeRO-1)
  int64_t activations = 0;  // everything else the step holds at its peak
  int64_t workspace = 0;    // kernel scratch at the peak
  int64_t total = 0;        // the peak of the sum
  int64_t workspace_peak = 0;  // the workspace category's own peak (the attention backward's scratch)
  std::string peak_phase;      // which phase holds the peak

  // Parts of `activations` at the peak, and the per-block figures they are made of.
  int64_t compute_copy = 0;     // bf16: the flat parameters in the compute dtype, read by the forward
  int64_t tokens = 0;           // the batch's ids and targets (int32)
  int64_t embedding = 0;        // what the embeddings keep (learned positions: token and position rows)
  int64_t saved_per_block = 0;  // what one recorded block keeps for its backward, its output included
  int64_t saved_blocks = 0;     // what all blocks keep: L × saved_per_block, or the L + 1 block inputs under recompute
  int64_t block_working = 0;    // the block being backpropagated (recomputed under recompute): its saved tensors and gradients
  int64_t head = 0;             // the LM head's working set (logits chunk, dlogits, dx, dW)
  int64_t offloaded = 0;        // train.offload_activations: the block inputs parked in host memory (not on the GPU)
  int64_t parameter_count = 0;
  std::vector<MemoryPhase> phases;  // every candidate, for the docs and --predict's breakdown
};

// One training micro-batch (forward, backward and the AdamW step) of `c` on a device of kind
// `device_kind` ("cpu" or "cuda"), with ZeRO-`c.train.zero` over `world_size` ranks. The dtype
// rules: bf16 (train.precision) activations and compute copy in 2 bytes, fp32 in 4; the GPU keeps
// LayerNorm and attention statistics in fp32 whatever the compute dtype, the CPU in the compute
// dtype. Model dropout is taken as 0 in the block figures unless set (then each dropout site
// keeps its output too). train.grad_accum does not change the peak: micro-batches run one at a time.
MemoryPrediction predict_memory(const Config& c, const std::string& device_kind, int world_size = 1);

// "params 1.2 GiB, grads …, total …" — the start-up log line and --predict's text.
std::string describe_prediction(const MemoryPrediction& p);

}  // namespace tg
