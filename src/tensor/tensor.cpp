// Tensor construction, views, conversions and host access.
#include "src/tensor/tensor.h"

#include <cstring>
#include <sstream>

namespace tg {

#ifdef TILEGRAD_HAVE_CUDA
void cuda_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes);
void cuda_zero(void* p, size_t nbytes);
bool cuda_fill(void* p, DType dtype, double value, int64_t n);
void cuda_convert(const void* src, DType from, void* dst, DType to, int64_t n);
#endif

#ifdef TILEGRAD_HAVE_CUDA
void cuda_synchronize();
void device_synchronize(Device d) {
  if (d.is_cuda()) cuda_synchronize();
}
void cuda_set_device(int device);
void set_current_device(Device d) {
  if (d.is_cuda()) cuda_set_device(d.index);
}
#else
int cuda_device_count() { return 0; }
void device_synchronize(Device) {}
void set_current_device(Device) {}
#endif

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

int64_t checked_numel(const Shape& s, const std::string& what) {
  int64_t n = 1;
  for (int64_t d : s) {
    TG_CHECK(d >= 0, what, ": shape ", shape_str(s), " has a negative dimension");
    TG_CHECK(!__builtin_mul_overflow(n, d, &n) && n <= (int64_t(1) << 60), what, ": the element count of shape ",
             shape_str(s), " overflows 64-bit size arithmetic");
  }
  return n;
}

namespace {
void check_shape(const Shape& shape) { checked_numel(shape, "tensor"); }

// Reads element i of a floating or integer buffer as double (host memory).
double load_as_double(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32: return static_cast<const float*>(p)[i];
    case DType::f64: return static_cast<const double*>(p)[i];
    case DType::bf16: return bf16_to_float(static_cast<const bf16*>(p)[i]);
    case DType::i32: return static_cast<const int32_t*>(p)[i];
    case DType::u16: return static_cast<const uint16_t*>(p)[i];
  }
  return 0;
}
void store_from_double(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f32: static_cast<float*>(p)[i] = float(v); break;
    case DType::f64: static_cast<double*>(p)[i] = v; break;
    case DType::bf16: static_cast<bf16*>(p)[i] = float_to_bf16(float(v)); break;
    case DType::i32: static_cast<int32_t*>(p)[i] = int32_t(v); break;
    case DType::u16: static_cast<uint16_t*>(p)[i] = uint16_t(v); break;
  }
}
}  // namespace

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  check_shape(shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(size_t(shape_numel(shape)) * dtype_size(dtype), device,
                                            current_mem_category());
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero();
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype) {
  TG_CHECK(int64_t(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
           " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) store_from_double(t.raw(), dtype, int64_t(i), values[i]);
  return t;
}

Tensor Tensor::from_ints(const std::vector<int32_t>& values, const Shape& shape) {
  TG_CHECK(int64_t(values.size()) == shape_numel(shape), "from_ints: ", values.size(),
           " values do not fill shape ", shape_str(shape));
  Tensor t = empty(shape, DType::i32);
  std::memcpy(t.raw(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

Tensor Tensor::view_of(const Tensor& base, int64_t element_offset, const Shape& shape) {
  size_t esize = dtype_size(base.dtype());
  size_t begin = base.impl_->offset + size_t(element_offset) * esize;
  TG_ASSERT(begin + size_t(shape_numel(shape)) * esize <= base.impl_->storage->nbytes);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.impl_->storage;
  impl->offset = begin;
  impl->shape = shape;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

int64_t Tensor::size(int64_t d) const {
  int64_t n = dim();
  if (d < 0) d += n;
  TG_CHECK(d >= 0 && d < n, "dimension ", d, " out of range for a tensor of shape ", shape_str(shape()));
  return impl_->shape[size_t(d)];
}

std::string Tensor::desc() const {
  if (!defined()) return "(undefined tensor)";
  return std::string(dtype_name(dtype())) + shape_str(shape()) + " on " + device().str();
}

Tensor& Tensor::set_requires_grad(bool r) {
  TG_CHECK(!r || is_floating(dtype()), "requires_grad on a tensor of dtype ", dtype_name(dtype()),
           ": only floating tensors can have gradients");
  impl_->requires_grad = r;
  return *this;
}

Tensor Tensor::view(const Shape& shape) const {
  TG_CHECK(shape_numel(shape) == numel(), "view: cannot view ", desc(), " as ", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->offset = impl_->offset;
  impl->shape = shape;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::detach() const { return view(shape()); }

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), dtype(), device());
  t.copy_from(*this);
  return t;
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return clone();
  Tensor out = empty(shape(), t, device());
  if (device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
    cuda_convert(raw(), dtype(), out.raw(), t, numel());
#endif
    return out;
  }
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return clone();
  Tensor out = empty(shape(), dtype(), d);
#ifdef TILEGRAD_HAVE_CUDA
  cuda_copy(out.raw(), d, raw(), device(), nbytes());
#else
  TG_CHECK(false, "cannot move ", desc(), " to ", d.str(), ": tilegrad was built without CUDA");
#endif
  return out;
}

void Tensor::copy_from(const Tensor& src) {
  TG_CHECK(src.numel() == numel(), "copy_from: ", src.desc(), " into ", desc(), ": sizes differ");
  if (src.dtype() == dtype()) {
    if (device().is_cpu() && src.device().is_cpu()) {
      std::memcpy(raw(), src.raw(), nbytes());
      return;
    }
#ifdef TILEGRAD_HAVE_CUDA
    cuda_copy(raw(), device(), src.raw(), src.device(), nbytes());
    return;
#endif
  }
#ifdef TILEGRAD_HAVE_CUDA
  if (device().is_cuda() && src.device() == device()) {  // converted on the device, as to(dtype) converts
    cuda_convert(src.raw(), src.dtype(), raw(), dtype(), numel());
    return;
  }
#endif
  TG_CHECK(device().is_cpu() && src.device().is_cpu(), "copy_from with dtype conversion (",
           src.desc(), " into ", desc(), ") is only implemented within one device");
  int64_t n = numel();
  for (int64_t i = 0; i < n; ++i) store_from_double(raw(), dtype(), i, load_as_double(src.raw(), src.dtype(), i));
}

void Tensor::fill(double value) {
  int64_t n = numel();
  if (!device().is_cpu()) {
#ifdef TILEGRAD_HAVE_CUDA
    // A kernel where there is one (f32, bf16): the value travels as its argument, not through a
    // host buffer, so a recorded graph replays it (the backward's seed gradient).
    if (cuda_fill(raw(), dtype(), value, n)) return;
#endif
    Tensor host = empty(shape(), dtype(), Device::cpu());
    host.fill(value);
    copy_from(host);
    return;
  }
  if (dtype() == DType::f32) {
    float v = float(value);
    float* p = data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = v;
    return;
  }
  for (int64_t i = 0; i < n; ++i) store_from_double(raw(), dtype(), i, value);
}

void Tensor::zero() {
  if (device().is_cpu()) {
    std::memset(raw(), 0, nbytes());
    return;
  }
#ifdef TILEGRAD_HAVE_CUDA
  cuda_zero(raw(), nbytes());
#endif
}

std::vector<double> Tensor::to_double_vector() const {
  Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  std::vector<double> v(static_cast<size_t>(numel()));
  for (int64_t i = 0; i < numel(); ++i) v[size_t(i)] = load_as_double(host.raw(), dtype(), i);
  return v;
}

std::vector<float> Tensor::to_float_vector() const {
  std::vector<double> d = to_double_vector();
  return std::vector<float>(d.begin(), d.end());
}

double Tensor::item() const {
  TG_CHECK(numel() == 1, "item() on ", desc(), ": needs exactly one element");
  return to_double_vector()[0];
}

}  // namespace tg
