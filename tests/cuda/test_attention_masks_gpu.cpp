// Structured attention masks (sliding window, documents) on the GPU at the op and model level:
// ops::self_attention's fused node on a GPU against the CPU in double (outputs and d(qkv)), the
// materialised GPU path (fp32: no fused kernel) against the CPU too, and a short GPT training run
// with document masks whose loss falls and differs from the unmasked run's.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "src/nn/gpt.h"
#include "src/ops/ops.h"
#include "src/optim/adamw.h"
#include "tests/test_util.h"

namespace tg {
namespace {

using testing::random_tensor;

double rel_norm(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 0.01 * std::sqrt(double(a.size())));
}

// y = self_attention(qkv) and d(qkv) for Σ y ∘ w, on `dev` in `dtype`, as host doubles.
std::vector<std::vector<double>> self_attention_run(Device dev, DType dtype, ops::AttentionKind kind, const Tensor& qkv_host,
                                                    const Tensor& w_host, int64_t n_head, double rope_base,
                                                    const ops::AttentionMask& mask) {
  Tensor qkv = qkv_host.to(dtype), w = w_host.to(dtype);
  if (!dev.is_cpu()) qkv = qkv.to(dev), w = w.to(dev);
  qkv.set_requires_grad(true);
  Tensor y = ops::self_attention(qkv, n_head, kind, rope_base, mask);
  if (kind == ops::AttentionKind::flash && dtype == DType::bf16) {
    EXPECT_EQ(y.grad_fn()->op, "self_attention");
  }
  ops::sum(ops::mul(y, w)).backward();
  return {y.to_double_vector(), qkv.grad().to_double_vector()};
}

// The fused GPU self-attention with a window and documents (head dims 64 and 128, with and
// without RoPE) against the CPU's in double: within bf16 rounding, outputs and d(qkv).
TEST(AttentionMasksGpu, SelfAttentionMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine (or built without CUDA)";
  struct Case {
    int64_t T, D, window;
    std::vector<int64_t> lengths;
    double rope;
  };
  for (const Case& c : {Case{300, 64, 0, {1, 40, 1, 150, 7}, 0.0}, Case{300, 64, 50, {}, 10000.0},
                        Case{1000, 128, 100, {1, 300, 2, 500}, 10000.0}, Case{129, 128, 5, {64}, 0.0}}) {
    SCOPED_TRACE("T " + std::to_string(c.T) + " D " + std::to_string(c.D) + " window " + std::to_string(c.window));
    const int64_t B = 2, H = 2, C = H * c.D;
    ops::AttentionMask mask;
    mask.window = c.window;
    if (!c.lengths.empty()) mask.doc_start = testing::document_starts_of_lengths(B, c.T, c.lengths);
    const Tensor qkv = random_tensor({B, c.T, 3 * C}, 11, DType::f32).to(DType::bf16).to(DType::f64);
    const Tensor w = random_tensor({B, c.T, C}, 12, DType::f32).to(DType::bf16).to(DType::f64);
    const auto ref = self_attention_run(Device::cpu(), DType::f64, ops::AttentionKind::flash, qkv, w, H, c.rope, mask);
    const auto gpu = self_attention_run(Device::cuda(0), DType::bf16, ops::AttentionKind::flash, qkv, w, H, c.rope, mask);
    EXPECT_LT(rel_norm(gpu[0], ref[0]), 2e-2) << "y";
    EXPECT_LT(rel_norm(gpu[1], ref[1]), 5e-2) << "d(qkv)";
    // With the device copy made by the caller (as the GPT does once per step): the same bits.
    ops::AttentionMask pre = mask;
    if (mask.doc_start.defined()) pre.doc_start_device = mask.doc_start.to(Device::cuda(0));
    const auto gpu_pre = self_attention_run(Device::cuda(0), DType::bf16, ops::AttentionKind::flash, qkv, w, H, c.rope, pre);
    EXPECT_EQ(gpu_pre[0], gpu[0]);
    EXPECT_EQ(gpu_pre[1], gpu[1]);
  }
}

// fp32 on the GPU has no fused kernel: the materialised attention takes the mask as a bias.
TEST(AttentionMasksGpu, MaterialisedPathMatchesCpu) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine (or built without CUDA)";
  const int64_t B = 2, T = 70, H = 2, C = 2 * 16;
  ops::AttentionMask mask;
  mask.window = 9;
  mask.doc_start = testing::document_starts_of_lengths(B, T, {1, 12, 30, 2});
  const Tensor qkv = random_tensor({B, T, 3 * C}, 21, DType::f32).to(DType::f64);
  const Tensor w = random_tensor({B, T, C}, 22, DType::f32).to(DType::f64);
  const auto ref = self_attention_run(Device::cpu(), DType::f64, ops::AttentionKind::naive, qkv, w, H, 0.0, mask);
  for (ops::AttentionKind kind : {ops::AttentionKind::flash, ops::AttentionKind::naive}) {
    const auto gpu = self_attention_run(Device::cuda(0), DType::f32, kind, qkv, w, H, 0.0, mask);
    EXPECT_LT(rel_norm(gpu[0], ref[0]), 1e-4) << "y";
    EXPECT_LT(rel_norm(gpu[1], ref[1]), 1e-4) << "d(qkv)";
  }
}

// A short GPT run on the GPU (bf16 compute: the fused kernels) with document masks: the loss falls,
// and differs from the same run without them (the masks reach the kernels).
std::vector<double> document_curve(bool document_mask, int steps) {
  nn::GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.d_model = 128, c.vocab_size = 64, c.max_seq_len = 256;
  nn::GPT model(c, 9, DType::f32, Device::cuda(0), DType::bf16);
  const int32_t eot = 63;
  if (document_mask) model.set_document_eot(eot);
  optim::AdamW opt(model.params(), {0.9, 0.95, 1e-8, 0.1});
  // Documents of 1 to 90 tokens, each a stream token t+1 = (3·token t + 1) mod 63 from a random
  // start, closed by the end-of-text token.
  const int64_t B = 4, T = 256;
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> seq(size_t(B * T + 1));
    uint64_t r = uint64_t(s) * 7919 + 17;
    int32_t tok = 0, left = 0;
    for (size_t i = 0; i < seq.size(); ++i) {
      if (left == 0) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        left = int32_t(1 + (r >> 33) % 90);
        tok = int32_t((r >> 20) % 63);
        seq[i] = eot;
        continue;
      }
      seq[i] = tok;
      tok = (3 * tok + 1) % 63;
      --left;
    }
    std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
    for (size_t i = 0; i < x.size(); ++i) x[i] = seq[i], y[i] = seq[i + 1];
    model.params().zero_grad();
    Tensor l = model.loss(Tensor::from_ints(x, {B, T}), Tensor::from_ints(y, {B, T}));
    l.backward();
    optim::clip_grad_norm(model.params(), 1.0);
    opt.step(1e-3);
    losses.push_back(l.item());
  }
  return losses;
}

TEST(AttentionMasksGpu, DocumentMaskTrainingLearns) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine (or built without CUDA)";
  const std::vector<double> masked = document_curve(true, 200), plain = document_curve(false, 200);
  for (size_t i = 0; i < masked.size(); ++i) ASSERT_TRUE(std::isfinite(masked[i])) << "step " << i;
  // (Mean of the last 10 steps: each step draws new documents.)
  double last = 0;
  for (size_t i = masked.size() - 10; i < masked.size(); ++i) last += masked[i] / 10;
  EXPECT_LT(last, 0.6 * masked.front()) << "the model must learn the documents";
  double diff = 0;
  for (size_t i = 1; i < masked.size(); ++i) diff = std::max(diff, std::abs(masked[i] - plain[i]));
  EXPECT_GT(diff, 1e-3) << "the document mask changed nothing";
}

}  // namespace
}  // namespace tg
