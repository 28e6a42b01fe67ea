// What the op files share: integer inputs' device copies, the linear layers' argument checks
// and the GEMM call their GPU paths run.
#pragma once
#include <cstdint>

#include "kernels/cuda/gemm.h"
#include "src/tensor/dispatch.h"
#include "src/tensor/tensor.h"
#include "src/util/error.h"

namespace tg::ops::internal {

// Integer inputs (token ids, targets) are range-checked on the host; a GPU op then gets a
// device copy. Ids that already live on the GPU are trusted (nothing reads them back).
inline Tensor ids_on(const Tensor& ids, Device d) { return ids.device() == d ? ids : ids.to(d); }

// x (..., K), weight (N, K) as in torch.nn.Linear, bias (N) or undefined: errors name the op.
inline void check_linear(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  detail::check_defined(op, x, "x");
  detail::check_defined(op, weight, "weight");
  detail::check_same(op, x, weight);
  TG_CHECK(weight.dim() == 2, op, ": weight must be (out, in), got ", weight.desc());
  TG_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), op, ": input ", x.desc(), " has last dimension ",
           (x.dim() ? x.size(-1) : 0), " but weight ", weight.desc(), " expects ", weight.size(1));
  if (bias.defined()) {
    detail::check_same(op, x, bias);
    TG_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), op, ": bias ", bias.desc(), " does not match weight ",
             weight.desc(), " (expected [", weight.size(0), "])");
  }
}

// C (M, N) = op(A) · op(B) (+ bias per column), row-major, through cuBLASLt with fp32 accumulation.
template <typename T>
void cuda_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
               T* C, int64_t ldc, int64_t batch, int64_t sa, int64_t sb, int64_t sc, const T* bias = nullptr) {
  cuda::gemm<T>(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc, batch, sa, sb, sc,
                bias ? cuda::Epilogue::bias : cuda::Epilogue::none, bias, detail::cuda_stream());
}

}  // namespace tg::ops::internal
