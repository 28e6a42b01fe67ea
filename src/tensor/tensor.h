// Tensor: a cheap shared handle to storage + shape + dtype + device, and, when it takes
// part in autograd, its gradient and the node that produced it.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "src/tensor/dtype.h"
#include "src/tensor/memory.h"
#include "src/util/error.h"

namespace tg {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);
// The element count of `s`, or tg::Error naming `what` and the shape when a dimension is
// negative or the product (or its byte count at 8 bytes per element) overflows 64 bits.
int64_t checked_numel(const Shape& s, const std::string& what);

struct Node;       // src/autograd/autograd.h
class GradSink;    // src/autograd/grad_sink.h

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  size_t offset = 0;  // bytes into storage: parameters are views into one flat buffer
  Shape shape;
  DType dtype = DType::f32;
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;  // leaves only: accumulated by backward()
  std::shared_ptr<Node> grad_fn;     // non-leaves: the op that produced this tensor
  std::shared_ptr<GradSink> grad_sink;  // leaves: where backward() sends their gradients, if bound
};

// Number of usable CUDA devices (0 in a build without CUDA or on a machine without a GPU).
int cuda_device_count();
// Makes `d` this thread's current GPU (a data-parallel rank's own; no-op for the CPU).
void set_current_device(Device d);
// Waits for the GPU work queued by this thread (no-op on CPU-only builds): for timing.
void device_synchronize(Device d);

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // Uninitialised storage charged to the current memory category (see MemoryCategoryScope).
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  // Copies host values into a new CPU tensor of the given dtype.
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                            DType dtype = DType::f32);
  static Tensor from_ints(const std::vector<int32_t>& values, const Shape& shape);
  // A view of `count` elements of `base`'s storage starting at element `element_offset`.
  static Tensor view_of(const Tensor& base, int64_t element_offset, const Shape& shape);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  int64_t dim() const { return int64_t(impl_->shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape_numel(impl_->shape); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device; }
  std::string desc() const;  // "f32[2, 3] on cpu": for error messages

  void* raw() const { return static_cast<char*>(impl_->storage->data) + impl_->offset; }
  template <typename T>
  T* data() const {
    TG_CHECK(dtype_of<T>::value == dtype(), "tensor of dtype ", dtype_name(dtype()),
             " accessed as ", dtype_name(dtype_of<T>::value));
    return static_cast<T*>(raw());
  }

  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& set_requires_grad(bool r);
  Tensor grad() const { return Tensor(impl_->grad); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  const std::shared_ptr<Node>& grad_fn() const { return impl_->grad_fn; }
  bool is_leaf() const { return impl_->grad_fn == nullptr; }

  // Backpropagates from this scalar (d self / d self = 1) into every leaf's grad.
  void backward() const;

  // Same storage, new shape (no autograd; ops::reshape records one).
  Tensor view(const Shape& shape) const;
  // Same storage, cut from the graph.
  Tensor detach() const;
  // A deep copy (no autograd).
  Tensor clone() const;
  // A copy converted to another dtype (no autograd).
  Tensor to(DType t) const;
  Tensor to(Device d) const;
  void copy_from(const Tensor& src);  // same shape, any dtype conversion among floats
  void fill(double value);
  void zero();

  std::vector<double> to_double_vector() const;
  std::vector<float> to_float_vector() const;
  double item() const;  // value of a one-element tensor, as double

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

}  // namespace tg
