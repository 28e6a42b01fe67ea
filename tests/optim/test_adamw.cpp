// AdamW against a hand-computed update, clipping, and the learning-rate schedule.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "src/optim/adamw.h"

namespace tg {
namespace {

TEST(AdamW, OneStepMatchesHandComputedUpdate) {
  nn::ParameterStore store;
  store.declare("w", {2, 2}, nn::Init::ones);  // 2-D: decayed
  store.declare("b", {2}, nn::Init::ones);     // 1-D: not decayed
  store.allocate(0);
  std::vector<float> grads = {0.5f, -1.0f, 2.0f, 0.0f, -0.25f, 4.0f};
  std::copy(grads.begin(), grads.end(), store.flat_grads().data<float>());
  optim::AdamWConfig cfg{0.9, 0.99, 1e-8, 0.1};
  optim::AdamW opt(store, cfg);
  const double lr = 0.01;
  opt.step(lr);
  std::vector<float> p = store.flat_values().to_float_vector();
  for (size_t i = 0; i < grads.size(); ++i) {
    // First step: m̂ = g, v̂ = g², so the update is g/(|g| + eps) (± 1 unless g = 0).
    double g = grads[i];
    double m_hat = (1 - 0.9) * g / (1 - 0.9), v_hat = (1 - 0.99) * g * g / (1 - 0.99);
    double decay = i < 4 ? 0.1 : 0.0;
    double expected = 1.0 - lr * (m_hat / (std::sqrt(v_hat) + 1e-8) + decay * 1.0);
    EXPECT_NEAR(p[i], expected, 1e-6) << "element " << i;
  }
  // Second step with the same gradient: m̂ and v̂ stay g and g² after bias correction.
  std::copy(grads.begin(), grads.end(), store.flat_grads().data<float>());
  std::vector<float> p1 = p;
  opt.step(lr);
  p = store.flat_values().to_float_vector();
  for (size_t i = 0; i < grads.size(); ++i) {
    double g = grads[i], decay = i < 4 ? 0.1 : 0.0;
    double expected = p1[i] - lr * (g / (std::abs(g) + 1e-8) + decay * p1[i]);
    EXPECT_NEAR(p[i], expected, 1e-6) << "element " << i;
  }
  EXPECT_EQ(opt.steps_taken(), 2);
}

// Betas, bias correction, eps and decay each change this result: different gradients on the
// two steps, beta1 0.8 and beta2 0.95 (so neither (1 − β1)/√(1 − β2) nor the bias corrections
// cancel), and an eps large enough to matter.
TEST(AdamW, TwoStepsWithDifferentGradientsMatchTheFormula) {
  nn::ParameterStore store;
  store.declare("w", {2, 2}, nn::Init::ones);
  store.declare("b", {2}, nn::Init::ones);
  store.allocate(0);
  const double b1 = 0.8, b2 = 0.95, eps = 1e-3, wd = 0.1, lr = 0.01;
  optim::AdamW opt(store, optim::AdamWConfig{b1, b2, eps, wd});
  const std::vector<float> g1 = {0.5f, -1.0f, 2.0f, 0.0f, -0.25f, 4.0f};
  const std::vector<float> g2 = {1.5f, 0.5f, -3.0f, 0.125f, 0.75f, -2.0f};
  std::vector<double> p(6, 1.0), m(6, 0.0), v(6, 0.0);
  int t = 0;
  for (const auto* g : {&g1, &g2}) {
    std::copy(g->begin(), g->end(), store.flat_grads().data<float>());
    opt.step(lr);
    ++t;
    for (size_t i = 0; i < 6; ++i) {
      const double gi = (*g)[i];
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      const double m_hat = m[i] / (1 - std::pow(b1, t)), v_hat = v[i] / (1 - std::pow(b2, t));
      const double decay = i < 4 ? wd : 0.0;
      p[i] = p[i] - lr * (m_hat / (std::sqrt(v_hat) + eps) + decay * p[i]);
    }
    const std::vector<float> got = store.flat_values().to_float_vector();
    for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(got[i], p[i], 2e-7) << "step " << t << ", element " << i;
  }
  // The same two steps with the betas swapped would land elsewhere: the check can fail.
  const double swapped = [&] {
    double mm = 0, vv = 0, pp = 1;
    for (int k = 1; k <= 2; ++k) {
      const double gi = (k == 1 ? g1 : g2)[0];
      mm = b2 * mm + (1 - b2) * gi, vv = b1 * vv + (1 - b1) * gi * gi;
      pp -= lr * (mm / (1 - std::pow(b2, k)) / (std::sqrt(vv / (1 - std::pow(b1, k))) + eps) + wd * pp);
    }
    return pp;
  }();
  EXPECT_GT(std::abs(swapped - p[0]), 1e-5);
}

TEST(AdamW, ClipGradNormScalesToTheLimit) {
  nn::ParameterStore store;
  store.declare("w", {4}, nn::Init::zeros);
  store.allocate(0);
  float* g = store.flat_grads().data<float>();
  g[0] = 3; g[1] = 4; g[2] = 0; g[3] = 0;
  EXPECT_NEAR(optim::clip_grad_norm(store, 1.0), 5.0, 1e-9);
  EXPECT_NEAR(optim::grad_norm(store), 1.0, 1e-5);
  EXPECT_NEAR(optim::clip_grad_norm(store, 10.0), 1.0, 1e-5);  // under the limit: untouched
  EXPECT_NEAR(optim::grad_norm(store), 1.0, 1e-5);
}

// A weight and a bias with fixed values and gradients (norm above 0.5), the same on every call.
std::unique_ptr<nn::ParameterStore> store_with_gradients() {
  auto store = std::make_unique<nn::ParameterStore>();
  store->declare("w", {3, 5}, nn::Init::normal, 0.5);
  store->declare("b", {5}, nn::Init::zeros);
  store->allocate(7);
  float* g = store->flat_grads().data<float>();
  for (int64_t i = 0; i < store->numel(); ++i) g[i] = float(0.3 * std::sin(1.7 * double(i) + 0.2));
  return store;
}

// Clipping folded into the update (what training does) is bitwise the update after clipping the
// gradients in place.
TEST(AdamW, ClipFactorInTheUpdateEqualsClippingTheGradients) {
  auto make = store_with_gradients;
  auto a = make(), b = make();
  optim::AdamW opt_a(*a, {}), opt_b(*b, {});
  const double norm = optim::grad_norm(*a);
  ASSERT_GT(norm, 0.5);
  EXPECT_NEAR(optim::clip_factor(norm, 0.5), 0.5 / (norm + 1e-6), 1e-15);
  EXPECT_EQ(optim::clip_factor(norm, 0.0), 1.0);        // clipping off
  EXPECT_EQ(optim::clip_factor(norm, 10 * norm), 1.0);  // under the limit
  EXPECT_EQ(optim::clip_factor(NAN, 0.5), 1.0);         // a non-finite norm is the trainer's to handle
  opt_a.step(1e-2, optim::clip_factor(norm, 0.5));
  EXPECT_NEAR(optim::clip_grad_norm(*b, 0.5), norm, 1e-12);
  opt_b.step(1e-2);
  const Tensor pa = a->flat_values(), pb = b->flat_values();
  for (int64_t i = 0; i < a->numel(); ++i) ASSERT_EQ(pa.data<float>()[i], pb.data<float>()[i]) << i;
  EXPECT_NE(pa.data<float>()[0], make()->flat_values().data<float>()[0]);  // the step did move it
  // The folded form leaves the gradients as they were.
  EXPECT_NEAR(optim::grad_norm(*a), norm, 1e-12);
}

// The step decided where the parameters are (what training does): from the record {loss, squared
// gradient norm} it takes bitwise the update of step(lr, clip_factor(norm)) — clipping included —
// skips a step whose loss or norm is not finite without touching anything, and after
// max_bad_steps such steps in a row takes no update until the host stops the run.
TEST(AdamW, DecidedStepsEqualHostDecidedOnesAndSkipNonFiniteOnes) {
  auto make = store_with_gradients;
  auto host = make(), device = make();
  optim::AdamW opt_host(*host, {}), opt_device(*device, {});
  opt_device.reset_decision(0);
  const optim::StepRules rules{0.5, 2};
  Tensor record = Tensor::zeros({2}, DType::f64);
  auto decided = [&](double loss) {
    optim::grad_sum_squares_to(*device, {}, Tensor::view_of(record, 1, {1}));
    record.data<double>()[0] = loss;
    opt_device.step_decided(1e-2, record, rules);
  };
  const double norm = optim::grad_norm(*host);
  ASSERT_GT(norm, 0.5);  // so the clip applies
  for (int s = 0; s < 3; ++s) {
    opt_host.step(1e-2, optim::clip_factor(norm, 0.5));
    decided(2.5);
  }
  auto same = [&] {
    const Tensor a = host->flat_values(), b = device->flat_values();
    for (int64_t i = 0; i < a.numel(); ++i)
      if (a.data<float>()[i] != b.data<float>()[i]) return false;
    return true;
  };
  EXPECT_TRUE(same());
  EXPECT_EQ(opt_device.decision().steps, 3);
  EXPECT_EQ(opt_device.steps_taken(), 3);
  // A non-finite loss: skipped, nothing moves, the count of bad steps goes up.
  decided(NAN);
  EXPECT_TRUE(same());
  cpu::StepDecision d = opt_device.decision();
  EXPECT_EQ(d.skip, 1);
  EXPECT_EQ(d.bad_in_row, 1);
  EXPECT_EQ(d.steps, 3);
  // A finite step resets the count and updates as the host would.
  opt_host.step(1e-2, optim::clip_factor(norm, 0.5));
  decided(2.5);
  EXPECT_TRUE(same());
  EXPECT_EQ(opt_device.decision().bad_in_row, 0);
  // Two non-finite steps in a row reach max_bad_steps: stopped, and even a finite step is skipped.
  decided(INFINITY);
  decided(NAN);
  d = opt_device.decision();
  EXPECT_EQ(d.stopped, 1);
  EXPECT_EQ(d.bad_in_row, 2);
  decided(2.5);
  EXPECT_TRUE(same());
  EXPECT_EQ(opt_device.decision().steps, 4);
}

TEST(LRSchedule, WarmupThenCosineToMinimum) {
  optim::LRSchedule s{optim::Schedule::cosine, 1e-3, 1e-4, 10, 110};
  EXPECT_NEAR(s.at(0), 1e-4, 1e-12);
  EXPECT_NEAR(s.at(9), 1e-3, 1e-12);
  EXPECT_NEAR(s.at(10), 1e-3, 1e-12);
  EXPECT_NEAR(s.at(60), 0.5 * (1e-3 + 1e-4), 1e-12);
  EXPECT_NEAR(s.at(110), 1e-4, 1e-12);
  EXPECT_NEAR(s.at(500), 1e-4, 1e-12);
  optim::LRSchedule c{optim::Schedule::constant, 1e-3, 1e-4, 10, 110};
  EXPECT_NEAR(c.at(5), 6e-4, 1e-12);
  EXPECT_NEAR(c.at(100), 1e-3, 1e-12);
}

TEST(LRSchedule, WarmupStableDecay) {
  optim::LRSchedule s{optim::Schedule::wsd, 1e-3, 1e-4, 10, 110, 20};
  EXPECT_NEAR(s.at(0), 1e-4, 1e-12);
  EXPECT_NEAR(s.at(9), 1e-3, 1e-12);
  EXPECT_NEAR(s.at(50), 1e-3, 1e-12);
  EXPECT_NEAR(s.at(89), 1e-3, 1e-12);           // the last stable step
  EXPECT_NEAR(s.at(90), 1e-3 - 9e-4 / 20, 1e-12);  // the decay's first
  EXPECT_NEAR(s.at(99), 1e-3 - 9e-4 / 2, 1e-12);
  EXPECT_NEAR(s.at(109), 1e-4, 1e-12);          // the last step trains at min_lr
  EXPECT_NEAR(s.at(500), 1e-4, 1e-12);
  // A longer run (a resume with a larger max_steps) has the same rates until its own decay.
  optim::LRSchedule longer = s;
  longer.max_steps = 210;
  for (int64_t step = 0; step < 90; ++step) EXPECT_EQ(longer.at(step), s.at(step)) << step;
  EXPECT_NEAR(longer.at(189), 1e-3, 1e-12);
  // Decay steps 0: the last fifth; never into the warmup.
  optim::LRSchedule fifth{optim::Schedule::wsd, 1e-3, 1e-4, 10, 110, 0};
  EXPECT_NEAR(fifth.at(87), 1e-3, 1e-12);
  EXPECT_LT(fifth.at(88), 1e-3);
  optim::LRSchedule short_run{optim::Schedule::wsd, 1e-3, 1e-4, 100, 110, 0};
  EXPECT_NEAR(short_run.at(99), 1e-3, 1e-12);
  EXPECT_NEAR(short_run.at(100), 1e-3 - 9e-4 / 10, 1e-12);
}

}  // namespace
}  // namespace tg
