// AdamW, gradient clipping and learning-rate schedules.
#include "src/optim/adamw.h"

#include <cmath>

#include "kernels/cpu/adamw.h"
#include "kernels/cuda/optim.h"
#include "src/tensor/dispatch.h"

namespace tg::optim {

AdamW::AdamW(nn::ParameterStore& params, const AdamWConfig& config) : params_(params), config_(config) {
  MemoryCategoryScope scope(MemCategory::optimizer);
  Tensor flat = params.flat_values();
  m_ = Tensor::zeros(flat.shape(), flat.dtype(), flat.device());
  v_ = Tensor::zeros(flat.shape(), flat.dtype(), flat.device());
}

void AdamW::step(double lr, double grad_scale) {
  ++steps_;
  Tensor values = params_.flat_values();
  TG_CHECK(values.dtype() == DType::f32, "AdamW: needs f32 master parameters, got ", values.desc());
  const float bc1 = float(1.0 - std::pow(config_.beta1, double(steps_)));
  const float bc2 = float(1.0 - std::pow(config_.beta2, double(steps_)));
  float* p = values.data<float>();
  const float* g = params_.flat_grads().data<float>();
  float* m = m_.data<float>();
  float* v = v_.data<float>();
  // The flat layout puts decayed parameters first: elements [0, n_decay) take weight decay.
  const int64_t n = params_.numel(), n_decay = params_.decay_numel();
  const float b1 = float(config_.beta1), b2 = float(config_.beta2), eps = float(config_.eps);
  const float gs = float(grad_scale);
  if (values.device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
    // One fused kernel over the whole flat buffer.
    cuda::adamw_update(p, g, m, v, n, n_decay, float(lr), b1, b2, eps, float(config_.weight_decay), bc1, bc2, gs,
                       detail::cuda_stream());
#endif
    return;
  }
  cpu::adamw_update(p, g, m, v, n_decay, float(lr), b1, b2, eps, float(config_.weight_decay), bc1, bc2, gs);
  cpu::adamw_update(p + n_decay, g + n_decay, m + n_decay, v + n_decay, n - n_decay, float(lr), b1, b2, eps, 0.0f,
                    bc1, bc2, gs);
}

double grad_norm(const nn::ParameterStore& params) {
  Tensor g = params.flat_grads();
  TG_CHECK(g.dtype() == DType::f32, "grad_norm: needs f32 gradients, got ", g.desc());
  if (g.device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
    Tensor scratch, total;
    {
      MemoryCategoryScope ws(MemCategory::workspace);
      const int64_t words = int64_t((cuda::sum_squares_scratch_bytes(g.numel()) + 7) / 8);
      scratch = Tensor::empty({words}, DType::f64, g.device());
      total = Tensor::empty({1}, DType::f64, g.device());
    }
    cuda::sum_squares(g.data<float>(), g.numel(), scratch.raw(), static_cast<double*>(total.raw()),
                      detail::cuda_stream());
    return std::sqrt(total.item());
#endif
  }
  return std::sqrt(cpu::sum_squares(g.data<float>(), g.numel()));
}

double clip_factor(double norm, double max_norm) {
  return max_norm > 0 && std::isfinite(norm) && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

double clip_grad_norm(nn::ParameterStore& params, double max_norm) {
  double norm = grad_norm(params);
  if (const double factor = clip_factor(norm, max_norm); factor != 1.0) {
    Tensor g = params.flat_grads();
    const float s = float(factor);
    if (g.device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
      cuda::scale_inplace(g.data<float>(), s, g.numel(), detail::cuda_stream());
#endif
    } else {
      cpu::scale_inplace(g.data<float>(), s, g.numel());
    }
  }
  return norm;
}

double LRSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step < warmup_steps) return lr * double(step + 1) / double(warmup_steps);
  if (kind == Schedule::constant) return lr;
  if (step >= max_steps) return min_lr;
  double progress = double(step - warmup_steps) / double(std::max<int64_t>(1, max_steps - warmup_steps));
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (lr - min_lr);
}

}  // namespace tg::optim
