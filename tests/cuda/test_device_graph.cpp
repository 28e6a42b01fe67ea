// DeviceGraph: a recorded function's device work replays on the values its inputs hold at replay
// time, a model's forward and backward replayed equals the launched one bit for bit, and what
// cannot be recorded (a copy from host memory) is refused with the reason.
#include <gtest/gtest.h>

#include <string>

#include "src/nn/gpt.h"
#include "src/ops/ops.h"
#include "src/tensor/device_graph.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

namespace tg {
namespace {

TEST(DeviceGraph, ReplaysOnTheInputsCurrentValues) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor x = Tensor::from_vector({1, 2, 3, 4}, {4}).to(gpu);
  Tensor y = Tensor::zeros({4}, DType::f32, gpu);
  DeviceGraph graph = DeviceGraph::capture(gpu, [&] { y.copy_from(ops::scale(ops::add(x, x), 0.5)); });
  EXPECT_EQ(y.to_double_vector(), std::vector<double>({0, 0, 0, 0})) << "recording must not run the work";
  graph.replay();
  EXPECT_EQ(y.to_double_vector(), std::vector<double>({1, 2, 3, 4}));
  x.copy_from(Tensor::from_vector({-1, 5, 0.5, 8}, {4}));
  graph.replay();
  EXPECT_EQ(y.to_double_vector(), std::vector<double>({-1, 5, 0.5, 8}));
}

// With the whole LM head at once and a chunk of rows at a time (the head's backward inside the
// forward); head dim 32, so the fused attention kernels run.
class DeviceGraphModel : public ::testing::TestWithParam<int64_t> {};

TEST_P(DeviceGraphModel, ForwardAndBackwardReplayedEqualLaunched) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  nn::GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.d_model = 64, c.vocab_size = 96, c.max_seq_len = 32;
  nn::GPT model(c, 7, DType::f32, gpu, DType::bf16);
  model.set_lm_head_chunk(GetParam());
  const int64_t B = 2, T = 32;
  auto batch = [&](int seed) {
    std::vector<int32_t> ids(size_t(B * T));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 37 + size_t(seed) * 11) % size_t(c.vocab_size));
    return Tensor::from_ints(ids, {B, T}).to(gpu);
  };
  Tensor loss = Tensor::zeros({1}, DType::f32, gpu);
  Tensor x = Tensor::zeros({B, T}, DType::i32, gpu), y = Tensor::zeros({B, T}, DType::i32, gpu);
  auto forward_backward = [&] {
    model.params().zero_grad();
    Tensor l = model.loss(x, y);
    loss.copy_from(l);
    l.backward();
  };
  // Launched: two batches' losses and gradients.
  std::vector<Tensor> launched;  // on the host
  for (int s : {1, 2}) {
    x.copy_from(batch(s)), y.copy_from(batch(s + 5));
    forward_backward();
    launched.push_back(loss.to(Device::cpu()));
    launched.push_back(model.params().flat_grads().to(Device::cpu()));
  }
  DeviceGraph graph = DeviceGraph::capture(gpu, forward_backward);
  std::vector<Tensor> replayed;
  for (int s : {1, 2}) {
    x.copy_from(batch(s)), y.copy_from(batch(s + 5));
    graph.replay();
    replayed.push_back(loss.to(Device::cpu()));
    replayed.push_back(model.params().flat_grads().to(Device::cpu()));
  }
  ASSERT_EQ(replayed.size(), launched.size());
  for (size_t i = 0; i < launched.size(); ++i)
    EXPECT_TRUE(testing::bitwise_equal(replayed[i], launched[i])) << (i % 2 ? "gradients" : "loss") << " of batch " << i / 2;
  EXPECT_FALSE(testing::bitwise_equal(launched[1], launched[3])) << "the two batches must give different gradients";
}

INSTANTIATE_TEST_SUITE_P(LmHead, DeviceGraphModel, ::testing::Values(int64_t(0), int64_t(24)),
                         [](const ::testing::TestParamInfo<int64_t>& i) {
                           return i.param ? "chunk" + std::to_string(i.param) : std::string("whole");
                         });

// Tensor::full on the GPU: a fill kernel for f32 and bf16 (what a graph may record: the
// backward's seed), the host's values copied for the other dtypes; each element the value.
TEST(DeviceGraph, FullOnTheGpuHoldsTheValueInEveryDtype) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  for (DType dt : {DType::f32, DType::bf16, DType::f64, DType::i32})
    for (int64_t n : {1, 7, 4099}) {
      const Tensor t = Tensor::full({n}, 3.0, dt, gpu);
      EXPECT_EQ(t.to_double_vector(), std::vector<double>(size_t(n), 3.0)) << dtype_name(dt) << " × " << n;
    }
  Tensor seed = Tensor::zeros({5}, DType::f32, gpu);
  DeviceGraph graph = DeviceGraph::capture(gpu, [&] { seed.copy_from(Tensor::full({5}, -1.5, DType::f32, gpu)); });
  graph.replay();
  EXPECT_EQ(seed.to_double_vector(), std::vector<double>(5, -1.5));
}

TEST(DeviceGraph, ACopyFromHostMemoryIsRefusedWhileRecording) {
  REQUIRE_GPU();
  const Device gpu = Device::cuda(0);
  Tensor y = Tensor::zeros({3}, DType::f32, gpu);
  try {
    (void)DeviceGraph::capture(gpu, [&] { y.copy_from(Tensor::from_vector({1, 2, 3}, {3})); });
    FAIL() << "a copy from host memory was recorded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("from host memory"), std::string::npos) << e.what();
  }
  // The stream is usable afterwards.
  y.copy_from(Tensor::from_vector({1, 2, 3}, {3}));
  EXPECT_EQ(y.to_double_vector(), std::vector<double>({1, 2, 3}));
}

}  // namespace
}  // namespace tg
