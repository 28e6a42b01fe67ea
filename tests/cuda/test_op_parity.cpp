// The CPU/GPU parity table at the op level: every op's forward and input gradients on the GPU
// (f32 and bf16) against its CPU twin (f32), as a relative-norm error with a stated tolerance;
// then the whole model (loss and every gradient) and bitwise determinism on the GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "src/nn/gpt.h"
#include "src/ops/ops.h"
#include "src/optim/adamw.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

#ifdef TILEGRAD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tg {
namespace {

using testing::have_gpu;
using testing::rel_norm;

using OpFn = std::function<Tensor(const std::vector<Tensor>&)>;
struct ParityCase {
  std::string name;
  std::vector<Shape> inputs;
  OpFn op;
  double tol_f32 = 1e-5, tol_bf16 = 2e-2;
};
void PrintTo(const ParityCase& c, std::ostream* os) { *os << c.name; }

std::vector<ParityCase> parity_table() {
  const std::vector<int32_t> ids = {3, 0, 4, 3, 1, 4, 2, 2};
  const std::vector<int32_t> targets = {2, -1, 0, 4, 4, 1, 3, 0};
  std::vector<ParityCase> t;
  t.push_back({"add", {{4, 33}, {4, 33}}, [](auto& x) { return ops::add(x[0], x[1]); }});
  t.push_back({"add_broadcast", {{2, 9, 33}, {33}}, [](auto& x) { return ops::add(x[0], x[1]); }});
  t.push_back({"mul", {{5, 17}, {5, 17}}, [](auto& x) { return ops::mul(x[0], x[1]); }});
  t.push_back({"scale", {{7, 3}}, [](auto& x) { return ops::scale(x[0], -0.37); }});
  t.push_back({"sum", {{37, 5}}, [](auto& x) { return ops::sum(x[0]); }});
  t.push_back({"transpose12", {{2, 3, 4, 40}}, [](auto& x) { return ops::transpose12(x[0]); }});
  t.push_back({"slice_last", {{3, 99}}, [](auto& x) { return ops::slice_last(x[0], 33, 33); }});
  t.push_back({"concat_last", {{4, 9, 16}, {4, 9, 8}}, [](auto& x) { return ops::concat_last({x[0], x[1]}); }});
  for (double base : {0.0, 10000.0}) {
    // d = 64 takes the fused kernel in bf16 (and the materialised fallback in f32).
    t.push_back({std::string("self_attention_flash") + (base > 0 ? "_rope" : ""), {{2, 77, 3 * 128}},
                 [base](auto& x) { return ops::self_attention(x[0], 2, ops::AttentionKind::flash, base); }});
  }
  t.push_back({"embedding", {{5, 24}}, [ids](auto& x) { return ops::embedding(x[0], Tensor::from_ints(ids, {2, 4})); }});
  t.push_back({"linear", {{2, 7, 64}, {48, 64}, {48}}, [](auto& x) { return ops::linear(x[0], x[1], x[2]); }});
  t.push_back({"linear_nobias", {{9, 40}, {24, 40}}, [](auto& x) { return ops::linear(x[0], x[1], Tensor()); }});
  // 384 rows: the fused GELU-backward + bias-sum kernel (two passes); 14 rows: its one-pass fallback.
  t.push_back({"linear_gelu", {{4, 96, 64}, {48, 64}, {48}}, [](auto& x) { return ops::linear_gelu(x[0], x[1], x[2]); }});
  t.push_back({"linear_gelu_small", {{2, 7, 64}, {48, 64}, {48}}, [](auto& x) { return ops::linear_gelu(x[0], x[1], x[2]); }});
  t.push_back({"linear_gelu_nobias", {{9, 40}, {24, 40}}, [](auto& x) { return ops::linear_gelu(x[0], x[1], Tensor()); }});
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Shape sa = ta ? Shape{3, 16, 12} : Shape{3, 12, 16}, sb = tb ? Shape{3, 20, 16} : Shape{3, 16, 20};
      t.push_back({"matmul_t" + std::to_string(ta) + std::to_string(tb), {sa, sb},
                   [ta, tb](auto& x) { return ops::matmul(x[0], x[1], ta, tb); }});
    }
  t.push_back({"gelu", {{3, 71}}, [](auto& x) { return ops::gelu(x[0]); }});
  t.push_back({"layernorm", {{6, 96}, {96}, {96}}, [](auto& x) { return ops::layernorm(x[0], x[1], x[2]); }});
  t.push_back({"layernorm_nobias", {{5, 37}, {37}}, [](auto& x) { return ops::layernorm(x[0], x[1], Tensor()); }});
  t.push_back({"residual+layernorm", {{6, 96}, {96}, {96}}, [](auto& x) {  // dx_add: the residual's gradient
                 Tensor a = ops::scale(x[0], 1.5);
                 return ops::add(a, ops::layernorm(a, x[1], x[2]));
               }});
  t.push_back({"softmax", {{6, 77}}, [](auto& x) { return ops::softmax(x[0]); }});
  t.push_back({"causal_mask+softmax", {{3, 9, 9}}, [](auto& x) { return ops::softmax(ops::causal_mask(x[0])); }});
  t.push_back({"attention_softmax", {{3, 40, 40}}, [](auto& x) { return ops::attention_softmax(x[0], 0.3, false); }});
  t.push_back({"attention_softmax_causal", {{3, 40, 40}}, [](auto& x) { return ops::attention_softmax(x[0], 0.3, true); }});
  t.push_back({"cross_entropy", {{8, 5}}, [targets](auto& x) {
                 return ops::cross_entropy(x[0], Tensor::from_ints(targets, {8}));
               }});
  // The chunked LM head and loss: 8 rows in chunks of 3 (ragged), V 50 (not a multiple of the
  // vector width), and all at once.
  for (int64_t chunk : {3, 0})
    t.push_back({"linear_cross_entropy_chunk" + std::to_string(chunk), {{8, 64}, {50, 64}}, [targets, chunk](auto& x) {
                   return ops::linear_cross_entropy(x[0], x[1], Tensor::from_ints(targets, {8}), chunk);
                 }});
  t.push_back({"dropout", {{4, 50}}, [](auto& x) { return ops::dropout(x[0], 0.25, 42); }});
  t.push_back({"rope", {{2, 7, 3, 16}}, [](auto& x) { return ops::rope(x[0], 10000.0, 3); }});
  for (bool causal : {false, true}) {
    Shape s = {2, 19, 2, 16};
    t.push_back({std::string("attention_naive") + (causal ? "_causal" : ""), {s, s, s},
                 [causal](auto& x) { return ops::attention_naive(x[0], x[1], x[2], causal); }});
  }
  return t;
}

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
