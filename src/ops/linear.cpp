// The linear layers: linear, linear_gelu (GPT's up-projection and its GELU), mlp (GPT's whole MLP
// as one node on the GPU) and the batched matmul; their backwards' GEMMs add into the fp32
// parameter gradients where the engine offers them.
#include <type_traits>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "src/ops/op_util.h"
#include "src/ops/ops.h"
#include "src/tensor/dispatch.h"

namespace tg::ops {

using detail::check_defined;
using detail::check_same;
using detail::cuda_stream;
using detail::dispatch;
using detail::empty_like;
using internal::check_linear;
using internal::cuda_gemm;

namespace {
// The two GEMMs of a linear layer's backward: dx (rows, K) = g (rows, N) · W (N, K) when x needs
// it, dW (N, K) = gᵀ (N, rows) · x (rows, K). The bias gradient is a column-sum kernel of its own:
// cuBLASLt's BGRADB epilogue (the bias gradient out of dW's GEMM) made the GPT-2 step slower
// (docs/performance.md "Where a step's time goes"). When the weight is a bf16 compute copy of an
// fp32 parameter on the GPU (the weight's input of the node: GradHandOver::accumulator), dW is
// added straight into the parameter's fp32 gradient by the GEMM (beta = 1), or written there
// (beta = 0) when the buffer holds no gradient of the step yet (GradSink's first writes: no
// zeroing pass before the step), and no dW is returned: no bf16 dW is written, and no pass folds
// it into fp32 (docs/performance.md, table of changes).
std::pair<Tensor, Tensor> linear_backward_gemms(const Tensor& g, const Tensor& x, const Tensor& w, bool need_x,
                                                int64_t rows, int64_t N, int64_t K, GradHandOver& hand_over,
                                                size_t w_input) {
  bool first_write = false;
  const Tensor w_acc = g.device().is_cuda() && g.dtype() == DType::bf16 ? hand_over.accumulator(w_input, &first_write)
                                                                        : Tensor();
  const bool into_acc = w_acc.defined();
  Tensor gx, gw = into_acc ? Tensor() : Tensor::empty({N, K}, g.dtype(), g.device());
  if (need_x) gx = Tensor::empty(x.shape(), g.dtype(), g.device());
  dispatch("linear backward", g,
           [&]<typename T>() {
             if (need_x) cpu::gemm(false, false, rows, K, N, T(1), g.data<T>(), N, w.data<T>(), K, T(0), gx.data<T>(), K);
             cpu::gemm(true, false, N, K, rows, T(1), g.data<T>(), N, x.data<T>(), K, T(0), gw.data<T>(), K);
           },
           [&]<typename T>() {
             if (need_x)
               cuda_gemm<T>(false, false, rows, K, N, g.data<T>(), N, w.data<T>(), K, gx.data<T>(), K, 1, 0, 0, 0);
             if constexpr (std::is_same_v<T, bf16>) {
               if (into_acc) {
                 TG_ASSERT(w_acc.shape() == (Shape{N, K}));
                 cuda::gemm_accumulate_f32(true, false, N, K, rows, 1.0f, g.data<T>(), N, x.data<T>(), K,
                                           first_write ? 0.0f : 1.0f, w_acc.data<float>(), K, cuda_stream());
                 return;
               }
             }
             cuda_gemm<T>(true, false, N, K, rows, g.data<T>(), N, x.data<T>(), K, gw.data<T>(), K, 1, 0, 0, 0);
           });
  return {gx, gw};
}

// x·Wᵀ (+ b) into a new (…, N) tensor: on the CPU the bias is copied in and the GEMM adds with
// beta = 1; on the GPU it rides in cuBLASLt's epilogue.
Tensor linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const int64_t K = weight.size(1), N = weight.size(0), rows = x.numel() / K;
  Shape shape = x.shape();
  shape.back() = N;
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  dispatch("linear", x,
           [&]<typename T>() {
             T* o = out.data<T>();
             if (bias.defined()) {  // beta = 1 folds the bias add into the GEMM
               const T* b = bias.data<T>();
               for (int64_t r = 0; r < rows; ++r) std::copy(b, b + N, o + r * N);
             }
             cpu::gemm(false, true, rows, N, K, T(1), x.data<T>(), K, weight.data<T>(), K,
                       T(bias.defined() ? 1 : 0), o, N);
           },
           [&]<typename T>() {  // the bias rides in cuBLASLt's epilogue
             cuda_gemm<T>(false, true, rows, N, K, x.data<T>(), K, weight.data<T>(), K, out.data<T>(), N, 1, 0, 0, 0,
                        bias.defined() ? bias.data<T>() : nullptr);
           });
  return out;
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear("linear", x, weight, bias);
  const int64_t K = weight.size(1), N = weight.size(0), rows = x.numel() / K;
  Tensor out = linear_forward(x, weight, bias);
  record(out, "linear", {x, weight, bias},
         [x = x.detach(), w = weight.detach(), has_bias = bias.defined(), rows, N, K,
          need_x = x.requires_grad()](const Tensor& g, GradHandOver& hand_over) {
           auto [gx, gw] = linear_backward_gemms(g, x, w, need_x, rows, N, K, hand_over, 1);
           Tensor gb;
           if (has_bias) {
             gb = Tensor::empty({N}, g.dtype(), g.device());
             dispatch("linear backward", g, [&]<typename T>() { cpu::sum_rows(g.data<T>(), gb.data<T>(), rows, N); },
                      [&]<typename T>() {
                        Tensor scratch = detail::workspace_floats(cuda::sum_rows_scratch_floats(rows, N), g.device());
                        cuda::sum_rows(g.data<T>(), gb.data<T>(), rows, N, scratch.data<float>(), cuda_stream());
                      });
           }
           return std::vector<Tensor>{gx, gw, gb};
         });
  return out;
}

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_linear("linear_gelu", x, weight, bias);
  const int64_t K = weight.size(1), N = weight.size(0), rows = x.numel() / K;
  // pre: saved for GELU's derivative, as gelu(linear()) saves it. The GELU is a kernel of its own:
  // cuBLASLt's GELU_AUX_BIAS epilogue (pre and the GELU from the GEMM) made the GPT-2 step no
  // faster (docs/performance.md "Where a step's time goes").
  Tensor pre = linear_forward(x, weight, bias);
  Tensor out = empty_like(pre);
  dispatch("linear_gelu", pre, [&]<typename T>() { cpu::gelu_forward(pre.data<T>(), out.data<T>(), pre.numel()); },
           [&]<typename T>() { cuda::gelu_forward(pre.data<T>(), out.data<T>(), pre.numel(), cuda_stream()); });
  record(out, "linear_gelu", {x, weight, bias},
         [x = x.detach(), w = weight.detach(), pre, has_bias = bias.defined(), rows, N, K,
          need_x = x.requires_grad()](const Tensor& g, GradHandOver& hand_over) {
           // d(pre) = gelu'(pre)·g, and the bias gradient Σ_rows d(pre) in the same pass on the GPU.
           Tensor dpre = empty_like(pre), gb;
           if (has_bias) gb = Tensor::empty({N}, g.dtype(), g.device());
           dispatch("linear_gelu backward", g,
                    [&]<typename T>() {
                      cpu::gelu_backward(pre.data<T>(), g.data<T>(), dpre.data<T>(), g.numel());
                      if (has_bias) cpu::sum_rows(dpre.data<T>(), gb.data<T>(), rows, N);
                    },
                    [&]<typename T>() {
                      if (has_bias) {
                        Tensor scratch = detail::workspace_floats(cuda::sum_rows_scratch_floats(rows, N), g.device());
                        cuda::gelu_backward_sum_rows(pre.data<T>(), g.data<T>(), dpre.data<T>(), gb.data<T>(), rows, N,
                                                     scratch.data<float>(), cuda_stream());
                      } else {
                        cuda::gelu_backward(pre.data<T>(), g.data<T>(), dpre.data<T>(), g.numel(), cuda_stream());
                      }
                    });
           auto [gx, gw] = linear_backward_gemms(dpre, x, w, need_x, rows, N, K, hand_over, 1);
           return std::vector<Tensor>{gx, gw, gb};
         });
  return out;
}

Tensor mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj) {
  check_linear("mlp", x, w_fc, b_fc);
  check_defined("mlp", w_proj, "w_proj");
  check_same("mlp", x, w_proj);
  TG_CHECK(w_proj.dim() == 2 && w_proj.size(1) == w_fc.size(0), "mlp: w_proj ", w_proj.desc(),
           " must be (out, ", w_fc.size(0), "): its input is the output of w_fc ", w_fc.desc());
  if (b_proj.defined()) {
    check_same("mlp", x, b_proj);
    TG_CHECK(b_proj.dim() == 1 && b_proj.size(0) == w_proj.size(0), "mlp: b_proj ", b_proj.desc(),
             " does not match w_proj ", w_proj.desc(), " (expected [", w_proj.size(0), "])");
  }
  // On the CPU the two ops it stands for (the reference of the GPU's node, and the same graph, so
  // the same memory, as a model built from them).
  if (x.device().is_cpu()) return linear(linear_gelu(x, w_fc, b_fc), w_proj, b_proj);
  // Layer 1 (x → pre → h) is (rows, K1) → (rows, N1), layer 2 (h → out) (rows, K2 = N1) → (rows, N2).
  const int64_t K1 = w_fc.size(1), N1 = w_fc.size(0), K2 = N1, N2 = w_proj.size(0), rows = x.numel() / K1;
  // The calls of linear_gelu and then linear, so the output is theirs bit for bit.
  Tensor pre = linear_forward(x, w_fc, b_fc);
  Tensor h = empty_like(pre);
  dispatch("mlp", pre, [&]<typename T>() { TG_ASSERT(false); },
           [&]<typename T>() { cuda::gelu_forward(pre.data<T>(), h.data<T>(), pre.numel(), cuda_stream()); });
  Tensor out = linear_forward(h, w_proj, b_proj);
  record(out, "mlp", {x, w_fc, b_fc, w_proj, b_proj},
         [x = x.detach(), w_fc = w_fc.detach(), w_proj = w_proj.detach(), pre, h, has_b_fc = b_fc.defined(),
          has_b_proj = b_proj.defined(), rows, N1, K1, N2, K2,
          need_x = x.requires_grad()](const Tensor& g, GradHandOver& hand_over) mutable {
           // The down-projection's weight and bias gradients, as linear's backward forms them; h is
           // let go before dpre is made, as the down-projection's own node would have been.
           Tensor gw_proj = linear_backward_gemms(g, h, w_proj, /*need_x=*/false, rows, N2, K2, hand_over, 3).second;
           h = Tensor();
           Tensor gb_proj;
           if (has_b_proj) {
             gb_proj = Tensor::empty({N2}, g.dtype(), g.device());
             dispatch("mlp backward", g, [&]<typename T>() { TG_ASSERT(false); },
                      [&]<typename T>() {
                        Tensor scratch = detail::workspace_floats(cuda::sum_rows_scratch_floats(rows, N2), g.device());
                        cuda::sum_rows(g.data<T>(), gb_proj.data<T>(), rows, N2, scratch.data<float>(), cuda_stream());
                      });
           }
           // dpre = gelu'(pre) ⊙ (g · w_proj) and the up-projection's bias gradient Σ_rows dpre: in
           // bf16 dpre from cuBLASLt's DGELU epilogue, so g · w_proj (rows, N1) is never written,
           // and the bias gradient from a column-sum kernel (cuBLASLt's DGELU_BGRAD, which forms
           // both, made GPT-2's step 8 % slower: docs/performance.md, table of changes); otherwise
           // (fp32, or a shape cuBLASLt has no DGELU algorithm for) that product, then
           // linear_gelu's backward kernel.
           Tensor dpre = empty_like(pre), gb_fc;
           if (has_b_fc) gb_fc = Tensor::empty({N1}, g.dtype(), g.device());
           dispatch("mlp backward", g, [&]<typename T>() { TG_ASSERT(false); },
                    [&]<typename T>() {
                      if constexpr (std::is_same_v<T, bf16>) {
                        if (cuda::gemm_dgelu(rows, K2, N2, g.data<T>(), N2, w_proj.data<T>(), K2, pre.data<T>(),
                                             dpre.data<T>(), nullptr, cuda_stream())) {
                          if (has_b_fc) {
                            Tensor scratch =
                                detail::workspace_floats(cuda::sum_rows_scratch_floats(rows, N1), g.device());
                            cuda::sum_rows(dpre.data<T>(), gb_fc.data<T>(), rows, N1, scratch.data<float>(),
                                           cuda_stream());
                          }
                          return;
                        }
                      }
                      Tensor gh = empty_like(pre);
                      cuda_gemm<T>(false, false, rows, K2, N2, g.data<T>(), N2, w_proj.data<T>(), K2, gh.data<T>(), K2,
                                   1, 0, 0, 0);
                      if (has_b_fc) {
                        Tensor scratch = detail::workspace_floats(cuda::sum_rows_scratch_floats(rows, N1), g.device());
                        cuda::gelu_backward_sum_rows(pre.data<T>(), gh.data<T>(), dpre.data<T>(), gb_fc.data<T>(), rows,
                                                     N1, scratch.data<float>(), cuda_stream());
                      } else {
                        cuda::gelu_backward(pre.data<T>(), gh.data<T>(), dpre.data<T>(), gh.numel(), cuda_stream());
                      }
                    });
           auto [gx, gw_fc] = linear_backward_gemms(dpre, x, w_fc, need_x, rows, N1, K1, hand_over, 1);
           return std::vector<Tensor>{gx, gw_fc, gb_fc, gw_proj, gb_proj};
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
  // One batched product; lda/ldb follow the stored layouts.
  auto product = [](const Tensor& like, bool tA, bool tB, int64_t batch, int64_t M, int64_t N, int64_t K,
                    const Tensor& A, int64_t sA, const Tensor& B, int64_t sB, Tensor& C) {
    const int64_t lda = tA ? M : K, ldb = tB ? K : N;
    dispatch("matmul", like,
             [&]<typename T>() {
               cpu::gemm_batched(tA, tB, batch, M, N, K, A.data<T>(), sA, B.data<T>(), sB, T(0), C.data<T>(), M * N);
             },
             [&]<typename T>() {
               cuda_gemm<T>(tA, tB, M, N, K, A.data<T>(), lda, B.data<T>(), ldb, C.data<T>(), N, batch, sA, sB, M * N);
             });
  };
  product(a, ta, tb, batch, M, N, K, a, M * K, b, K * N, out);
  record(out, "matmul", {a, b},
         [a = a.detach(), b = b.detach(), ta, tb, batch, M, N, K, product](const Tensor& g) {
           Tensor ga = empty_like(a), gb = empty_like(b);
           if (!ta)  // dA (M, K) = G · op(B)ᵀ
             product(g, false, !tb, batch, M, K, N, g, M * N, b, K * N, ga);
           else  // stored A is (K, M): dA = op(B) · Gᵀ
             product(g, tb, true, batch, K, M, N, b, K * N, g, M * N, ga);
           if (!tb)  // dB (K, N) = op(A)ᵀ · G
             product(g, !ta, false, batch, K, N, M, a, M * K, g, M * N, gb);
           else  // stored B is (N, K): dB = Gᵀ · op(A)
             product(g, true, ta, batch, N, K, M, g, M * N, a, M * K, gb);
           return std::vector<Tensor>{ga, gb};
         });
  return out;
}

}  // namespace tg::ops
