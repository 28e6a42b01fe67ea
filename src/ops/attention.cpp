// Attention on (B, T, H, D): the materialised reference and the fused FlashAttention op.
#include <cmath>
#include <iostream>
#include <mutex>
#include <set>
#include <string>

#include "kernels/cpu/flash_attention.h"
#include "src/ops/ops.h"
#include "src/tensor/dispatch.h"

namespace tg::ops {

using detail::check_defined;
using detail::check_same;
using detail::dispatch;
using detail::empty_like;

namespace {
void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_defined(op, q, "q");
  check_defined(op, k, "k");
  check_defined(op, v, "v");
  check_same(op, q, k);
  check_same(op, q, v);
  TG_CHECK(q.dim() == 4, op, ": q must be (B, T, H, D), got ", q.desc());
  TG_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), op, ": q, k, v shapes differ: ",
           shape_str(q.shape()), ", ", shape_str(k.shape()), ", ", shape_str(v.shape()));
}
}  // namespace

Tensor attention_naive(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  check_qkv("attention_naive", q, k, v);
  const double scale_factor = 1.0 / std::sqrt(double(q.size(3)));
  Tensor qh = transpose12(q), kh = transpose12(k), vh = transpose12(v);  // (B, H, T, D)
  Tensor s = matmul(qh, kh, false, true);                               // (B, H, T, T)
  Tensor p = attention_softmax(s, scale_factor, causal);               // scale, mask, softmax: only P is kept
  return transpose12(matmul(p, vh));                                    // (B, T, H, D)
}

Tensor attention_flash(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  check_qkv("attention_flash", q, k, v);
  if (q.device().is_cuda()) {
    // No fused GPU kernel yet: take the materialised path, and say so once per shape.
    static std::mutex mu;
    static std::set<std::string> warned;
    std::lock_guard<std::mutex> lock(mu);
    if (warned.insert(q.desc()).second)
      std::cerr << "tilegrad: warning: attention_flash has no GPU kernel for " << q.desc()
                << "; using the materialised attention (T×T scores)" << std::endl;
    return attention_naive(q, k, v, causal);
  }
  const cpu::AttentionShape shape{q.size(0), q.size(1), q.size(2), q.size(3), causal,
                                  1.0 / std::sqrt(double(q.size(3)))};
  Tensor o = empty_like(q);
  Tensor lse = Tensor::empty({shape.B, shape.H, shape.T}, q.dtype(), q.device());  // (B, H, T)
  dispatch("attention_flash", q,
           [&]<typename T>() {
             cpu::flash_attention_forward(q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(), lse.data<T>(), shape);
           },
           [&]<typename T>() {});
  // Saved for the backward: the inputs, O and the log-sum-exp; never the (T, T) scores.
  record(o, "attention_flash", {q, k, v},
         [q = q.detach(), k = k.detach(), v = v.detach(), o_saved = o.detach(), lse, shape](const Tensor& g) {
           Tensor dq = empty_like(q), dk = empty_like(k), dv = empty_like(v);
           dispatch("attention_flash backward", g,
                    [&]<typename T>() {
                      cpu::flash_attention_backward(q.data<T>(), k.data<T>(), v.data<T>(), o_saved.data<T>(),
                                                    lse.data<T>(), g.data<T>(), dq.data<T>(), dk.data<T>(),
                                                    dv.data<T>(), shape);
                    },
                    [&]<typename T>() {});
           return std::vector<Tensor>{dq, dk, dv};
         });
  return o;
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, AttentionKind kind) {
  return kind == AttentionKind::flash ? attention_flash(q, k, v, causal) : attention_naive(q, k, v, causal);
}

}  // namespace tg::ops
