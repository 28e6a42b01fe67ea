// AdamW, gradient clipping and learning-rate schedules.
#include "src/optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/adamw.h"
#include "kernels/cuda/optim.h"
#include "src/tensor/dispatch.h"

namespace tg::optim {

AdamW::AdamW(nn::ParameterStore& params, const AdamWConfig& config, std::vector<nn::FlatRange> owned)
    : params_(params), config_(config), owned_(std::move(owned)) {
  if (owned_.empty()) owned_.push_back({0, params.numel()});
  int64_t n = 0;
  for (const nn::FlatRange& r : owned_) {
    TG_ASSERT(r.offset >= 0 && r.length >= 0 && r.offset + r.length <= params.numel());
    n += r.length;
  }
  MemoryCategoryScope scope(MemCategory::optimizer);
  Tensor flat = params.flat_values();
  m_ = Tensor::zeros({n}, flat.dtype(), flat.device());
  v_ = Tensor::zeros({n}, flat.dtype(), flat.device());
}

void AdamW::step(double lr, double grad_scale) {
  ++steps_;
  Tensor values = params_.flat_values();
  TG_CHECK(values.dtype() == DType::f32, "AdamW: needs f32 master parameters, got ", values.desc());
  const float bc1 = float(1.0 - std::pow(config_.beta1, double(steps_)));
  const float bc2 = float(1.0 - std::pow(config_.beta2, double(steps_)));
  const float b1 = float(config_.beta1), b2 = float(config_.beta2), eps = float(config_.eps);
  const float gs = float(grad_scale), wd = float(config_.weight_decay);
  int64_t at = 0;  // where the range's moments start
  for (const nn::FlatRange& r : owned_) {
    float* p = values.data<float>() + r.offset;
    const float* g = params_.flat_grads().data<float>() + r.offset;
    float* m = m_.data<float>() + at;
    float* v = v_.data<float>() + at;
    at += r.length;
    // The flat layout puts decayed parameters first: elements [0, decay_numel) take weight decay.
    const int64_t n = r.length, n_decay = std::clamp<int64_t>(params_.decay_numel() - r.offset, 0, n);
    if (values.device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
      // One fused kernel over the range.
      cuda::adamw_update(p, g, m, v, n, n_decay, float(lr), b1, b2, eps, wd, bc1, bc2, gs, detail::cuda_stream());
#endif
      continue;
    }
    cpu::adamw_update(p, g, m, v, n_decay, float(lr), b1, b2, eps, wd, bc1, bc2, gs);
    cpu::adamw_update(p + n_decay, g + n_decay, m + n_decay, v + n_decay, n - n_decay, float(lr), b1, b2, eps, 0.0f,
                      bc1, bc2, gs);
  }
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

double grad_sum_squares(const nn::ParameterStore& params, const std::vector<nn::FlatRange>& ranges) {
  Tensor g = params.flat_grads();
  TG_CHECK(g.dtype() == DType::f32, "grad_sum_squares: needs f32 gradients, got ", g.desc());
  double total = 0;
  if (g.device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
    // One partial sum per range on the device, read back together.
    Tensor scratch, sums;
    {
      MemoryCategoryScope ws(MemCategory::workspace);
      int64_t longest = 1;
      for (const nn::FlatRange& r : ranges) longest = std::max(longest, r.length);
      scratch = Tensor::empty({int64_t((cuda::sum_squares_scratch_bytes(longest) + 7) / 8)}, DType::f64, g.device());
      sums = Tensor::zeros({int64_t(std::max<size_t>(ranges.size(), 1))}, DType::f64, g.device());
    }
    for (size_t i = 0; i < ranges.size(); ++i)
      if (ranges[i].length > 0)
        cuda::sum_squares(g.data<float>() + ranges[i].offset, ranges[i].length, scratch.raw(),
                          static_cast<double*>(sums.raw()) + i, detail::cuda_stream());
    for (double s : sums.to(Device::cpu()).to_double_vector()) total += s;
#endif
    return total;
  }
  for (const nn::FlatRange& r : ranges) total += cpu::sum_squares(g.data<float>() + r.offset, r.length);
  return total;
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
