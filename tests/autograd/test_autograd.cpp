// The tape: accumulation for reused tensors, no_grad, graph freed after backward, errors.
#include <gtest/gtest.h>

#include "src/ops/gradcheck.h"
#include "src/nn/parameters.h"
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
  // Saved: the inner GELU's output, which the outer one's backward reads. The outer GELU's output
  // is read by no backward (sum's needs only its shape): a node holds no input's memory, so it
  // was freed when the expression dropped it.
  const int64_t one = 256 * 256 * 8;
  EXPECT_GT(memory_stats(Device::cpu()).current_total, before + one - 1);
  EXPECT_LT(memory_stats(Device::cpu()).current_total, before + 2 * one);
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

// The hand-over is the closure's argument: a closure that takes the gradient another consumer
// already sent to its input returns the total, and the engine stores that instead of adding.
TEST(Autograd, ClosureTakesThePendingGradientFromItsArgument) {
  Tensor x = Tensor::from_vector({1.0, 2.0}, {2}, DType::f64);
  x.set_requires_grad(true);
  Tensor h = ops::scale(x, 1.0);  // a non-leaf used twice
  int took = 0;
  Tensor mine = ops::scale(h, 1.0).detach();
  record(mine, "takes", {h}, [&took](const Tensor& g, GradHandOver& hand_over) {
    Tensor pending = hand_over.take(0);
    EXPECT_FALSE(hand_over.take(0).defined());  // handed over once
    if (!pending.defined()) return std::vector<Tensor>{ops::scale(g, 3.0)};
    ++took;
    return std::vector<Tensor>{ops::add(ops::scale(g, 3.0), pending)};
  });
  // d/dx sum(5h + 3h) = 8: the other consumer (5h) runs first, so its gradient is pending.
  ops::sum(ops::add(mine, ops::scale(h, 5.0))).backward();
  EXPECT_EQ(took, 1);
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{8.0, 8.0}));
}

// A closure that takes the pending gradient and returns none has added both itself (into an
// accumulator, GradHandOver::accumulator): the engine drops what was pending instead of passing
// it on a second time. Here the closure adds nothing, so x gets no gradient from h at all.
TEST(Autograd, ClosureThatTakesAndReturnsNoGradientLeavesNothingPending) {
  Tensor x = Tensor::from_vector({1.0, 2.0}, {2}, DType::f64);
  x.set_requires_grad(true);
  Tensor h = ops::scale(x, 1.0);  // a non-leaf used twice
  Tensor mine = ops::scale(h, 1.0).detach();
  bool took = false;
  record(mine, "takes and keeps", {h}, [&took](const Tensor&, GradHandOver& hand_over) {
    took = hand_over.take(0).defined();
    return std::vector<Tensor>{Tensor()};
  });
  Tensor y = ops::scale(x, 7.0);  // a path to x that does not go through h
  ops::sum(ops::add(ops::add(mine, ops::scale(h, 5.0)), y)).backward();
  EXPECT_TRUE(took);
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{7.0, 7.0}));
}

// complete(i) tells a closure whether it is the last node to read input i: h below is read by two
// recorded nodes, and whichever the walk reaches first sees it incomplete, the second complete.
// A leaf input is never reported complete (its gradient goes to its sink, not to a node).
TEST(Autograd, HandOverSaysWhichReaderOfAnInputIsTheLast) {
  Tensor x = Tensor::from_vector({1.0, 2.0}, {2}, DType::f64);
  x.set_requires_grad(true);
  Tensor h = ops::scale(x, 1.0);  // a non-leaf read twice
  std::vector<std::pair<std::string, bool>> seen;  // (reader, h complete), in the walk's order
  auto reader = [&seen](const std::string& name, const Tensor& in, const Tensor& leaf) {
    Tensor out = ops::scale(in, 1.0).detach();
    record(out, name, {in, leaf}, [&seen, name](const Tensor& g, GradHandOver& hand_over) {
      seen.emplace_back(name, hand_over.complete(0));
      EXPECT_FALSE(hand_over.complete(1)) << "a leaf input";
      return std::vector<Tensor>{g, Tensor()};
    });
    return out;
  };
  Tensor first = reader("a", h, x), second = reader("b", h, x);
  ops::sum(ops::add(first, ops::scale(second, 3.0))).backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_FALSE(seen[0].second) << seen[0].first << " ran first, so h had another reader still to run";
  EXPECT_TRUE(seen[1].second) << seen[1].first << " ran last";
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{4.0, 4.0}));
}

// A cast's backward returns its gradient as it is; the leaf's sink folds it into the leaf's
// gradient of another dtype (here f32 into f64), the small folds batched until the backward ends.
// The ready hook hears of the leaf once, after its fold is added, and a later gradient of the
// leaf's own dtype is added after the waiting fold (the order of the additions is kept).
TEST(Autograd, SinkFoldsConvertedGradientsAndReportsFinalLeavesAfterTheirFolds) {
  auto sink = std::make_shared<GradSink>();
  Tensor x = Tensor::from_vector({0.5, -1.0, 2.0}, {3}, DType::f64);
  x.set_requires_grad(true);
  x.set_grad(Tensor::zeros({3}, DType::f64));
  bind_grad_sink(x, sink);
  EXPECT_EQ(grad_sink_of(x), sink.get());
  std::vector<std::vector<double>> reported;
  {
    GradSink::ReadyScope scope(*sink, [&](const Tensor& leaf) {
      EXPECT_TRUE(leaf.same(x));
      reported.push_back(leaf.grad().to_double_vector());
    });
    EXPECT_TRUE(sink->wants_final());
    // Walked in this order: cast(x) · 3 (a fold that waits), x · x (2x, of x's own dtype: added
    // after the waiting fold), cast(x) · 2 (x's last reader: a fold that waits, so the report
    // waits for the end of the backward).
    Tensor first = ops::sum(ops::scale(ops::cast(x, DType::f32), 2.0));
    Tensor square = ops::cast(ops::sum(ops::mul(x, x)), DType::f32);  // a cast of a non-leaf too
    Tensor last = ops::sum(ops::scale(ops::cast(x, DType::f32), 3.0));
    Tensor loss = ops::add(ops::add(first, square), last);
    loss.backward();
  }
  EXPECT_FALSE(sink->wants_final());
  const std::vector<double> want{5.0 + 1.0, 5.0 - 2.0, 5.0 + 4.0};
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0], want);  // reported with every addition in it
  EXPECT_EQ(x.grad().to_double_vector(), want);
}

// First writes: leaves whose buffers hold garbage but are marked as holding no gradient get the
// first gradient written (the fold of another dtype included), later ones added, in one backward
// and across two (gradient accumulation); a marked leaf that gets no gradient is zeroed when the
// backward ends (a nested one inside it, as tg::checkpoint runs, included).
TEST(Autograd, SinkWritesTheFirstGradientOfAMarkedLeafAndZeroesTheUnwritten) {
  auto sink = std::make_shared<GradSink>();
  auto leaf = [&](std::vector<double> v) {
    Tensor t = Tensor::from_vector(v, {int64_t(v.size())}, DType::f64);
    t.set_requires_grad(true);
    t.set_grad(Tensor::full(t.shape(), 99.0, DType::f64, Device::cpu()));  // garbage, not a gradient
    bind_grad_sink(t, sink);
    return t;
  };
  Tensor x = leaf({1.0, 2.0}), y = leaf({3.0, 4.0}), unused = leaf({5.0}), z = leaf({6.0, 7.0});
  sink->expect_first_writes({x, y, unused});
  // x: 2x (its own dtype) then 3 (a folded cast); y: 5 (only a fold); z not marked: added to 99.
  const auto f32 = [](const Tensor& t) { return ops::cast(t, DType::f32); };
  ops::add(ops::add(f32(ops::sum(ops::mul(x, x))), ops::sum(ops::scale(f32(x), 3.0))),
           ops::add(ops::sum(ops::scale(f32(y), 5.0)), f32(ops::sum(z))))
      .backward();
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{5.0, 7.0}));
  EXPECT_EQ(y.grad().to_double_vector(), (std::vector<double>{5.0, 5.0}));
  EXPECT_EQ(unused.grad().to_double_vector(), (std::vector<double>{0.0}));
  EXPECT_EQ(z.grad().to_double_vector(), (std::vector<double>{100.0, 100.0}));
  ops::sum(ops::scale(x, 2.0)).backward();  // a second backward adds
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{7.0, 9.0}));

  x.set_grad(Tensor::full({2}, 99.0, DType::f64, Device::cpu()));
  y.set_grad(Tensor::full({2}, 99.0, DType::f64, Device::cpu()));
  sink->expect_first_writes({x, y});
  // With a nested backward (the checkpoint's second run) inside the outer one: x's first gradient
  // is written, and y, which gets none, is zeroed by the end of the backward.
  Tensor inner = checkpoint([](const std::vector<Tensor>& in) { return ops::scale(in[0], 4.0); }, {x});
  ops::sum(ops::add(inner, ops::scale(x, 0.0))).backward();
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{4.0, 4.0}));
  EXPECT_EQ(y.grad().to_double_vector(), (std::vector<double>{0.0, 0.0}));
}

// A backward that throws leaves no waiting fold behind for the next one to add.
TEST(Autograd, SinkDropsWaitingFoldsWhenABackwardThrows) {
  auto sink = std::make_shared<GradSink>();
  Tensor x = Tensor::from_vector({1.0, 1.0}, {2}, DType::f64);
  x.set_requires_grad(true);
  x.set_grad(Tensor::zeros({2}, DType::f64));
  bind_grad_sink(x, sink);
  Tensor y = Tensor::from_vector({1.0, 1.0}, {2}, DType::f32);
  y.set_requires_grad(true);
  Tensor t = ops::scale(y, 1.0).detach();
  record(t, "throws", {y}, [](const Tensor&) -> std::vector<Tensor> { TG_CHECK(false, "backward failed"); });
  // The cast's node runs before the throwing one (the add's second input is walked first).
  EXPECT_THROW(ops::sum(ops::add(t, ops::cast(x, DType::f32))).backward(), Error);
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{0.0, 0.0}));
  ops::sum(ops::cast(x, DType::f32)).backward();
  EXPECT_EQ(x.grad().to_double_vector(), (std::vector<double>{1.0, 1.0}));
}

// Every parameter of a store sends its gradient to the store's one sink, into the flat buffer.
TEST(Autograd, ParameterStoreBindsEveryParameterToItsSink) {
  nn::ParameterStore store;
  store.declare("w", {2, 3}, nn::Init::normal);
  store.declare("b", {2}, nn::Init::ones);
  store.allocate(7);
  for (const nn::Parameter& p : store.all()) EXPECT_EQ(grad_sink_of(p.value), &store.grad_sink()) << p.name;
  int reports = 0;
  {
    GradSink::ReadyScope scope(store.grad_sink(), [&](const Tensor&) { ++reports; });
    ops::sum(ops::linear(Tensor::full({4, 3}, 1.0), store.get("w"), store.get("b"))).backward();
  }
  EXPECT_EQ(reports, 2);
  const std::vector<double> flat = store.flat_grads().to_double_vector();
  ASSERT_EQ(flat.size(), 8u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(flat[size_t(i)], 4.0) << i;  // dW: four rows of ones
  for (int i = 6; i < 8; ++i) EXPECT_EQ(flat[size_t(i)], 4.0) << i;  // db: four rows
}

}  // namespace
}  // namespace tg
