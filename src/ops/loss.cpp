// The losses: cross-entropy over given logits, and the LM head and its cross-entropy as one op
// (linear_cross_entropy: the logits made and consumed a chunk of rows at a time).
#include <algorithm>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/gemm.h"
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
using internal::check_linear;
using internal::cuda_gemm;
using internal::ids_on;

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

}  // namespace tg::ops
