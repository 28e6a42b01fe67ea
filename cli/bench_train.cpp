// `tilegrad bench train`: training-step throughput beside bench/reference/torch_gpt.py
// (throughput, and under mpirun its ddp mode).
#include "cli/bench.h"

#include <cstdio>
#include <string>
#include <vector>

#include "src/dist/communicator.h"
#include "src/tensor/memory.h"
#include "src/trainer/trainer.h"

#include "cli/bench_steps.h"

namespace tg {

using bench::fmt_ms;
using bench::gib;
using bench::run_training_steps;
using bench::StepFigures;

// Training-step throughput of a config's model on random tokens (data loading excluded), the
// figure compared with bench/reference/torch_gpt.py throughput (and, under mpirun, torch_gpt.py ddp).
int bench_train(const cli::Args& a) {
  Config cfg = load_config(a.positional[1], a.all("set"), false);
  validate_config(cfg);
  // Under mpirun or srun every rank trains its own batch; rank 0 reports.
  const dist::Placement placement = dist::placement_from_environment();
  const Device device = resolve_device(cfg.run.device, placement.local_rank);
  set_current_device(device);
  std::unique_ptr<dist::Communicator> comm = dist::make_communicator(placement, device, cfg.run.comm_timeout_s);
  const int W = comm->world_size();
  const StepFigures f =
      run_training_steps(cfg, device, a.get_int("warmup", 5), a.get_int("steps", 20), false, comm.get());
  // Tokens per optimizer step and rank: grad_accum micro-batches of B × T.
  const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len, k = cfg.train.grad_accum, tokens = B * T * k;
  const double tps = double(tokens) / f.seconds_per_step;
  const MemoryStats& m = f.memory;
  if (W > 1 || !placement.launcher.empty()) {
    // Per rank and in total; the slowest rank and the largest peak bound the job.
    const std::vector<double> worst = comm->all_reduce_values(
        {f.seconds_per_step, double(m.peak_total), f.exposed_comm_seconds_per_step}, dist::ReduceOp::max,
        "bench: slowest rank");
    if (comm->rank() == 0)
      std::printf(
          "{\"bench\":\"train_data_parallel\",\"config\":\"%s\",\"backend\":\"%s\",\"world_size\":%d,\"zero\":%d,"
          "\"bucket_mb\":%g,\"B\":%lld,\"T\":%lld,\"grad_accum\":%lld,\"ms_per_step\":%.2f,"
          "\"tokens_per_s_per_rank\":%.0f,\"tokens_per_s_total\":%.0f,\"comm_exposed_ms\":%.2f,"
          "\"peak_gib_per_rank\":%.3f}\n",
          a.positional[1].c_str(), comm->backend().c_str(), W, cfg.train.zero, cfg.train.bucket_mb, (long long)B,
          (long long)T, (long long)k, worst[0] * 1e3, double(tokens) / worst[0], double(W * tokens) / worst[0],
          worst[2] * 1e3, gib(int64_t(worst[1])));
    if (comm->rank() != 0) return 0;
  }
  std::printf(
      "{\"bench\":\"train\",\"config\":\"%s\",\"device\":\"%s\",\"precision\":\"%s\",\"attention\":\"%s\","
      "\"deterministic\":%s,\"lm_head_chunk\":%d,\"recompute\":%s,\"cuda_graph\":%s,"
      "\"B\":%lld,\"T\":%lld,\"grad_accum\":%lld,\"params\":%lld,\"ms_per_step\":%.2f,\"host_ms_per_step\":%.2f,\"tokens_per_s\":%.0f,\"tflops\":%.1f,"
      "\"mfu_vs_989\":%.4f,\"peak_gib\":%.3f,\"loss\":%.4f}\n",
      a.positional[1].c_str(), device.str().c_str(), cfg.train.precision.c_str(), cfg.model.attention.c_str(),
      cfg.train.deterministic ? "true" : "false", cfg.train.lm_head_chunk,
      cfg.train.recompute ? "true" : "false", f.cuda_graph ? "true" : "false", (long long)B, (long long)T, (long long)k, (long long)f.params,
      f.seconds_per_step * 1e3, f.host_seconds_per_step * 1e3, tps, f.flops_per_token * tps / 1e12,
      f.flops_per_token * tps / 989e12, gib(m.peak_total), f.loss);
  std::printf("peak memory by category:");
  for (int c = 0; c < kNumMemCategories; ++c)
    std::printf(" %s %s", mem_category_name(MemCategory(c)), format_bytes(m.peak[size_t(c)]).c_str());
  std::printf("\n");
#ifdef TILEGRAD_HAVE_CUDA
  if (device.is_cuda()) {  // cross-check: the driver's view must cover what tilegrad counts
    size_t free_bytes = 0, total_bytes = 0;
    cuda_mem_get_info(&free_bytes, &total_bytes);
    std::printf("device memory in use (cudaMemGetInfo, pool and context included): %s; tilegrad counts %s now\n",
                format_bytes(int64_t(total_bytes - free_bytes)).c_str(), format_bytes(m.current_total).c_str());
  }
#endif
  return 0;
}

}  // namespace tg
