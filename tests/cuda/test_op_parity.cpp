// The CPU/GPU parity table at the op level: every op's forward and input gradients on the GPU
// (f32 and bf16) against its CPU twin (f32), as a relative-norm error with a stated tolerance —
// the GPU rows of the op specification (tests/op_specs.h); then the whole model (loss and every
// gradient) and bitwise determinism on the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "src/nn/gpt.h"
#include "src/ops/ops.h"
#include "src/optim/adamw.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/op_specs.h"
#include "tests/test_util.h"

#ifdef TILEGRAD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tg {
namespace {

using testing::have_gpu;
using testing::rel_norm;

using testing::GpuSample;

// The GPU rows of the op specification (tests/op_specs.h), in its order.
std::vector<GpuSample> parity_table() {
  std::vector<GpuSample> t;
  for (const testing::OpSpec& s : testing::op_specs()) t.insert(t.end(), s.gpu.begin(), s.gpu.end());
  return t;
}
using ParityCase = GpuSample;

struct OpRun {
  std::vector<double> out;
  std::vector<std::vector<double>> grads;
};

// Runs the op on inputs (in `dtype` on `device`), backpropagates Σ out ∘ W, returns host values.
OpRun run_case(const ParityCase& c, Device device, DType dtype) {
  std::vector<Tensor> xs;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    Tensor host = testing::random_tensor(c.inputs[i], 200 + i, DType::f32);
    // Round through bf16 on both sides, so only the op's own error is measured.
    host = host.to(DType::bf16).to(DType::f32);
    Tensor x = host.to(device);
    if (dtype != DType::f32) x = x.to(dtype);
    x.set_requires_grad(true);
    xs.push_back(x);
  }
  Tensor out = c.op(xs);
  Tensor w = testing::random_tensor(out.shape(), 7, DType::f32).to(DType::bf16).to(DType::f32).to(device);
  if (out.dtype() != DType::f32) w = w.to(out.dtype());
  ops::sum(ops::mul(out, w)).backward();
  OpRun r;
  r.out = out.to_double_vector();
  for (const Tensor& x : xs) r.grads.push_back(x.grad().defined() ? x.grad().to_double_vector() : std::vector<double>());
  return r;
}

class OpParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(OpParity, GpuMatchesCpu) {
  REQUIRE_GPU();
  const ParityCase& c = GetParam();
  OpRun cpu = run_case(c, Device::cpu(), DType::f32);
  for (DType dt : {DType::f32, DType::bf16}) {
    const double tol = dt == DType::f32 ? c.tol_f32 : c.tol_bf16;
    OpRun gpu = run_case(c, Device::cuda(0), dt);
    EXPECT_LT(rel_norm(gpu.out, cpu.out), tol) << c.name << " forward in " << dtype_name(dt);
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      if (cpu.grads[i].empty()) continue;
      ASSERT_EQ(gpu.grads[i].size(), cpu.grads[i].size());
      EXPECT_LT(rel_norm(gpu.grads[i], cpu.grads[i]), tol) << c.name << " gradient of input " << i << " in "
                                                           << dtype_name(dt);
    }
    for (double v : gpu.out) ASSERT_FALSE(std::isnan(v)) << c.name << " produced NaN";
  }
}

INSTANTIATE_TEST_SUITE_P(Ops, OpParity, ::testing::ValuesIn(parity_table()),
                         [](const ::testing::TestParamInfo<ParityCase>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n) if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

nn::GPTConfig small_gpt() {
  nn::GPTConfig c;
  c.n_layer = 2; c.n_head = 4; c.d_model = 64; c.vocab_size = 97; c.max_seq_len = 32;
  return c;
}

std::pair<Tensor, Tensor> tokens(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::vector<int32_t> a(static_cast<size_t>(B * T)), b(static_cast<size_t>(B * T));
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = int32_t(nn::normal_from(seed, 1, i) * 1000 + 100000) % int32_t(V);
    b[i] = int32_t(nn::normal_from(seed, 2, i) * 1000 + 100000) % int32_t(V);
  }
  return {Tensor::from_ints(a, {B, T}), Tensor::from_ints(b, {B, T})};
}

TEST(ModelParity, LossAndEveryGradientMatchTheCpu) {
  REQUIRE_GPU();
  for (auto pos : {nn::PosEmbedding::learned, nn::PosEmbedding::rope}) {
    nn::GPTConfig c = small_gpt();
    c.pos_embedding = pos;
    auto [ids, tgt] = tokens(3, 32, c.vocab_size, 5);
    nn::GPT cpu(c, 11);
    Tensor lc = cpu.loss(ids, tgt);
    lc.backward();
    for (DType compute : {DType::f32, DType::bf16}) {
      nn::GPT gpu(c, 11, DType::f32, Device::cuda(0), compute);
      Tensor lg = gpu.loss(ids, tgt);
      lg.backward();
      const double tol = compute == DType::f32 ? 1e-4 : 3e-2;
      EXPECT_NEAR(lg.item(), lc.item(), compute == DType::f32 ? 1e-4 : 2e-2) << dtype_name(compute);
      for (const nn::Parameter& p : cpu.params().all()) {
        Tensor gg = gpu.params().get(p.name).grad();
        EXPECT_LT(rel_norm(gg.to_double_vector(), p.value.grad().to_double_vector()), tol)
            << p.name << " in " << dtype_name(compute);
      }
    }
  }
}

std::vector<double> train_losses(Device device, DType compute, int steps) {
  nn::GPTConfig c = small_gpt();
  c.dropout = 0.1;
  nn::GPT model(c, 3, DType::f32, device, compute);
  optim::AdamW opt(model.params(), {0.9, 0.95, 1e-8, 0.1});
  std::vector<double> losses;
  auto [ids, tgt] = tokens(4, 32, c.vocab_size, 1);  // one batch, repeated: the loss must fall
  for (int s = 0; s < steps; ++s) {
    model.params().zero_grad();
    Tensor l = model.loss(ids, tgt);
    l.backward();
    optim::clip_grad_norm(model.params(), 1.0);
    opt.step(1e-3);
    losses.push_back(l.item());
  }
  return losses;
}

TEST(GpuDeterminism, SameSeedGivesBitwiseEqualLosses) {
  REQUIRE_GPU();
  for (DType compute : {DType::f32, DType::bf16}) {
    std::vector<double> a = train_losses(Device::cuda(0), compute, 15), b = train_losses(Device::cuda(0), compute, 15);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i << " in " << dtype_name(compute);
  }
}

TEST(GpuTraining, Bf16TrainingTracksTheCpu) {
  REQUIRE_GPU();
  std::vector<double> cpu = train_losses(Device::cpu(), DType::f32, 30);
  std::vector<double> gpu = train_losses(Device::cuda(0), DType::bf16, 30);
  EXPECT_LT(gpu.back(), gpu.front() - 0.3) << "bf16 training does not learn";
  EXPECT_NEAR(gpu.back(), cpu.back(), 0.1);
}

TEST(GpuMemory, CountersTrackTheAllocatorAndCudaAgrees) {
  REQUIRE_GPU();
#ifdef TILEGRAD_HAVE_CUDA
  const Device dev = Device::cuda(0);
  const int64_t before = memory_stats(dev).current_total;
  const int64_t bytes = int64_t(1) << 30;
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  {
    MemoryCategoryScope scope(MemCategory::workspace);
    Tensor t = Tensor::zeros({bytes / 4}, DType::f32, dev);
    EXPECT_EQ(memory_stats(dev).current_total - before, bytes);
    EXPECT_GE(memory_stats(dev).current[size_t(MemCategory::workspace)], bytes);
    size_t free1 = 0;
    ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
    // The pool may have had the block cached already; it can never hold less than we count.
    EXPECT_GE(int64_t(total - free1), memory_stats(dev).current_total);
  }
  EXPECT_EQ(memory_stats(dev).current_total, before);
#endif
}

}  // namespace
}  // namespace tg
