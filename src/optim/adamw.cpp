// AdamW, gradient clipping and learning-rate schedules.
#include "src/optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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
  decision_ = Tensor::zeros({int64_t(sizeof(cpu::StepDecision) / sizeof(double))}, DType::f64, flat.device());
}

void AdamW::step(double lr, double grad_scale) {
  ++steps_;
  update(lr, float(1.0 - std::pow(config_.beta1, double(steps_))), float(1.0 - std::pow(config_.beta2, double(steps_))),
         float(grad_scale), nullptr);
}

void AdamW::update(double lr, float bc1, float bc2, float grad_scale, const cpu::StepDecision* device_decision) {
  Tensor values = params_.flat_values();
  TG_CHECK(values.dtype() == DType::f32, "AdamW: needs f32 master parameters, got ", values.desc());
  const float b1 = float(config_.beta1), b2 = float(config_.beta2), eps = float(config_.eps);
  const float wd = float(config_.weight_decay);
  // On the GPU, an optimizer that updates every value writes the model's bf16 compute copy with
  // them (ParameterStore::compute_values): the next forward does not convert the parameters.
  Tensor compute;
  if (values.device().is_cuda() && owns_all() && params_.compute_dtype() == DType::bf16)
    compute = params_.compute_copy_buffer();
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
      // One fused kernel over the range; with a device decision it reads the step's constants there.
      bf16* c = compute.defined() ? compute.data<bf16>() + r.offset : nullptr;
      if (device_decision)
        cuda::adamw_update_decided(p, g, m, v, c, n, n_decay, float(lr), b1, b2, eps, wd, device_decision,
                                   detail::cuda_stream());
      else
        cuda::adamw_update(p, g, m, v, c, n, n_decay, float(lr), b1, b2, eps, wd, bc1, bc2, grad_scale,
                           detail::cuda_stream());
#endif
      continue;
    }
    cpu::adamw_update(p, g, m, v, n_decay, float(lr), b1, b2, eps, wd, bc1, bc2, grad_scale);
    cpu::adamw_update(p + n_decay, g + n_decay, m + n_decay, v + n_decay, n - n_decay, float(lr), b1, b2, eps, 0.0f,
                      bc1, bc2, grad_scale);
  }
}

static_assert(sizeof(cpu::StepDecision) % sizeof(double) == 0, "StepDecision is kept in an f64 tensor");

void AdamW::reset_decision(int32_t bad_in_row) {
  cpu::StepDecision d;
  d.steps = steps_;
  d.bad_in_row = bad_in_row;
  Tensor host = Tensor::zeros(decision_.shape(), DType::f64, Device::cpu());
  std::memcpy(host.raw(), &d, sizeof d);
  decision_.copy_from(host);
}

cpu::StepDecision AdamW::decision() {
  Tensor host = decision_.to(Device::cpu());
  cpu::StepDecision d;
  std::memcpy(&d, host.raw(), sizeof d);
  steps_ = d.steps;
  return d;
}

void AdamW::step_decided(double lr, const Tensor& record, const StepRules& rules) {
  TG_CHECK(record.numel() == 2 && record.dtype() == DType::f64 && record.device() == m_.device(),
           "AdamW::step_decided: the record must be two f64 on ", m_.device().str(), ", got ", record.desc());
  const double* rec = static_cast<const double*>(record.raw());
  auto* d = static_cast<cpu::StepDecision*>(decision_.raw());
  if (m_.device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
    cuda::decide_step(rec, rules.max_norm, config_.beta1, config_.beta2, rules.max_bad_steps, d,
                      detail::cuda_stream());
#endif
    update(lr, 1.0f, 1.0f, 1.0f, d);
    return;
  }
  cpu::decide_step(rec[0], rec[1], rules.max_norm, config_.beta1, config_.beta2, rules.max_bad_steps, *d);
  steps_ = d->steps;
  if (!d->skip) update(lr, float(d->bias_correction1), float(d->bias_correction2), float(d->clip), nullptr);
}

void grad_sum_squares_to(const nn::ParameterStore& params, const std::vector<nn::FlatRange>& ranges,
                         const Tensor& out) {
  Tensor g = params.flat_grads();
  TG_CHECK(g.dtype() == DType::f32, "grad_sum_squares_to: needs f32 gradients, got ", g.desc());
  TG_CHECK(out.numel() == 1 && out.dtype() == DType::f64 && out.device() == g.device(),
           "grad_sum_squares_to: out must be one f64 on ", g.device().str(), ", got ", out.desc());
  double* dst = static_cast<double*>(out.raw());
  if (g.device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
    MemoryCategoryScope ws(MemCategory::workspace);
    if (ranges.empty()) {
      Tensor scratch =
          Tensor::empty({int64_t((cuda::sum_squares_scratch_bytes(g.numel()) + 7) / 8)}, DType::f64, g.device());
      cuda::sum_squares(g.data<float>(), g.numel(), scratch.raw(), dst, detail::cuda_stream());
      return;
    }
    int64_t longest = 1;
    for (const nn::FlatRange& r : ranges) longest = std::max(longest, r.length);
    Tensor scratch =
        Tensor::empty({int64_t((cuda::sum_squares_scratch_bytes(longest) + 7) / 8)}, DType::f64, g.device());
    Tensor sums = Tensor::zeros({int64_t(ranges.size())}, DType::f64, g.device());
    for (size_t i = 0; i < ranges.size(); ++i)
      if (ranges[i].length > 0)
        cuda::sum_squares(g.data<float>() + ranges[i].offset, ranges[i].length, scratch.raw(),
                          static_cast<double*>(sums.raw()) + i, detail::cuda_stream());
    cuda::sum_in_order(static_cast<const double*>(sums.raw()), int64_t(ranges.size()), dst, detail::cuda_stream());
#endif
    return;
  }
  if (ranges.empty()) {
    *dst = cpu::sum_squares(g.data<float>(), g.numel());
    return;
  }
  double total = 0;
  for (const nn::FlatRange& r : ranges) total += cpu::sum_squares(g.data<float>() + r.offset, r.length);
  *dst = total;
}

void add_divided(const Tensor& dst, const Tensor& value, double divisor) {
  TG_CHECK(dst.numel() == 1 && dst.dtype() == DType::f64 && value.numel() == 1 && value.device() == dst.device(),
           "add_divided: needs one f64 and one value on the same device, got ", dst.desc(), " and ", value.desc());
  Tensor v = value.dtype() == DType::f32 ? value : value.to(DType::f32);
  if (dst.device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
    cuda::add_divided(static_cast<double*>(dst.raw()), v.data<float>(), divisor, detail::cuda_stream());
#endif
    return;
  }
  *static_cast<double*>(dst.raw()) += double(*v.data<float>()) / divisor;
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
  if (kind == Schedule::wsd) {
    const int64_t decay = std::min(decay_steps > 0 ? decay_steps : std::max<int64_t>(1, max_steps / 5),
                                   std::max<int64_t>(1, max_steps - warmup_steps));
    const int64_t start = max_steps - decay;
    if (step < start) return lr;
    return lr - (lr - min_lr) * double(step - start + 1) / double(decay);
  }
  double progress = double(step - warmup_steps) / double(std::max<int64_t>(1, max_steps - warmup_steps));
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (lr - min_lr);
}

}  // namespace tg::optim
