// `tilegrad bench memory --predict --series … --out DIR`: the JSON lines, the table, memory.csv
// (a row per series and T, measured and predicted, by category) and memory.png (with gnuplot,
// which ./test.sh installs; without it the PNG is skipped and says so), and --no-run's
// predictions for lengths no machine here could run.
#include <gtest/gtest.h>
#include <sys/wait.h>
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
#include "src/io/config.h"
#include "src/trainer/memory_model.h"

#ifndef TILEGRAD_SOURCE_DIR
#define TILEGRAD_SOURCE_DIR "."
#endif
#ifndef TILEGRAD_BINARY_DIR
#define TILEGRAD_BINARY_DIR "build"
#endif

namespace tg {
namespace {

namespace fs = std::filesystem;

std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

const std::string kBinary = std::string(TILEGRAD_BINARY_DIR) + "/tilegrad";
const std::string kTinyConfig = std::string(TILEGRAD_SOURCE_DIR) + "/configs/long-tiny.yaml";

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("tilegrad_bench_memory_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::vector<std::vector<std::string>> read_csv(const fs::path& path) {
  std::ifstream in(path);
  std::vector<std::vector<std::string>> rows;
  std::string line;
  while (std::getline(in, line)) {
    // RFC 4180 fields: a quoted one may hold commas (the phase names do).
    std::vector<std::string> cells(1);
    bool quoted = false;
    for (char ch : line) {
      if (ch == '"') quoted = !quoted;
      else if (ch == ',' && !quoted) cells.emplace_back();
      else cells.back() += ch;
    }
    rows.push_back(cells);
  }
  return rows;
}

TEST(BenchMemory, WritesTheCsvAndThePng) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  const fs::path dir = scratch("bench");
  {  // PyTorch's series as torch_gpt.py memory --csv writes it
    std::ofstream f(dir / "torch.csv");
    f << "series,T,peak_gib,ms\nsdpa_flash,64,0.004,1.0\nsdpa_flash,128,0.006,2.0\nsdpa_flash,256,0.011,3.0\n";
  }
  auto [rc, out] = shell(kBinary + " bench memory " + kTinyConfig +
                         " --set run.device=cpu train.lm_head_chunk=64 --min-t 64 --max-t 256 --series "
                         "flash-recompute-chunk,materialised --predict --out " + (dir / "out").string() +
                         " --torch-csv " + (dir / "torch.csv").string());
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"predicted_peak_gib\":"), std::string::npos) << out;
  EXPECT_NE(out.find("| series | T | peak | of which activations | predicted (error) | ms/step |"), std::string::npos) << out;
  const auto rows = read_csv(dir / "out" / "memory.csv");
  ASSERT_EQ(rows.size(), 7u) << "a header and 2 series × 3 lengths";
  const std::vector<std::string> header = {
      "series", "T", "status", "measured_peak_bytes", "predicted_peak_bytes", "params_bytes", "grads_bytes",
      "optimizer_bytes", "activations_bytes", "workspace_bytes", "predicted_params_bytes", "predicted_grads_bytes",
      "predicted_optimizer_bytes", "predicted_activations_bytes", "predicted_workspace_bytes", "predicted_phase",
      "step_ms"};
  EXPECT_EQ(rows[0], header);
  const std::vector<std::string> series = {"flash-recompute-chunk", "materialised"};
  for (size_t i = 1; i < rows.size(); ++i) {
    const auto& r = rows[i];
    ASSERT_EQ(r.size(), header.size()) << i;
    EXPECT_EQ(r[0], series[(i - 1) / 3]);
    EXPECT_EQ(std::stoll(r[1]), 64ll << ((i - 1) % 3));
    EXPECT_EQ(r[2], "measured");
    EXPECT_FALSE(r[15].empty()) << "the predicted phase";
    EXPECT_GT(std::stod(r[16]), 0) << "the step's milliseconds, after the phase";
    const double measured = std::stod(r[3]), predicted = std::stod(r[4]);
    EXPECT_LE(std::abs(predicted - measured), 0.05 * measured) << r[0] << " T " << r[1];
    // The measured categories: params, grads and optimizer as the model has them; on the CPU
    // (no workspace) the activations' own peak is where the total's is, so the categories add up.
    EXPECT_EQ(r[5], r[10]);
    EXPECT_EQ(r[6], r[11]);
    EXPECT_EQ(r[7], r[12]);
    EXPECT_EQ(std::stoll(r[7]), 2 * std::stoll(r[5]) + int64_t(sizeof(cpu::StepDecision)))
        << "AdamW's two moments and the device-side step state";
    EXPECT_EQ(std::stoll(r[9]), 0);
    EXPECT_EQ(std::stoll(r[5]) + std::stoll(r[6]) + std::stoll(r[7]) + std::stoll(r[8]), std::stoll(r[3]));
    EXPECT_GT(std::stod(r[16]), 0.0) << "step ms";
  }
  // The materialised attention keeps (T, T) scores: it needs more than the recomputed flash at T 256.
  EXPECT_GT(std::stoll(rows[6][3]), std::stoll(rows[3][3]));
  const fs::path png = dir / "out" / "memory.png";
  if (std::system("gnuplot --version > /dev/null 2>&1") != 0) {
    EXPECT_NE(out.find("memory.png skipped"), std::string::npos) << out;
    EXPECT_FALSE(fs::exists(png));
  } else {
    ASSERT_TRUE(fs::exists(png)) << out;
    std::ifstream f(png, std::ios::binary);
    char magic[4] = {};
    f.read(magic, 4);
    EXPECT_EQ(std::string(magic + 1, 3), "PNG");
    EXPECT_GT(fs::file_size(png), 5000u);
    for (const auto& e : fs::directory_iterator(dir / "out"))
      EXPECT_NE(e.path().filename().string()[0], '.') << "plot data left behind: " << e.path();
  }
  fs::remove_all(dir);
}

TEST(BenchMemory, NoRunPrintsThePredictionForAGpu) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  auto [rc, out] = shell(kBinary + " bench memory " + kTinyConfig +
                         " --set run.device=cuda train.precision=bf16 --min-t 1048576 --max-t 2097152 --no-run");
  ASSERT_EQ(rc, 0) << out;
  for (int64_t T : {1048576, 2097152}) {
    Config c = load_config(kTinyConfig, {"run.device=cuda", "train.precision=bf16", "train.seq_len=" + std::to_string(T)},
                           false);
    const MemoryPrediction p = predict_memory(c, "cuda");
    const std::string field = "\"T\":" + std::to_string(T) + ",\"params\":" + std::to_string(p.parameter_count) +
                              ",\"predicted_only\":true";
    EXPECT_NE(out.find(field), std::string::npos) << field << "\n" << out;
    EXPECT_NE(out.find("\"predicted_peak_bytes\":" + std::to_string(p.total)), std::string::npos) << out;
  }
  EXPECT_EQ(out.find("\"peak_gib\""), std::string::npos) << "nothing was measured";
}

TEST(BenchMemory, TrainsWithinFivePercentOfThePrediction) {
  // `tilegrad train` in a process of its own (the peak is per process): the peak its metrics
  // record is the one its start-up line predicts.
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  const fs::path dir = scratch("train");
  {
    std::ofstream f(dir / "text.txt");
    for (int i = 0; i < 3000; ++i) f << "In the beginning " << i % 7 << " the word was " << (i * 13) % 11 << ".\n";
  }
  prepare_text({(dir / "text.txt").string()}, (dir / "data").string(), 0.1, false);
  const std::vector<std::string> sets = {"data.train=" + (dir / "data" / "train_*.bin").string(),
                                         "data.val=" + (dir / "data" / "val_*.bin").string(), "run.device=cpu",
                                         "run.out_dir=" + (dir / "run").string(), "train.max_steps=2",
                                         "train.seq_len=1024", "train.warmup_steps=1", "run.eval_every=0",
                                         "run.ckpt_every=0", "run.log_every=1"};
  std::string cmd = "OMP_NUM_THREADS=2 " + kBinary + " train " + kTinyConfig + " --set";
  for (const std::string& s : sets) cmd += " " + s;
  auto [rc, out] = shell(cmd);
  ASSERT_EQ(rc, 0) << out;
  const MemoryPrediction p = predict_memory(load_config(kTinyConfig, sets), "cpu");
  EXPECT_NE(out.find("memory predicted per rank (docs/memory.md): " + describe_prediction(p)), std::string::npos) << out;
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  std::string line;
  int64_t peak = -1;
  while (std::getline(metrics, line)) {
    const size_t at = line.find("\"peak_bytes\":");
    if (at != std::string::npos) peak = std::stoll(line.substr(at + 13));
  }
  ASSERT_GT(peak, 0) << "metrics.jsonl records the peak";
  EXPECT_LE(std::abs(double(p.total - peak)), 0.05 * double(peak)) << "predicted " << p.total << ", measured " << peak;
  fs::remove_all(dir);
}

// `tilegrad bench train` with train.grad_accum: a step is k micro-batches, so its tokens are
// B·T·k, and the loss it reports is their mean (the same tokens each time: the first step's mean
// equals one micro-batch's loss exactly).
TEST(BenchTrain, AStepIsEveryMicroBatchOfGradAccum) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  const std::string config = std::string(TILEGRAD_SOURCE_DIR) + "/configs/kjv-tiny.yaml";
  auto field = [](const std::string& line, const std::string& key) {
    const size_t at = line.find("\"" + key + "\":");
    EXPECT_NE(at, std::string::npos) << key << " in " << line;
    return at == std::string::npos ? -1.0 : std::stod(line.substr(at + key.size() + 3));
  };
  std::vector<std::string> lines;
  for (int k : {1, 2}) {
    auto [rc, out] = shell("OMP_NUM_THREADS=2 " + kBinary + " bench train " + config +
                           " --steps 1 --warmup 0 --set run.device=cpu train.grad_accum=" + std::to_string(k));
    ASSERT_EQ(rc, 0) << out;
    const size_t at = out.find("{\"bench\":\"train\"");
    ASSERT_NE(at, std::string::npos) << out;
    lines.push_back(out.substr(at, out.find('\n', at) - at));
  }
  for (int k : {1, 2}) {
    const std::string& line = lines[size_t(k - 1)];
    EXPECT_EQ(field(line, "grad_accum"), k) << line;
    const double tokens = field(line, "tokens_per_s") * field(line, "ms_per_step") / 1e3;
    EXPECT_NEAR(tokens, 12.0 * 64.0 * k, 0.01 * 12 * 64 * k) << "B·T·k tokens a step: " << line;
  }
  EXPECT_EQ(field(lines[0], "loss"), field(lines[1], "loss")) << "the mean of two equal micro-batch losses";
}

}  // namespace
}  // namespace tg
