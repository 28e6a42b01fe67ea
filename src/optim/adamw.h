// AdamW over the flat parameter buffer (decoupled weight decay on 2-D weights only),
// global gradient-norm clipping, and the learning-rate schedules.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "src/nn/parameters.h"

namespace tg::optim {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
};

// The limits a step decided on the device applies: train.grad_clip and train.max_bad_steps.
struct StepRules {
  double max_norm = 0;  // clip to this global norm (0: no clipping)
  int64_t max_bad_steps = 0;
};

class AdamW {
 public:
  // `owned`: the ranges of the flat buffers this optimizer updates and keeps moments for (a
  // data-parallel rank's shard under ZeRO-1); empty means all of them.
  AdamW(nn::ParameterStore& params, const AdamWConfig& config, std::vector<nn::FlatRange> owned = {});
  // One update with learning rate `lr` from the gradients in the store's flat grad buffer, each
  // read as g·grad_scale (clip_factor's result: clipping without a pass of its own). The
  // gradients themselves are left as they are.
  void step(double lr, double grad_scale = 1.0);
  // One training step decided where the parameters are, with no host read: `record` (two f64 on
  // the parameters' device: the step's mean loss and its squared gradient norm) decides whether
  // the update is taken — both finite — and with which clipping factor (cpu::decide_step); the
  // update then runs, or is skipped, there. The host learns the outcome from decision().
  void step_decided(double lr, const Tensor& record, const StepRules& rules);
  // The decided steps' state, read from the device (a host synchronisation: read it when
  // logging); steps_taken() follows it.
  cpu::StepDecision decision();
  // Starts deciding from the host's state: steps_taken() updates so far and the run's count of
  // consecutive non-finite steps (at the start of training, after a resume).
  void reset_decision(int32_t bad_in_row);
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t s) { steps_ = s; }
  // The moments of the owned ranges, back to back: (numel) in the flat parameters' layout when
  // the optimizer owns everything.
  Tensor first_moment() const { return m_; }
  Tensor second_moment() const { return v_; }
  const std::vector<nn::FlatRange>& owned() const { return owned_; }
  bool owns_all() const { return owned_.size() == 1 && owned_[0].offset == 0 && owned_[0].length == params_.numel(); }

 private:
  // The update of every owned range with the step's bias corrections and gradient scale, or, on a
  // GPU with device_decision set, with those the device decided (skipping the step there).
  void update(double lr, float bc1, float bc2, float grad_scale, const cpu::StepDecision* device_decision);

  nn::ParameterStore& params_;
  AdamWConfig config_;
  std::vector<nn::FlatRange> owned_;
  Tensor m_, v_;
  int64_t steps_ = 0;
  Tensor decision_;  // one cpu::StepDecision on the parameters' device (optimizer memory)
};

// The global L2 norm of all gradients (in double, reproducible).
double grad_norm(const nn::ParameterStore& params);
// The sum of squares of the gradients in `ranges` (in double): a ZeRO-1 rank's part of the norm.
double grad_sum_squares(const nn::ParameterStore& params, const std::vector<nn::FlatRange>& ranges);
// The square of the gradients' global norm over `ranges` (all of them when empty), written to
// `out` (one f64 on the gradients' device) with no host read: the per-range sums of grad_norm and
// grad_sum_squares, added in the same order.
void grad_sum_squares_to(const nn::ParameterStore& params, const std::vector<nn::FlatRange>& ranges,
                         const Tensor& out);
// dst += value / divisor, both one element on the same device (value f32, dst f64): a
// micro-batch's loss added to its step's mean there, without reading it on the host.
void add_divided(const Tensor& dst, const Tensor& value, double divisor);
// The factor that brings gradients of global norm `norm` to at most max_norm: max_norm/(norm+1e-6)
// when max_norm > 0 and norm is finite and above it, else 1. Training passes it to AdamW::step.
double clip_factor(double norm, double max_norm);
// Scales the gradients in place by clip_factor(their norm, max_norm); returns the norm before
// clipping. (For callers that need the clipped gradients themselves.)
double clip_grad_norm(nn::ParameterStore& params, double max_norm);

enum class Schedule { cosine, constant, wsd };

// Linear warmup from lr/warmup to lr over `warmup_steps`, then cosine to min_lr at max_steps
// (cosine), flat at lr (constant), or flat at lr and then linear to min_lr over the last
// `decay_steps` (wsd: warmup, stable, decay; 0 decay steps: the last fifth of max_steps). A
// wsd run resumed with a larger max_steps is unchanged up to its new decay. step counts from 0.
struct LRSchedule {
  Schedule kind = Schedule::cosine;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t max_steps = 1;
  int64_t decay_steps = 0;
  double at(int64_t step) const;
};

}  // namespace tg::optim
