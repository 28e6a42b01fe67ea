// The memory model (src/trainer/memory_model.h) against the memory accounting's measured peak of
// real training steps on the CPU (fp32): a tiny GPT at T = 256 … 4096, with and without
// recompute and the chunked head, learned and rotary positions, the fused and the materialised
// attention. The prediction must be within 5 % of the measured peak at every T, as
// `tilegrad bench memory --predict` prints it; the categories are reported beside it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cpu/adamw.h"
#include "src/data/prepare.h"
#include "src/nn/gpt.h"
#include "src/optim/adamw.h"
#include "src/trainer/memory_model.h"
#include "src/trainer/state.h"
#include "src/trainer/trainer.h"

#ifndef TILEGRAD_SOURCE_DIR
#define TILEGRAD_SOURCE_DIR "."
#endif

namespace tg {
namespace {

// The peak of everything from before the model is built through a training step (forward,
// backward, clipped AdamW) on random tokens: what `tilegrad bench memory` measures.
MemoryStats measure_steps(const Config& cfg) {
  const Device device = Device::cpu();
  reset_peak_memory(device);
  MemoryStats stats;
  {
    nn::GPT model(gpt_config_from(cfg.model), uint64_t(cfg.train.seed), DType::f32, device, DType::f32);
    model.set_lm_head_chunk(cfg.train.lm_head_chunk);
    model.set_recompute(cfg.train.recompute);
    model.set_recompute_rows(cfg.train.recompute_rows);
    optim::AdamW opt(model.params(), {cfg.train.beta1, cfg.train.beta2, cfg.train.eps, cfg.train.weight_decay});
    const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len, V = cfg.model.vocab_size;
    std::vector<int32_t> x(size_t(B * T)), y(size_t(B * T));
    for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 7919 + 13) % size_t(V)), y[i] = int32_t((i * 104729 + 5) % size_t(V));
    const Tensor ids = Tensor::from_ints(x, {B, T}), tgt = Tensor::from_ints(y, {B, T});
    {  // one step: AdamW's state exists from its construction, so the first step is the largest
      model.params().zero_grad();
      Tensor l = model.loss(ids, tgt);
      l.backward();
      opt.step(1e-3, optim::clip_factor(optim::grad_norm(model.params()), 1.0));
      EXPECT_TRUE(std::isfinite(l.item()));
    }
    stats = memory_stats(device);
  }
  return stats;
}

struct Variant {
  const char* name;
  const char* pos;
  const char* attention;
  int chunk;
  bool recompute;
  int batch;
  int64_t max_t;
  double dropout = 0.0;
  int rows = 0;  // train.recompute_rows
};

Config tiny(const Variant& v, int64_t T) {
  Config c;
  c.model.n_layer = 2;
  c.model.n_head = 4;
  c.model.d_model = 64;
  c.model.vocab_size = 256;
  c.model.pos_embedding = v.pos;
  c.model.attention = v.attention;
  c.model.max_seq_len = int(T);
  c.model.dropout = v.dropout;
  c.train.batch_size = v.batch;
  c.train.seq_len = int(T);
  c.train.lm_head_chunk = v.chunk;
  c.train.recompute = v.recompute;
  c.train.recompute_rows = v.rows;
  c.train.precision = "fp32";
  return c;
}

double mib(int64_t b) { return double(b) / double(1 << 20); }

TEST(MemoryModel, PredictsTheMeasuredCpuPeakWithinFivePercent) {
  const std::vector<Variant> variants = {
      {"rope, plain", "rope", "flash", 0, false, 1, 4096},
      {"rope, recompute + chunk 256", "rope", "flash", 256, true, 1, 4096},
      {"rope, recompute", "rope", "flash", 0, true, 1, 4096},
      {"rope, chunk 512", "rope", "flash", 512, false, 1, 4096},
      {"learned, plain", "learned", "flash", 0, false, 1, 4096},
      {"learned, recompute + chunk 128, B 2", "learned", "flash", 128, true, 2, 4096},
      {"rope, dropout 0.1, chunk 256", "rope", "flash", 256, false, 1, 2048, 0.1},
      {"learned, dropout 0.1, recompute", "learned", "flash", 0, true, 1, 2048, 0.1},
      {"materialised, rope", "rope", "naive", 0, false, 1, 512},
      {"materialised, learned, recompute + chunk 256", "learned", "naive", 256, true, 1, 512},
      {"rope, recompute + chunk 256, pieces 128", "rope", "flash", 256, true, 1, 4096, 0.0, 128},
      {"rope, recompute + chunk 1024, pieces 1000", "rope", "flash", 1024, true, 1, 4096, 0.0, 1000},
      {"learned, chunk 128, pieces 64, B 2", "learned", "flash", 128, false, 2, 2048, 0.0, 64},
      {"materialised, rope, recompute, pieces 128", "rope", "naive", 256, true, 1, 512, 0.0, 128},
  };
  for (const Variant& v : variants) {
    for (int64_t T = 256; T <= v.max_t; T *= 2) {
      const Config c = tiny(v, T);
      const MemoryPrediction p = predict_memory(c, "cpu");
      const MemoryStats m = measure_steps(c);
      const double err = double(p.total - m.peak_total) / double(m.peak_total);
      std::printf("%-45s T %5lld  measured %10lld B  predicted %10lld B (%+lld B, %+.3f %%, %s)  activations %.3f / %.3f MiB\n",
                  v.name, (long long)T, (long long)m.peak_total, (long long)p.total, (long long)(p.total - m.peak_total), 100 * err, p.peak_phase.c_str(),
                  mib(m.peak[size_t(MemCategory::activations)]), mib(p.activations));
      EXPECT_LE(std::abs(err), 0.05) << v.name << " at T " << T << ": predicted " << p.total << " B, measured "
                                     << m.peak_total << " B";
      // The categories that do not depend on the step are exact.
      EXPECT_EQ(p.params, m.peak[size_t(MemCategory::params)]) << v.name << " T " << T;
      EXPECT_EQ(p.grads, m.peak[size_t(MemCategory::grads)]) << v.name << " T " << T;
      EXPECT_EQ(p.optimizer, m.peak[size_t(MemCategory::optimizer)]) << v.name << " T " << T;
      EXPECT_EQ(p.workspace_peak, m.peak[size_t(MemCategory::workspace)]) << v.name << " T " << T;
    }
  }
}

namespace fs = std::filesystem;

const std::string kTinyConfig = std::string(TILEGRAD_SOURCE_DIR) + "/configs/long-tiny.yaml";

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("tilegrad_memory_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(MemoryModel, GpuBf16FollowsTheDtypeRules) {
  // The same model on the GPU in bf16: activations in 2 bytes, statistics in 4, the bf16 compute
  // copy of the parameters, the tied head's dW waiting for wte's conversion.
  Config c = tiny({"", "rope", "flash", 4096, true, 1, 0}, 65536);
  c.model.n_layer = 12, c.model.n_head = 12, c.model.d_model = 768, c.model.vocab_size = 50304;
  c.train.precision = "bf16";
  const MemoryPrediction gpu = predict_memory(c, "cuda");
  const int64_t P = gpu.parameter_count, N = 65536, C = 768, u = N * C * 2;
  EXPECT_EQ(gpu.compute_copy, 2 * P);
  EXPECT_EQ(gpu.saved_per_block, 18 * u + 2 * 2 * N * 4 + 12 * N * 4) << "16 units, RoPE's q and k, fp32 statistics";
  EXPECT_EQ(gpu.peak_phase, "recomputed block backward");
  // The block's backward: its working set is 2 units above the block's tensors less its output
  // (no GELU output gradient: ops::mlp forms the pre-activation's in its GEMM), and c_fc's bias
  // gradient (its weight's goes straight into fp32).
  EXPECT_EQ(gpu.activations, 2 * P + 8 * N + 13 * u + (17 * u + 16 * N + 48 * N + 2 * u + 4 * C * 2) +
                                 50304 * C * 2 + 8);
  const int64_t decision = int64_t(sizeof(cpu::StepDecision));  // the step decided on the device
  EXPECT_EQ(gpu.total, 16 * P + decision + gpu.activations);
  c.train.zero = 1;
  EXPECT_EQ(predict_memory(c, "cuda", 4).optimizer, 8 * P / 4 + decision) << "ZeRO-1 shards AdamW's state";
}

TEST(MemoryModel, TrainLogsThePrediction) {
  const fs::path dir = scratch("train");
  {
    std::ofstream f(dir / "text.txt");
    for (int i = 0; i < 400; ++i) f << "In the beginning " << i % 7 << " the word was " << (i * 13) % 11 << ".\n";
  }
  prepare_text({(dir / "text.txt").string()}, (dir / "data").string(), 0.2, false);
  const Config c = load_config(kTinyConfig, {"data.train=" + (dir / "data" / "train_*.bin").string(),
                                             "data.val=" + (dir / "data" / "val_*.bin").string(), "run.device=cpu",
                                             "run.out_dir=" + (dir / "run").string(), "train.max_steps=1",
                                             "train.seq_len=256", "train.warmup_steps=1", "run.eval_every=0",
                                             "run.ckpt_every=0"});
  Trainer(c).run();
  std::ifstream log(dir / "run" / "train.log");
  std::stringstream text;
  text << log.rdbuf();
  const std::string expected = "memory predicted per rank (docs/memory.md): " + describe_prediction(predict_memory(c, "cpu"));
  EXPECT_NE(text.str().find(expected), std::string::npos) << text.str();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tg
