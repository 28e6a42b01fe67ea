// Elementwise and layout ops: add, mul, scale, sum, cast, reshape, transpose, slices.
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/permute.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/layout.h"
#include "src/ops/ops.h"
#include "src/tensor/dispatch.h"

namespace tg::ops {

using detail::check_defined;
using detail::check_same;
using detail::cuda_stream;
using detail::dispatch;
using detail::empty_like;

namespace {
bool is_suffix(const Shape& small, const Shape& big) {
  if (small.size() > big.size()) return false;
  return std::equal(small.rbegin(), small.rend(), big.rbegin());
}

// out (cols) = Σ_rows g (rows, cols): the gradient of a broadcast operand.
Tensor sum_rows(const char* op, const Tensor& g, const Shape& shape, int64_t rows, int64_t cols) {
  Tensor out = Tensor::empty(shape, g.dtype(), g.device());
  dispatch(op, g, [&]<typename T>() { cpu::sum_rows(g.data<T>(), out.data<T>(), rows, cols); },
           [&]<typename T>() {
             Tensor scratch = detail::workspace_floats(cuda::sum_rows_scratch_floats(rows, cols), g.device());
             cuda::sum_rows(g.data<T>(), out.data<T>(), rows, cols, scratch.data<float>(), cuda_stream());
           });
  return out;
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
  dispatch("add", a, [&]<typename T>() { cpu::add_forward(a.data<T>(), b.data<T>(), out.data<T>(), rows, cols); },
           [&]<typename T>() {
             cuda::add_forward(a.data<T>(), b.data<T>(), out.data<T>(), rows, cols, cuda_stream());
           });
  record(out, "add", {a, b}, [rows, cols, b_shape = b.shape()](const Tensor& g) {
    Tensor gb = rows == 1 ? g.view(b_shape) : sum_rows("add backward", g, b_shape, rows, cols);
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
  auto run = [](const Tensor& x, const Tensor& y, Tensor& out) {
    dispatch("mul", x, [&]<typename T>() { cpu::mul_forward(x.data<T>(), y.data<T>(), out.data<T>(), x.numel()); },
             [&]<typename T>() {
               cuda::mul_forward(x.data<T>(), y.data<T>(), out.data<T>(), x.numel(), cuda_stream());
             });
  };
  Tensor out = empty_like(a);
  run(a, b, out);
  record(out, "mul", {a, b}, [a = a.detach(), b = b.detach(), run](const Tensor& g) {
    Tensor ga = empty_like(g), gb = empty_like(g);
    run(g, b, ga);
    run(g, a, gb);
    return std::vector<Tensor>{ga, gb};
  });
  return out;
}

namespace {
Tensor scale_raw(const Tensor& x, double s) {
  Tensor out = empty_like(x);
  dispatch("scale", x, [&]<typename T>() { cpu::scale_forward(x.data<T>(), out.data<T>(), T(s), x.numel()); },
           [&]<typename T>() { cuda::scale_forward(x.data<T>(), out.data<T>(), float(s), x.numel(), cuda_stream()); });
  return out;
}
}  // namespace

Tensor scale(const Tensor& x, double s) {
  check_defined("scale", x, "x");
  Tensor out = scale_raw(x, s);
  record(out, "scale", {x}, [s](const Tensor& g) { return std::vector<Tensor>{scale_raw(g, s)}; });
  return out;
}

Tensor sum(const Tensor& x) {
  check_defined("sum", x, "x");
  // A sum over everything is the column sum of an (n, 1) matrix: one fixed-order reduction.
  Tensor out = sum_rows("sum", x, {1}, x.numel(), 1);
  record(out, "sum", {x}, [shape = x.shape()](const Tensor& g) {
    return std::vector<Tensor>{Tensor::full(shape, g.item(), g.dtype(), g.device())};
  });
  return out;
}

Tensor mean(const Tensor& x) {
  TG_CHECK(x.numel() > 0, "mean of an empty tensor ", x.desc());
  return scale(sum(x), 1.0 / double(x.numel()));
}

// The backward of a conversion x → out returns out's gradient as it is, in out's dtype
// (record_cast): the engine converts it for a non-leaf x, and a leaf's sink folds it into the
// leaf's gradient (a bf16 gradient added into an fp32 parameter's in one pass, the small ones
// batched; see src/autograd/grad_sink.h), unless the consumer added it into that fp32 gradient
// itself (GradHandOver::accumulator). So a parameter's compute copy costs no converted gradient
// copy.

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", x, "x");
  if (x.dtype() == dtype) return x;
  TG_CHECK(is_floating(x.dtype()) && is_floating(dtype), "cast: ", x.desc(), " to ", dtype_name(dtype),
           ": only floating dtypes convert");
  Tensor out = x.to(dtype);
  record_cast(out, x);
  return out;
}

Tensor cast_precomputed(const Tensor& x, const Tensor& converted) {
  check_defined("cast_precomputed", x, "x");
  check_defined("cast_precomputed", converted, "converted");
  TG_CHECK(converted.shape() == x.shape() && converted.device() == x.device() && is_floating(x.dtype()) &&
               is_floating(converted.dtype()),
           "cast_precomputed: ", converted.desc(), " is not a conversion of ", x.desc());
  if (x.dtype() == converted.dtype()) return x;
  Tensor out = converted.view(converted.shape());  // a handle of its own to carry the node
  record_cast(out, x);
  return out;
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

namespace {
// x (A, M, N, D) → (A, N, M, D).
Tensor swap12(const Tensor& x, int64_t A, int64_t M, int64_t N, int64_t D) {
  Tensor out = Tensor::empty({A, N, M, D}, x.dtype(), x.device());
  dispatch("transpose12", x, [&]<typename T>() { cpu::swap_dims12(x.data<T>(), out.data<T>(), A, M, N, D); },
           [&]<typename T>() { cuda::swap_dims12(x.data<T>(), out.data<T>(), A, M, N, D, cuda_stream()); });
  return out;
}
}  // namespace

Tensor transpose12(const Tensor& x) {
  check_defined("transpose12", x, "x");
  TG_CHECK(x.dim() == 4, "transpose12: needs a 4-D tensor (A, M, N, D), got ", x.desc());
  const int64_t A = x.size(0), M = x.size(1), N = x.size(2), D = x.size(3);
  Tensor out = swap12(x, A, M, N, D);
  record(out, "transpose12", {x}, [A, M, N, D](const Tensor& g) { return std::vector<Tensor>{swap12(g, A, N, M, D)}; });
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
  dispatch("slice_last", x, [&]<typename T>() { cpu::slice_last(x.data<T>(), out.data<T>(), rows, cols, start, len); },
           [&]<typename T>() {
             cuda::slice_last(x.data<T>(), out.data<T>(), rows, cols, start, len, cuda_stream());
           });
  record(out, "slice_last", {x}, [rows, cols, start, len, in_shape = x.shape()](const Tensor& g) {
    Tensor gx = Tensor::zeros(in_shape, g.dtype(), g.device());
    dispatch("slice_last backward", g,
             [&]<typename T>() { cpu::unslice_last(g.data<T>(), gx.data<T>(), rows, cols, start, len); },
             [&]<typename T>() {
               cuda::unslice_last(g.data<T>(), gx.data<T>(), rows, cols, start, len, cuda_stream());
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

Tensor concat_last(const std::vector<Tensor>& xs) {
  TG_CHECK(!xs.empty(), "concat_last: no inputs");
  const Tensor& x0 = xs[0];
  check_defined("concat_last", x0, "xs[0]");
  Shape lead(x0.shape().begin(), x0.shape().end() - 1);
  int64_t cols = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    check_same("concat_last", x0, xs[i]);
    TG_CHECK(xs[i].dim() == x0.dim() && Shape(xs[i].shape().begin(), xs[i].shape().end() - 1) == lead,
             "concat_last: input ", i, " ", xs[i].desc(), " does not match the leading shape of ", x0.desc());
    cols += xs[i].size(-1);
  }
  const int64_t rows = shape_numel(lead);
  Shape shape = lead;
  shape.push_back(cols);
  Tensor out = Tensor::empty(shape, x0.dtype(), x0.device());
  std::vector<int64_t> starts;
  int64_t start = 0;
  for (const Tensor& x : xs) {  // every column of out is written once: no zero fill needed
    const int64_t len = x.size(-1);
    dispatch("concat_last", x, [&]<typename T>() { cpu::unslice_last(x.data<T>(), out.data<T>(), rows, cols, start, len); },
             [&]<typename T>() {
               cuda::unslice_last(x.data<T>(), out.data<T>(), rows, cols, start, len, cuda_stream());
             });
    starts.push_back(start);
    start += len;
  }
  std::vector<Shape> shapes;
  for (const Tensor& x : xs) shapes.push_back(x.shape());
  record(out, "concat_last", xs, [rows, cols, starts, shapes](const Tensor& g) {
    std::vector<Tensor> gs;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const int64_t len = shapes[i].back();
      Tensor gi = Tensor::empty(shapes[i], g.dtype(), g.device());
      dispatch("concat_last backward", g,
               [&]<typename T>() { cpu::slice_last(g.data<T>(), gi.data<T>(), rows, cols, starts[i], len); },
               [&]<typename T>() {
                 cuda::slice_last(g.data<T>(), gi.data<T>(), rows, cols, starts[i], len, cuda_stream());
               });
      gs.push_back(gi);
    }
    return gs;
  });
  return out;
}

}  // namespace tg::ops
