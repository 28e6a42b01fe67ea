// AdamW over the flat parameter buffer (decoupled weight decay on 2-D weights only),
// global gradient-norm clipping, and the learning-rate schedules.
#pragma once
#include <cstdint>

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
  AdamW(nn::ParameterStore& params, const AdamWConfig& config);
  // One update with learning rate `lr` from the gradients in the store's flat grad buffer.
  void step(double lr);
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t s) { steps_ = s; }
  Tensor first_moment() const { return m_; }   // (numel), same layout as the flat parameters
  Tensor second_moment() const { return v_; }  // (numel)

 private:
  nn::ParameterStore& params_;
  AdamWConfig config_;
  Tensor m_, v_;
  int64_t steps_ = 0;
};

// The global L2 norm of all gradients (in double, reproducible).
double grad_norm(const nn::ParameterStore& params);
// Scales gradients so that their global norm is at most max_norm (when max_norm > 0 and the
// norm is finite); returns the norm before clipping.
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
