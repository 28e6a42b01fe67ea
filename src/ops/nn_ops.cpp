// Neural-network ops: embedding, linear, matmul, GELU, LayerNorm, softmax, cross-entropy,
// dropout, RoPE and the causal mask of the materialised attention.
#include <limits>

#include "kernels/cpu/dropout.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/permute.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/softmax.h"
#include "src/ops/dispatch.h"
#include "src/ops/ops.h"

namespace tg::ops {

using detail::check_defined;
using detail::check_same;
using detail::dispatch_float;
using detail::empty_like;

Tensor embedding(const Tensor& weight, const Tensor& ids) {
  check_defined("embedding", weight, "weight");
  check_defined("embedding", ids, "ids");
  TG_CHECK(weight.dim() == 2, "embedding: weight must be (V, C), got ", weight.desc());
  TG_CHECK(ids.dtype() == DType::i32, "embedding: ids must be i32, got ", ids.desc());
  TG_CHECK(ids.device() == weight.device(), "embedding: device mismatch: weight ", weight.desc(),
           ", ids ", ids.desc());
  const int64_t V = weight.size(0), C = weight.size(1), N = ids.numel();
  const int32_t* id = ids.data<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    TG_CHECK(id[n] >= 0 && id[n] < V, "embedding: id ", id[n], " at position ", n,
             " is outside the table of ", V, " rows (", weight.desc(), ")");
  Shape shape = ids.shape();
  shape.push_back(C);
  Tensor out = Tensor::empty(shape, weight.dtype(), weight.device());
  dispatch_float("embedding", weight, [&]<typename T>() {
    cpu::embedding_forward(weight.data<T>(), id, out.data<T>(), N, C);
  });
  record(out, "embedding", {weight}, [ids, V, C, N](const Tensor& g) {
    Tensor gw = Tensor::empty({V, C}, g.dtype(), g.device());
    dispatch_float("embedding backward", g, [&]<typename T>() {
      cpu::embedding_backward(g.data<T>(), ids.data<int32_t>(), gw.data<T>(), N, V, C);
    });
    return std::vector<Tensor>{gw};
  });
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_defined("linear", x, "x");
  check_defined("linear", weight, "weight");
  check_same("linear", x, weight);
  TG_CHECK(weight.dim() == 2, "linear: weight must be (out, in), got ", weight.desc());
  TG_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ", x.desc(),
           " has last dimension ", (x.dim() ? x.size(-1) : 0), " but weight ", weight.desc(),
           " expects ", weight.size(1));
  const int64_t K = weight.size(1), N = weight.size(0), rows = x.numel() / K;
  if (bias.defined()) {
    check_same("linear", x, bias);
    TG_CHECK(bias.dim() == 1 && bias.size(0) == N, "linear: bias ", bias.desc(),
             " does not match weight ", weight.desc(), " (expected [", N, "])");
  }
  Shape shape = x.shape();
  shape.back() = N;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  dispatch_float("linear", x, [&]<typename T>() {
    T* o = out.data<T>();
    if (bias.defined()) {  // beta = 1 folds the bias add into the GEMM
      const T* b = bias.data<T>();
      for (int64_t r = 0; r < rows; ++r) std::copy(b, b + N, o + r * N);
    }
    cpu::gemm(false, true, rows, N, K, T(1), x.data<T>(), K, weight.data<T>(), K,
              T(bias.defined() ? 1 : 0), o, N);
  });
  record(out, "linear", {x, weight, bias},
         [x = x.detach(), w = weight.detach(), has_bias = bias.defined(), rows, N, K,
          need_x = x.requires_grad()](const Tensor& g) {
           Tensor gx, gw = Tensor::empty({N, K}, g.dtype(), g.device()), gb;
           if (need_x) gx = Tensor::empty(x.shape(), g.dtype(), g.device());
           if (has_bias) gb = Tensor::empty({N}, g.dtype(), g.device());
           dispatch_float("linear backward", g, [&]<typename T>() {
             if (need_x)  // dx (rows, K) = g (rows, N) · W (N, K)
               cpu::gemm(false, false, rows, K, N, T(1), g.data<T>(), N, w.data<T>(), K, T(0),
                         gx.data<T>(), K);
             // dW (N, K) = gᵀ (N, rows) · x (rows, K)
             cpu::gemm(true, false, N, K, rows, T(1), g.data<T>(), N, x.data<T>(), K, T(0),
                       gw.data<T>(), K);
             if (has_bias) cpu::sum_rows(g.data<T>(), gb.data<T>(), rows, N);
           });
           return std::vector<Tensor>{gx, gw, gb};
         });
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  check_defined("matmul", a, "a");
  check_defined("matmul", b, "b");
  check_same("matmul", a, b);
  TG_CHECK(a.dim() >= 2 && a.dim() == b.dim(), "matmul: needs equal ranks ≥ 2, got ", a.desc(),
           " and ", b.desc());
  Shape batch_a(a.shape().begin(), a.shape().end() - 2), batch_b(b.shape().begin(), b.shape().end() - 2);
  TG_CHECK(batch_a == batch_b, "matmul: batch dimensions differ: ", a.desc(), " vs ", b.desc());
  const int64_t M = ta ? a.size(-1) : a.size(-2), Ka = ta ? a.size(-2) : a.size(-1);
  const int64_t Kb = tb ? b.size(-1) : b.size(-2), N = tb ? b.size(-2) : b.size(-1);
  TG_CHECK(Ka == Kb, "matmul: inner dimensions differ: ", a.desc(), (ta ? "ᵀ" : ""), " · ",
           b.desc(), (tb ? "ᵀ" : ""), " (", Ka, " vs ", Kb, ")");
  const int64_t K = Ka, batch = shape_numel(batch_a);
  Shape shape = batch_a;
  shape.push_back(M);
  shape.push_back(N);
  Tensor out = Tensor::empty(shape, a.dtype(), a.device());
  dispatch_float("matmul", a, [&]<typename T>() {
    cpu::gemm_batched(ta, tb, batch, M, N, K, a.data<T>(), M * K, b.data<T>(), K * N, T(0),
                      out.data<T>(), M * N);
  });
  record(out, "matmul", {a, b},
         [a = a.detach(), b = b.detach(), ta, tb, batch, M, N, K](const Tensor& g) {
           Tensor ga = empty_like(a), gb = empty_like(b);
           dispatch_float("matmul backward", g, [&]<typename T>() {
             const T *A = a.data<T>(), *B = b.data<T>(), *G = g.data<T>();
             if (!ta)  // dA (M, K) = G · op(B)ᵀ
               cpu::gemm_batched(false, !tb, batch, M, K, N, G, M * N, B, K * N, T(0), ga.data<T>(), M * K);
             else  // stored A is (K, M): dA = op(B) · Gᵀ
               cpu::gemm_batched(tb, true, batch, K, M, N, B, K * N, G, M * N, T(0), ga.data<T>(), M * K);
             if (!tb)  // dB (K, N) = op(A)ᵀ · G
               cpu::gemm_batched(!ta, false, batch, K, N, M, A, M * K, G, M * N, T(0), gb.data<T>(), K * N);
             else  // stored B is (N, K): dB = Gᵀ · op(A)
               cpu::gemm_batched(true, ta, batch, N, K, M, G, M * N, A, M * K, T(0), gb.data<T>(), K * N);
           });
           return std::vector<Tensor>{ga, gb};
         });
  return out;
}

Tensor gelu(const Tensor& x) {
  check_defined("gelu", x, "x");
  Tensor out = empty_like(x);
  dispatch_float("gelu", x, [&]<typename T>() { cpu::gelu_forward(x.data<T>(), out.data<T>(), x.numel()); });
  record(out, "gelu", {x}, [x = x.detach()](const Tensor& g) {
    Tensor gx = empty_like(g);
    dispatch_float("gelu backward", g, [&]<typename T>() {
      cpu::gelu_backward(x.data<T>(), g.data<T>(), gx.data<T>(), g.numel());
    });
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  check_defined("layernorm", x, "x");
  check_defined("layernorm", weight, "weight");
  check_same("layernorm", x, weight);
  TG_CHECK(x.dim() >= 1, "layernorm: needs at least 1 dimension, got ", x.desc());
  const int64_t C = x.size(-1), N = x.numel() / C;
  TG_CHECK(weight.shape() == Shape{C}, "layernorm: weight ", weight.desc(), " does not match the last dimension of ",
           x.desc());
  if (bias.defined()) {
    check_same("layernorm", x, bias);
    TG_CHECK(bias.shape() == Shape{C}, "layernorm: bias ", bias.desc(), " does not match the last dimension of ",
             x.desc());
  }
  Tensor out = empty_like(x);
  Tensor mean = Tensor::empty({N}, x.dtype(), x.device()), rstd = Tensor::empty({N}, x.dtype(), x.device());
  dispatch_float("layernorm", x, [&]<typename T>() {
    cpu::layernorm_forward(x.data<T>(), weight.data<T>(), bias.defined() ? bias.data<T>() : nullptr,
                           out.data<T>(), mean.data<T>(), rstd.data<T>(), N, C, eps);
  });
  record(out, "layernorm", {x, weight, bias},
         [x = x.detach(), w = weight.detach(), mean, rstd, has_bias = bias.defined(), N, C](const Tensor& g) {
           Tensor gx = empty_like(x), gw = empty_like(w), gb;
           if (has_bias) gb = empty_like(w);
           dispatch_float("layernorm backward", g, [&]<typename T>() {
             cpu::layernorm_backward(x.data<T>(), w.data<T>(), mean.data<T>(), rstd.data<T>(), g.data<T>(),
                                     gx.data<T>(), gw.data<T>(), has_bias ? gb.data<T>() : nullptr, N, C);
           });
           return std::vector<Tensor>{gx, gw, gb};
         });
  return out;
}

Tensor softmax(const Tensor& x) {
  check_defined("softmax", x, "x");
  TG_CHECK(x.dim() >= 1, "softmax: needs at least 1 dimension, got ", x.desc());
  const int64_t C = x.size(-1), N = C ? x.numel() / C : 0;
  Tensor out = empty_like(x);
  dispatch_float("softmax", x, [&]<typename T>() { cpu::softmax_forward(x.data<T>(), out.data<T>(), N, C); });
  record(out, "softmax", {x}, [y = out.detach(), N, C](const Tensor& g) {
    Tensor gx = empty_like(g);
    dispatch_float("softmax backward", g, [&]<typename T>() {
      cpu::softmax_backward(y.data<T>(), g.data<T>(), gx.data<T>(), N, C);
    });
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index) {
  check_defined("cross_entropy", logits, "logits");
  check_defined("cross_entropy", targets, "targets");
  TG_CHECK(logits.dim() == 2, "cross_entropy: logits must be (N, V), got ", logits.desc());
  TG_CHECK(targets.dtype() == DType::i32 && targets.numel() == logits.size(0) && targets.dim() == 1,
           "cross_entropy: targets must be i32 [", logits.size(0), "] to match logits ", logits.desc(),
           ", got ", targets.desc());
  const int64_t N = logits.size(0), V = logits.size(1);
  const int32_t* t = targets.data<int32_t>();
  for (int64_t n = 0; n < N; ++n)
    TG_CHECK(t[n] == ignore_index || (t[n] >= 0 && t[n] < V), "cross_entropy: target ", t[n],
             " at row ", n, " is outside [0, ", V, ") and is not the ignore index ", ignore_index);
  Tensor lse = Tensor::empty({N}, logits.dtype(), logits.device());
  Tensor row_loss = Tensor::empty({N}, logits.dtype(), logits.device());
  Tensor out = Tensor::empty({1}, logits.dtype(), logits.device());
  int64_t counted = 0;
  dispatch_float("cross_entropy", logits, [&]<typename T>() {
    counted = cpu::cross_entropy_forward(logits.data<T>(), t, lse.data<T>(), row_loss.data<T>(), N, V,
                                         ignore_index);
    T total = cpu::sum_all(row_loss.data<T>(), N);
    out.data<T>()[0] = counted > 0 ? total / T(counted) : T(0);
  });
  record(out, "cross_entropy", {logits},
         [logits = logits.detach(), targets, lse, counted, N, V, ignore_index](const Tensor& g) {
           Tensor gl = empty_like(logits);
           dispatch_float("cross_entropy backward", g, [&]<typename T>() {
             cpu::cross_entropy_backward(logits.data<T>(), targets.data<int32_t>(), lse.data<T>(),
                                         g.data<T>()[0], counted, gl.data<T>(), N, V, ignore_index);
           });
           return std::vector<Tensor>{gl};
         });
  return out;
}

Tensor dropout(const Tensor& x, double p, uint64_t seed, bool training) {
  check_defined("dropout", x, "x");
  TG_CHECK(p >= 0.0 && p < 1.0, "dropout: probability ", p, " is outside [0, 1)");
  if (!training || p == 0.0) return x;
  Tensor out = empty_like(x);
  dispatch_float("dropout", x, [&]<typename T>() {
    cpu::dropout_apply(x.data<T>(), out.data<T>(), x.numel(), float(p), seed);
  });
  record(out, "dropout", {x}, [p, seed](const Tensor& g) {
    Tensor gx = empty_like(g);
    dispatch_float("dropout backward", g, [&]<typename T>() {
      cpu::dropout_apply(g.data<T>(), gx.data<T>(), g.numel(), float(p), seed);
    });
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor rope(const Tensor& x, double base, int64_t pos_offset) {
  check_defined("rope", x, "x");
  TG_CHECK(x.dim() == 4 && x.size(3) % 2 == 0, "rope: needs (B, T, H, D) with even D, got ", x.desc());
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  Tensor out = empty_like(x);
  dispatch_float("rope", x, [&]<typename S>() {
    cpu::rope_apply(x.data<S>(), out.data<S>(), B, T, H, D, base, pos_offset, +1);
  });
  record(out, "rope", {x}, [B, T, H, D, base, pos_offset](const Tensor& g) {
    Tensor gx = empty_like(g);
    dispatch_float("rope backward", g, [&]<typename S>() {
      cpu::rope_apply(g.data<S>(), gx.data<S>(), B, T, H, D, base, pos_offset, -1);
    });
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor causal_mask(const Tensor& s) {
  check_defined("causal_mask", s, "scores");
  TG_CHECK(s.dim() >= 2 && s.size(-1) == s.size(-2), "causal_mask: needs (..., T, T), got ", s.desc());
  const int64_t T = s.size(-1), batch = T > 0 ? s.numel() / (T * T) : 0;
  Tensor out = empty_like(s);
  dispatch_float("causal_mask", s, [&]<typename S>() {
    cpu::causal_mask(s.data<S>(), out.data<S>(), batch, T, T, -std::numeric_limits<S>::infinity());
  });
  record(out, "causal_mask", {s}, [batch, T](const Tensor& g) {
    Tensor gs = empty_like(g);
    dispatch_float("causal_mask backward", g, [&]<typename S>() {
      cpu::causal_mask(g.data<S>(), gs.data<S>(), batch, T, T, S(0));
    });
    return std::vector<Tensor>{gs};
  });
  return out;
}

}  // namespace tg::ops
