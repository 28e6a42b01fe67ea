// Neural-network ops besides the linear layers, the normalisations and the losses (linear.cpp,
// normalization.cpp, loss.cpp): embedding, GELU, softmax, dropout, RoPE and the causal mask and
// softmax of the materialised attention.
#include <algorithm>
#include <limits>

#include "kernels/cpu/dropout.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/permute.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/attention_softmax.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/layout.h"
#include "kernels/cuda/softmax.h"
#include "src/ops/op_util.h"
#include "src/ops/ops.h"
#include "src/tensor/dispatch.h"

namespace tg::ops {

using detail::check_defined;
using detail::check_same;
using detail::cuda_stream;
using detail::dispatch;
using detail::empty_like;
using internal::ids_on;

Tensor embedding(const Tensor& weight, const Tensor& ids_in) {
  check_defined("embedding", weight, "weight");
  check_defined("embedding", ids_in, "ids");
  TG_CHECK(weight.dim() == 2, "embedding: weight must be (V, C), got ", weight.desc());
  TG_CHECK(ids_in.dtype() == DType::i32, "embedding: ids must be i32, got ", ids_in.desc());
  const int64_t V = weight.size(0), C = weight.size(1), N = ids_in.numel();
  if (ids_in.device().is_cpu()) {
    const int32_t* id = ids_in.data<int32_t>();
    for (int64_t n = 0; n < N; ++n)
      TG_CHECK(id[n] >= 0 && id[n] < V, "embedding: id ", id[n], " at position ", n,
               " is outside the table of ", V, " rows (", weight.desc(), ")");
  }
  TG_CHECK(ids_in.device().is_cpu() || ids_in.device() == weight.device(), "embedding: device mismatch: weight ",
           weight.desc(), ", ids ", ids_in.desc());
  Tensor ids = ids_on(ids_in, weight.device());
  Shape shape = ids.shape();
  shape.push_back(C);
  Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
  dispatch("embedding", weight,
           [&]<typename T>() { cpu::embedding_forward(weight.data<T>(), ids.data<int32_t>(), out.data<T>(), N, C); },
           [&]<typename T>() {
             cuda::embedding_forward(weight.data<T>(), ids.data<int32_t>(), out.data<T>(), N, C, cuda_stream());
           });
  record(out, "embedding", {weight}, [ids, V, C, N](const Tensor& g, GradHandOver& hand_over) {
    // The bf16 compute copy of an fp32 table on the GPU: its tokens' rows are added straight into
    // the table's fp32 gradient, only the rows that occur. The tied LM head's gradient is folded
    // in by the table's conversion node as any other, except when that buffer holds no gradient of
    // the step yet (GradSink's first writes): then it starts as the LM head's gradient, taken here
    // and converted in one pass, or as zeros when there is none.
    bool first_write = false;
    Tensor acc =
        g.device().is_cuda() && g.dtype() == DType::bf16 ? hand_over.accumulator(0, &first_write) : Tensor();
    if (acc.defined()) {
#ifdef TILEGRAD_HAVE_CUDA
      if (first_write) {
        const Tensor other = hand_over.take(0);
        if (other.defined()) acc.copy_from(other);
        else acc.zero();
      }
      const size_t bytes = cuda::embedding_backward_accumulate_scratch_bytes(N);
      Tensor scratch = detail::workspace_floats((bytes + sizeof(float) - 1) / sizeof(float), g.device());
      cuda::embedding_backward_accumulate(g.data<bf16>(), ids.data<int32_t>(), acc.data<float>(), N, V, C,
                                          scratch.raw(), bytes, cuda_stream());
#endif
      return std::vector<Tensor>{Tensor()};
    }
    Tensor gw = Tensor::empty({V, C}, g.dtype(), g.device());
    // A table with another consumer (GPT-2's tied LM head) already has its gradient: it is added
    // as the table's gradient is written instead of in a pass of its own over (V, C).
    Tensor other = hand_over.take(0);
    TG_ASSERT(!other.defined() || (other.shape() == gw.shape() && other.dtype() == gw.dtype()));
    dispatch("embedding backward", g,
             [&]<typename T>() {
               cpu::embedding_backward(g.data<T>(), ids.data<int32_t>(), gw.data<T>(), N, V, C);
               if (other.defined()) cpu::add_inplace(gw.data<T>(), other.data<T>(), gw.numel());
             },
             [&]<typename T>() {
               cuda::embedding_backward(g.data<T>(), ids.data<int32_t>(), other.defined() ? other.data<T>() : nullptr,
                                        gw.data<T>(), N, V, C, cuda_stream());
             });
    return std::vector<Tensor>{gw};
  });
  return out;
}

Tensor gelu(const Tensor& x) {
  check_defined("gelu", x, "x");
  Tensor out = empty_like(x);
  dispatch("gelu", x, [&]<typename T>() { cpu::gelu_forward(x.data<T>(), out.data<T>(), x.numel()); },
           [&]<typename T>() { cuda::gelu_forward(x.data<T>(), out.data<T>(), x.numel(), cuda_stream()); });
  record(out, "gelu", {x}, [x = x.detach()](const Tensor& g) {
    Tensor gx = empty_like(g);
    dispatch("gelu backward", g, [&]<typename T>() { cpu::gelu_backward(x.data<T>(), g.data<T>(), gx.data<T>(), g.numel()); },
             [&]<typename T>() {
               cuda::gelu_backward(x.data<T>(), g.data<T>(), gx.data<T>(), g.numel(), cuda_stream());
             });
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor softmax(const Tensor& x) {
  check_defined("softmax", x, "x");
  TG_CHECK(x.dim() >= 1, "softmax: needs at least 1 dimension, got ", x.desc());
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  Tensor out = empty_like(x);
  dispatch("softmax", x, [&]<typename T>() { cpu::softmax_forward(x.data<T>(), out.data<T>(), N, C); },
           [&]<typename T>() { cuda::softmax_forward(x.data<T>(), out.data<T>(), N, C, cuda_stream()); });
  record(out, "softmax", {x}, [y = out.detach(), N, C](const Tensor& g) {
    Tensor gx = empty_like(g);
    dispatch("softmax backward", g,
             [&]<typename T>() { cpu::softmax_backward(y.data<T>(), g.data<T>(), gx.data<T>(), N, C); },
             [&]<typename T>() { cuda::softmax_backward(y.data<T>(), g.data<T>(), gx.data<T>(), N, C, cuda_stream()); });
    return std::vector<Tensor>{gx};
  });
  return out;
}

namespace {
Tensor dropout_raw(const Tensor& x, double p, uint64_t seed, uint64_t first) {
  Tensor out = empty_like(x);
  dispatch("dropout", x,
           [&]<typename T>() { cpu::dropout_apply(x.data<T>(), out.data<T>(), x.numel(), float(p), seed, first); },
           [&]<typename T>() {
             cuda::dropout_apply(x.data<T>(), out.data<T>(), x.numel(), float(p), seed, first, cuda_stream());
           });
  return out;
}
}  // namespace

Tensor dropout(const Tensor& x, double p, uint64_t seed, bool training, uint64_t first) {
  check_defined("dropout", x, "x");
  TG_CHECK(p >= 0.0 && p < 1.0, "dropout: probability ", p, " is outside [0, 1)");
  if (!training || p == 0.0) return x;
  Tensor out = dropout_raw(x, p, seed, first);
  record(out, "dropout", {x},
         [p, seed, first](const Tensor& g) { return std::vector<Tensor>{dropout_raw(g, p, seed, first)}; });
  return out;
}

namespace {
Tensor rope_raw(const Tensor& x, double base, int64_t pos_offset, int direction) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  Tensor out = empty_like(x);
  dispatch("rope", x,
           [&]<typename S>() { cpu::rope_apply(x.data<S>(), out.data<S>(), B, T, H, D, base, pos_offset, direction); },
           [&]<typename S>() {
             cuda::rope_apply(x.data<S>(), out.data<S>(), B, T, H, D, base, pos_offset, direction, cuda_stream());
           });
  return out;
}
}  // namespace

Tensor rope(const Tensor& x, double base, int64_t pos_offset, bool inverse) {
  check_defined("rope", x, "x");
  TG_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "rope: needs (B, T, H, D) with even D, got ", x.desc());
  const int direction = inverse ? -1 : +1;
  Tensor out = rope_raw(x, base, pos_offset, direction);
  record(out, "rope", {x}, [base, pos_offset, direction](const Tensor& g) {
    return std::vector<Tensor>{rope_raw(g, base, pos_offset, -direction)};  // a rotation's gradient rotates back
  });
  return out;
}

namespace {
Tensor mask_raw(const Tensor& s, int64_t batch, int64_t T, double fill) {
  Tensor out = empty_like(s);
  dispatch("causal_mask", s, [&]<typename S>() { cpu::causal_mask(s.data<S>(), out.data<S>(), batch, T, T, S(fill)); },
           [&]<typename S>() { cuda::causal_mask(s.data<S>(), out.data<S>(), batch, T, T, float(fill), cuda_stream()); });
  return out;
}
}  // namespace

Tensor causal_mask(const Tensor& s) {
  check_defined("causal_mask", s, "scores");
  TG_CHECK(s.dim() >= 2 && s.size(-1) == s.size(-2), "causal_mask: needs (..., T, T), got ", s.desc());
  const int64_t T = s.size(-1), batch = T > 0 ? s.numel() / (T * T) : 0;
  Tensor out = mask_raw(s, batch, T, -std::numeric_limits<double>::infinity());
  record(out, "causal_mask", {s}, [batch, T](const Tensor& g) { return std::vector<Tensor>{mask_raw(g, batch, T, 0.0)}; });
  return out;
}

Tensor attention_softmax(const Tensor& s, double scale, bool causal) {
  check_defined("attention_softmax", s, "scores");
  TG_CHECK(s.dim() >= 2 && s.size(-1) == s.size(-2), "attention_softmax: needs (..., T, T), got ", s.desc());
  const int64_t T = s.size(-1), batch = T > 0 ? s.numel() / (T * T) : 0;
  Tensor p = empty_like(s);
  dispatch("attention_softmax", s,
           [&]<typename S>() { cpu::attention_softmax_forward(s.data<S>(), p.data<S>(), batch, T, S(scale), causal); },
           [&]<typename S>() {
             cuda::attention_softmax_forward(s.data<S>(), p.data<S>(), batch, T, float(scale), causal, cuda_stream());
           });
  record(p, "attention_softmax", {s}, [p_saved = p.detach(), batch, T, scale](const Tensor& g) {
    Tensor gs = empty_like(g);
    dispatch("attention_softmax backward", g,
             [&]<typename S>() {
               cpu::attention_softmax_backward(p_saved.data<S>(), g.data<S>(), gs.data<S>(), batch, T, S(scale));
             },
             [&]<typename S>() {
               cuda::attention_softmax_backward(p_saved.data<S>(), g.data<S>(), gs.data<S>(), batch, T, float(scale),
                                                cuda_stream());
             });
    return std::vector<Tensor>{gs};
  });
  return p;
}

}  // namespace tg::ops
