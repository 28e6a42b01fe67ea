// Helpers shared by the op implementations: dtype dispatch and common input checks.
#pragma once
#include <cstdint>
#include <string>

#include "src/tensor/tensor.h"

namespace tg::ops::detail {

// Calls f.template operator()<T>() with T = float or double for the tensor's dtype.
template <typename F>
void dispatch_float(const char* op, const Tensor& t, F&& f) {
  TG_CHECK(t.device().is_cpu(), op, ": ", t.desc(),
           " is on a device this op does not support yet (only cpu)");
  switch (t.dtype()) {
    case DType::f32: f.template operator()<float>(); break;
    case DType::f64: f.template operator()<double>(); break;
    default:
      TG_CHECK(false, op, ": unsupported dtype ", dtype_name(t.dtype()), " (", t.desc(),
               "); use f32 or f64");
  }
}

inline void check_defined(const char* op, const Tensor& t, const char* name) {
  TG_CHECK(t.defined(), op, ": input '", name, "' is undefined");
}

// Same dtype and device for all floating inputs of an op.
inline void check_same(const char* op, const Tensor& a, const Tensor& b) {
  TG_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch: ", a.desc(), " vs ", b.desc());
  TG_CHECK(a.device() == b.device(), op, ": device mismatch: ", a.desc(), " vs ", b.desc());
}

inline Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }

}  // namespace tg::ops::detail
