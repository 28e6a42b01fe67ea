// Whole-model training with the fused GPU attention against the materialised path: loss curves
// over 200 steps agree within bf16 tolerance (head dim 64, so the fused kernel is taken).
#include <gtest/gtest.h>

#include <cmath>

#include "src/nn/gpt.h"
#include "src/optim/adamw.h"
#include "tests/test_util.h"

namespace tg {
namespace {

std::vector<double> curve(ops::AttentionKind kind, int steps) {
  nn::GPTConfig c;
  c.n_layer = 2; c.n_head = 2; c.d_model = 128; c.vocab_size = 64; c.max_seq_len = 128;
  c.attention = kind;
  nn::GPT model(c, 9, DType::f32, Device::cuda(0), DType::bf16);
  optim::AdamW opt(model.params(), {0.9, 0.95, 1e-8, 0.1});
  // A learnable stream: token t+1 = (3·token t + 1) mod 64 with a random start per row.
  const int64_t B = 8, T = 128;
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s) {
    std::vector<int32_t> x(static_cast<size_t>(B * T)), y(static_cast<size_t>(B * T));
    for (int64_t b = 0; b < B; ++b) {
      int32_t tok = int32_t((s * 131 + b * 17) % 64);
      for (int64_t t = 0; t < T; ++t) {
        x[size_t(b * T + t)] = tok;
        tok = (3 * tok + 1) % 64;
        y[size_t(b * T + t)] = tok;
      }
    }
    model.params().zero_grad();
    Tensor l = model.loss(Tensor::from_ints(x, {B, T}), Tensor::from_ints(y, {B, T}));
    l.backward();
    optim::clip_grad_norm(model.params(), 1.0);
    opt.step(1e-3);
    losses.push_back(l.item());
  }
  return losses;
}

TEST(FlashTraining, LossCurveMatchesTheMaterialisedPath) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine (or built without CUDA)";
  std::vector<double> flash = curve(ops::AttentionKind::flash, 200), naive = curve(ops::AttentionKind::naive, 200);
  double worst = 0;
  for (size_t i = 0; i < flash.size(); ++i) {
    ASSERT_TRUE(std::isfinite(flash[i])) << "step " << i;
    worst = std::max(worst, std::abs(flash[i] - naive[i]) / std::max(1.0, std::abs(naive[i])));
  }
  EXPECT_LT(worst, 0.05) << "largest relative loss difference over 200 steps";
  EXPECT_LT(flash.back(), 0.5 * flash.front()) << "the model must learn the sequence";
  EXPECT_LT(std::abs(flash.back() - naive.back()), 0.05);
}

// A small model and one fixed batch of it on the GPU (ids and targets, B × T).
struct SmallRun {
  nn::GPTConfig config;
  Tensor ids, targets;
  SmallRun(int64_t vocab, int64_t max_seq_len, int64_t B, int64_t T) {
    config.n_layer = 2, config.n_head = 2, config.d_model = 128, config.vocab_size = vocab;
    config.max_seq_len = max_seq_len;
    std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
    for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((7 * i + 3) % vocab), y[i] = int32_t((5 * i + 1) % vocab);
    ids = Tensor::from_ints(x, {B, T}).to(Device::cuda(0));
    targets = Tensor::from_ints(y, {B, T}).to(Device::cuda(0));
  }
};

// AdamW writes the bf16 compute copy with its update (ParameterStore::compute_values): after
// every step — taken by the host's constants, decided on the device, or skipped there — the kept
// copy is the cast of the values bit for bit, training gives the losses of converting before every
// forward, and values written from outside are converted again once values_changed() says so.
TEST(FlashTraining, TheComputeCopyTheUpdateWritesIsTheCastOfTheValues) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine (or built without CUDA)";
  const SmallRun small(64, 64, 4, 64);
  const nn::GPTConfig& c = small.config;
  const Tensor &ids = small.ids, &tgt = small.targets;
  auto run = [&](bool convert_every_step) {
    nn::GPT model(c, 9, DType::f32, Device::cuda(0), DType::bf16);
    optim::AdamW opt(model.params(), {0.9, 0.95, 1e-8, 0.1});
    Tensor record = Tensor::zeros({2}, DType::f64, Device::cuda(0));
    opt.reset_decision(0);
    std::vector<double> losses;
    for (int s = 0; s < 6; ++s) {
      if (convert_every_step) model.params().values_changed();
      model.params().zero_grad();
      Tensor l = model.loss(ids, tgt);
      l.backward();
      losses.push_back(l.item());
      if (s % 2 == 0) {
        opt.step(1e-3, optim::clip_factor(optim::grad_norm(model.params()), 1.0));
      } else {  // decided on the device; step 3 has a non-finite loss and is skipped there
        const double loss = s == 3 ? std::nan("") : losses.back();
        record.copy_from(Tensor::from_vector({loss, 1.0}, {2}, DType::f64));
        opt.step_decided(1e-3, record, {1.0, 4});
      }
      const Tensor cast = model.params().flat_values().to(DType::bf16);
      EXPECT_TRUE(testing::bitwise_equal(model.params().compute_values().to(Device::cpu()), cast.to(Device::cpu())))
          << "after step " << s;
    }
    EXPECT_EQ(opt.decision().skip, 0) << "the step after the skipped one is taken";
    // Values written from outside: the next forward converts them.
    model.params().flat_values().copy_from(Tensor::zeros({model.params().numel()}, DType::f32, Device::cuda(0)));
    model.params().values_changed();
    EXPECT_TRUE(testing::bitwise_equal(model.params().compute_values().to(Device::cpu()),
                              Tensor::zeros({model.params().numel()}, DType::bf16, Device::cpu())));
    return losses;
  };
  const std::vector<double> kept = run(false), converted = run(true);
  for (size_t i = 0; i < kept.size(); ++i) EXPECT_EQ(kept[i], converted[i]) << "step " << i;
  EXPECT_NE(kept[0], kept[5]) << "the updates must change the model";
}

// The weights' gradients written by the backward instead of zeroed before it
// (ParameterStore::zero_grad_at_first_write): from buffers full of NaN, one and two micro-batches,
// with and without recomputation, the gradients equal those of zero_grad (the tied table's within
// rounding: its two gradients are added in another order).
TEST(FlashTraining, GradientsWrittenAtTheirFirstWriteEqualZeroedOnes) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine (or built without CUDA)";
  const SmallRun small(96, 80, 4, 64);  // learned positions past T: rows of the table with no gradient
  const nn::GPTConfig& c = small.config;
  const Tensor &ids = small.ids, &tgt = small.targets;
  for (int micro : {1, 2})
    for (bool recompute : {false, true}) {
      auto grads = [&](bool first_write) {
        nn::GPT model(c, 9, DType::f32, Device::cuda(0), DType::bf16);
        model.set_recompute(recompute);
        Tensor g = model.params().flat_grads();
        g.copy_from(Tensor::full(g.shape(), std::nan(""), DType::f32, Device::cuda(0)));
        if (first_write) model.params().zero_grad_at_first_write();
        else model.params().zero_grad();
        for (int m = 0; m < micro; ++m) model.loss(ids, tgt).backward();
        return g.to(Device::cpu()).to_double_vector();
      };
      const std::vector<double> zeroed = grads(false), written = grads(true);
      ASSERT_EQ(zeroed.size(), written.size());
      double largest = 0, worst = 0;
      size_t nan = 0;
      for (size_t i = 0; i < zeroed.size(); ++i) {
        nan += std::isnan(written[i]) ? 1 : 0;
        largest = std::max(largest, std::abs(zeroed[i]));
        worst = std::max(worst, std::abs(written[i] - zeroed[i]));
      }
      EXPECT_EQ(nan, 0u) << "gradients neither written nor zeroed (" << micro << " micro-batches, recompute "
                         << recompute << ")";
      EXPECT_LE(worst, 1e-6 * largest) << micro << " micro-batches, recompute " << recompute;
      EXPECT_GT(largest, 0.0);
    }
}

}  // namespace
}  // namespace tg
