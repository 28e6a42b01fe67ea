// Flat parameter and gradient buffers with named views; deterministic initialisation.
#include "src/nn/parameters.h"

#include <cmath>
#include <limits>

#include "kernels/cpu/dropout.h"

namespace tg::nn {

double normal_from(uint64_t seed, uint64_t stream, uint64_t index) {
  // Box–Muller on two uniforms in (0, 1] drawn from independent hash streams.
  uint64_t base = cpu::hash64(seed ^ cpu::hash64(stream * 0x9e3779b97f4a7c15ull + 1));
  double u1 = (double(cpu::hash64(base ^ (2 * index)) >> 11) + 1.0) * (1.0 / 9007199254740992.0);
  double u2 = double(cpu::hash64(base ^ (2 * index + 1)) >> 11) * (1.0 / 9007199254740992.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

void ParameterStore::declare(const std::string& name, const Shape& shape, Init init, double init_std) {
  TG_CHECK(!values_.defined(), "parameter '", name, "' declared after the store was allocated");
  TG_CHECK(index_.emplace(name, params_.size()).second, "parameter '", name, "' declared twice");
  for (int64_t d : shape) TG_CHECK(d >= 0, "parameter '", name, "': negative dimension in shape ", shape_str(shape));
  const int64_t n = checked_numel(shape, "parameter '" + name + "'");
  TG_CHECK(n <= std::numeric_limits<int64_t>::max() - total_, "parameter '", name, "' of shape ", shape_str(shape),
           ": the parameter count overflows 64 bits (", total_, " before it)");
  Parameter p;
  p.name = name;
  p.decay = shape.size() >= 2;
  p.init = init;
  p.init_std = init_std;
  params_.push_back(p);
  shapes_.push_back(shape);
  total_ += n;
}

void ParameterStore::allocate(uint64_t seed, DType dtype, Device device) {
  int64_t offset = 0;
  for (bool decayed : {true, false})
    for (size_t i = 0; i < params_.size(); ++i)
      if (params_[i].decay == decayed) {
        params_[i].offset = offset;
        offset += shape_numel(shapes_[i]);
        if (decayed) decay_total_ = offset;
      }
  {
    MemoryCategoryScope scope(MemCategory::params);
    values_ = Tensor::empty({total_}, DType::f64 == dtype ? DType::f64 : DType::f32, Device::cpu());
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    Tensor view = Tensor::view_of(values_, p.offset, shapes_[i]);
    std::vector<double> init(size_t(view.numel()));
    for (size_t j = 0; j < init.size(); ++j)
      init[j] = p.init == Init::ones ? 1.0 : p.init == Init::zeros ? 0.0 : p.init_std * normal_from(seed, i, j);
    view.copy_from(Tensor::from_vector(init, shapes_[i], DType::f64));
  }
  if (!device.is_cpu()) {
    MemoryCategoryScope scope(MemCategory::params);
    values_ = values_.to(device);
  }
  {
    MemoryCategoryScope scope(MemCategory::grads);
    grads_ = Tensor::zeros({total_}, values_.dtype(), device);
  }
  compute_dtype_ = values_.dtype();
  compute_copy_ = Tensor();
  compute_copy_current_ = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    Parameter& p = params_[i];
    p.value = Tensor::view_of(values_, p.offset, shapes_[i]);
    p.value.set_requires_grad(true);
    p.value.set_grad(Tensor::view_of(grads_, p.offset, shapes_[i]));
    bind_grad_sink(p.value, sink_);
  }
}

const Parameter& ParameterStore::find(const std::string& name) const {
  auto it = index_.find(name);
  TG_CHECK(it != index_.end(), "no parameter named '", name, "'");
  return params_[it->second];
}

const Tensor& ParameterStore::get(const std::string& name) const { return find(name).value; }

bool ParameterStore::has(const std::string& name) const { return index_.count(name) != 0; }

void ParameterStore::zero_grad() { grads_.zero(); }

void ParameterStore::zero_grad_at_first_write() {
  if (!grads_.device().is_cuda() || decay_total_ == 0) return zero_grad();
  // The decayed parameters lead the flat layout (allocate()): the rest is one zeroing pass.
  Tensor::view_of(grads_, decay_total_, {total_ - decay_total_}).zero();
  std::vector<Tensor> weights;
  for (const Parameter& p : params_)
    if (p.decay) weights.push_back(p.value);
  sink_->expect_first_writes(weights);
}

Tensor ParameterStore::compute_values() {
  if (compute_dtype_ == values_.dtype()) return values_;
  return compute_copy_.defined() ? compute_copy_buffer() : values_.to(compute_dtype_);
}

Tensor ParameterStore::compute_copy_buffer() {
  if (compute_dtype_ == values_.dtype()) return Tensor();
  if (!compute_copy_.defined()) {
    MemoryCategoryScope scope(MemCategory::activations);  // where the forward's conversion is counted
    compute_copy_ = Tensor::empty({total_}, compute_dtype_, values_.device());
    compute_copy_current_ = false;
  }
  if (!compute_copy_current_) compute_copy_.copy_from(values_);
  compute_copy_current_ = true;
  return compute_copy_;
}

}  // namespace tg::nn
