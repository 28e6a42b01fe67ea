// What a run needs in memory, from its config alone, before anything is allocated: parameter
// count, gradients, AdamW state and an estimate of the activations, in overflow-checked 64-bit
// arithmetic, compared with what the device has (CPU: MemAvailable from /proc/meminfo).
#pragma once
#include <cstdint>
#include <string>

#include "src/io/config.h"
#include "src/tensor/tensor.h"

namespace tg {

struct Footprint {
  int64_t params = 0;            // parameter count
  int64_t param_bytes = 0;       // fp32 master weights (+ the bf16 compute copy)
  int64_t grad_bytes = 0;        // fp32 gradients
  int64_t optimizer_bytes = 0;   // AdamW's two moments (this rank's share under ZeRO-1)
  int64_t activation_bytes = 0;  // an estimate of what one micro-batch's forward keeps for the backward
  int64_t total_bytes = 0;
};

// The parameter count of the GPT the config describes; tg::Error naming the keys when the
// count overflows 64 bits.
int64_t parameter_count(const ModelConfig& m);

// Training (training = true: gradients, AdamW state and a batch_size × seq_len micro-batch) or
// inference (the weights and a 1 × seq_len forward). tg::Error naming the keys on overflow.
Footprint estimate_footprint(const Config& c, bool training, int world_size = 1);

// Bytes the device can still give: MemAvailable on the CPU, free memory on a GPU; -1 if unknown.
int64_t available_memory(Device d);
// The device's whole memory: MemTotal on the CPU, a GPU's total; -1 if unknown.
int64_t total_memory(Device d);

// tg::Error (one line naming the keys and the figures) when the estimate exceeds what the
// device has available.
void check_fits(const Config& c, Device d, bool training, int world_size = 1);

}  // namespace tg
