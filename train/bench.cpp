// `tilegrad bench train`, `bench memory` and `bench attention`: timed on the device with the same
// shapes and FLOP conventions as the PyTorch reference, bench/reference/torch_gpt.py.
#include "train/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#ifdef TILEGRAD_HAVE_CUDA
#include "kernels/cuda/check.cuh"
#endif
#include "kernels/cuda/flash_attention/flash.h"
#include "src/dist/grad_sync.h"
#include "src/nn/gpt.h"
#include "src/optim/adamw.h"
#include "src/tensor/dispatch.h"
#include "src/trainer/footprint.h"
#include "src/trainer/memory_model.h"
#include "src/trainer/state.h"
#include "src/trainer/trainer.h"
#include "train/gnuplot.h"

namespace tg {

#ifdef TILEGRAD_HAVE_CUDA
void cuda_mem_get_info(size_t* free_bytes, size_t* total_bytes);  // kernels/cuda/runtime.cu
#endif

namespace {
// What `warmup` untimed and then `steps` timed training steps of a config's model measured.
struct StepFigures {
  double seconds_per_step = 0, loss = 0, flops_per_token = 0;
  double exposed_comm_seconds_per_step = 0;  // data parallel: reduction time the backward did not hide
  int64_t params = 0;
  MemoryStats memory;  // peak over the timed steps, or from before the model (peak_from_start)
};

// Training steps (forward, backward, clipped AdamW) of cfg's model on random tokens, data loading
// excluded. The peak memory covers the timed steps or, with peak_from_start, everything from
// before the model is built (its parameters and AdamW's state included, as torch_gpt.py memory
// measures it).
// With a communicator of W > 1 ranks, each rank trains on its own batch and the gradients are
// reduced as in training (buckets overlapped with the backward, ZeRO-0 or 1 from the config).
StepFigures run_training_steps(const Config& cfg, Device device, int64_t warmup, int64_t steps, bool peak_from_start,
                               dist::Communicator* comm = nullptr) {
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
  auto step = [&] {
    model.params().zero_grad();
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
  for (int64_t i = 0; i < warmup; ++i) step();
  device_synchronize(device);
  if (comm) comm->barrier("bench: timed steps start");
  if (!peak_from_start) reset_peak_memory(device);
  const double comm_before = sync ? sync->exposed_seconds() : 0.0;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) step();
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
}  // namespace

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
      "\"deterministic\":%s,\"lm_head_chunk\":%d,\"recompute\":%s,"
      "\"B\":%lld,\"T\":%lld,\"grad_accum\":%lld,\"params\":%lld,\"ms_per_step\":%.2f,\"tokens_per_s\":%.0f,\"tflops\":%.1f,"
      "\"mfu_vs_989\":%.4f,\"peak_gib\":%.3f,\"loss\":%.4f}\n",
      a.positional[1].c_str(), device.str().c_str(), cfg.train.precision.c_str(), cfg.model.attention.c_str(),
      cfg.train.deterministic ? "true" : "false", cfg.train.lm_head_chunk,
      cfg.train.recompute ? "true" : "false", (long long)B, (long long)T, (long long)k, (long long)f.params,
      f.seconds_per_step * 1e3, tps, f.flops_per_token * tps / 1e12,
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

// The communicator's collectives timed on flat fp32 buffers, the figure compared with NCCL's own
// (bench/reference/torch_allreduce.py under torchrun, same sizes). Bus bandwidth as nccl-tests
// define it: the bytes over the time, times 2(W − 1)/W for all_reduce and (W − 1)/W for
// reduce_scatter and all_gather (the bytes being the whole buffer), so that it reads against the
// links' speed whatever W.
int bench_allreduce(const cli::Args& a) {
  const char* fn = "tilegrad bench allreduce";
  const std::string collective = a.get("collective", "all_reduce");
  TG_CHECK(collective == "all_reduce" || collective == "reduce_scatter" || collective == "all_gather", fn,
           ": --collective ", collective, " is unknown; give all_reduce, reduce_scatter or all_gather");
  const int64_t iters = a.get_int("steps", 20), warmup = a.get_int("warmup", 5);
  TG_CHECK(iters >= 1, fn, ": --steps ", iters, " times nothing; give at least 1");
  TG_CHECK(warmup >= 0, fn, ": --warmup is negative");
  // Default sizes: a 25-MiB gradient bucket (train.bucket_mb's default) and GPT-2 small's whole
  // fp32 gradient (123,689,472 parameters: 471.8 MiB).
  std::vector<double> sizes_mib;
  {
    std::stringstream list(a.get("mib", "25,471.8"));
    std::string item;
    while (std::getline(list, item, ',')) {
      char* end = nullptr;
      const double v = std::strtod(item.c_str(), &end);
      TG_CHECK(end != item.c_str() && *end == '\0' && v > 0 && v <= 65536, fn, ": --mib takes sizes in MiB, e.g. "
               "25,471.8; got '", item, "'");
      sizes_mib.push_back(v);
    }
  }
  const dist::Placement placement = dist::placement_from_environment();
  const Device device = resolve_device(a.get("device", "auto"), placement.local_rank);
  set_current_device(device);
  std::unique_ptr<dist::Communicator> comm = dist::make_communicator(placement, device, 600);
  const int W = comm->world_size(), rank = comm->rank();
  const double factor = collective == "all_reduce" ? 2.0 * (W - 1) / W : double(W - 1) / W;
  auto start = [&](const Tensor& buf) {
    if (collective == "all_reduce") comm->all_reduce_async(buf, dist::ReduceOp::sum, "bench buffer");
    else if (collective == "reduce_scatter") comm->reduce_scatter_async(buf, "bench buffer");
    else comm->all_gather_async(buf, "bench buffer");
  };
  auto value_at = [&](const Tensor& buf, int64_t i) { return Tensor::view_of(buf, i, {1}).to(Device::cpu()).item(); };
  for (double mib : sizes_mib) {
    // Whole elements, a multiple of W (the sharded collectives split the buffer evenly).
    const int64_t n = std::max<int64_t>(W, (int64_t(mib * 1048576.0 / 4.0) + W - 1) / W * W), shard = n / W;
    Tensor buf = Tensor::full({n}, double(rank + 1), DType::f32, device);
    // Once for the result: every rank holding r + 1, the sum is W(W + 1)/2; gathered, slice j holds j + 1.
    start(buf);
    comm->wait();
    const int64_t other = ((rank + 1) % W) * shard;  // the first element of the next rank's slice
    const double got = collective == "all_gather" ? value_at(buf, other) : value_at(buf, rank * shard);
    const double want = collective == "all_gather" ? double((rank + 1) % W + 1) : double(W) * (W + 1) / 2.0;
    const bool right = comm->all_agree(got == want, "bench: the collective's result");
    TG_CHECK(right, fn, ": ", collective, " of ", n, " floats gave ", got, " where ", want,
             " was due (on this rank or another): the communicator is wrong");
    for (int64_t i = 0; i < warmup; ++i) start(buf);
    comm->wait();
    device_synchronize(device);
    comm->barrier("bench: before timing");
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) start(buf);
    comm->wait();
    device_synchronize(device);
    const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(iters);
    const double seconds = comm->all_reduce_values({mine}, dist::ReduceOp::max, "bench: slowest rank")[0];
    const double bytes = double(n) * 4.0, algbw = bytes / seconds / 1e9;
    if (rank == 0)
      std::printf("{\"bench\":\"collective\",\"collective\":\"%s\",\"backend\":\"%s\",\"world_size\":%d,"
                  "\"device\":\"%s\",\"bytes\":%.0f,\"ms\":%.4f,\"algbw_gbs\":%.2f,\"busbw_gbs\":%.2f}\n",
                  collective.c_str(), comm->backend().c_str(), W, device.str().c_str(), bytes, seconds * 1e3, algbw,
                  algbw * factor);
    std::fflush(stdout);
  }
  return 0;
}

namespace {
// One series of `bench memory`: the config as given, or one of the comparison's presets.
struct MemorySeries {
  std::string name;
  Config cfg;
};

std::vector<MemorySeries> memory_series(const Config& base, const std::string& list) {
  std::vector<MemorySeries> out;
  std::string rest = list;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string name = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    Config c = base;
    if (name == "config") {
    } else if (name == "flash") {  // the fused attention, every block's tensors kept, the whole head at once
      c.model.attention = "flash", c.train.recompute = false, c.train.lm_head_chunk = 0;
    } else if (name == "flash-recompute-chunk") {  // the long-context keys (the config's chunk, or 4096)
      c.model.attention = "flash", c.train.recompute = true;
      if (c.train.lm_head_chunk <= 0) c.train.lm_head_chunk = 4096;
    } else if (name == "materialised") {  // the (T, T) scores and probabilities kept per block
      c.model.attention = "naive", c.train.recompute = false, c.train.lm_head_chunk = 0;
    } else {
      TG_CHECK(false, "tilegrad bench memory: --series '", name,
               "' is unknown; give a comma-separated list of config, flash, flash-recompute-chunk, materialised");
    }
    out.push_back({name, c});
  }
  TG_CHECK(!out.empty(), "tilegrad bench memory: --series is empty");
  return out;
}

struct MemoryRow {
  std::string series;
  int64_t T = 0;
  enum Status { measured, out_of_memory, predicted_only, predicted_not_to_fit } status = measured;
  double ms = 0;
  MemoryStats m;
  MemoryPrediction p;
};

const char* status_name(MemoryRow::Status s) {
  switch (s) {
    case MemoryRow::measured: return "measured";
    case MemoryRow::out_of_memory: return "out_of_memory";
    case MemoryRow::predicted_only: return "predicted";
    default: return "predicted_not_to_fit";
  }
}

// The device's whole memory (the plot's capacity line): a GPU's total, the CPU's MemTotal; -1 if unknown.
int64_t device_capacity(Device d) {
#ifdef TILEGRAD_HAVE_CUDA
  if (d.is_cuda()) {
    size_t free_bytes = 0, total_bytes = 0;
    cuda_mem_get_info(&free_bytes, &total_bytes);
    return int64_t(total_bytes);
  }
#endif
  if (!d.is_cpu()) return -1;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == "MemTotal:") return kb * 1024;
  }
  return -1;
}

// PyTorch's series from bench/reference/torch_gpt.py memory: its --csv file (series,T,peak_gib,ms)
// or its JSON lines (out-of-memory lines skipped). Returns (series, T, peak GiB) rows.
struct TorchPoint {
  std::string series;
  int64_t T;
  double peak_gib;
};
std::vector<TorchPoint> read_torch_memory(const std::string& path) {
  std::ifstream in(path);
  TG_CHECK(in.good(), "tilegrad bench memory: cannot read --torch-csv ", path);
  std::vector<TorchPoint> out;
  std::string line;
  const std::regex series_re("\"series\":\\s*\"([^\"]+)\""), t_re("\"T\":\\s*(\\d+)"),
      peak_re("\"peak_gib\":\\s*([-0-9.eE+]+)");
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '{') {
      std::smatch s, t, p;
      if (std::regex_search(line, s, series_re) && std::regex_search(line, t, t_re) &&
          std::regex_search(line, p, peak_re))
        out.push_back({s[1], std::stoll(t[1]), std::stod(p[1])});
      continue;
    }
    std::stringstream cells(line);
    std::string series, T, peak;
    if (!std::getline(cells, series, ',') || !std::getline(cells, T, ',') || !std::getline(cells, peak, ',')) continue;
    if (series == "series") continue;  // the header
    try {
      out.push_back({series, std::stoll(T), std::stod(peak)});
    } catch (const std::exception&) {
      TG_CHECK(false, "tilegrad bench memory: --torch-csv ", path, ": the line '", line,
               "' is neither series,T,peak_gib,ms nor a JSON line of torch_gpt.py memory");
    }
  }
  TG_CHECK(!out.empty(), "tilegrad bench memory: --torch-csv ", path, " has no measurements");
  return out;
}

std::string gnuplot_quote(const std::string& s) {
  std::string out;
  for (char ch : s) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return out;
}

// DIR/memory.png: peak memory against T (log–log; measured points, predicted dashed lines,
// PyTorch's series, the device capacity across), and beside it the breakdown by category at each
// series' largest T.
void plot_memory(const std::filesystem::path& dir, const std::vector<MemoryRow>& rows,
                 const std::vector<std::string>& series, const std::vector<TorchPoint>& torch, int64_t capacity,
                 const std::string& device_name) {
  namespace fs = std::filesystem;
  std::vector<fs::path> data;
  struct RemoveData {
    std::vector<fs::path>& files;
    ~RemoveData() {
      for (const fs::path& f : files) fs::remove(f);
    }
  } remove_data{data};
  std::string lines;
  auto curve = [&](const std::string& file, const std::string& style) {
    lines += std::string(lines.empty() ? "plot " : ", ") + "'" + gnuplot_quote(file) + "' using 1:2 " + style;
  };
  const double G = double(1ll << 30);
  for (size_t i = 0; i < series.size(); ++i) {
    const fs::path measured = dir / (".memory_measured_" + std::to_string(i) + ".dat");
    const fs::path predicted = dir / (".memory_predicted_" + std::to_string(i) + ".dat");
    data.push_back(measured), data.push_back(predicted);
    std::ofstream fm(measured), fp(predicted);
    int nm = 0;
    for (const MemoryRow& r : rows) {
      if (r.series != series[i]) continue;
      fp << r.T << " " << double(r.p.total) / G << "\n";
      if (r.status == MemoryRow::measured) fm << r.T << " " << double(r.m.peak_total) / G << "\n", ++nm;
    }
    const std::string color = " lc " + std::to_string(i + 1);
    if (nm) curve(measured.string(), "with linespoints pt 7 lw 2" + color + " title '" + gnuplot_quote(series[i]) + " (measured)'");
    curve(predicted.string(), "with lines dt 2 lw 1.5" + color + " title '" + gnuplot_quote(series[i]) + " (predicted)'");
  }
  std::vector<std::string> torch_series;
  for (const TorchPoint& t : torch)
    if (std::find(torch_series.begin(), torch_series.end(), t.series) == torch_series.end()) torch_series.push_back(t.series);
  for (size_t i = 0; i < torch_series.size(); ++i) {
    const fs::path f = dir / (".memory_torch_" + std::to_string(i) + ".dat");
    data.push_back(f);
    std::ofstream out(f);
    for (const TorchPoint& t : torch)
      if (t.series == torch_series[i]) out << t.T << " " << t.peak_gib << "\n";
    curve(f.string(), "with linespoints pt 5 lw 1.5 lc " + std::to_string(series.size() + i + 1) + " title 'PyTorch " +
                          gnuplot_quote(torch_series[i]) + "'");
  }
  if (capacity > 0)
    lines += ", " + std::to_string(double(capacity) / G) + " with lines lw 2 lc rgb 'black' title '" +
             gnuplot_quote(device_name) + " capacity'";
  // The breakdown: per series its largest T that was measured (or, without a run, predicted).
  const fs::path bars = dir / ".memory_breakdown.dat";
  data.push_back(bars);
  {
    std::ofstream out(bars);
    out << "series params grads optimizer activations workspace\n";
    for (const std::string& s : series) {
      const MemoryRow* last = nullptr;
      for (const MemoryRow& r : rows)
        if (r.series == s && (r.status == MemoryRow::measured || r.status == MemoryRow::predicted_only)) last = &r;
      if (!last) continue;
      const bool run = last->status == MemoryRow::measured;
      auto cat = [&](MemCategory c, int64_t predicted) {
        return double(run ? last->m.peak[size_t(c)] : predicted) / G;
      };
      out << "\"" << s << "\\nT " << last->T << (run ? "" : " (predicted)") << "\" " << cat(MemCategory::params, last->p.params)
          << " " << cat(MemCategory::grads, last->p.grads) << " " << cat(MemCategory::optimizer, last->p.optimizer) << " "
          << cat(MemCategory::activations, last->p.activations) << " " << cat(MemCategory::workspace, last->p.workspace)
          << "\n";
    }
  }
  const fs::path png = dir / "memory.png";
  std::string script = "set terminal pngcairo noenhanced size 1500,640\nset output '" + gnuplot_quote(png.string()) + "'\n" +
                       "set multiplot layout 1,2\n"
                       "set title 'Peak memory of one training step'\nset logscale xy 2\nset format x '%.0s%c'\n"
                       "set format y '%.3g'\nset bmargin 5\n"
                       "set xlabel 'sequence length T (tokens)'\nset ylabel 'peak memory (GiB)'\nset grid\n"
                       "set key bottom right opaque\n" +
                       lines +
                       "\nunset logscale\nset format x '%g'\nset title 'Peak by category at the largest T'\n"
                       "set style data histograms\nset style histogram rowstacked\nset style fill solid 0.8 border -1\n"
                       "set boxwidth 0.6\nset xlabel ''\nset ylabel 'GiB'\nset key top left\nset yrange [0:*]\n"
                       "plot for [i=2:6] '" +
                       gnuplot_quote(bars.string()) + "' using i:xtic(1) title columnheader(i)\nunset multiplot\n";
  run_gnuplot("tilegrad bench memory", script);
}
}  // namespace

// Peak memory of one training step against the sequence length, the figure compared with
// bench/reference/torch_gpt.py memory: T = --min-t, 2·--min-t, … up to --max-t, the config's model
// built afresh for each with train.seq_len = T (and, with learned positions, a table of at least T
// rows, as torch_gpt.py sizes its own), --warmup untimed and --steps timed steps (1 and 1 unless
// given). A series stops at the first T that runs out of memory, as torch_gpt.py's does.
// --predict puts the memory model's figures (src/trainer/memory_model.h) beside the measured
// ones; --no-run prints only those (any T, also one that does not fit). --out DIR writes
// memory.csv and, with gnuplot, memory.png.
int bench_memory(const cli::Args& a) {
  namespace fs = std::filesystem;
  const char* fn = "tilegrad bench memory";
  Config base = load_config(a.positional[1], a.all("set"), false);
  validate_config(base);
  const int64_t min_t = a.get_int("min-t", 1024), max_t = a.get_int("max-t", 131072);
  const int64_t warmup = a.get_int("warmup", 1), steps = a.get_int("steps", 1);
  const bool no_run = a.has("no-run"), predict = a.has("predict") || no_run;
  TG_CHECK(min_t >= 1, fn, ": --min-t ", min_t, " is not a sequence length; give one ≥ 1");
  TG_CHECK(min_t <= max_t, fn, ": --min-t ", min_t, " exceeds --max-t ", max_t, "; no length would run");
  TG_CHECK(max_t <= INT32_MAX, fn, ": --max-t ", max_t, " exceeds the config's int range");
  const std::vector<MemorySeries> series = memory_series(base, a.get("series", "config"));
  const std::vector<TorchPoint> torch = a.has("torch-csv") ? read_torch_memory(a.get("torch-csv", "")) : std::vector<TorchPoint>{};
  const std::string out_dir = a.get("out", "");
  if (!out_dir.empty()) fs::create_directories(out_dir);
  // Without a run the device is the config's (run.device cuda… predicts for a GPU on any machine).
  const bool config_gpu = base.run.device.rfind("cuda", 0) == 0;
  const Device device = no_run && (config_gpu || base.run.device == "cpu")
                            ? (config_gpu ? Device::cuda(0) : Device::cpu())
                            : resolve_device(base.run.device);
  const std::string kind = device.is_cuda() ? "cuda" : "cpu";
  const int64_t capacity = a.has("capacity-gib") ? int64_t(a.get_double("capacity-gib", 0) * double(1ll << 30))
                                           : (no_run && device.is_cuda() ? -1 : device_capacity(device));
  std::vector<MemoryRow> rows;
  auto gib_fields = [](const MemoryPrediction& p) {
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  ",\"predicted_peak_gib\":%.3f,\"predicted_params_gib\":%.3f,\"predicted_grads_gib\":%.3f,"
                  "\"predicted_optimizer_gib\":%.3f,\"predicted_activations_gib\":%.3f,\"predicted_workspace_gib\":%.3f,"
                  "\"predicted_peak_bytes\":%lld,\"predicted_phase\":\"%s\"",
                  gib(p.total), gib(p.params), gib(p.grads), gib(p.optimizer), gib(p.activations), gib(p.workspace),
                  (long long)p.total, p.peak_phase.c_str());
    return std::string(buf);
  };
  for (const MemorySeries& s : series) {
    for (int64_t T = min_t; T <= max_t; T *= 2) {
      Config cfg = s.cfg;
      cfg.train.seq_len = int(T);
      if (cfg.model.pos_embedding == "learned") cfg.model.max_seq_len = std::max(cfg.model.max_seq_len, int(T));
      validate_config(cfg);
      MemoryRow row;
      row.series = s.name, row.T = T;
      row.p = predict_memory(cfg, kind);
      const std::string head = std::string("{\"bench\":\"memory\",\"series\":\"") + s.name + "\"";
      if (no_run) {
        row.status = MemoryRow::predicted_only;
        rows.push_back(row);
        std::printf("%s,\"config\":\"%s\",\"device\":\"%s\",\"precision\":\"%s\",\"attention\":\"%s\","
                    "\"lm_head_chunk\":%d,\"recompute\":%s,\"B\":%d,\"T\":%lld,\"params\":%lld,\"predicted_only\":true%s}\n",
                    head.c_str(), a.positional[1].c_str(), kind.c_str(), cfg.train.precision.c_str(),
                    cfg.model.attention.c_str(), cfg.train.lm_head_chunk, cfg.train.recompute ? "true" : "false",
                    cfg.train.batch_size, (long long)T, (long long)row.p.parameter_count, gib_fields(row.p).c_str());
        std::fflush(stdout);
        continue;
      }
      // On the CPU a step that does not fit would swap or be killed rather than fail cleanly:
      // the prediction stops the series first.
      const int64_t avail = device.is_cpu() ? available_memory(device) : -1;
      if (avail > 0 && row.p.total > avail) {
        row.status = MemoryRow::predicted_not_to_fit;
        rows.push_back(row);
        std::printf("%s,\"T\":%lld,\"oom\":true,\"skipped\":\"predicted %.3f GiB exceeds the %.3f GiB available\"}\n",
                    head.c_str(), (long long)T, gib(row.p.total), gib(avail));
        break;
      }
      try {
        const StepFigures f = run_training_steps(cfg, device, warmup, steps, true);
        const MemoryStats& m = f.memory;
        row.ms = f.seconds_per_step * 1e3, row.m = m;
        rows.push_back(row);
        std::printf(
            "%s,\"config\":\"%s\",\"device\":\"%s\",\"precision\":\"%s\",\"attention\":\"%s\","
            "\"lm_head_chunk\":%d,\"recompute\":%s,\"B\":%d,\"T\":%lld,\"params\":%lld,\"ms_per_step\":%.2f,"
            "\"peak_gib\":%.3f,\"activations_gib\":%.3f,\"largest_allocation_gib\":%.3f,\"params_gib\":%.3f,"
            "\"grads_gib\":%.3f,\"optimizer_gib\":%.3f,\"workspace_gib\":%.3f,\"peak_bytes\":%lld",
            head.c_str(), a.positional[1].c_str(), device.str().c_str(), cfg.train.precision.c_str(),
            cfg.model.attention.c_str(), cfg.train.lm_head_chunk, cfg.train.recompute ? "true" : "false",
            cfg.train.batch_size, (long long)T, (long long)f.params, row.ms, gib(m.peak_total),
            gib(m.peak[size_t(MemCategory::activations)]), gib(m.largest_allocation),
            gib(m.peak[size_t(MemCategory::params)]), gib(m.peak[size_t(MemCategory::grads)]),
            gib(m.peak[size_t(MemCategory::optimizer)]), gib(m.peak[size_t(MemCategory::workspace)]),
            (long long)m.peak_total);
        if (predict)
          std::printf("%s,\"predicted_error_pct\":%.2f", gib_fields(row.p).c_str(),
                      100.0 * double(row.p.total - m.peak_total) / double(m.peak_total));
        std::printf("}\n");
      } catch (const OutOfMemory& e) {
        row.status = MemoryRow::out_of_memory;
        rows.push_back(row);
        std::printf("%s,\"T\":%lld,\"oom\":true", head.c_str(), (long long)T);
        if (predict) std::printf("%s", gib_fields(row.p).c_str());
        std::printf("}\n");
        std::fprintf(stderr, "%s\n", e.what());
        break;
      }
      std::fflush(stdout);
    }
  }
  const bool several = series.size() > 1;
  std::printf("\n|%s T | peak | of which activations |%s ms/step |\n|%s---|---|---|%s---|\n", several ? " series |" : "",
              predict ? " predicted (error) |" : "", several ? "---|" : "", predict ? "---|" : "");
  for (const MemoryRow& r : rows) {
    if (several) std::printf("| %s ", r.series.c_str());
    std::printf("| %lld ", (long long)r.T);
    if (r.status == MemoryRow::measured)
      std::printf("| %s | %s |", format_bytes(r.m.peak_total).c_str(),
                  format_bytes(r.m.peak[size_t(MemCategory::activations)]).c_str());
    else if (r.status == MemoryRow::predicted_only) std::printf("| | |");
    else std::printf("| out of memory%s | |", r.status == MemoryRow::predicted_not_to_fit ? " (predicted)" : "");
    if (predict) {
      std::printf(" %s", format_bytes(r.p.total).c_str());
      if (r.status == MemoryRow::measured)
        std::printf(" (%+.1f %%)", 100.0 * double(r.p.total - r.m.peak_total) / double(r.m.peak_total));
      std::printf(" |");
    }
    if (r.status == MemoryRow::measured) std::printf(" %.1f |\n", r.ms);
    else std::printf(" |\n");
  }
  if (out_dir.empty()) return 0;
  const fs::path csv = fs::path(out_dir) / "memory.csv";
  {
    std::ofstream out(csv);
    TG_CHECK(out.good(), fn, ": cannot write ", csv.string());
    out << "series,T,status,measured_peak_bytes,predicted_peak_bytes,params_bytes,grads_bytes,optimizer_bytes,"
           "activations_bytes,workspace_bytes,predicted_params_bytes,predicted_grads_bytes,predicted_optimizer_bytes,"
           "predicted_activations_bytes,predicted_workspace_bytes,predicted_phase,step_ms\n";
    // The phase is quoted: its name has commas ("recomputed block backward, MLP pieces").
    for (const MemoryRow& r : rows) {
      const bool run = r.status == MemoryRow::measured;
      auto m = [&](int64_t v) { return run ? std::to_string(v) : std::string(); };
      out << r.series << "," << r.T << "," << status_name(r.status) << "," << m(r.m.peak_total) << "," << r.p.total;
      for (int c = 0; c < kNumMemCategories; ++c) out << "," << m(r.m.peak[size_t(c)]);
      out << "," << r.p.params << "," << r.p.grads << "," << r.p.optimizer << "," << r.p.activations << ","
          << r.p.workspace << ",\"" << r.p.peak_phase << "\"," << (run ? fmt_ms(r.ms) : std::string()) << "\n";
    }
  }
  std::printf("\nwrote %s\n", csv.string().c_str());
  std::vector<std::string> names;
  for (const MemorySeries& s : series) names.push_back(s.name);
  if (!gnuplot_available()) {
    std::printf("memory.png skipped: gnuplot is not installed (apt-get install gnuplot-nox); "
                "python3 bench/plot_memory.py %s draws it with matplotlib\n", out_dir.c_str());
    return 0;
  }
  plot_memory(out_dir, rows, names, torch, capacity, device.str());
  std::printf("wrote %s\n", (fs::path(out_dir) / "memory.png").string().c_str());
  return 0;
}

namespace {
// A bf16 tensor of uniform values in [−1, 1) from a xorshift stream (fast enough for 100 M elements).
Tensor random_bf16(const Shape& shape, uint64_t seed, Device device) {
  Tensor host = Tensor::empty(shape, DType::bf16);
  bf16* p = host.data<bf16>();
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < host.numel(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = float_to_bf16(float(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
  return host.to(device);
}

#ifdef TILEGRAD_HAVE_CUDA
// The reference attention benchmark's timing (PyTorch's torch_attention.py): `warm` untimed calls, then per timed call CUDA
// events recorded around it on the stream and a synchronisation, the median of `runs`.
template <typename F>
double median_event_seconds(int64_t runs, int64_t warm, F&& f) {
  for (int64_t i = 0; i < warm; ++i) f();
  TG_CUDA_CHECK(cudaStreamSynchronize(detail::cuda_stream()));
  cudaEvent_t start, stop;
  TG_CUDA_CHECK(cudaEventCreate(&start));
  TG_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> t;
  for (int64_t i = 0; i < runs; ++i) {
    TG_CUDA_CHECK(cudaEventRecord(start, detail::cuda_stream()));
    f();
    TG_CUDA_CHECK(cudaEventRecord(stop, detail::cuda_stream()));
    TG_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TG_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    t.push_back(ms * 1e-3);
  }
  TG_CUDA_CHECK(cudaEventDestroy(start));
  TG_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
#endif

template <typename F>
double median_seconds(int64_t runs, Device device, F&& f) {
  std::vector<double> t;
  for (int64_t i = 0; i < runs; ++i) {
    device_synchronize(device);
    auto t0 = std::chrono::steady_clock::now();
    f();
    device_synchronize(device);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int bench_attention(const cli::Args& a) {
  // The options first, so that a bad one is named whatever the machine.
  const int64_t runs = a.get_int("steps", 20), max_t = a.get_int("max-t", 32768);
  // --protocol sustained (default): warm-up forward + backward pairs, then `runs` forwards,
  // `runs` deterministic and `runs` atomic backwards back to back, each call timed on the host
  // between synchronisations. reference: torch_attention.py's — per mode the forward timed alone
  // (5 warm-up calls, `runs` timed), then forward + backward (3 warm-up calls, runs / 2 timed),
  // the backward the difference of the medians, CUDA events around each call. The sustained
  // one keeps the board at its power cap through a shape's three modes, which the reference's
  // shorter passes might not; measured side by side in one call the two agree (geometric means
  // 0.987–1.005 per column, docs/kernels.md §3), and the sustained one
  // times the backward directly, without the difference's noise, so it stays the default.
  const std::string protocol = a.get("protocol", "sustained");
  const bool sustained = protocol == "sustained";
  const int64_t warm_fwd = a.get_int("warmup", sustained ? 3 : 5), warm_fb = a.get_int("warmup", 3);
  const int64_t min_t = a.get_int("min-t", 1024);  // e.g. --min-t 8192 --max-t 8192: one T (for ncu)
  const int64_t only_d = a.get_int("head-dim", 0);  // 0: 64 and 128
  const int64_t masks = a.get_int("causal", 2);     // 1: causal only, 0: non-causal only, 2: both
  // --variant NAME: a shape of the wgmma kernels' development registry (cuda::flash_attention_variants,
  // docs/kernels.md §4.4) instead of the one the launchers select, wherever it applies; the others
  // run the launchers' shapes. tools/attention_ab.sh compares variants so, from one binary.
  const std::string variant = a.get("variant", "");
  // --window W, --docs N: the structured masks (causal only): a sliding window of W keys, and N
  // equal documents per row (doc_start built accordingly). Each masked shape is timed beside the
  // same shape's full causal attention; its TF/s count the visible (query, key) pairs exactly.
  const int64_t window = a.get_int("window", 0), docs = a.get_int("docs", 0);
  const bool masked = window > 0 || docs > 0;
  const char* fn = "tilegrad bench attention";
  TG_CHECK(window >= 0 && docs >= 0, fn, ": --window and --docs must be ≥ 0");
  TG_CHECK(!masked || masks != 0, fn, ": --window and --docs are causal masks; --causal 0 times nothing");
  TG_CHECK(runs >= 1, fn, ": --steps ", runs, " times nothing; give at least 1");
  TG_CHECK(only_d == 0 || only_d == 32 || only_d == 64 || only_d == 96 || only_d == 128, fn, ": --head-dim ", only_d,
           " has no kernel; give 32, 64, 96, 128 or 0 (64 and 128)");
  TG_CHECK(max_t >= 1024, fn, ": --max-t ", max_t, " is below the shortest shape (T = 1024)");
  TG_CHECK(min_t <= max_t, fn, ": --min-t ", min_t, " exceeds --max-t ", max_t, "; no shape would run");
  TG_CHECK(sustained || protocol == "reference", fn, ": --protocol ", protocol, " is unknown; give reference or sustained");
  TG_CHECK(warm_fwd >= 0 && warm_fb >= 0, fn, ": --warmup is negative");
  TG_CHECK(masks >= 0 && masks <= 2, fn, ": --causal takes 1 (causal only), 0 (non-causal only) or 2 (both), got ",
           masks);
#ifdef TILEGRAD_HAVE_CUDA
  const int variant_id = variant.empty() ? 0 : cuda::flash_attention_variant(variant);
  if (!variant.empty() && variant_id == 0) {
    std::string names;
    for (const cuda::FlashVariant& v : cuda::flash_attention_variants()) names += " " + v.name;
    TG_CHECK(false, fn, ": --variant ", variant, " is not in the registry; give one of:", names);
  }
  TG_CHECK(cuda_device_count() > 0, fn, ": needs a CUDA GPU");
  const Device dev = Device::cuda(0);
  // bwd: the default, deterministic backward (dQ in a pass of its own); atomic: the opt-in
  // backward that adds dQ with unordered atomics (FlashDq::kAtomic, train.deterministic: false;
  // --atomic 2: FlashDq::kAtomicKernel, its kernel also where kAtomic takes the deterministic one).
  // The kernels flash attention takes on this GPU (FlashKernels::kAuto: wgmma on an H100/H200);
  // --compare 1 also times the portable mma.sync kernels (fwd/bwd mma.sync TF/s) on the same inputs.
  const bool compare = a.get_int("compare", 0) != 0;
  const bool backward = a.get_int("backward", 1) != 0;  // 0: the forward alone (backward columns 0)
  const int64_t atomic_arg = a.get_int("atomic", 1);
  TG_CHECK(atomic_arg >= 0 && atomic_arg <= 2, fn, ": --atomic takes 0, 1 or 2, got ", atomic_arg);
  const bool atomic = backward && atomic_arg != 0;  // 0: not the opt-in atomic backward (column 0)
  const cuda::FlashDq atomic_mode = atomic_arg == 2 ? cuda::FlashDq::kAtomicKernel : cuda::FlashDq::kAtomic;
  std::printf("%-4s %-6s %-7s %-9s %-9s %-9s %-9s %-10s%s%s\n", "d", "T", "causal", "fwd ms", "bwd ms", "fwd TF/s",
              "bwd TF/s", "atomic TF/s", compare ? " mma.sync fwd / bwd TF/s" : "",
              masked ? " | full causal: fwd ms, bwd ms, fwd TF/s, bwd TF/s" : "");
  // Head dims 32 and 96 only when asked for: the reference benchmark's shapes (torch_attention.py) are
  // 64 and 128 (hidden 2048: 2048 / 96 is not whole, so d 96 runs 21 heads, hidden 2016).
  for (int64_t D : {32, 64, 96, 128}) {
    if (only_d == 0 ? D == 32 || D == 96 : D != only_d) continue;
    const int64_t H = 2048 / D;
    for (int64_t T = 1024; T <= max_t; T *= 2) {
      if (T < min_t) continue;
      const int64_t B = std::max<int64_t>(1, 16384 / T);
      Tensor q = random_bf16({B, T, H, D}, 1, dev), k = random_bf16({B, T, H, D}, 2, dev),
             v = random_bf16({B, T, H, D}, 3, dev), dout = random_bf16({B, T, H, D}, 4, dev);
      Tensor o = Tensor::empty(q.shape(), DType::bf16, dev), lse = Tensor::empty({B, H, T}, DType::f32, dev);
      Tensor dq = Tensor::empty(q.shape(), DType::bf16, dev), dk = Tensor::empty(q.shape(), DType::bf16, dev),
             dv = Tensor::empty(q.shape(), DType::bf16, dev);
      // Sized for the atomic mode, which also serves the default.
      const size_t ws_bytes = cuda::flash_attention_backward_workspace_bytes(B, T, H, D, cuda::FlashDq::kAtomic);
      Tensor ws = Tensor::empty({int64_t(ws_bytes / 4 + 4)}, DType::f32, dev);
      // --docs N: N equal documents per row (the last one shorter when N does not divide T).
      Tensor doc_start;
      std::vector<int32_t> starts;
      if (docs > 0) {
        const int64_t len = (T + docs - 1) / docs;
        starts.resize(size_t(B * T));
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < T; ++t) starts[size_t(b * T + t)] = int32_t(t / len * len);
        doc_start = Tensor::from_ints(starts, {B, T}).to(dev);
      }
      // The visible (query, key) pairs of the mask, counted exactly from lo(i): Σ (i − lo(i) + 1).
      double visible = 0;
      if (masked)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < T; ++i) {
            int64_t lo = docs > 0 ? starts[size_t(b * T + i)] : 0;
            if (window > 0) lo = std::max<int64_t>(lo, i - window + 1);
            visible += double(i - lo + 1);
          }
      for (bool causal : {true, false}) {
        if (masks != 2 && causal != (masks == 1)) continue;
        if (masked && !causal) continue;
        cuda::FlashAttentionParams p{};
        p.q = q.data<bf16>(), p.k = k.data<bf16>(), p.v = v.data<bf16>(), p.o = o.data<bf16>();
        p.lse = lse.data<float>(), p.dout = dout.data<bf16>(), p.dq = dq.data<bf16>(), p.dk = dk.data<bf16>();
        p.dv = dv.data<bf16>(), p.workspace = ws.raw();
        p.B = B, p.T = T, p.H = H, p.D = D, p.scale = float(1.0 / std::sqrt(double(D))), p.causal = causal;
        p.variant = uint8_t(variant_id);
        auto fwd = [&] { cuda::flash_attention_forward(p, detail::cuda_stream()); };
        auto bwd = [&] { cuda::flash_attention_backward(p, detail::cuda_stream()); };
        // Seconds of one forward, and of one backward given the forward's (the reference
        // protocol subtracts it), with the current p.kernels and p.dq_mode.
        auto time_fwd = [&] {
          if (sustained) {
            for (int64_t i = 0; i < warm_fwd; ++i) {
              fwd();
              if (backward) bwd();
            }
            return median_seconds(runs, dev, fwd);
          }
          return median_event_seconds(runs, warm_fwd, fwd);
        };
        auto time_bwd = [&](double tf) {
          if (sustained) return median_seconds(runs, dev, bwd);
          const double tfb = median_event_seconds(std::max<int64_t>(1, runs / 2), warm_fb, [&] { fwd(), bwd(); });
          return std::max(tfb - tf, 1e-9);
        };
        // Masked: the same shape's full causal attention first, then the mask.
        double tf_full = 0, tb_full = 0;
        if (masked) {
          tf_full = time_fwd(), tb_full = backward ? time_bwd(tf_full) : 0.0;
          p.window = window;
          p.doc_start = docs > 0 ? doc_start.data<int32_t>() : nullptr;
        }
        const double tf = time_fwd();
        const double tb = backward ? time_bwd(tf) : 0.0;  // 0: not timed
        p.dq_mode = atomic_mode;
        const double tb_atomic = atomic ? time_bwd(tf) : 0.0;
        p.dq_mode = cuda::FlashDq::kRecompute;
        double tf_mma = 0, tb_mma = 0;
        if (compare) {
          p.kernels = cuda::FlashKernels::kMmaSync;
          tf_mma = time_fwd(), tb_mma = time_bwd(tf_mma);
          p.kernels = cuda::FlashKernels::kAuto;
        }
        // FlashAttention papers' convention: 4·B·H·T²·d forward, halved when causal; backward 2.5×.
        // Masked: 4·H·d per visible (query, key) pair, counted exactly (the full causal beside it
        // keeps the convention).
        const double full_flops = 4.0 * double(B * H) * double(T) * double(T) * double(D) / (causal ? 2.0 : 1.0);
        const double flops = masked ? 4.0 * double(H) * double(D) * visible : full_flops;
        const double bf = 2.5 * flops / 1e12;
        auto rate = [](double tflop, double seconds) { return seconds > 0 ? tflop / seconds : 0.0; };
        std::printf("%-4lld %-6lld %-7s %-9.3f %-9.3f %-9.1f %-9.1f %-10.1f", (long long)D, (long long)T,
                    masked ? "masked" : causal ? "yes" : "no", tf * 1e3, tb * 1e3, flops / tf / 1e12, rate(bf, tb),
                    rate(bf, tb_atomic));
        if (compare) std::printf(" %-7.1f %-7.1f", flops / tf_mma / 1e12, bf / tb_mma);
        if (masked)
          std::printf(" | %-9.3f %-9.3f %-9.1f %-9.1f", tf_full * 1e3, tb_full * 1e3, full_flops / tf_full / 1e12,
                      rate(2.5 * full_flops / 1e12, tb_full));
        std::printf("\n");
        std::printf("{\"bench\":\"attention\",\"impl\":\"tilegrad\",\"variant\":\"%s\",\"d\":%lld,\"T\":%lld,"
                    "\"B\":%lld,\"H\":%lld,\"protocol\":\"%s\",\"causal\":%s,\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"fwd_tflops\":%.1f,\"bwd_tflops\":%.1f,"
                    "\"bwd_atomic_tflops\":%.1f",
                    variant.empty() ? "default" : variant.c_str(), (long long)D, (long long)T, (long long)B, (long long)H,
                    protocol.c_str(), causal ? "true" : "false", tf * 1e3,
                    tb * 1e3, flops / tf / 1e12, rate(bf, tb), rate(bf, tb_atomic));
        if (compare)
          std::printf(",\"fwd_mma_sync_tflops\":%.1f,\"bwd_mma_sync_tflops\":%.1f", flops / tf_mma / 1e12, bf / tb_mma);
        if (masked)
          std::printf(",\"window\":%lld,\"docs\":%lld,\"visible_fraction\":%.4f,\"causal_fwd_ms\":%.4f,"
                      "\"causal_bwd_ms\":%.4f,\"causal_fwd_tflops\":%.1f,\"causal_bwd_tflops\":%.1f",
                      (long long)window, (long long)docs, visible / (double(B) * double(T) * double(T + 1) / 2.0),
                      tf_full * 1e3, tb_full * 1e3, full_flops / tf_full / 1e12, rate(2.5 * full_flops / 1e12, tb_full));
        std::printf("}\n");
        std::fflush(stdout);
      }
    }
  }
  return 0;
#else
  TG_CHECK(false, fn, ": this tilegrad was built without CUDA");
  return 1;
#endif
}

}  // namespace tg
