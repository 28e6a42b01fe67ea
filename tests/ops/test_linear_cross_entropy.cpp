// The chunked LM head and loss (ops::linear_cross_entropy) against the two ops it replaces,
// cross_entropy(linear(x, W)): the same loss and gradients at every chunk size, the upstream
// gradient, no-gradient and all-ignored cases, the memory it holds, and its errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/ops/ops.h"
#include "src/tensor/memory.h"
#include "tests/test_util.h"

namespace tg {
namespace {

using testing::random_tensor;
using testing::rel_error;

struct LossAndGrads {
  double loss;
  std::vector<double> dx, dw;
};

// loss · upstream, backpropagated; the composite (chunk < 0) or the chunked op.
LossAndGrads run(const Tensor& x0, const Tensor& w0, const Tensor& targets, int64_t chunk, double upstream = 1.0) {
  Tensor x = x0.clone(), w = w0.clone();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor loss = chunk < 0 ? ops::cross_entropy(ops::linear(x, w, Tensor()), targets)
                          : ops::linear_cross_entropy(x, w, targets, chunk);
  const double value = loss.item();
  (upstream == 1.0 ? loss : ops::scale(loss, upstream)).backward();
  return {value, x.grad().to_double_vector(), w.grad().to_double_vector()};
}

Tensor targets_for(int64_t N, int64_t V, uint64_t seed, int ignored_every = 4) {
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n)
    t[size_t(n)] = n % ignored_every == 1 ? -1 : int32_t((uint64_t(n) * 2654435761u + seed) % uint64_t(V));
  return Tensor::from_ints(t, {N});
}

TEST(LinearCrossEntropy, MatchesTheCompositeAtEveryChunkSize) {
  const int64_t N = 13, C = 8, V = 37;
  const Tensor x = random_tensor({N, C}, 1), w = random_tensor({V, C}, 2, DType::f64, 0.5);
  const Tensor targets = targets_for(N, V, 7);
  const LossAndGrads ref = run(x, w, targets, -1);
  for (int64_t chunk : {1, 2, 5, 12, 13, 40, 0}) {
    SCOPED_TRACE("chunk_rows " + std::to_string(chunk));
    const LossAndGrads got = run(x, w, targets, chunk);
    EXPECT_NEAR(got.loss, ref.loss, 1e-13 * std::abs(ref.loss));
    EXPECT_LT(rel_error(got.dx, ref.dx), 1e-13);
    EXPECT_LT(rel_error(got.dw, ref.dw), 1e-13);
  }
}

TEST(LinearCrossEntropy, UpstreamGradientScalesBothGradients) {
  const int64_t N = 9, C = 4, V = 11;
  const Tensor x = random_tensor({N, C}, 3), w = random_tensor({V, C}, 4);
  const Tensor targets = targets_for(N, V, 5);
  const LossAndGrads ref = run(x, w, targets, -1, -2.5), got = run(x, w, targets, 4, -2.5);
  EXPECT_LT(rel_error(got.dx, ref.dx), 1e-13);
  EXPECT_LT(rel_error(got.dw, ref.dw), 1e-13);
}

TEST(LinearCrossEntropy, OnlyTheInputsThatNeedAGradientGetOne) {
  const int64_t N = 6, C = 4, V = 9;
  const Tensor targets = targets_for(N, V, 2);
  Tensor x = random_tensor({N, C}, 5), w = random_tensor({V, C}, 6);
  w.set_requires_grad(true);  // x does not need one (an embedding-free test head)
  ops::linear_cross_entropy(x, w, targets, 4).backward();
  EXPECT_FALSE(x.grad().defined());
  const LossAndGrads ref = run(x, w, targets, -1);
  EXPECT_LT(rel_error(w.grad().to_double_vector(), ref.dw), 1e-13);
  {
    NoGradGuard no_grad;  // evaluation: the loss alone, nothing recorded
    Tensor xg = x.clone(), wg = w.clone();
    xg.set_requires_grad(true);
    Tensor loss = ops::linear_cross_entropy(xg, wg, targets, 2);
    EXPECT_FALSE(loss.requires_grad());
    EXPECT_NEAR(loss.item(), ref.loss, 1e-13 * std::abs(ref.loss));
  }
}

TEST(LinearCrossEntropy, AllRowsIgnoredGivesZeroLossAndZeroGradients) {
  const int64_t N = 5, C = 3, V = 7;
  const Tensor targets = Tensor::from_ints(std::vector<int32_t>(size_t(N), -1), {N});
  const LossAndGrads got = run(random_tensor({N, C}, 8), random_tensor({V, C}, 9), targets, 2);
  EXPECT_EQ(got.loss, 0.0);
  for (double v : got.dx) EXPECT_EQ(v, 0.0);
  for (double v : got.dw) EXPECT_EQ(v, 0.0);
}

// The point of the op: only a chunk of logits (and one of their gradients) is ever allocated,
// where the composite allocates all N·V logits and their gradient.
TEST(LinearCrossEntropy, HoldsOnlyAChunkOfLogits) {
  const int64_t N = 256, C = 16, V = 1000, chunk = 32;
  const Tensor x = random_tensor({N, C}, 10), w = random_tensor({V, C}, 11);
  const Tensor targets = targets_for(N, V, 3);
  const int64_t logits_bytes = N * V * int64_t(sizeof(double));
  reset_peak_memory(Device::cpu());
  run(x, w, targets, -1);
  const MemoryStats composite = memory_stats(Device::cpu());
  EXPECT_GE(composite.largest_allocation, logits_bytes);
  reset_peak_memory(Device::cpu());
  run(x, w, targets, chunk);
  const MemoryStats chunked = memory_stats(Device::cpu());
  EXPECT_LE(chunked.largest_allocation, chunk * V * int64_t(sizeof(double)));
  EXPECT_LT(chunked.peak_total - chunked.current_total, composite.peak_total - composite.current_total - logits_bytes);
}

TEST(LinearCrossEntropy, BadInputsNameTheOpAndTheProblem) {
  const Tensor x = random_tensor({4, 3}, 12), w = random_tensor({6, 3}, 13);
  auto expect_error = [](auto&& call, const std::vector<std::string>& parts) {
    try {
      call();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const std::string& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  expect_error([&] { ops::linear_cross_entropy(x, w, targets_for(4, 6, 1), -3); }, {"linear_cross_entropy", "chunk_rows is -3"});
  expect_error([&] { ops::linear_cross_entropy(x, w, targets_for(3, 6, 1), 2); }, {"linear_cross_entropy", "targets", "[4]"});
  expect_error([&] { ops::linear_cross_entropy(x.view({2, 2, 3}), w, targets_for(4, 6, 1), 2); },
               {"linear_cross_entropy", "(N, C)"});
  expect_error([&] { ops::linear_cross_entropy(x, random_tensor({6, 5}, 14), targets_for(4, 6, 1), 2); },
               {"linear_cross_entropy", "last dimension 3"});
  expect_error([&] { ops::linear_cross_entropy(x, w, Tensor::from_ints({1, 2, 6, 0}, {4}), 2); },
               {"linear_cross_entropy", "target 6", "row 2"});
}

}  // namespace
}  // namespace tg
