// The tape: accumulation for reused tensors, no_grad, graph freed after backward, errors.
#include <gtest/gtest.h>

#include "src/autograd/gradcheck.h"
#include "src/ops/ops.h"
#include "src/tensor/memory.h"
#include "tests/test_util.h"

#include <tuple>

namespace tg {
namespace {

using testing::random_tensor;

TEST(Autograd, ReusedTensorAccumulatesGradients) {
  // y = sum(x·x + 3x) → dy/dx = 2x + 3: x is used three times along two paths.
  Tensor x = Tensor::from_vector({1.0, -2.0, 0.5}, {3}, DType::f64);
  x.set_requires_grad(true);
  ops::sum(ops::add(ops::mul(x, x), ops::scale(x, 3.0))).backward();
  std::vector<double> g = x.grad().to_double_vector();
  EXPECT_DOUBLE_EQ(g[0], 5.0);
  EXPECT_DOUBLE_EQ(g[1], -1.0);
  EXPECT_DOUBLE_EQ(g[2], 4.0);
}

TEST(Autograd, BackwardTwiceAccumulatesIntoLeafGrad) {
  Tensor x = Tensor::from_vector({2.0}, {1}, DType::f64);
  x.set_requires_grad(true);
  ops::scale(x, 4.0).backward();
  ops::scale(x, 4.0).backward();
  EXPECT_DOUBLE_EQ(x.grad().item(), 8.0);
}

TEST(Autograd, DiamondGraphAccumulatesThroughIntermediate) {
  // h = 2x used by two branches that meet again: d/dx sum(h·h + h) = 2·(2h + 1).
  Tensor x = random_tensor({4}, 1);
  x.set_requires_grad(true);
  Tensor h = ops::scale(x, 2.0);
  ops::sum(ops::add(ops::mul(h, h), h)).backward();
  std::vector<double> xv = x.to_double_vector(), g = x.grad().to_double_vector();
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(g[i], 2.0 * (4.0 * xv[i] + 1.0), 1e-12);
}

TEST(Autograd, NoGradRecordsNothing) {
  Tensor x = random_tensor({3}, 2);
  x.set_requires_grad(true);
  Tensor y;
  {
    NoGradGuard guard;
    y = ops::scale(x, 2.0);
  }
  EXPECT_FALSE(y.requires_grad());
  EXPECT_EQ(y.grad_fn(), nullptr);
  EXPECT_THROW(y.backward(), Error);
  Tensor z = ops::scale(x, 2.0);
  EXPECT_NE(z.grad_fn(), nullptr);
}

TEST(Autograd, GraphIsFreedAfterBackward) {
  Tensor x = random_tensor({256, 256}, 3);
  x.set_requires_grad(true);
  const int64_t before = memory_stats(Device::cpu()).current_total;
  Tensor loss = ops::sum(ops::gelu(ops::gelu(x)));
  EXPECT_GT(memory_stats(Device::cpu()).current_total, before + 2 * 256 * 256 * 8 - 1);  // saved activations
  std::weak_ptr<Node> node = loss.grad_fn();
  loss.backward();
  EXPECT_TRUE(node.expired());
  x.set_grad(Tensor());
  // Only the loss tensor itself (one element) remains.
  EXPECT_LE(memory_stats(Device::cpu()).current_total, before + 64);
}

TEST(Autograd, BackwardNeedsAScalar) {
  Tensor x = random_tensor({3}, 4);
  x.set_requires_grad(true);
  try {
    ops::scale(x, 2.0).backward();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one-element"), std::string::npos) << e.what();
  }
}

// checkpoint: the same output and gradients as the plain graph — the inputs' and those of a
// leaf the function reads (a weight) — while keeping none of the function's intermediates.
TEST(Autograd, CheckpointGivesTheSameGradientsAndKeepsNoIntermediates) {
  const Tensor x0 = random_tensor({128, 64}, 11), w0 = random_tensor({64, 64}, 12, DType::f64, 0.1);
  auto fn = [](const Tensor& x, const Tensor& w) {  // three (128, 64) intermediates
    Tensor h = ops::gelu(ops::linear(x, w, Tensor()));
    return ops::add(x, ops::gelu(ops::mul(h, h)));
  };
  auto run = [&](bool recompute, int64_t* held) {
    Tensor x = x0.clone(), w = w0.clone();
    x.set_requires_grad(true);
    w.set_requires_grad(true);
    Tensor a = ops::scale(x, 1.5);  // a non-leaf input, as a block's is
    const int64_t before = memory_stats(Device::cpu()).current_total;
    Tensor y = recompute ? checkpoint([&](const std::vector<Tensor>& in) { return fn(in[0], w); }, {a}) : fn(a, w);
    *held = memory_stats(Device::cpu()).current_total - before;
    Tensor loss = ops::sum(ops::mul(y, y));
    const double value = loss.item();
    loss.backward();
    return std::make_tuple(value, x.grad().to_double_vector(), w.grad().to_double_vector());
  };
  int64_t held_plain = 0, held_recomputed = 0;
  auto [lp, dxp, dwp] = run(false, &held_plain);
  auto [lr, dxr, dwr] = run(true, &held_recomputed);
  EXPECT_EQ(lr, lp);
  EXPECT_LT(testing::rel_error(dxr, dxp), 1e-14);
  EXPECT_LT(testing::rel_error(dwr, dwp), 1e-14);
  const int64_t tensor_bytes = 128 * 64 * 8;
  EXPECT_GE(held_plain, 4 * tensor_bytes);   // y and what the plain graph saves for the backward
  EXPECT_LE(held_recomputed, tensor_bytes + 256);  // y alone
}

TEST(Autograd, BackwardFromASeedGradient) {
  Tensor x = random_tensor({5}, 13);
  x.set_requires_grad(true);
  Tensor y = ops::scale(x, 3.0);
  Tensor seed = random_tensor({5}, 14);
  backward(y, seed);
  EXPECT_LT(testing::rel_error(x.grad().to_double_vector(), ops::scale(seed, 3.0).to_double_vector()), 1e-15);
  EXPECT_THROW(backward(ops::scale(x, 2.0), random_tensor({4}, 15)), Error);  // seed of another shape
}

TEST(Autograd, GradcheckDetectsAWrongGradient) {
  // A deliberately wrong backward must be caught: gradcheck is not a test that cannot fail.
  auto wrong = [](const std::vector<Tensor>& x) {
    Tensor out = ops::scale(x[0], 1.0).detach();
    record(out, "wrong", {x[0]}, [](const Tensor& g) { return std::vector<Tensor>{ops::scale(g, 2.0)}; });
    return out;
  };
  Tensor x = random_tensor({3}, 5);
  x.set_requires_grad(true);
  EXPECT_FALSE(gradcheck(wrong, {x}).ok);
}

}  // namespace
}  // namespace tg
