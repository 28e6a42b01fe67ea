// CUDA AdamW over the flat fp32 parameter buffer, the deterministic global sum of squares for
// gradient clipping, and an in-place scale: twins of kernels/cpu/adamw.h.
#pragma once
#include "kernels/cpu/adamw.h"
#include "kernels/cuda/stream.h"

#include <cstddef>
#include <cstdint>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// One fused pass over p, g, m, v (n) fp32: elements [0, n_decay) get decoupled weight decay, the
// rest (biases, LayerNorm parameters, by the buffer's ordering) do not. Same formula as the CPU:
//   m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²;  p ← p − lr·(m/bc1 / (√(v/bc2) + eps) + wd·p)
// bc1, bc2 = 1 − β1^t, 1 − β2^t for the step t being taken. Requires 0 ≤ n_decay ≤ n.
// g is read as g·grad_scale: gradient clipping folded into the update (a separate scaling pass
// over GPT-2's 124 M fp32 gradients cost 0.25 ms a step). compute (n bf16, or null): where the
// updated p is also written in bf16, rounded to nearest even as the fp32 → bf16 cast rounds —
// the model's compute copy, so that its forward does not convert the parameters again.
void adamw_update(float* p, const float* g, float* m, float* v, bf16* compute, int64_t n, int64_t n_decay, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float bc1, float bc2, float grad_scale,
                  cudaStream_t stream);

// A training step decided on the device (cpu::StepDecision): decide_step reads the step's record
// {mean loss, squared gradient norm} (two doubles, device memory) and updates *decision in one
// thread; adamw_update_decided then takes the update with the decision's bias corrections and
// clipping factor, or returns at once when the decision skips the step. No host synchronisation.
void decide_step(const double* record, double max_norm, double beta1, double beta2, int64_t max_bad_steps,
                 cpu::StepDecision* decision, cudaStream_t stream);
void adamw_update_decided(float* p, const float* g, float* m, float* v, bf16* compute, int64_t n, int64_t n_decay,
                          float lr, float beta1, float beta2, float eps, float weight_decay,
                          const cpu::StepDecision* decision, cudaStream_t stream);

// *dst += double(*src) / divisor (one element each, device memory): a micro-batch's loss added to
// its step's mean without reading it on the host.
void add_divided(double* dst, const float* src, double divisor, cudaStream_t stream);

// *out = xs[0] + xs[1] + … + xs[n−1], added in that order in double (n small: one thread).
void sum_in_order(const double* xs, int64_t n, double* out, cudaStream_t stream);

// Bytes of scratch sum_squares needs for n elements (one double per 8192-element block).
size_t sum_squares_scratch_bytes(int64_t n);

// *out_device (one double, device memory) = Σ g[i]² accumulated in double: each 8192-element block
// sums in a fixed order into scratch, then one block adds the partials in order. Bitwise
// reproducible for a given n and g alignment. scratch holds sum_squares_scratch_bytes(n) bytes
// (8-byte aligned). No host synchronisation.
void sum_squares(const float* g, int64_t n, void* scratch, double* out_device, cudaStream_t stream);

// x (n) *= s.
void scale_inplace(float* x, float s, int64_t n, cudaStream_t stream);

}  // namespace tg::cuda
