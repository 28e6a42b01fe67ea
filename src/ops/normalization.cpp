// LayerNorm, and the residual add fused with the LayerNorm that reads its sum (with, on the GPU,
// the bias of the projection whose output is added, its gradient summed by the LayerNorm's backward).
#include <memory>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/layernorm.h"
#include "src/ops/ops.h"
#include "src/tensor/dispatch.h"

namespace tg::ops {

using detail::check_defined;
using detail::check_same;
using detail::cuda_stream;
using detail::dispatch;
using detail::empty_like;

namespace {

void check_layernorm(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_defined(op, x, "x");
  check_defined(op, weight, "weight");
  check_same(op, x, weight);
  TG_CHECK(x.dim() >= 1, op, ": needs at least 1 dimension, got ", x.desc());
  const int64_t C = x.size(-1);
  TG_CHECK(weight.shape() == Shape{C}, op, ": weight ", weight.desc(), " does not match the last dimension of ",
           x.desc());
  if (bias.defined()) {
    check_same(op, x, bias);
    TG_CHECK(bias.shape() == Shape{C}, op, ": bias ", bias.desc(), " does not match the last dimension of ", x.desc());
  }
}

// Set by a LayerNorm node that summed its input's whole gradient over the rows for the bias added
// into that input (add_layernorm's b_bias): the add node then leaves that bias alone.
struct SumBiasGiven {
  bool given = false;
};

// LayerNorm's node on out = LayerNorm(x) with the forward's statistics. With sum_bias (x = a + b +
// sum_bias, add_layernorm's), the node also reads sum_bias, and gives it Σ_rows dx when dx is x's
// whole gradient (GradHandOver::complete) and the GPU kernel forms the sum as it writes dx.
void record_layernorm(Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mean,
                      const Tensor& rstd, const Tensor& sum_bias = {},
                      std::shared_ptr<SumBiasGiven> sum_bias_given = nullptr) {
  const int64_t C = x.size(-1), N = x.numel() / C;
  std::vector<Tensor> inputs{x, weight, bias};
  if (sum_bias.defined()) inputs.push_back(sum_bias);
  record(out, "layernorm", std::move(inputs),
         [x = x.detach(), w = weight.detach(), mean, rstd, has_bias = bias.defined(), N, C,
          sum_bias_given](const Tensor& g, GradHandOver& hand_over) {
           Tensor gx = empty_like(x), gw = empty_like(w), gb, gsum_bias;
           if (has_bias) gb = empty_like(w);
           // x is usually also the residual stream: the gradient its other consumer already sent
           // is added as dx is written instead of in a pass of its own.
           Tensor resid = hand_over.take(0);
           TG_ASSERT(!resid.defined() || (resid.shape() == x.shape() && resid.dtype() == x.dtype()));
           if (sum_bias_given && g.device().is_cuda() && hand_over.complete(0)) {
             gsum_bias = empty_like(w);
             sum_bias_given->given = true;
           }
           dispatch("layernorm backward", g,
                    [&]<typename T>() {
                      cpu::layernorm_backward(x.data<T>(), w.data<T>(), mean.data<T>(), rstd.data<T>(), g.data<T>(),
                                              gx.data<T>(), gw.data<T>(), has_bias ? gb.data<T>() : nullptr, N, C);
                      if (resid.defined()) cpu::add_inplace(gx.data<T>(), resid.data<T>(), gx.numel());
                    },
                    [&]<typename T>() {
                      Tensor scratch;
                      {
                        MemoryCategoryScope ws(MemCategory::workspace);
                        scratch = Tensor::empty({int64_t(cuda::layernorm_backward_scratch_floats(N, C))}, DType::f32,
                                                g.device());
                      }
                      cuda::layernorm_backward(x.data<T>(), w.data<T>(), mean.data<float>(), rstd.data<float>(),
                                               g.data<T>(), resid.defined() ? resid.data<T>() : nullptr, gx.data<T>(),
                                               gw.data<T>(), has_bias ? gb.data<T>() : nullptr,
                                               gsum_bias.defined() ? gsum_bias.data<T>() : nullptr, N, C,
                                               scratch.data<float>(), cuda_stream());
                    });
           std::vector<Tensor> grads{gx, gw, gb};
           if (sum_bias_given) grads.push_back(gsum_bias);
           return grads;
         });
}

}  // namespace

Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_layernorm("layernorm", x, weight, bias);
  const int64_t C = x.size(-1), N = x.numel() / C;
  Tensor out = empty_like(x);
  // Statistics: in the input's precision on the CPU (f64 for gradient checks), fp32 on the GPU.
  const DType stat = x.device().is_cpu() ? x.dtype() : DType::f32;
  Tensor mean = Tensor::empty({N}, stat, x.device()), rstd = Tensor::empty({N}, stat, x.device());
  dispatch("layernorm", x,
           [&]<typename T>() {
             cpu::layernorm_forward(x.data<T>(), weight.data<T>(), bias.defined() ? bias.data<T>() : nullptr,
                                    out.data<T>(), mean.data<T>(), rstd.data<T>(), N, C, eps);
           },
           [&]<typename T>() {
             cuda::layernorm_forward(x.data<T>(), weight.data<T>(), bias.defined() ? bias.data<T>() : nullptr,
                                     out.data<T>(), mean.data<float>(), rstd.data<float>(), N, C, float(eps),
                                     cuda_stream());
           });
  record_layernorm(out, x, weight, bias, mean, rstd);
  return out;
}

AddLayerNorm add_layernorm(const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias, double eps,
                           const Tensor& b_bias) {
  check_defined("add_layernorm", a, "a");
  check_defined("add_layernorm", b, "b");
  check_same("add_layernorm", a, b);
  TG_CHECK(a.shape() == b.shape(), "add_layernorm: shapes differ: ", a.desc(), " vs ", b.desc());
  if (b_bias.defined()) {
    check_same("add_layernorm", a, b_bias);
    TG_CHECK(b_bias.shape() == Shape{a.size(-1)}, "add_layernorm: b_bias ", b_bias.desc(),
             " does not match the last dimension of ", a.desc());
  }
  if (a.device().is_cpu()) {  // the ops it stands for: the reference of the GPU's single pass
    Tensor sum = add(a, b_bias.defined() ? add(b, b_bias) : b);
    return {sum, layernorm(sum, weight, bias, eps)};
  }
  check_layernorm("add_layernorm", a, weight, bias);
  const int64_t C = a.size(-1), N = a.numel() / C;
  Tensor sum = empty_like(a), out = empty_like(a);
  Tensor mean = Tensor::empty({N}, DType::f32, a.device()), rstd = Tensor::empty({N}, DType::f32, a.device());
  dispatch("add_layernorm", a, [&]<typename T>() { TG_ASSERT(false); },
           [&]<typename T>() {
             cuda::add_layernorm_forward(a.data<T>(), b.data<T>(), b_bias.defined() ? b_bias.data<T>() : nullptr,
                                         sum.data<T>(), weight.data<T>(), bias.defined() ? bias.data<T>() : nullptr,
                                         out.data<T>(), mean.data<float>(), rstd.data<float>(), N, C, float(eps),
                                         cuda_stream());
           });
  if (!b_bias.defined()) {
    // The graph add() and layernorm() would record: the sum's gradient goes to both addends.
    record(sum, "add", {a, b}, [](const Tensor& g) { return std::vector<Tensor>{g, g}; });
    record_layernorm(out, sum, weight, bias, mean, rstd);
    return {sum, out};
  }
  // b_bias's gradient is the column sums of the sum's whole gradient. The LayerNorm's backward runs
  // before the add's (it reads the sum) and, when it holds that whole gradient, forms the column
  // sums as it writes it; otherwise the add's backward sums its gradient in a pass of its own.
  auto given = std::make_shared<SumBiasGiven>();
  record(sum, "add", {a, b, b_bias}, [given, N, C](const Tensor& g) {
    Tensor gbias;
    if (!given->given) {
      gbias = Tensor::empty({C}, g.dtype(), g.device());
      dispatch("add_layernorm backward", g, [&]<typename T>() { TG_ASSERT(false); },
               [&]<typename T>() {
                 Tensor scratch = detail::workspace_floats(cuda::sum_rows_scratch_floats(N, C), g.device());
                 cuda::sum_rows(g.data<T>(), gbias.data<T>(), N, C, scratch.data<float>(), cuda_stream());
               });
    }
    return std::vector<Tensor>{g, g, gbias};
  });
  record_layernorm(out, sum, weight, bias, mean, rstd, b_bias, given);
  return {sum, out};
}

}  // namespace tg::ops
