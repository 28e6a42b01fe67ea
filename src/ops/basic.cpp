// Elementwise and layout ops: add, mul, scale, sum, reshape, transpose, slices.
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/permute.h"
#include "src/ops/dispatch.h"
#include "src/ops/ops.h"

namespace tg::ops {

using detail::check_defined;
using detail::check_same;
using detail::dispatch_float;
using detail::empty_like;

namespace {
bool is_suffix(const Shape& small, const Shape& big) {
  if (small.size() > big.size()) return false;
  return std::equal(small.rbegin(), small.rend(), big.rbegin());
}
}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  check_defined("add", a, "a");
  check_defined("add", b, "b");
  check_same("add", a, b);
  TG_CHECK(is_suffix(b.shape(), a.shape()), "add: shape ", shape_str(b.shape()),
           " does not broadcast onto ", shape_str(a.shape()),
           " (b's shape must equal a's or a trailing part of it)");
  const int64_t cols = b.numel(), rows = cols ? a.numel() / cols : 0;
  Tensor out = empty_like(a);
  dispatch_float("add", a, [&]<typename T>() {
    cpu::add_forward(a.data<T>(), b.data<T>(), out.data<T>(), rows, cols);
  });
  record(out, "add", {a, b}, [rows, cols, b_shape = b.shape()](const Tensor& g) {
    Tensor gb;
    if (rows == 1) {
      gb = g.view(b_shape);
    } else {
      gb = Tensor::empty(b_shape, g.dtype(), g.device());
      dispatch_float("add backward", g, [&]<typename T>() {
        cpu::sum_rows(g.data<T>(), gb.data<T>(), rows, cols);
      });
    }
    return std::vector<Tensor>{g, gb};
  });
  return out;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  check_defined("mul", a, "a");
  check_defined("mul", b, "b");
  check_same("mul", a, b);
  TG_CHECK(a.shape() == b.shape(), "mul: shapes differ: ", shape_str(a.shape()), " vs ",
           shape_str(b.shape()));
  Tensor out = empty_like(a);
  dispatch_float("mul", a, [&]<typename T>() {
    cpu::mul_forward(a.data<T>(), b.data<T>(), out.data<T>(), a.numel());
  });
  record(out, "mul", {a, b}, [a = a.detach(), b = b.detach()](const Tensor& g) {
    Tensor ga = empty_like(g), gb = empty_like(g);
    dispatch_float("mul backward", g, [&]<typename T>() {
      cpu::mul_forward(g.data<T>(), b.data<T>(), ga.data<T>(), g.numel());
      cpu::mul_forward(g.data<T>(), a.data<T>(), gb.data<T>(), g.numel());
    });
    return std::vector<Tensor>{ga, gb};
  });
  return out;
}

Tensor scale(const Tensor& x, double s) {
  check_defined("scale", x, "x");
  Tensor out = empty_like(x);
  dispatch_float("scale", x, [&]<typename T>() {
    cpu::scale_forward(x.data<T>(), out.data<T>(), T(s), x.numel());
  });
  record(out, "scale", {x}, [s](const Tensor& g) {
    Tensor gx = empty_like(g);
    dispatch_float("scale backward", g, [&]<typename T>() {
      cpu::scale_forward(g.data<T>(), gx.data<T>(), T(s), g.numel());
    });
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor sum(const Tensor& x) {
  check_defined("sum", x, "x");
  Tensor out = Tensor::empty({1}, x.dtype(), x.device());
  dispatch_float("sum", x, [&]<typename T>() { out.data<T>()[0] = cpu::sum_all(x.data<T>(), x.numel()); });
  record(out, "sum", {x}, [shape = x.shape()](const Tensor& g) {
    return std::vector<Tensor>{Tensor::full(shape, g.item(), g.dtype(), g.device())};
  });
  return out;
}

Tensor mean(const Tensor& x) {
  TG_CHECK(x.numel() > 0, "mean of an empty tensor ", x.desc());
  return scale(sum(x), 1.0 / double(x.numel()));
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  check_defined("reshape", x, "x");
  TG_CHECK(shape_numel(shape) == x.numel(), "reshape: cannot reshape ", x.desc(), " to ",
           shape_str(shape), " (", shape_numel(shape), " elements vs ", x.numel(), ")");
  Tensor out = x.view(shape);
  record(out, "reshape", {x}, [in_shape = x.shape()](const Tensor& g) {
    return std::vector<Tensor>{g.view(in_shape)};
  });
  return out;
}

Tensor transpose12(const Tensor& x) {
  check_defined("transpose12", x, "x");
  TG_CHECK(x.dim() == 4, "transpose12: needs a 4-D tensor (A, M, N, D), got ", x.desc());
  const int64_t A = x.size(0), M = x.size(1), N = x.size(2), D = x.size(3);
  Tensor out = Tensor::empty({A, N, M, D}, x.dtype(), x.device());
  dispatch_float("transpose12", x, [&]<typename T>() {
    cpu::swap_dims12(x.data<T>(), out.data<T>(), A, M, N, D);
  });
  record(out, "transpose12", {x}, [A, M, N, D](const Tensor& g) {
    Tensor gx = Tensor::empty({A, M, N, D}, g.dtype(), g.device());
    dispatch_float("transpose12 backward", g, [&]<typename T>() {
      cpu::swap_dims12(g.data<T>(), gx.data<T>(), A, N, M, D);
    });
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor slice_last(const Tensor& x, int64_t start, int64_t len) {
  check_defined("slice_last", x, "x");
  TG_CHECK(x.dim() >= 1, "slice_last: needs at least 1 dimension, got ", x.desc());
  const int64_t cols = x.size(-1);
  TG_CHECK(start >= 0 && len >= 0 && start + len <= cols, "slice_last: range [", start, ", ",
           start + len, ") out of bounds for last dimension ", cols, " of ", x.desc());
  const int64_t rows = cols ? x.numel() / cols : 0;
  Shape shape = x.shape();
  shape.back() = len;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  dispatch_float("slice_last", x, [&]<typename T>() {
    cpu::slice_last(x.data<T>(), out.data<T>(), rows, cols, start, len);
  });
  record(out, "slice_last", {x}, [rows, cols, start, len, in_shape = x.shape()](const Tensor& g) {
    Tensor gx = Tensor::zeros(in_shape, g.dtype(), g.device());
    dispatch_float("slice_last backward", g, [&]<typename T>() {
      cpu::unslice_last(g.data<T>(), gx.data<T>(), rows, cols, start, len);
    });
    return std::vector<Tensor>{gx};
  });
  return out;
}

std::vector<Tensor> split_last(const Tensor& x, int64_t parts) {
  check_defined("split_last", x, "x");
  TG_CHECK(parts > 0 && x.size(-1) % parts == 0, "split_last: last dimension of ", x.desc(),
           " does not split into ", parts, " equal parts");
  int64_t len = x.size(-1) / parts;
  std::vector<Tensor> out;
  for (int64_t i = 0; i < parts; ++i) out.push_back(slice_last(x, i * len, len));
  return out;
}

}  // namespace tg::ops
