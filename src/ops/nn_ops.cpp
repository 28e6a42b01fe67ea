// Neural-network ops: embedding, linear, matmul, GELU, LayerNorm, softmax, cross-entropy,
// dropout, RoPE and the causal mask of the materialised attention.
#include <algorithm>
#include <limits>
#include <memory>
#include <type_traits>

#include "kernels/cpu/dropout.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/permute.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/attention_softmax.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/layernorm.h"
#include "kernels/cuda/layout.h"
#include "kernels/cuda/softmax.h"
#include "src/ops/ops.h"
#include "src/tensor/dispatch.h"

namespace tg::ops {

using detail::check_defined;
using detail::check_same;
using detail::cuda_stream;
using detail::dispatch;
using detail::empty_like;

namespace {
// Integer inputs (token ids, targets) are range-checked on the host; a GPU op then gets a
// device copy. Ids that already live on the GPU are trusted (nothing reads them back).
Tensor ids_on(const Tensor& ids, Device d) { return ids.device() == d ? ids : ids.to(d); }
}  // namespace

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
    // the table's fp32 gradient, only the rows that occur (the tied LM head's gradient, not taken
    // here, is folded in by the table's conversion node as any other).
    if (const Tensor acc = hand_over.accumulator(0); acc.defined() && g.device().is_cuda() && g.dtype() == DType::bf16) {
#ifdef TILEGRAD_HAVE_CUDA
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

namespace {
// C (M, N) = op(A) · op(B) (+ bias per column), row-major, through cuBLASLt with fp32 accumulation.
template <typename T>
void cuda_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
               T* C, int64_t ldc, int64_t batch, int64_t sa, int64_t sb, int64_t sc, const T* bias = nullptr) {
  cuda::gemm<T>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc, batch, sa, sb, sc,
                bias ? cuda::Epilogue::bias : cuda::Epilogue::none, bias, cuda_stream());
}
}  // namespace

namespace {
void check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check_defined(op, x, "x");
  check_defined(op, weight, "weight");
  check_same(op, x, weight);
  TG_CHECK(weight.dim() == 2, op, ": weight must be (out, in), got ", weight.desc());
  TG_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), op, ": input ", x.desc(), " has last dimension ",
           (x.dim() ? x.size(-1) : 0), " but weight ", weight.desc(), " expects ", weight.size(1));
  if (bias.defined()) {
    check_same(op, x, bias);
    TG_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, ": bias ", bias.desc(), " does not match weight ",
             weight.desc(), " (expected [", weight.size(0), "])");
  }
}

// The two GEMMs of a linear layer's backward: dx (rows, K) = g (rows, N) · W (N, K) when x needs
// it, dW (N, K) = gᵀ (N, rows) · x (rows, K). The bias gradient is a column-sum kernel of its own:
// cuBLASLt's BGRADB epilogue (the bias gradient out of dW's GEMM) made the GPT-2 step slower
// (docs/performance.md "Where a step's time goes"). When the weight is a bf16 compute copy of an
// fp32 parameter on the GPU (w_acc: GradHandOver::accumulator), dW is added straight into the
// parameter's fp32 gradient by the GEMM (beta = 1) and no dW is returned: no bf16 dW is written,
// and no pass folds it into fp32 (docs/performance.md, table of changes).
std::pair<Tensor, Tensor> linear_backward_gemms(const Tensor& g, const Tensor& x, const Tensor& w, bool need_x,
                                                int64_t rows, int64_t N, int64_t K, const Tensor& w_acc) {
  const bool into_acc = w_acc.defined() && g.device().is_cuda() && g.dtype() == DType::bf16;
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
                 cuda::gemm_accumulate_f32(true, false, N, K, rows, 1.0f, g.data<T>(), N, x.data<T>(), K, 1.0f,
                                           w_acc.data<float>(), K, cuda_stream());
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
           auto [gx, gw] = linear_backward_gemms(g, x, w, need_x, rows, N, K, hand_over.accumulator(1));
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
           auto [gx, gw] = linear_backward_gemms(dpre, x, w, need_x, rows, N, K, hand_over.accumulator(1));
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
           Tensor gw_proj = linear_backward_gemms(g, h, w_proj, /*need_x=*/false, rows, N2, K2,
                                                  hand_over.accumulator(3)).second;
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
           auto [gx, gw_fc] = linear_backward_gemms(dpre, x, w_fc, need_x, rows, N1, K1, hand_over.accumulator(1));
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
// Targets on the host are range-checked here (on the GPU a bad one makes the loss NaN, loudly).
void check_targets(const char* op, const Tensor& targets, int64_t V, int32_t ignore_index) {
  if (!targets.device().is_cpu()) return;
  const int32_t* t = targets.data<int32_t>();
  for (int64_t n = 0; n < targets.numel(); ++n)
    TG_CHECK(t[n] == ignore_index || (t[n] >= 0 && t[n] < V), op, ": target ", t[n], " at row ", n,
             " is outside [0, ", V, ") and is not the ignore index ", ignore_index);
}
}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets_in, int32_t ignore_index) {
  check_defined("cross_entropy", logits, "logits");
  check_defined("cross_entropy", targets_in, "targets");
  TG_CHECK(logits.dim() == 2, "cross_entropy: logits must be (N, V), got ", logits.desc());
  TG_CHECK(targets_in.dtype() == DType::i32 && targets_in.numel() == logits.size(0) && targets_in.dim() == 1,
           "cross_entropy: targets must be i32 [", logits.size(0), "] to match logits ", logits.desc(),
           ", got ", targets_in.desc());
  const int64_t N = logits.size(0), V = logits.size(1);
  check_targets("cross_entropy", targets_in, V, ignore_index);
  Tensor targets = ids_on(targets_in, logits.device());
  if (logits.device().is_cuda()) {
    // GPU: statistics and the loss in fp32 whatever the logits' dtype, and — when a backward
    // will follow — the gradient in the same pass over the logits, so the backward keeps neither
    // the logits nor reads them again (it only rescales for an upstream gradient other than 1).
    Tensor lse = Tensor::empty({N}, DType::f32, logits.device()), row_loss = Tensor::empty({N}, DType::f32, logits.device());
    Tensor out = Tensor::empty({1}, DType::f32, logits.device()), count = Tensor::empty({1}, DType::i32, logits.device());
    Tensor dlogits = needs_grad({&logits}) ? empty_like(logits) : Tensor();
    dispatch("cross_entropy", logits, [&]<typename T>() {}, [&]<typename T>() {
      cuda::cross_entropy_forward(logits.data<T>(), targets.data<int32_t>(), lse.data<float>(), row_loss.data<float>(),
                                  out.data<float>(), count.data<int32_t>(),
                                  dlogits.defined() ? dlogits.data<T>() : nullptr, N, V, ignore_index, cuda_stream());
    });
    record(out, "cross_entropy", {logits}, [dlogits](const Tensor& g) {
      dispatch("cross_entropy backward", dlogits, [&]<typename T>() {}, [&]<typename T>() {
        cuda::cross_entropy_backward(g.data<float>(), dlogits.data<T>(), dlogits.numel(), cuda_stream());
      });
      return std::vector<Tensor>{dlogits};
    });
    return out;
  }
  Tensor lse = Tensor::empty({N}, logits.dtype(), logits.device());
  Tensor row_loss = Tensor::empty({N}, logits.dtype(), logits.device());
  Tensor out = Tensor::empty({1}, logits.dtype(), logits.device());
  int64_t counted = 0;
  dispatch("cross_entropy", logits,
           [&]<typename T>() {
             counted = cpu::cross_entropy_forward(logits.data<T>(), targets.data<int32_t>(), lse.data<T>(),
                                                  row_loss.data<T>(), N, V, ignore_index);
             T total = cpu::sum_all(row_loss.data<T>(), N);
             out.data<T>()[0] = counted > 0 ? total / T(counted) : T(0);
           },
           [&]<typename T>() {});
  record(out, "cross_entropy", {logits},
         [logits = logits.detach(), targets, lse, counted, N, V, ignore_index](const Tensor& g) {
           Tensor gl = empty_like(logits);
           dispatch("cross_entropy backward", g,
                    [&]<typename T>() {
                      cpu::cross_entropy_backward(logits.data<T>(), targets.data<int32_t>(), lse.data<T>(),
                                                  g.data<T>()[0], counted, gl.data<T>(), N, V, ignore_index);
                    },
                    [&]<typename T>() {});
           return std::vector<Tensor>{gl};
         });
  return out;
}

// The LM head and its loss a chunk of rows at a time. Per chunk: logits = x_c·Wᵀ, the rows'
// log-sum-exp and losses, and — when a backward will follow — dlogits = (softmax − onehot)/count
// written over the logits, then dx_c = dlogits·W and dW += dlogitsᵀ·x_c. Only one chunk's logits
// are ever held (chunk·V elements, not the (N, V) logits and their gradient as well); the gradients
// are complete when the forward returns, so the backward only rescales them by the upstream
// gradient (as cross_entropy's GPU path does). count is over the whole batch, so every chunk's
// dlogits is already the mean's gradient. On the GPU with bf16 and several chunks, dW is summed
// over the chunks in fp32 and rounded once.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets_in, int64_t chunk_rows,
                            int32_t ignore_index) {
  const char* op = "linear_cross_entropy";
  check_linear(op, x, weight, Tensor());
  check_defined(op, targets_in, "targets");
  TG_CHECK(x.dim() == 2, op, ": x must be (N, C), got ", x.desc());
  const int64_t N = x.size(0), C = x.size(1), V = weight.size(0);
  TG_CHECK(targets_in.dtype() == DType::i32 && targets_in.dim() == 1 && targets_in.numel() == N, op,
           ": targets must be i32 [", N, "] to match x ", x.desc(), ", got ", targets_in.desc());
  TG_CHECK(chunk_rows >= 0, op, ": chunk_rows is ", chunk_rows, "; give a positive number of rows, or 0 for all");
  check_targets(op, targets_in, V, ignore_index);
  Tensor targets = ids_on(targets_in, x.device());
  const int64_t chunk = chunk_rows == 0 || chunk_rows > N ? std::max<int64_t>(N, 1) : chunk_rows;
  const bool need_x = needs_grad({&x}), need_w = needs_grad({&weight}), grad = need_x || need_w;
  const DType stats = x.device().is_cuda() ? DType::f32 : x.dtype();  // GPU: statistics in fp32 whatever x is
  Tensor lse = Tensor::empty({N}, stats, x.device()), row_loss = Tensor::empty({N}, stats, x.device());
  Tensor out = Tensor::empty({1}, stats, x.device());
  Tensor logits = Tensor::empty({chunk, V}, x.dtype(), x.device());
  Tensor dlogits = grad ? logits : Tensor();  // the gradient overwrites the logits it is made from
  Tensor dx = need_x ? Tensor::empty({N, C}, x.dtype(), x.device()) : Tensor();
  // dW is summed over the chunks (zeros first: N may be 0); under bf16 on the GPU, in fp32 when
  // there is more than one chunk to add.
  const DType dw_sum_dtype = x.device().is_cuda() && x.dtype() == DType::bf16 && N > chunk ? DType::f32 : x.dtype();
  Tensor dw = need_w ? Tensor::zeros({V, C}, dw_sum_dtype, x.device()) : Tensor();
  dispatch(
      op, x,
      [&]<typename T>() {
        const int32_t* t = targets.data<int32_t>();
        int64_t counted = 0;
        for (int64_t n = 0; n < N; ++n) counted += t[n] != ignore_index;
        for (int64_t r0 = 0; r0 < N; r0 += chunk) {
          const int64_t n = std::min(chunk, N - r0);
          const T* xc = x.data<T>() + r0 * C;
          cpu::gemm(false, true, n, V, C, T(1), xc, C, weight.data<T>(), C, T(0), logits.data<T>(), V);
          cpu::cross_entropy_forward(logits.data<T>(), t + r0, lse.data<T>() + r0, row_loss.data<T>() + r0, n, V,
                                     ignore_index);
          if (!grad) continue;
          cpu::cross_entropy_backward(logits.data<T>(), t + r0, lse.data<T>() + r0, T(1), counted, dlogits.data<T>(),
                                      n, V, ignore_index);
          if (need_x)
            cpu::gemm(false, false, n, C, V, T(1), dlogits.data<T>(), V, weight.data<T>(), C, T(0),
                      dx.data<T>() + r0 * C, C);
          if (need_w) cpu::gemm(true, false, V, C, n, T(1), dlogits.data<T>(), V, xc, C, T(1), dw.data<T>(), C);
        }
        const T total = cpu::sum_all(row_loss.data<T>(), N);
        out.data<T>()[0] = counted > 0 ? total / T(counted) : T(0);
      },
      [&]<typename T>() {
        Tensor count = Tensor::empty({1}, DType::i32, x.device());
        cuda::cross_entropy_count(targets.data<int32_t>(), N, ignore_index, count.data<int32_t>(), cuda_stream());
        for (int64_t r0 = 0; r0 < N; r0 += chunk) {
          const int64_t n = std::min(chunk, N - r0);
          const T* xc = x.data<T>() + r0 * C;
          cuda_gemm<T>(false, true, n, V, C, xc, C, weight.data<T>(), C, logits.data<T>(), V, 1, 0, 0, 0);
          cuda::cross_entropy_rows(logits.data<T>(), targets.data<int32_t>() + r0, lse.data<float>() + r0,
                                   row_loss.data<float>() + r0, count.data<int32_t>(),
                                   grad ? dlogits.data<T>() : nullptr, n, V, ignore_index, cuda_stream());
          if (need_x)
            cuda_gemm<T>(false, false, n, C, V, dlogits.data<T>(), V, weight.data<T>(), C, dx.data<T>() + r0 * C, C,
                         1, 0, 0, 0);
          if (need_w) {
            const float beta = r0 == 0 ? 0.0f : 1.0f;
            if constexpr (std::is_same_v<T, bf16>) {
              if (dw.dtype() == DType::f32) {  // several chunks: their products added in fp32
                cuda::gemm_accumulate_f32(true, false, V, C, n, 1.0f, dlogits.data<T>(), V, xc, C, beta,
                                          dw.data<float>(), C, cuda_stream());
                continue;
              }
            }
            cuda::gemm<T>(true, false, V, C, n, 1.0f, dlogits.data<T>(), V, xc, C, beta, dw.data<T>(), C, 1, 0, 0, 0,
                          cuda::Epilogue::none, nullptr, cuda_stream());
          }
        }
        cuda::cross_entropy_mean(row_loss.data<float>(), N, count.data<int32_t>(), out.data<float>(), cuda_stream());
      });
  if (!grad) return out;
  if (need_w && dw.dtype() != x.dtype()) dw = dw.to(x.dtype());  // the fp32 sum rounded once
  logits = dlogits = Tensor();  // the chunk buffers go now, not with the graph
  record(out, op, {x, weight}, [dx, dw](const Tensor& g) {
    for (const Tensor& d : {dx, dw}) {
      if (!d.defined()) continue;
      dispatch("linear_cross_entropy backward", d,
               [&]<typename T>() { cpu::scale_forward(d.data<T>(), d.data<T>(), g.data<T>()[0], d.numel()); },
               [&]<typename T>() { cuda::cross_entropy_backward(g.data<float>(), d.data<T>(), d.numel(), cuda_stream()); });
    }
    return std::vector<Tensor>{dx, dw};
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
