// The training program end to end on a tiny model: exact resume, signals, non-finite steps,
// deterministic sampling, the `tilegrad` command's help and errors, kill -9 during saves.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "src/data/bpe.h"
#include "src/data/prepare.h"
#include "src/interop/hf.h"
#include "src/trainer/generate.h"
#include "src/trainer/trainer.h"
#include "tests/test_util.h"

#ifndef TILEGRAD_BINARY_DIR
#define TILEGRAD_BINARY_DIR "build"
#endif

namespace tg {
namespace {

namespace fs = std::filesystem;

// A small corpus prepared once per process into a temp directory.
fs::path corpus_dir() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("tilegrad_trainer_test_" + std::to_string(getpid()));
    fs::create_directories(d);
    std::ofstream f(d / "text.txt");
    for (int i = 0; i < 400; ++i) f << "In the beginning " << i % 7 << " the word was " << (i * 13) % 11 << ".\n";
    f.close();
    prepare_text({(d / "text.txt").string()}, (d / "data").string(), 0.1, false);
    return d;
  }();
  return dir;
}

Config tiny_config(const std::string& run_name, const std::string& device = "cpu") {
  Config c;
  c.run.device = device;
  c.model.n_layer = 1; c.model.n_head = 2; c.model.d_model = 16; c.model.max_seq_len = 16;
  c.model.dropout = 0.1;  // exercises the dropout counter in resume
  c.data.train = (corpus_dir() / "data" / "train_*.bin").string();
  c.data.val = (corpus_dir() / "data" / "val_*.bin").string();
  c.train.batch_size = 4; c.train.seq_len = 16; c.train.max_steps = 12; c.train.warmup_steps = 2;
  c.train.grad_accum = 2;
  c.run.out_dir = (corpus_dir() / run_name).string();
  c.run.log_every = 4; c.run.eval_every = 6; c.run.eval_steps = 2; c.run.ckpt_every = 0; c.run.keep_last = 2;
  fs::remove_all(c.run.out_dir);
  return c;
}

bool have_gpu() { return cuda_device_count() > 0; }

// Sets one element of a (host or device) float buffer: the test's way of poisoning gradients.
void set_element(Tensor t, int64_t i, float v) {
  Tensor host = t.to(Device::cpu());
  host.data<float>()[i] = v;
  t.copy_from(host);
}

// Runs `straight` to its end, and `first` (the same run in another directory) cut half way with a
// signal (the schedule still spans 12 steps) and resumed from its latest checkpoint: the losses
// and the final parameters must be the same bits. Returns the straight run's losses.
std::vector<double> expect_exact_resume(const Config& straight, const Config& first) {
  Trainer a(straight);
  a.run();
  Trainer b(first);
  b.set_step_hook([](int64_t step) { if (step == 6) std::raise(SIGTERM); });
  TrainResult rb = b.run();
  EXPECT_TRUE(rb.interrupted);
  EXPECT_EQ(rb.final_step, 6);
  Trainer c(first);
  TrainResult rc = c.run("latest");
  EXPECT_EQ(rc.final_step, 12);
  std::vector<double> joined = b.losses();
  joined.insert(joined.end(), c.losses().begin(), c.losses().end());
  EXPECT_EQ(joined.size(), a.losses().size());
  if (joined.size() != a.losses().size()) return a.losses();
  for (size_t i = 0; i < joined.size(); ++i) EXPECT_EQ(joined[i], a.losses()[i]) << "step " << i + 1;
  EXPECT_TRUE(testing::bitwise_equal(a.model().params().flat_values(), c.model().params().flat_values()));
  // The whole run state, not only the weights: counters (step, tokens_seen, bad_steps_in_row,
  // optimizer_steps, ...), the loader cursor and dropout counter, and AdamW's moments.
  const CheckpointData fa = resolve_and_load(straight.run.out_dir, "latest").second;
  const CheckpointData fc = resolve_and_load(first.run.out_dir, "latest").second;
  EXPECT_EQ(fa.ints, fc.ints);
  EXPECT_EQ(fa.u64_arrays, fc.u64_arrays);
  EXPECT_EQ(fa.ints.at("step"), 12);
  EXPECT_EQ(fa.ints.count("bad_steps_in_row"), 1u);
  EXPECT_EQ(fa.ints.count("optimizer_steps"), 1u);
  EXPECT_EQ(fa.arrays.size(), fc.arrays.size());
  for (size_t i = 0; i < fa.arrays.size() && i < fc.arrays.size(); ++i) {
    EXPECT_EQ(fa.arrays[i].name, fc.arrays[i].name);
    EXPECT_TRUE(fa.arrays[i].data.size() == fc.arrays[i].data.size() &&
                std::memcmp(fa.arrays[i].data.data(), fc.arrays[i].data.data(), fa.arrays[i].data.size() * 4) == 0)
        << fa.arrays[i].name;
  }
  return a.losses();
}

// --resume auto, as a resubmitted job runs it: a fresh start in an empty run directory, then,
// after a stop by signal, a resume from its latest checkpoint, bit for bit the straight run.
TEST(Trainer, ResumeAutoStartsFreshThenContinues) {
  const Config straight = tiny_config("auto_straight", "cpu"), first = tiny_config("auto_resumed", "cpu");
  Trainer a(straight);
  a.run();
  Trainer b(first);
  b.set_step_hook([](int64_t step) { if (step == 6) std::raise(SIGTERM); });
  const TrainResult rb = b.run("auto");
  ASSERT_TRUE(rb.interrupted);
  EXPECT_EQ(rb.final_step, 6);
  Trainer c(first);
  const TrainResult rc = c.run("auto");
  EXPECT_EQ(rc.final_step, 12);
  std::vector<double> joined = b.losses();
  joined.insert(joined.end(), c.losses().begin(), c.losses().end());
  EXPECT_EQ(joined, a.losses());
  std::ifstream log_file(first.run.out_dir + "/train.log");
  const std::string log((std::istreambuf_iterator<char>(log_file)), std::istreambuf_iterator<char>());
  EXPECT_NE(log.find("--resume auto: no checkpoint in the run directory; starting fresh"), std::string::npos);
  EXPECT_NE(log.find("--resume auto: resuming from the run directory's latest checkpoint"), std::string::npos);
}

class ExactResume : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(ExactResume, IsBitwiseEqualToAStraightRun) {
  const auto& [device, precision] = GetParam();
  if (device == "cuda" && !have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine (or built without CUDA)";
  Config straight = tiny_config("straight_" + device + precision, device);
  straight.train.precision = precision;
  Config first = tiny_config("resumed_" + device + precision, device);
  first.train.precision = precision;
  expect_exact_resume(straight, first);
}

// The long-context keys (a chunked head, recomputed blocks — with dropout and two micro-batches a
// step, so each recomputation must draw its forward's masks) resume bit for bit, and train as the
// default does: the same losses up to the order of the head's sums.
TEST(Trainer, LongContextKeysResumeExactlyAndTrackTheDefault) {
  auto long_context = [](const std::string& name) {
    Config c = tiny_config(name);
    c.model.n_layer = 2;
    c.train.lm_head_chunk = 24;  // 4 × 16 = 64 rows: chunks of 24, 24, 16
    c.train.recompute = true;
    return c;
  };
  const std::vector<double> losses = expect_exact_resume(long_context("lc_straight"), long_context("lc_resumed"));
  Config plain = tiny_config("lc_default");
  plain.model.n_layer = 2;
  Trainer d(plain);
  d.run();
  ASSERT_EQ(d.losses().size(), losses.size());
  for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], d.losses()[i], 1e-5) << "step " << i + 1;
}

INSTANTIATE_TEST_SUITE_P(Devices, ExactResume,
                         ::testing::Values(std::make_pair(std::string("cpu"), std::string("fp32")),
                                           std::make_pair(std::string("cuda"), std::string("fp32")),
                                           std::make_pair(std::string("cuda"), std::string("bf16"))),
                         [](const auto& info) { return info.param.first + "_" + info.param.second; });

// Checkpoints are the same files on both devices: a run cut on one device resumes on the other
// and tracks the straight run within fp32 rounding.
TEST(Trainer, CheckpointsMoveBetweenCpuAndGpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine (or built without CUDA)";
  Config straight = tiny_config("xdev_straight", "cpu");
  Trainer a(straight);
  a.run();
  for (auto [first, second] : {std::pair<std::string, std::string>{"cpu", "cuda"}, {"cuda", "cpu"}}) {
    Config c1 = tiny_config("xdev_" + first + "_" + second, first);
    Trainer b(c1);
    b.set_step_hook([](int64_t step) { if (step == 6) std::raise(SIGTERM); });
    ASSERT_TRUE(b.run().interrupted);
    Config c2 = c1;
    c2.run.device = second;
    Trainer c(c2);
    EXPECT_EQ(c.run("latest").final_step, 12);
    for (size_t i = 0; i < c.losses().size(); ++i)
      EXPECT_NEAR(c.losses()[i], a.losses()[6 + i], 1e-3) << first << " → " << second << ", step " << 7 + i;
  }
}

TEST(Trainer, SigtermFinishesTheStepAndCheckpoints) {
  Config cfg = tiny_config("sigterm");
  Trainer t(cfg);
  t.set_step_hook([](int64_t step) { if (step == 3) std::raise(SIGTERM); });
  TrainResult r = t.run();
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.final_step, 3);
  EXPECT_TRUE(fs::exists(fs::path(cfg.run.out_dir) / "ckpt-3.h5"));
  auto [path, data] = resolve_and_load(cfg.run.out_dir, "latest");
  EXPECT_EQ(data.ints["step"], 3);
}

TEST(Trainer, NonFiniteStepsAreSkippedThenTheRunStops) {
  Config cfg = tiny_config("nan");
  cfg.train.max_bad_steps = 3;
  // Periodic checkpoints at 2, 4, 6, 8, 10 with 2 kept: the stop's own checkpoint must not prune
  // the ones from before the streak, which a run that diverged before its losses became
  // non-finite needs.
  cfg.run.ckpt_every = 2, cfg.run.keep_last = 2;
  Trainer t(cfg);
  Tensor before_bad;
  t.set_gradient_hook([&](int64_t step, nn::ParameterStore& ps) {
    if (step == 4) before_bad = ps.flat_values().clone();
    if (step == 4 || step == 5) set_element(ps.flat_grads(), 0, NAN);  // two bad steps: tolerated
    if (step >= 8) set_element(ps.flat_grads(), 0, INFINITY);          // three in a row: stop
  });
  t.set_step_hook([&](int64_t step) {
    if (step == 6) EXPECT_TRUE(testing::bitwise_equal(before_bad, t.model().params().flat_values()))
        << "skipped updates must leave the parameters unchanged";
  });
  try {
    t.run();
    FAIL() << "expected the run to stop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 consecutive steps"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("earlier checkpoints are kept"), std::string::npos) << e.what();
  }
  const std::vector<std::string> kept = list_checkpoints(cfg.run.out_dir);
  ASSERT_EQ(kept.size(), 3u);  // the periodic 8 and 10 (keep_last 2), and the stop's 11
  EXPECT_EQ(fs::path(kept[0]).filename(), "ckpt-8.h5");
  auto [path, data] = resolve_and_load(cfg.run.out_dir, "latest");
  EXPECT_EQ(data.ints["step"], 11);
  EXPECT_EQ(data.ints["bad_steps_in_row"], 3);
  std::ifstream m(fs::path(cfg.run.out_dir) / "metrics.jsonl");
  std::string all((std::istreambuf_iterator<char>(m)), {});
  EXPECT_NE(all.find("\"type\":\"skipped\",\"step\":5"), std::string::npos);
}

// The host reads the steps' losses and the device's skip decisions only when it logs: a run that
// logs every 6 steps trains, skips, logs skipped steps and stops exactly as one that reads every
// step — on the CPU and, where there is one, on the GPU, where the decision is the device's.
TEST(Trainer, ReadingStepsOnlyWhenLoggingChangesNothing) {
  for (const std::string device : {"cpu", "cuda"}) {
    if (device == "cuda" && !have_gpu()) {
      std::cout << "  (GPU part skipped: no CUDA device)\n";
      continue;
    }
    SCOPED_TRACE(device);
    auto run = [&](int log_every, std::vector<double>* losses, Tensor* params) {
      Config cfg = tiny_config("deferred_" + std::to_string(log_every), device);
      cfg.run.log_every = log_every;
      cfg.run.eval_every = 0;
      cfg.train.max_steps = 14;
      cfg.train.max_bad_steps = 3;
      Trainer t(cfg);
      t.set_gradient_hook([](int64_t step, nn::ParameterStore& ps) {
        if (step == 2 || step == 3) set_element(ps.flat_grads(), 0, NAN);  // tolerated
        if (step >= 9) set_element(ps.flat_grads(), 1, INFINITY);        // steps 10–12: the stop
      });
      std::string err;
      try {
        t.run();
      } catch (const Error& e) {
        err = e.what();
      }
      EXPECT_NE(err.find("3 consecutive steps"), std::string::npos) << err;
      *losses = t.losses();
      *params = t.model().params().flat_values().to(Device::cpu());
      auto [path, data] = resolve_and_load(cfg.run.out_dir, "latest");
      EXPECT_EQ(data.ints["step"], 12);
      EXPECT_EQ(data.ints["bad_steps_in_row"], 3);
      EXPECT_EQ(data.ints["optimizer_steps"], 7);  // 12 steps, of which 3 and 4, 10 to 12 skipped
      std::ifstream m(fs::path(cfg.run.out_dir) / "metrics.jsonl");
      const std::string all((std::istreambuf_iterator<char>(m)), {});
      for (int s : {3, 4, 10, 11, 12})
        EXPECT_NE(all.find("\"type\":\"skipped\",\"step\":" + std::to_string(s) + ","), std::string::npos) << s;
      EXPECT_EQ(all.find("\"type\":\"skipped\",\"step\":13,"), std::string::npos);
    };
    std::vector<double> every, deferred;
    Tensor p_every, p_deferred;
    run(1, &every, &p_every);
    run(6, &deferred, &p_deferred);
    ASSERT_EQ(every.size(), 12u);
    ASSERT_EQ(deferred.size(), 12u);
    for (size_t i = 0; i < every.size(); ++i)
      EXPECT_EQ(std::memcmp(&every[i], &deferred[i], sizeof(double)), 0) << "step " << i + 1;
    EXPECT_TRUE(testing::bitwise_equal(p_every, p_deferred));
  }
}

// train.cuda_graph replays a recording of the forward and backward; the run must be the one the
// kernels launched one by one make, bit for bit: losses (with two micro-batches a step, evaluation
// between steps and non-finite gradients skipped), the final parameters, and a resume.
TEST(Trainer, CudaGraphRunIsBitwiseTheLaunchedRun) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine (or built without CUDA)";
  auto graph_config = [](const std::string& name, bool graph) {
    Config c = tiny_config(name, "cuda");
    c.model.dropout = 0;
    c.train.precision = "bf16";
    c.train.cuda_graph = graph;
    return c;
  };
  auto run = [&](bool graph, std::vector<double>* losses, Tensor* params, double* val) {
    Trainer t(graph_config(graph ? "graph_on" : "graph_off", graph));
    t.set_gradient_hook([](int64_t step, nn::ParameterStore& ps) {
      if (step == 3) set_element(ps.flat_grads(), 0, NAN);  // a skipped step
    });
    const TrainResult r = t.run();
    *losses = t.losses();
    *params = t.model().params().flat_values().to(Device::cpu());
    *val = r.last_val_loss;
  };
  std::vector<double> launched, graphed;
  Tensor p_launched, p_graphed;
  double val_launched = 0, val_graphed = 0;
  run(false, &launched, &p_launched, &val_launched);
  run(true, &graphed, &p_graphed, &val_graphed);
  ASSERT_EQ(launched.size(), 12u);
  ASSERT_EQ(graphed.size(), 12u);
  for (size_t i = 0; i < launched.size(); ++i)
    EXPECT_EQ(std::memcmp(&launched[i], &graphed[i], sizeof(double)), 0)
        << "step " << i + 1 << ": " << launched[i] << " launched, " << graphed[i] << " replayed";
  EXPECT_LT(graphed.back(), graphed.front()) << "the replayed steps must train";
  EXPECT_TRUE(testing::bitwise_equal(p_launched, p_graphed));
  EXPECT_EQ(val_launched, val_graphed);
  std::ifstream log(corpus_dir() / "graph_on" / "train.log");
  const std::string all((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(all.find("cuda graph:"), std::string::npos) << "the run must say it replays a graph";
  // A resumed run records its graph again after its first step; its losses are the straight
  // run's, and those are the launched kernels' (these runs have no skipped step).
  const std::vector<double> resumed_graph =
      expect_exact_resume(graph_config("graph_straight", true), graph_config("graph_resumed", true));
  Trainer plain(graph_config("plain", false));
  plain.run();
  ASSERT_EQ(resumed_graph.size(), plain.losses().size());
  for (size_t i = 0; i < resumed_graph.size(); ++i)
    EXPECT_EQ(std::memcmp(&plain.losses()[i], &resumed_graph[i], sizeof(double)), 0) << "step " << i + 1;
}

// train.cuda_graph is honoured where a graph can replay the step; elsewhere the run says why in
// train.log and trains as it would without the key.
TEST(Trainer, CudaGraphWhereItCannotReplayIsLoggedAndLaunched) {
  const Device gpu = Device::cuda(0);
  Config c = tiny_config("graph_where", "cuda");
  c.model.dropout = 0;
  EXPECT_EQ(cuda_graph_obstacle(c, 1, gpu), "");
  EXPECT_EQ(cuda_graph_obstacle(c, 2, gpu), "the run has 2 ranks");
  EXPECT_EQ(cuda_graph_obstacle(c, 1, Device::cpu()), "the run is on cpu");
  c.model.dropout = 0.1;
  EXPECT_EQ(cuda_graph_obstacle(c, 1, gpu), "model.dropout is 0.1");
  c.model.dropout = 0, c.data.document_mask = true;
  EXPECT_EQ(cuda_graph_obstacle(c, 1, gpu), "data.document_mask is on");
  c.data.document_mask = false, c.train.recompute = true;
  EXPECT_EQ(cuda_graph_obstacle(c, 1, gpu), "train.recompute is on");
  c.train.recompute = false, c.train.recompute_rows = 8;
  EXPECT_EQ(cuda_graph_obstacle(c, 1, gpu), "train.recompute_rows is 8");

  Config on_cpu = tiny_config("graph_on_cpu");
  on_cpu.train.cuda_graph = true;
  Trainer with_key(on_cpu);
  with_key.run();
  Trainer without_key(tiny_config("graph_absent"));
  without_key.run();
  ASSERT_EQ(with_key.losses().size(), without_key.losses().size());
  for (size_t i = 0; i < with_key.losses().size(); ++i)
    EXPECT_EQ(std::memcmp(&with_key.losses()[i], &without_key.losses()[i], sizeof(double)), 0) << "step " << i + 1;
  std::ifstream log(corpus_dir() / "graph_on_cpu" / "train.log");
  const std::string all((std::istreambuf_iterator<char>(log)), {});
  EXPECT_NE(all.find("cuda graph: off, the run is on cpu; the kernels are launched one by one"), std::string::npos)
      << all;
}

// The count of non-finite steps in a row is part of the run state: steps 5, 6 and 7 are bad, and
// a run cut after step 6 (two in a row) stops after step 7 on resume, as the straight run does.
// A resume that started the count again would train on to step 12.
TEST(Trainer, ResumeKeepsTheCountOfBadStepsInARow) {
  auto poison = [](int64_t step, nn::ParameterStore& ps) {
    if (step >= 4 && step <= 6) set_element(ps.flat_grads(), 0, NAN);
  };
  auto stop_error = [](Trainer& t, const std::string& resume) {
    try {
      t.run(resume);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("the run did not stop; it ended at step 12");
  };
  Config straight = tiny_config("bad_row_straight");
  straight.train.max_bad_steps = 3;
  Trainer a(straight);
  a.set_gradient_hook(poison);
  std::string err = stop_error(a, "");
  EXPECT_NE(err.find("3 consecutive steps"), std::string::npos) << err;
  EXPECT_EQ(resolve_and_load(straight.run.out_dir, "latest").second.ints.at("step"), 7);

  Config cut = tiny_config("bad_row_resumed");
  cut.train.max_bad_steps = 3;
  Trainer b(cut);
  b.set_gradient_hook(poison);
  b.set_step_hook([](int64_t step) { if (step == 6) std::raise(SIGTERM); });
  ASSERT_TRUE(b.run().interrupted);
  EXPECT_EQ(resolve_and_load(cut.run.out_dir, "latest").second.ints.at("bad_steps_in_row"), 2);
  Trainer c(cut);
  c.set_gradient_hook(poison);
  err = stop_error(c, "latest");
  EXPECT_NE(err.find("3 consecutive steps"), std::string::npos) << err;
  const CheckpointData last = resolve_and_load(cut.run.out_dir, "latest").second;
  EXPECT_EQ(last.ints.at("step"), 7);
  EXPECT_EQ(last.ints.at("bad_steps_in_row"), 3);
}

TEST(Trainer, RefusesToOverwriteARunAndChecksModelCompatibility) {
  Config cfg = tiny_config("refuse");
  cfg.train.max_steps = 2;
  Trainer(cfg).run();
  EXPECT_THROW(Trainer(cfg).run(), Error);
  Config other = cfg;
  other.model.d_model = 32;
  other.train.max_steps = 4;
  try {
    Trainer(other).run("latest");
    FAIL() << "expected an incompatible-model error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.d_model: config has 32, checkpoint has 16"), std::string::npos) << e.what();
  }
}

// train.init_from: a new run (step 0, fresh AdamW) from a run's weights, read from its checkpoint
// or from its Hugging Face export; both start from the same parameters, so they train alike.
TEST(Trainer, InitFromACheckpointOrAHuggingFaceFolder) {
  Config source = tiny_config("init_source");
  source.model.dropout = 0.0;
  source.train.max_steps = 4;
  TrainResult a = Trainer(source).run();
  auto [path, data] = resolve_and_load(a.last_checkpoint, "latest");
  const std::string hf = (corpus_dir() / "init_source_hf").string();
  fs::remove_all(hf);
  export_hf(data, path, hf, false);

  Config from_ckpt = tiny_config("init_from_ckpt");
  from_ckpt.model.dropout = 0.0;
  from_ckpt.train.max_steps = 3;
  from_ckpt.train.init_from = source.run.out_dir;
  Config from_hf = tiny_config("init_from_hf");
  from_hf.model.dropout = 0.0;
  from_hf.train.max_steps = 3;
  from_hf.train.init_from = hf;
  Config fresh = from_hf;
  fresh.run.out_dir = (corpus_dir() / "init_fresh").string();
  fresh.train.init_from = "";
  fs::remove_all(fresh.run.out_dir);
  TrainResult b = Trainer(from_ckpt).run(), c = Trainer(from_hf).run(), d = Trainer(fresh).run();
  EXPECT_EQ(b.final_step, 3);  // a new run: it counts from 0
  EXPECT_EQ(b.last_loss, c.last_loss);
  EXPECT_NE(b.last_loss, d.last_loss);
  auto [pb, cb] = resolve_and_load(b.last_checkpoint, "latest");
  auto [pc, cc] = resolve_and_load(c.last_checkpoint, "latest");
  for (size_t i = 0; i < cb.arrays.size(); ++i) EXPECT_EQ(cb.arrays[i].data, cc.arrays[i].data) << cb.arrays[i].name;
  std::ifstream log(fs::path(from_hf.run.out_dir) / "train.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("initial parameters from Hugging Face GPT-2 " + hf), std::string::npos) << text;

  Config wrong = tiny_config("init_wrong");
  wrong.model.d_model = 32;
  wrong.train.init_from = hf;
  try {
    Trainer(wrong).run();
    FAIL() << "expected a shape error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: n_embd is 16, model.d_model is 32"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("transformer.wte.weight: shape [256, 16], the model's is [256, 32]"),
              std::string::npos) << e.what();
  }
}

TEST(Sampling, DeterministicForASeed) {
  nn::GPTConfig g;
  g.n_layer = 1; g.n_head = 2; g.d_model = 16; g.max_seq_len = 16;
  nn::GPT model(g, 3);
  SampleOptions o;
  o.tokens = 40; o.seed = 5; o.top_k = 20; o.temperature = 0.9;
  auto a = generate(model, {65, 66}, o), b = generate(model, {65, 66}, o);
  EXPECT_EQ(a, b);
  o.seed = 6;
  EXPECT_NE(generate(model, {65, 66}, o), a);
  o.top_k = 1;  // top-1 is greedy whatever the seed
  auto g1 = generate(model, {65}, o);
  o.temperature = 0;
  EXPECT_EQ(generate(model, {65}, o), g1);
}

// Nucleus sampling: top-p 1 draws what sampling without it draws; a nucleus smaller than the
// most likely token's probability holds that token alone (greedy); in between, every token drawn
// lies in the nucleus of its step, and the nucleus shrinks what is drawn.
TEST(Sampling, TopPDrawsFromTheNucleus) {
  nn::GPTConfig g;
  g.n_layer = 1; g.n_head = 2; g.d_model = 16; g.max_seq_len = 64;
  nn::GPT model(g, 3);
  SampleOptions o;
  o.tokens = 40; o.seed = 5; o.temperature = 3;  // flat enough that the nucleus holds many tokens
  const std::vector<int32_t> all = generate(model, {65, 66}, o);
  o.top_p = 1;
  EXPECT_EQ(generate(model, {65, 66}, o), all);
  o.top_p = 1e-9;
  const std::vector<int32_t> tiny = generate(model, {65, 66}, o);
  SampleOptions greedy = o;
  greedy.temperature = 0, greedy.top_p = 1;
  EXPECT_EQ(tiny, generate(model, {65, 66}, greedy));
  // Each token of a top-p 0.5 run is among the most likely ids whose probabilities first reach 0.5.
  o.top_p = 0.5;
  const std::vector<int32_t> half = generate(model, {65, 66}, o);
  std::vector<int32_t> seq = {65, 66};
  std::set<int32_t> distinct;
  for (int32_t t : half) {
    NoGradGuard no_grad;
    model.set_training(false);
    const int64_t n = int64_t(seq.size()), V = g.vocab_size;
    const std::vector<double> logits = model.forward(Tensor::from_ints(seq, {1, n})).to_double_vector();
    std::vector<double> p(logits.end() - V, logits.end());
    const double mx = *std::max_element(p.begin(), p.end());
    double z = 0;
    for (double& v : p) z += v = std::exp((v - mx) / o.temperature);
    double above = 0;  // the mass of the ids more likely than the drawn one
    for (double v : p) if (v > p[size_t(t)]) above += v;
    EXPECT_LT(above, 0.5 * z) << "token " << t << " is outside the nucleus";
    seq.push_back(t);
    distinct.insert(t);
  }
  EXPECT_GT(distinct.size(), 3u);
  EXPECT_THROW(generate(model, {65}, SampleOptions{.top_p = 0}), Error);
  EXPECT_THROW(generate(model, {65}, SampleOptions{.top_p = 1.5}), Error);
}

// A vocabulary padded past the tokenizer's: ids from drawable_ids on are never drawn, greedy or
// sampled, so every token decodes. A model of more ids than bytes without a tokenizer shows its
// text as ids; a prompt for it must be ids.
TEST(Sampling, DrawsOnlyIdsTheTokenizerKnows) {
  nn::GPTConfig g;
  g.n_layer = 1; g.n_head = 2; g.d_model = 16; g.max_seq_len = 16; g.vocab_size = 300;
  nn::GPT model(g, 3);
  SampleOptions o;
  o.tokens = 200; o.seed = 5; o.temperature = 50;  // nearly uniform over the ids allowed
  int max_id = 0;
  for (int32_t t : generate(model, {65}, o)) max_id = std::max(max_id, int(t));
  EXPECT_GE(max_id, 257) << "the test needs draws past the bytes to mean anything";
  o.drawable_ids = 257;
  for (double temperature : {50.0, 0.0}) {
    o.temperature = temperature;
    for (int32_t t : generate(model, {65}, o)) ASSERT_LT(t, 257) << "temperature " << temperature;
  }
  const TextCodec bytes = codec_for_vocabulary({}, 257), ids = codec_for_vocabulary({}, 300);
  EXPECT_FALSE(bytes.ids);
  EXPECT_EQ(bytes.vocab_size(), 257);
  ASSERT_TRUE(ids.ids);
  EXPECT_EQ(ids.vocab_size(), 0);
  EXPECT_EQ(ids.decode({464, 0, 299}), " 464 0 299");
  EXPECT_EQ(ids.encode(" 464  0\n299 "), (std::vector<int32_t>{464, 0, 299}));
  EXPECT_THROW(ids.encode("And God said"), Error);
}

// Samples during training come after the step's checkpoint, and a model of more ids than bytes
// trained on byte shards without a tokenizer logs them as ids instead of failing to decode.
TEST(Sampling, TrainingSamplesOfAPaddedVocabularyAreIds) {
  Config cfg = tiny_config("padded_samples");
  cfg.model.vocab_size = 300;
  cfg.run.sample_every = 6, cfg.run.sample_tokens = 30, cfg.run.ckpt_every = 6;
  TrainResult r = Trainer(cfg).run();
  EXPECT_EQ(r.final_step, cfg.train.max_steps);
  std::ifstream log(fs::path(cfg.run.out_dir) / "train.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("samples are shown as token ids"), std::string::npos) << text;
  const size_t ckpt = text.find("ckpt-6.h5"), sample = text.find("sample at step 6");
  ASSERT_NE(sample, std::string::npos) << text;
  EXPECT_LT(ckpt, sample) << "the sample came before the step's checkpoint";
}

// The validation split must hold one batch when the run evaluates: found before the first step.
TEST(Sampling, ValidationTooSmallForABatchIsFoundBeforeTraining) {
  Config cfg = tiny_config("val_too_small");
  cfg.train.batch_size = 4096;
  cfg.train.grad_accum = 1;
  try {
    Trainer(cfg).run();
    ADD_FAILURE() << "trained with a validation split smaller than one batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.val"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("run.eval_every: 0"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(fs::path(cfg.run.out_dir) / "latest"));
  // No validation data: an error when the run evaluates, nothing needed when it never does.
  Config none = tiny_config("val_none");
  none.data.val = "";
  try {
    Trainer(none).run();
    ADD_FAILURE() << "evaluated without validation data";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.val is not set"), std::string::npos) << e.what();
  }
  none = tiny_config("val_none");
  none.data.val = "", none.run.eval_every = 0;
  EXPECT_EQ(Trainer(none).run().final_step, none.train.max_steps);
}

// The key/value cache: each position's logits, decoded one token at a time after a prompt, equal
// the full forward's — learned positions, and RoPE past max_seq_len — on the CPU (fp32) and, where
// there is one, on the GPU in bf16.
TEST(Sampling, CachedDecodingMatchesTheFullForward) {
  for (const bool gpu : {false, true}) {
    if (gpu && !have_gpu()) {
      std::cout << "  (GPU part skipped: no CUDA device)\n";
      continue;
    }
    for (const nn::PosEmbedding pe : {nn::PosEmbedding::learned, nn::PosEmbedding::rope}) {
      SCOPED_TRACE(std::string(gpu ? "cuda" : "cpu") + (pe == nn::PosEmbedding::rope ? " rope" : " learned"));
      nn::GPTConfig g;
      g.n_layer = 2; g.n_head = 2; g.d_model = 32; g.max_seq_len = 32; g.vocab_size = 97; g.pos_embedding = pe;
      const Device device = gpu ? Device::cuda(0) : Device::cpu();
      nn::GPT model(g, 7, DType::f32, device, gpu ? DType::bf16 : DType::f32);
      model.set_training(false);
      NoGradGuard no_grad;
      const int64_t n = pe == nn::PosEmbedding::rope ? 48 : 32, prompt = 7, V = g.vocab_size;
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (int64_t t = 0; t < n; ++t) ids[size_t(t)] = int32_t((t * 37 + 11) % V);
      const std::vector<double> full = model.forward(Tensor::from_ints(ids, {1, n})).to_double_vector();
      nn::KVCache cache;
      std::vector<double> cached =
          model.forward_cached(Tensor::from_ints(std::vector<int32_t>(ids.begin(), ids.begin() + prompt), {1, prompt}), cache)
              .to_double_vector();
      for (int64_t t = prompt; t < n; ++t) {
        const std::vector<double> one = model.forward_cached(Tensor::from_ints({ids[size_t(t)]}, {1, 1}), cache).to_double_vector();
        cached.insert(cached.end(), one.begin(), one.end());
      }
      EXPECT_EQ(cache.length, n);
      ASSERT_EQ(cached.size(), full.size());
      const double tol = gpu ? 6e-2 : 2e-5;
      double worst = 0;
      for (size_t i = 0; i < full.size(); ++i) worst = std::max(worst, std::abs(cached[i] - full[i]));
      EXPECT_LE(worst, tol) << "largest logit difference";
    }
  }
}

// Greedy sampling picks the same tokens with and without the cache, including after a learned-
// position model's window slides.
TEST(Sampling, GreedyIsTheSameWithAndWithoutTheCache) {
  for (const nn::PosEmbedding pe : {nn::PosEmbedding::learned, nn::PosEmbedding::rope}) {
    nn::GPTConfig g;
    g.n_layer = 2; g.n_head = 2; g.d_model = 32; g.max_seq_len = 32; g.pos_embedding = pe;
    nn::GPT model(g, 11);
    SampleOptions o;
    o.temperature = 0;
    o.tokens = pe == nn::PosEmbedding::learned ? 60 : 28;  // RoPE: inside the window, where both see all
    const std::vector<int32_t> with = generate(model, {72, 101, 108, 108}, o);
    o.kv_cache = false;
    const std::vector<int32_t> without = generate(model, {72, 101, 108, 108}, o);
    EXPECT_EQ(with, without) << (pe == nn::PosEmbedding::rope ? "rope" : "learned");
  }
}

// Runs a shell command, returns (exit status, combined output).
std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

static const std::string kBinary = std::string(TILEGRAD_BINARY_DIR) + "/tilegrad";

TEST(Command, HelpOfEachSubcommand) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  for (const char* cmd : {"prepare", "train", "sample", "eval", "plot", "export", "tokenizer"}) {
    auto [rc, out] = shell(kBinary + " " + cmd + " --help");
    EXPECT_EQ(rc, 0) << cmd;
    EXPECT_NE(out.find(std::string("usage: tilegrad ") + cmd), std::string::npos) << out;
  }
  auto [rc, out] = shell(kBinary + " train --help");
  EXPECT_NE(out.find("--resume latest|auto|PATH"), std::string::npos) << out;
  EXPECT_NE(out.find("--set KEY=VALUE…"), std::string::npos) << out;
  auto [rc2, out2] = shell(kBinary + " sample x --temprature 2");
  EXPECT_EQ(rc2, 1);
  EXPECT_NE(out2.find("unknown option '--temprature'"), std::string::npos) << out2;
}

// A device setting's errors name the setting as the user gave it: a config key (run.device: …) or
// a command's option (--device …), and say what to use instead.
TEST(Command, DeviceErrorsNameTheSettingAsGiven) {
  auto message = [](const std::string& setting, const std::string& name) {
    try {
      resolve_device(setting, 0, name);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message("gpu", "--device").find("--device 'gpu': expected auto, cpu or cuda"), std::string::npos);
  EXPECT_NE(message("gpu", "run.device").find("run.device: 'gpu': expected auto, cpu or cuda"), std::string::npos);
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is visible: --device cuda resolves";
  const std::string option = message("cuda", "--device"), key = message("cuda", "run.device");
  EXPECT_NE(option.find("--device cuda, but "), std::string::npos) << option;
  EXPECT_NE(option.find("; use --device cpu or auto"), std::string::npos) << option;
  EXPECT_NE(key.find("run.device: cuda, but "), std::string::npos) << key;
  EXPECT_NE(key.find("; use run.device: cpu or auto"), std::string::npos) << key;
}

// The command list shows each command's first sentence whole where it fits a line ("llm.c" or
// "ckpt-*.h5" inside it do not end it), and cut at a word where it does not.
TEST(Command, ListShowsEachCommandsFirstSentence) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  auto [rc, out] = shell(kBinary + " --help");
  EXPECT_EQ(rc, 0);
  EXPECT_NE(out.find("  plot      Plot train and validation loss against step from RUN_DIR/metrics.jsonl into a PNG "
                     "(needs gnuplot).\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("  bench     Benchmarks.\n"), std::string::npos) << out;
  EXPECT_NE(out.find("  sample    Generate text from a checkpoint (a ckpt-*.h5 file or a run directory, whose latest "
                     "checkpoint is used).\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("  prepare   Tokenize text files (bytes, vocabulary 256"), std::string::npos) << out;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("  ", 0) != 0) continue;
    EXPECT_LE(line.size(), 2 + 10 + 112 + 2) << line;  // " …" is 4 bytes in UTF-8
    EXPECT_TRUE(line.back() == '.' || line.ends_with("…")) << line;
  }
}

TEST(Command, BenchAttentionNamesABadOptionOnAnyMachine) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  const std::pair<const char*, const char*> cases[] = {
      {"--min-t 4096 --max-t 2048", "--min-t 4096 exceeds --max-t 2048"},
      {"--max-t 512", "--max-t 512 is below the shortest shape"},
      {"--head-dim 80", "--head-dim 80 has no kernel"},
      {"--steps 0", "--steps 0 times nothing"},
      {"--protocol fast", "--protocol fast is unknown; give reference or sustained"},
      {"--warmup -1", "--warmup is negative"},
      {"--causal 3", "--causal takes 1 (causal only), 0 (non-causal only) or 2 (both), got 3"},
  };
  for (const auto& [args, message] : cases) {
    auto [rc, out] = shell(kBinary + " bench attention " + args);
    EXPECT_EQ(rc, 1) << args;
    EXPECT_NE(out.find(message), std::string::npos) << args << ": " << out;
  }
}

TEST(Command, BenchMemorySweepsTheSequenceLength) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  const std::string cfg = std::string(TILEGRAD_SOURCE_DIR) + "/configs/kjv-tiny.yaml";
  // kjv-tiny's position table has 64 rows: T 128 runs with the table grown to 128.
  auto [rc, out] = shell(kBinary + " bench memory " + cfg + " --min-t 16 --max-t 128 --set run.device=cpu model.n_layer=1" +
                         " train.batch_size=2 train.lm_head_chunk=8 train.recompute=true");
  ASSERT_EQ(rc, 0) << out;
  std::vector<double> peaks;
  for (int64_t T : {16, 32, 64, 128}) {
    const std::string key = "\"T\":" + std::to_string(T) + ",";
    const size_t at = out.find(key);
    ASSERT_NE(at, std::string::npos) << T << ": " << out;
    const size_t p = out.find("\"peak_gib\":", at);
    ASSERT_NE(p, std::string::npos) << out;
    peaks.push_back(std::stod(out.substr(p + 11)));
    EXPECT_NE(out.find("| " + std::to_string(T) + " | "), std::string::npos) << out;  // the closing table
  }
  EXPECT_GT(peaks.back(), peaks.front());  // activations grow with T
  EXPECT_NE(out.find("\"recompute\":true"), std::string::npos) << out;
  const std::pair<const char*, const char*> bad[] = {
      {"--min-t 0", "--min-t 0 is not a sequence length"},
      {"--min-t 64 --max-t 32", "--min-t 64 exceeds --max-t 32"},
  };
  for (const auto& [args, message] : bad) {
    auto [rc2, out2] = shell(kBinary + " bench memory " + cfg + " --set run.device=cpu " + args);
    EXPECT_EQ(rc2, 1) << args;
    EXPECT_NE(out2.find(message), std::string::npos) << args << ": " << out2;
  }
}

TEST(Command, BadSetFailsBeforeTraining) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  std::string cfg = std::string(TILEGRAD_SOURCE_DIR) + "/configs/kjv-tiny.yaml";
  auto [rc, out] = shell(kBinary + " train " + cfg + " --set train.lr=abc");
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("train.lr"), std::string::npos) << out;
}

TEST(Command, KillNineDuringSavesAlwaysLeavesAResumableRun) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  Config cfg = tiny_config("kill9");
  const std::string dir = cfg.run.out_dir;
  std::string base = kBinary + " train " + std::string(TILEGRAD_SOURCE_DIR) + "/configs/kjv-tiny.yaml --set" +
                     " model.n_layer=1 model.d_model=64 model.max_seq_len=16 train.seq_len=16 train.batch_size=2" +
                     " train.max_steps=100000 run.ckpt_every=1 run.keep_last=2 run.log_every=1000 run.eval_every=0" +
                     " run.sample_every=0 data.train=" + cfg.data.train + " data.val=" + cfg.data.val + " run.out_dir=" + dir;
  for (int round = 0; round < 6; ++round) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::string cmd = base + (round == 0 ? "" : " --resume latest") + " > /dev/null 2>&1";
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), (char*)nullptr);
      _exit(127);
    }
    // Round 0 waits for the first checkpoint (however loaded the machine); then each kill lands
    // at a different moment of a save.
    for (int waited = 0; round == 0 && waited < 120000 && !fs::exists(fs::path(dir) / "latest"); waited += 10)
      usleep(10000);
    usleep(useconds_t(round == 0 ? 200000 : 300000 + 137000 * round));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(fs::exists(fs::path(dir) / "latest")) << "round " << round << ": no checkpoint yet";
    auto [path, data] = resolve_and_load(dir, "latest");  // must load a complete checkpoint
    EXPECT_GT(data.ints["step"], 0);
  }
}

}  // namespace
}  // namespace tg

namespace tg {
namespace {

TEST(Command, PlotWritesALossPng) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  // test.sh installs gnuplot, so CI runs this; a machine without it (the GPU box) skips.
  if (std::system("gnuplot --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot is not installed";
  Config cfg = tiny_config("plot");
  Trainer(cfg).run();
  // Lines that are not the trainer's records are skipped, whatever their length (one of 300,000
  // digits once overflowed the stack of a regular-expression search) or content.
  {
    std::ofstream m(fs::path(cfg.run.out_dir) / "metrics.jsonl", std::ios::app);
    m << "{\"type\":\"train\",\"step\":99,\"loss\":" << std::string(300000, '7') << "}\n"
      << "{\"type\":\"train\",\"step\":\"x\",\"loss\":1}\n{\"type\":\"eval\",\"step\":3,\"val_loss\":null}\n"
      << "{\"type\":\"train\",\"st\n";
  }
  auto [rc, out] = shell(kBinary + " plot " + cfg.run.out_dir);
  ASSERT_EQ(rc, 0) << out;
  fs::path png = fs::path(cfg.run.out_dir) / "loss.png";
  ASSERT_TRUE(fs::exists(png));
  std::ifstream f(png, std::ios::binary);
  char magic[4] = {};
  f.read(magic, 4);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
  EXPECT_GT(fs::file_size(png), 1000u);
}

// Paths reach gnuplot's script as data: a quote in a run directory or output name is part of the
// name, never script (an output named like "x'; system('touch F'); print '" runs nothing), and an
// output that cannot be written is an error naming it and why, with no PNG sent to the terminal.
TEST(Command, PlotQuotesPathsAndNamesAnUnwritableOutput) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  if (std::system("gnuplot --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot is not installed";
  Config cfg = tiny_config("plot_quotes");
  const fs::path dir = fs::path(cfg.run.out_dir).parent_path() / "bob's run";
  fs::remove_all(dir);
  cfg.run.out_dir = dir.string();
  Trainer(cfg).run();
  auto [rc, out] = shell(kBinary + " plot \"" + dir.string() + "\"");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_GT(fs::file_size(dir / "loss.png"), 1000u);
  const fs::path marker = dir / "INJECTED";
  const std::string evil = "x.png'; system('touch " + marker.filename().string() + "'); print '";
  auto [rc2, out2] = shell("cd \"" + dir.string() + "\" && " + kBinary + " plot . --out \"" + evil + "\"");
  ASSERT_EQ(rc2, 0) << out2;
  EXPECT_FALSE(fs::exists(marker)) << "a path in the plot command ran as gnuplot script";
  EXPECT_GT(fs::file_size(dir / evil), 1000u);
  auto [rc3, out3] = shell(kBinary + " plot \"" + dir.string() + "\" --out /nonexistent-dir/x.png");
  EXPECT_EQ(rc3, 1) << out3;
  EXPECT_NE(out3.find("cannot write /nonexistent-dir/x.png: No such file or directory"), std::string::npos) << out3;
  EXPECT_EQ(out3.find("PNG"), std::string::npos) << "image bytes on the terminal";
}

TEST(Command, EvalAndSampleReadACheckpoint) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  Config cfg = tiny_config("evalsample");
  TrainResult r = Trainer(cfg).run();
  auto [rc, out] = shell(kBinary + " eval " + cfg.run.out_dir);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("val loss"), std::string::npos) << out;
  // The text (standard output) is the same for a seed; standard error reports the time it took.
  const std::string sample = "(" + kBinary + " sample " + r.last_checkpoint + " --prompt In --tokens 30 --seed 4";
  auto [rc1, s1] = shell(sample + " 2>/dev/null)");
  auto [rc2, s2] = shell(sample + " 2>/dev/null)");
  ASSERT_EQ(rc1, 0) << s1;
  EXPECT_GT(s1.size(), 30u) << s1;
  EXPECT_EQ(s1, s2);
  auto [rc3, s3] = shell(sample + " >/dev/null)");
  EXPECT_NE(s3.find("sampled 30 tokens in "), std::string::npos) << s3;
}

// A BPE learned by `tokenizer train`, shards made with it, a run that records it in its
// checkpoints, and sample, eval and export that use it.
TEST(Command, TokenizerPrepareTrainSampleExport) {
  if (!have_bpe_encoder()) GTEST_SKIP() << "built without ICU (libicu-dev): BPE cannot encode";
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  const fs::path dir = corpus_dir() / "bpe_cli";
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream a(dir / "a.txt"), b(dir / "b.txt");
    for (int i = 0; i < 200; ++i) a << "In the beginning " << i % 7 << " the word was " << (i * 13) % 11 << ".\n";
    for (int i = 0; i < 200; ++i) b << "And the earth was without form, and void; " << i % 5 << "\n";
  }
  const std::string texts = (dir / "a.txt").string() + " " + (dir / "b.txt").string();
  auto [rc, out] = shell(kBinary + " tokenizer train --text " + texts + " --vocab-size 300 --out " + (dir / "tok").string());
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) = shell(kBinary + " prepare --text " + texts + " --tokenizer " + (dir / "tok").string() + " --out " +
                            (dir / "data").string() + " --val-fraction 0.1");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(dir / "data/vocab.json"));
  Config cfg = tiny_config("bpe_cli/run");
  cfg.model.vocab_size = 300;
  cfg.data.train = (dir / "data/train_*.bin").string();
  cfg.data.val = (dir / "data/val_*.bin").string();
  cfg.run.sample_every = 12;
  TrainResult r = Trainer(cfg).run();
  auto [path, data] = resolve_and_load(r.last_checkpoint, "latest");
  EXPECT_EQ(data.strings.at("tokenizer/vocab.json"), BpeTokenizer::load((dir / "tok").string()).vocab_json());
  std::tie(rc, out) = shell(kBinary + " sample " + cfg.run.out_dir + " --prompt 'And the' --tokens 20 --temperature 0");
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("tokenizer: byte-level BPE (300 ids)"), std::string::npos) << out;
  EXPECT_NE(out.find("And the"), std::string::npos) << out;
  std::tie(rc, out) = shell(kBinary + " eval " + cfg.run.out_dir + " --steps 2");
  ASSERT_EQ(rc, 0) << out;
  std::tie(rc, out) = shell(kBinary + " export " + cfg.run.out_dir + " --format hf --out " + (dir / "hf").string());
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(fs::exists(dir / "hf/merges.txt"));
  std::ifstream config(dir / "hf/config.json");
  std::string text((std::istreambuf_iterator<char>(config)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"eos_token_id\": 299"), std::string::npos) << text;
  std::tie(rc, out) = shell(kBinary + " export " + cfg.run.out_dir + " --format onnx --out " + (dir / "x").string());
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("unknown --format 'onnx'; available: hf"), std::string::npos) << out;
  std::tie(rc, out) = shell(kBinary + " export " + cfg.run.out_dir + " --out " + (dir / "hf").string());
  EXPECT_EQ(rc, 1);
  EXPECT_NE(out.find("non-empty folder"), std::string::npos) << out;
}

}  // namespace
}  // namespace tg
