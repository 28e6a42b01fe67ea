// Training steps of a config's model on random tokens for `bench train` and `bench memory`.
#include "cli/bench_steps.h"

#include <chrono>
#include <cstdio>
#include <vector>

#include "src/dist/grad_sync.h"
#include "src/nn/gpt.h"
#include "src/optim/adamw.h"
#include "src/tensor/device_graph.h"
#include "src/trainer/trainer.h"

namespace tg::bench {

StepFigures run_training_steps(const Config& cfg, Device device, int64_t warmup, int64_t steps, bool peak_from_start,
                               dist::Communicator* comm) {
  TG_CHECK(cfg.train.precision == "fp32" || device.is_cuda(), "train.precision bf16 needs a GPU");
  TG_CHECK(steps > 0 && warmup >= 0, "tilegrad bench: --steps must be > 0 and --warmup ≥ 0");
  const DType compute = cfg.train.precision == "bf16" ? DType::bf16 : DType::f32;
  ops::set_deterministic(cfg.train.deterministic);
  if (peak_from_start) reset_peak_memory(device);
  nn::GPT model(gpt_config_from(cfg.model), uint64_t(cfg.train.seed), DType::f32, device, compute);
  model.set_lm_head_chunk(cfg.train.lm_head_chunk);
  model.set_recompute(cfg.train.recompute);
  model.set_recompute_rows(cfg.train.recompute_rows);
  model.set_offload_activations(cfg.train.offload_activations);
  const int W = comm ? comm->world_size() : 1;
  std::unique_ptr<dist::GradientSync> sync;
  if (W > 1)
    sync = std::make_unique<dist::GradientSync>(*comm, model.params(), cfg.train.zero,
                                                int64_t(cfg.train.bucket_mb * double(1 << 20)));
  optim::AdamW opt(model.params(), {cfg.train.beta1, cfg.train.beta2, cfg.train.eps, cfg.train.weight_decay},
                   sync ? sync->owned() : std::vector<nn::FlatRange>{});
  const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len, V = cfg.model.vocab_size;
  std::vector<int32_t> x(static_cast<size_t>(B * T)), y(static_cast<size_t>(B * T));
  for (size_t i = 0; i < x.size(); ++i) {
    const uint64_t stream = comm ? 2 * uint64_t(comm->rank()) : 0;  // each rank its own tokens
    x[i] = int32_t(nn::normal_from(1, 1 + stream, i) * 1e6 + 1e9) % int32_t(V);
    y[i] = int32_t(nn::normal_from(1, 2 + stream, i) * 1e6 + 1e9) % int32_t(V);
  }
  const Tensor ids = Tensor::from_ints(x, {B, T}).to(device), tgt = Tensor::from_ints(y, {B, T}).to(device);
  StepFigures f;
  // As in training: the loss and the gradient norm stay on the device, which decides the update
  // (optim::AdamW::step_decided); nothing in a step reads the device from the host.
  Tensor record = Tensor::zeros({2}, DType::f64, device);
  const Tensor record_loss = Tensor::view_of(record, 0, {1}), record_norm = Tensor::view_of(record, 1, {1});
  const optim::StepRules rules{cfg.train.grad_clip, std::max<int64_t>(cfg.train.max_bad_steps, 1)};
  opt.reset_decision(0);
  // train.grad_accum micro-batches per step (the same tokens each time), as the trainer runs
  // them: the buckets are reduced during the last one's backward.
  const int64_t k = cfg.train.grad_accum;
  auto forward_backward = [&] {
    model.params().zero_grad_at_first_write();  // as the trainer zeroes them
    record.zero();
    for (int64_t micro = 0; micro < k; ++micro) {
      Tensor l = model.loss(ids, tgt);
      optim::add_divided(record_loss, l, double(k));
      Tensor scaled = k * W == 1 ? l : ops::scale(l, 1.0 / double(k * W));
      if (micro == k - 1 && sync) {
        auto overlap = sync->overlap();
        scaled.backward();
      } else {
        scaled.backward();
      }
    }
  };
  auto update = [&] {
    if (!sync) {
      optim::grad_sum_squares_to(model.params(), {}, record_norm);
      opt.step_decided(cfg.train.lr, record, rules);
      return;
    }
    sync->finish();
    sync->grad_sum_squares_to(record_norm);
    opt.step_decided(cfg.train.lr, record, rules);
    sync->gather_parameters();
  };
  for (int64_t i = 0; i < warmup; ++i) {
    forward_backward();
    update();
  }
  device_synchronize(device);
  if (comm) comm->barrier("bench: timed steps start");
  if (!peak_from_start) reset_peak_memory(device);
  // train.cuda_graph, as the trainer takes it: the forward and backward recorded once and
  // replayed (the update stays launched), where nothing stands in the way (cuda_graph_obstacle).
  DeviceGraph graph;
  if (cfg.train.cuda_graph && cuda_graph_obstacle(cfg, W, device).empty())
    graph = DeviceGraph::capture(device, forward_backward);
  f.cuda_graph = graph.captured();
  const double comm_before = sync ? sync->exposed_seconds() : 0.0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) {
    if (graph.captured()) graph.replay();
    else forward_backward();
    update();
  }
  f.host_seconds_per_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(steps);
  device_synchronize(device);
  f.seconds_per_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(steps);
  f.loss = record_loss.item();
  if (sync) f.exposed_comm_seconds_per_step = (sync->exposed_seconds() - comm_before) / double(steps);
  // nanoGPT / llm.c convention: 6·N (N without the position table) + 12·L·d·T FLOPs per token.
  f.params = model.params().numel();
  int64_t n = f.params;
  if (model.params().has("transformer.wpe.weight")) n -= model.params().get("transformer.wpe.weight").numel();
  f.flops_per_token = 6.0 * double(n) + 12.0 * cfg.model.n_layer * cfg.model.d_model * double(T);
  f.memory = memory_stats(device);
  return f;
}

double gib(int64_t bytes) { return double(bytes) / double(1ll << 30); }

std::string fmt_ms(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", ms);
  return buf;
}

}  // namespace tg::bench
