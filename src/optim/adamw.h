// AdamW over the flat parameter buffer (decoupled weight decay on 2-D weights only),
// global gradient-norm clipping, and the learning-rate schedules.
#pragma once
#include <cstdint>
#include <vector>

#include "src/nn/parameters.h"

namespace tg::optim {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
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
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t s) { steps_ = s; }
  // The moments of the owned ranges, back to back: (numel) in the flat parameters' layout when
  // the optimizer owns everything.
  Tensor first_moment() const { return m_; }
  Tensor second_moment() const { return v_; }
  const std::vector<nn::FlatRange>& owned() const { return owned_; }
  bool owns_all() const { return owned_.size() == 1 && owned_[0].offset == 0 && owned_[0].length == params_.numel(); }

 private:
  nn::ParameterStore& params_;
  AdamWConfig config_;
  std::vector<nn::FlatRange> owned_;
  Tensor m_, v_;
  int64_t steps_ = 0;
};

// The global L2 norm of all gradients (in double, reproducible).
double grad_norm(const nn::ParameterStore& params);
// The sum of squares of the gradients in `ranges` (in double): a ZeRO-1 rank's part of the norm.
double grad_sum_squares(const nn::ParameterStore& params, const std::vector<nn::FlatRange>& ranges);
// The factor that brings gradients of global norm `norm` to at most max_norm: max_norm/(norm+1e-6)
// when max_norm > 0 and norm is finite and above it, else 1. Training passes it to AdamW::step.
double clip_factor(double norm, double max_norm);
// Scales the gradients in place by clip_factor(their norm, max_norm); returns the norm before
// clipping. (For callers that need the clipped gradients themselves.)
double clip_grad_norm(nn::ParameterStore& params, double max_norm);

enum class Schedule { cosine, constant };

// Linear warmup from lr/warmup to lr over `warmup_steps`, then cosine to min_lr at max_steps
// (cosine) or flat at lr (constant). step counts from 0.
struct LRSchedule {
  Schedule kind = Schedule::cosine;
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 0;
  int64_t max_steps = 1;
  double at(int64_t step) const;
};

}  // namespace tg::optim
