// `tilegrad bench memory`: the peak memory of one training step against the sequence length,
// measured and predicted, with memory.csv and memory.png, beside bench/reference/torch_gpt.py memory.
#include "cli/bench.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "src/tensor/memory.h"
#include "src/trainer/footprint.h"
#include "src/trainer/memory_model.h"
#include "src/util/files.h"
#include "src/trainer/trainer.h"
#include "cli/gnuplot.h"

#include "cli/bench_steps.h"

namespace tg {

using bench::fmt_ms;
using bench::gib;
using bench::run_training_steps;
using bench::StepFigures;

namespace {
constexpr const char* kWho = "tilegrad bench memory";
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
    // The steps launched as written: the memory model predicts the launched step, and a recorded
    // graph keeps its memory in a pool of its own.
    c.train.cuda_graph = false;
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

// PyTorch's series from bench/reference/torch_gpt.py memory: its --csv file (series,T,peak_gib,ms)
// or its JSON lines (out-of-memory lines skipped). Returns (series, T, peak GiB) rows.
struct TorchPoint {
  std::string series;
  int64_t T;
  double peak_gib;
};
std::vector<TorchPoint> read_torch_memory(const std::string& path) {
  std::istringstream in(read_regular_file(path, "tilegrad bench memory: --torch-csv"));
  std::vector<TorchPoint> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '{') {
      const nlohmann::json r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (r.is_object() && r.contains("series") && r["series"].is_string() && r.contains("T") &&
          r["T"].is_number_integer() && r.contains("peak_gib") && r["peak_gib"].is_number())
        out.push_back({r["series"].get<std::string>(), r["T"].get<int64_t>(), r["peak_gib"].get<double>()});
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
    lines += std::string(lines.empty() ? "plot " : ", ") + "'" + gnuplot_quote(kWho, file) + "' using 1:2 " + style;
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
    if (nm) curve(measured.string(), "with linespoints pt 7 lw 2" + color + " title '" + gnuplot_quote(kWho, series[i]) + " (measured)'");
    curve(predicted.string(), "with lines dt 2 lw 1.5" + color + " title '" + gnuplot_quote(kWho, series[i]) + " (predicted)'");
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
                          gnuplot_quote(kWho, torch_series[i]) + "'");
  }
  if (capacity > 0)
    lines += ", " + std::to_string(double(capacity) / G) + " with lines lw 2 lc rgb 'black' title '" +
             gnuplot_quote(kWho, device_name) + " capacity'";
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
  std::string script = "set multiplot layout 1,2\n"
                       "set title 'Peak memory of one training step'\nset logscale xy 2\nset format x '%.0s%c'\n"
                       "set format y '%.3g'\nset bmargin 5\n"
                       "set xlabel 'sequence length T (tokens)'\nset ylabel 'peak memory (GiB)'\nset grid\n"
                       "set key bottom right opaque\n" +
                       lines +
                       "\nunset logscale\nset format x '%g'\nset title 'Peak by category at the largest T'\n"
                       "set style data histograms\nset style histogram rowstacked\nset style fill solid 0.8 border -1\n"
                       "set boxwidth 0.6\nset xlabel ''\nset ylabel 'GiB'\nset key top left\nset yrange [0:*]\n"
                       "plot for [i=2:6] '" +
                       gnuplot_quote(kWho, bars.string()) + "' using i:xtic(1) title columnheader(i)\nunset multiplot\n";
  run_gnuplot(kWho, "pngcairo noenhanced size 1500,640", png.string(), script);
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
                                           : (no_run && device.is_cuda() ? -1 : total_memory(device));
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

}  // namespace tg
