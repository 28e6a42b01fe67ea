// The memory model (src/trainer/memory_model.h) on the GPU: one bf16 training step of a small GPT
// (head dim 64, GPT-2's vocabulary) at T = 1024 … 16384, measured by the memory accounting from
// before the model is built, against the prediction for "cuda" — the dtype rules (bf16
// activations, fp32 statistics, the bf16 compute copy, the head's dW summed in fp32) and the
// GPU's fused self-attention, which reads q, k, v out of qkv. Within 5 % at every T, as on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "src/nn/gpt.h"
#include "src/optim/adamw.h"
#include "src/tensor/memory.h"
#include "src/trainer/memory_model.h"
#include "src/trainer/state.h"
#include "tests/cuda/cuda_test_util.h"

namespace tg {
namespace {

MemoryStats measure_gpu_step(const Config& cfg) {
  const Device device = Device::cuda(0);
  const DType compute = cfg.train.precision == "bf16" ? DType::bf16 : DType::f32;
  device_synchronize(device);
  reset_peak_memory(device);
  MemoryStats stats;
  {
    nn::GPT model(gpt_config_from(cfg.model), uint64_t(cfg.train.seed), DType::f32, device, compute);
    model.set_lm_head_chunk(cfg.train.lm_head_chunk);
    model.set_recompute(cfg.train.recompute);
    model.set_recompute_rows(cfg.train.recompute_rows);
    model.set_offload_activations(cfg.train.offload_activations);
    optim::AdamW opt(model.params(), {cfg.train.beta1, cfg.train.beta2, cfg.train.eps, cfg.train.weight_decay});
    const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len, V = cfg.model.vocab_size;
    std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
    for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 7919 + 13) % size_t(V)), y[i] = int32_t((i * 104729 + 5) % size_t(V));
    const Tensor ids = Tensor::from_ints(x, {B, T}).to(device), tgt = Tensor::from_ints(y, {B, T}).to(device);
    model.params().zero_grad();
    Tensor l = model.loss(ids, tgt);
    l.backward();
    opt.step(1e-3, optim::clip_factor(optim::grad_norm(model.params()), 1.0));
    EXPECT_TRUE(std::isfinite(l.item()));
    device_synchronize(device);
    stats = memory_stats(device);
  }
  return stats;
}

TEST(MemoryModelGpu, PredictsTheMeasuredBf16PeakWithinFivePercent) {
  REQUIRE_GPU();
  struct Variant {
    const char* name;
    const char* pos;
    const char* attention;
    const char* precision;
    int chunk;
    bool recompute;
    int64_t max_t;
    int rows = 0;          // train.recompute_rows
    bool offload = false;  // train.offload_activations
  };
  const std::vector<Variant> variants = {
      {"bf16 learned, recompute + chunk 1024", "learned", "flash", "bf16", 1024, true, 16384},
      {"bf16 rope, recompute + chunk 1024", "rope", "flash", "bf16", 1024, true, 16384},
      {"bf16 rope, whole head", "rope", "flash", "bf16", 0, false, 8192},
      {"bf16 learned, chunk 2048", "learned", "flash", "bf16", 2048, false, 16384},
      {"bf16 materialised", "rope", "naive", "bf16", 0, false, 2048},
      {"fp32 (materialised fallback), chunk 512", "learned", "flash", "fp32", 512, false, 2048},
      {"bf16 rope, recompute + chunk 1024, pieces 4096", "rope", "flash", "bf16", 1024, true, 65536, 4096},
      {"bf16 rope, recompute, pieces 4096, offload", "rope", "flash", "bf16", 1024, true, 65536, 4096, true},
      {"bf16 rope, recompute + chunk 1024, offload", "rope", "flash", "bf16", 1024, true, 65536, 0, true},
  };
  for (const Variant& v : variants) {
    for (int64_t T = 1024; T <= v.max_t; T *= 2) {
      Config c;
      c.model.n_layer = 2, c.model.n_head = 4, c.model.d_model = 256, c.model.vocab_size = 50304;
      c.model.pos_embedding = v.pos, c.model.attention = v.attention, c.model.max_seq_len = int(T);
      c.train.batch_size = 1, c.train.seq_len = int(T), c.train.lm_head_chunk = v.chunk, c.train.recompute = v.recompute;
      c.train.recompute_rows = v.rows, c.train.offload_activations = v.offload;
      c.train.precision = v.precision;
      const MemoryPrediction p = predict_memory(c, "cuda");
      const MemoryStats m = measure_gpu_step(c);
      const double err = double(p.total - m.peak_total) / double(m.peak_total);
      std::printf("%-42s T %6lld  measured %12lld B  predicted %12lld B (%+.3f %%, %s)  workspace %lld / %lld B\n",
                  v.name, (long long)T, (long long)m.peak_total, (long long)p.total, 100 * err, p.peak_phase.c_str(),
                  (long long)m.peak[size_t(MemCategory::workspace)], (long long)p.workspace_peak);
      EXPECT_LE(std::abs(err), 0.05) << v.name << " at T " << T;
      EXPECT_EQ(p.params, m.peak[size_t(MemCategory::params)]) << v.name;
      EXPECT_EQ(p.grads, m.peak[size_t(MemCategory::grads)]) << v.name;
      EXPECT_EQ(p.optimizer, m.peak[size_t(MemCategory::optimizer)]) << v.name;
    }
  }
}

}  // namespace
}  // namespace tg
