// Nothing crashes, nothing is lost: full disks, absurd configs, inconsistent or non-finite
// checkpoints, signals, metrics that stay valid UTF-8 JSON with one record per step, and CPU
// training that gives the same bits on 1 and 2 OpenMP threads.
#include <gtest/gtest.h>
#include <omp.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <set>

#include "src/data/prepare.h"
#include "src/interop/hf.h"
#include "src/io/append_file.h"
#include "src/trainer/footprint.h"
#include "src/trainer/generate.h"
#include "src/trainer/trainer.h"
#include "tests/fuzz_util.h"
#include "tests/test_util.h"

#ifndef TILEGRAD_BINARY_DIR
#define TILEGRAD_BINARY_DIR "build"
#endif

namespace tg {
namespace {

namespace fs = std::filesystem;

fs::path corpus_dir() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("tilegrad_robust_test_" + std::to_string(getpid()));
    fs::create_directories(d);
    std::ofstream f(d / "text.txt");
    for (int i = 0; i < 400; ++i) f << "In the beginning " << i % 7 << " the word was " << (i * 13) % 11 << ".\n";
    f.close();
    prepare_text({(d / "text.txt").string()}, (d / "data").string(), 0.1, false);
    return d;
  }();
  return dir;
}

Config tiny_config(const std::string& run_name) {
  Config c;
  c.run.device = "cpu";
  c.model.n_layer = 1; c.model.n_head = 2; c.model.d_model = 16; c.model.max_seq_len = 16;
  c.data.train = (corpus_dir() / "data" / "train_*.bin").string();
  c.data.val = (corpus_dir() / "data" / "val_*.bin").string();
  c.train.batch_size = 4; c.train.seq_len = 16; c.train.max_steps = 12; c.train.warmup_steps = 2;
  c.run.out_dir = (corpus_dir() / run_name).string();
  c.run.log_every = 1; c.run.eval_every = 6; c.run.eval_steps = 2; c.run.ckpt_every = 4; c.run.keep_last = 5;
  fs::remove_all(c.run.out_dir);
  return c;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::vector<std::string> lines_of(const fs::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

// Well-formed UTF-8 per RFC 3629.
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
    for (size_t k = 1; k < n; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d >> 6) != 2) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    const uint32_t min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

std::pair<int, std::string> shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

const std::string kBinary = std::string(TILEGRAD_BINARY_DIR) + "/tilegrad";

std::string train_command(const Config& c, const std::string& extra = "") {
  return kBinary + " train " + std::string(TILEGRAD_SOURCE_DIR) + "/configs/kjv-tiny.yaml --set run.device=cpu" +
         " model.n_layer=1 model.n_head=2 model.d_model=16 model.max_seq_len=16 train.seq_len=16 train.batch_size=4" +
         " train.warmup_steps=2 run.sample_every=0 run.eval_steps=2 data.train=" + c.data.train +
         " data.val=" + c.data.val + " run.out_dir=" + c.run.out_dir + " " + extra;
}

// ---------------------------------------------------------------------------------------------
// Signals

TEST(Robustness, SighupStopsWithACheckpointLikeSigterm) {
  Config cfg = tiny_config("sighup");
  cfg.run.ckpt_every = 0;
  Trainer t(cfg);
  t.set_step_hook([](int64_t step) { if (step == 3) std::raise(SIGHUP); });
  TrainResult r = t.run();
  EXPECT_TRUE(r.interrupted);
  EXPECT_EQ(r.final_step, 3);
  EXPECT_EQ(resolve_and_load(cfg.run.out_dir, "latest").second.ints.at("step"), 3);
}

// A second training process in a run directory that one is training in stops before it writes
// anything there (two would interleave their logs and delete each other's temporary checkpoint
// files); once the first has ended, the directory is free again.
TEST(Robustness, OneTrainingPerRunDirectory) {
  Config cfg = tiny_config("locked");
  std::string second;
  Trainer t(cfg);
  t.set_step_hook([&](int64_t step) {
    if (step != 2) return;
    try {
      Trainer(cfg).run("latest");
    } catch (const Error& e) {
      second = e.what();
    }
  });
  EXPECT_EQ(t.run().final_step, 12);
  EXPECT_NE(second.find("another tilegrad (pid " + std::to_string(::getpid()) + ") is training in"), std::string::npos)
      << second;
  cfg.train.max_steps = 14;
  EXPECT_EQ(Trainer(cfg).run("latest").final_step, 14);
}

// ---------------------------------------------------------------------------------------------
// Resume: one record per step, and no resume past max_steps

TEST(Robustness, ResumeLeavesOneMetricsRecordPerStep) {
  Config cfg = tiny_config("metrics_resume");
  {
    Trainer t(cfg);
    // The run dies after step 6 (its last checkpoint is step 4): steps 5 and 6 are in the metrics.
    t.set_step_hook([](int64_t step) { if (step == 6) throw Error("simulated crash"); });
    EXPECT_THROW(t.run(), Error);
  }
  Trainer t2(cfg);
  EXPECT_EQ(t2.run("latest").final_step, 12);
  std::map<int64_t, int> train_records, eval_records;
  std::regex step_re("\"step\":([0-9]+)");
  for (const std::string& line : lines_of(fs::path(cfg.run.out_dir) / "metrics.jsonl")) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, step_re)) << line;
    if (line.find("\"type\":\"train\"") != std::string::npos) ++train_records[std::stoll(m[1])];
    if (line.find("\"type\":\"eval\"") != std::string::npos) ++eval_records[std::stoll(m[1])];
  }
  EXPECT_EQ(train_records.size(), 12u);
  for (auto [step, n] : train_records) EXPECT_EQ(n, 1) << "train record of step " << step;
  for (auto [step, n] : eval_records) EXPECT_EQ(n, 1) << "eval record of step " << step;
}

// The resume's rewind of metrics.jsonl reads each line as JSON: lines of any length, torn lines,
// steps of another type or past 64 bits are kept or dropped, never an exception or a crash.
TEST(Robustness, MetricsRewindReadsLinesOfAnyContent) {
  const fs::path path = fs::temp_directory_path() / ("tg_metrics_rewind_" + std::to_string(getpid()) + ".jsonl");
  const std::string long_line = "{\"type\":\"train\",\"step\":3,\"loss\":" + std::string(300000, '1') + "}";
  const std::vector<std::string> lines = {
      "{\"type\":\"train\",\"step\":4,\"loss\":2.5}",  // kept
      long_line,                                            // kept (step 3)
      "{\"type\":\"train\",\"step\":7,\"loss\":2.0}",  // dropped
      "{\"type\":\"eval\",\"step\":9,\"val_loss\":1}",  // dropped
      "{\"type\":\"train\",\"step\":8,\"lo",            // torn: kept
      "{\"type\":\"train\",\"step\":\"9\"}",           // no integer step: kept
      "{\"step\":" + std::string(40, '9') + "}",             // a step past 64 bits parses as a float: kept
      "[1, 2]",                                                // kept
  };
  {
    std::ofstream out(path);
    for (const std::string& l : lines) out << l << "\n";
  }
  EXPECT_EQ(drop_records_after_step(path.string(), 5), 2);
  std::vector<std::string> kept = lines_of(path);
  ASSERT_EQ(kept.size(), 6u);
  EXPECT_EQ(kept[0], lines[0]);
  EXPECT_EQ(kept[1], long_line);
  EXPECT_EQ(kept[2], lines[4]);
  EXPECT_EQ(kept[5], lines[7]);
  fs::remove(path);
}

// A resume on other training shards (a shard added to the glob's folder) says so in train.log,
// naming the shard; a resume on the same shards says nothing.
TEST(Robustness, ResumeOnOtherTrainingShardsSaysSo) {
  Config cfg = tiny_config("other_shards");
  const fs::path data = fs::path(cfg.run.out_dir).parent_path() / "other_shards_data";
  fs::remove_all(data);
  fs::create_directories(data);
  fs::copy_file(corpus_dir() / "data" / "train_000000.bin", data / "train_000000.bin");
  cfg.data.train = (data / "train_*.bin").string();
  cfg.train.max_steps = 4;
  cfg.run.eval_every = 0;
  Trainer(cfg).run();
  const fs::path log = fs::path(cfg.run.out_dir) / "train.log";
  auto notes = [&] {
    int n = 0;
    std::string last;
    for (const std::string& line : lines_of(log))
      if (line.find("training shards differ") != std::string::npos) ++n, last = line;
    return std::make_pair(n, last);
  };
  Config more = cfg;
  more.train.max_steps = 6;
  Trainer(more).run("latest");
  EXPECT_EQ(notes().first, 0);
  fs::copy_file(data / "train_000000.bin", data / "train_000001.bin");
  more.train.max_steps = 8;
  Trainer(more).run("latest");
  const auto [n, line] = notes();
  EXPECT_EQ(n, 1);
  EXPECT_NE(line.find("at data.train shards: 'train_000001.bin, " + std::to_string(fs::file_size(data / "train_000001.bin")) +
                      " bytes' (the checkpoint's run: '(nothing)')"), std::string::npos) << line;
  fs::remove_all(data);
}

// run.keep_best: after every evaluation the run directory's `best` names the checkpoint of the
// lowest val loss so far — written at that step when no periodic checkpoint fell there, kept
// through keep_last's pruning, carried on by a resumed run — and RUN/best loads it.
TEST(Robustness, KeepBestKeepsTheCheckpointOfTheLowestValLoss) {
  Config cfg = tiny_config("keep_best");
  cfg.train.max_steps = 5;
  cfg.train.lr = 0.3;  // a loss that rises as well as falls
  cfg.run.eval_every = 1;
  cfg.run.ckpt_every = 5;
  cfg.run.keep_last = 1;
  cfg.run.keep_best = true;
  const std::string out = cfg.run.out_dir;
  auto lowest = [&] {  // (step, val loss) of the lowest eval record so far
    std::pair<int64_t, double> best{-1, INFINITY};
    std::regex eval_re("\"type\":\"eval\",\"step\":([0-9]+),\"val_loss\":([-0-9.e+]+)");
    for (const std::string& line : lines_of(fs::path(out) / "metrics.jsonl")) {
      std::smatch m;
      if (std::regex_search(line, m, eval_re) && std::stod(m[2]) < best.second) best = {std::stoll(m[1]), std::stod(m[2])};
    }
    return best;
  };
  auto expect_best = [&](const char* when) {
    SCOPED_TRACE(when);
    const auto [step, loss] = lowest();
    ASSERT_GT(step, 0);
    const auto best = read_best(out);
    ASSERT_TRUE(best.has_value());
    EXPECT_EQ(fs::path(best->first).filename(), "ckpt-" + std::to_string(step) + ".h5");
    EXPECT_NEAR(best->second, loss, 1e-8 * std::abs(loss));  // metrics.jsonl keeps 10 digits
    EXPECT_EQ(resolve_and_load(out + "/best", "latest").first, best->first);  // the pointer as a path
    EXPECT_EQ(resolve_and_load(out, "best").first, best->first);
    // keep_last 1: the latest and the best, nothing else.
    std::set<std::string> kept;
    for (const std::string& p : list_checkpoints(out)) kept.insert(fs::path(p).filename().string());
    std::set<std::string> want = {fs::path(best->first).filename().string(), lines_of(fs::path(out) / "latest").front()};
    EXPECT_EQ(kept, want);
  };
  Trainer(cfg).run();
  ASSERT_LT(lowest().first, 5) << "the test needs a val loss that rose after its lowest";
  expect_best("first run");
  Config more = cfg;
  more.train.max_steps = 20;
  Trainer(more).run("latest");
  expect_best("resumed run");
  // Without `best`, asking for it is an error; keep_best needs evaluations.
  EXPECT_NE(error_of([&] { resolve_and_load(corpus_dir().string(), "best"); }).find("no best checkpoint in"),
            std::string::npos);
  Config no_eval = cfg;
  no_eval.run.eval_every = 0;
  EXPECT_NE(error_of([&] { validate_config(no_eval); }).find("run.keep_best: true needs evaluations"), std::string::npos);
}

TEST(Robustness, ResumeAtOrBeyondMaxStepsIsAnError) {
  Config cfg = tiny_config("beyond");
  cfg.train.max_steps = 8;
  Trainer(cfg).run();
  Config lower = cfg;
  lower.train.max_steps = 6;
  lower.train.warmup_steps = 2;
  std::string err = error_of([&] { Trainer(lower).run("latest"); });
  EXPECT_NE(err.find("is at step 8, beyond train.max_steps (6)"), std::string::npos) << err;
  err = error_of([&] { Trainer(cfg).run("latest"); });
  EXPECT_NE(err.find("which is train.max_steps (8)"), std::string::npos) << err;
  EXPECT_NE(err.find("raise train.max_steps"), std::string::npos) << err;
}

// ---------------------------------------------------------------------------------------------
// Non-finite steps: skipped steps change nothing, and a non-finite state is never saved

TEST(Robustness, SkippedStepsTouchNeitherParametersNorAdamWState) {
  Config cfg = tiny_config("skip_state");
  cfg.train.max_bad_steps = 3;
  cfg.run.ckpt_every = 8;
  Trainer t(cfg);
  t.set_gradient_hook([](int64_t step, nn::ParameterStore& ps) {
    if (step >= 8) ps.flat_grads().fill(NAN);  // steps 9, 10, 11 are skipped; the run stops after 11
  });
  EXPECT_NE(error_of([&] { t.run(); }).find("3 consecutive steps"), std::string::npos);
  // The state saved after the skipped steps is the state after step 8, bit for bit: parameters,
  // both AdamW moments and AdamW's step count.
  const CheckpointData at8 = load_checkpoint((fs::path(cfg.run.out_dir) / "ckpt-8.h5").string());
  const CheckpointData at11 = load_checkpoint((fs::path(cfg.run.out_dir) / "ckpt-11.h5").string());
  EXPECT_EQ(at8.ints.at("optimizer_steps"), at11.ints.at("optimizer_steps"));
  EXPECT_EQ(at11.ints.at("bad_steps_in_row"), 3);
  ASSERT_EQ(at8.arrays.size(), at11.arrays.size());
  for (size_t i = 0; i < at8.arrays.size(); ++i) {
    ASSERT_EQ(at8.arrays[i].name, at11.arrays[i].name);
    EXPECT_EQ(0, std::memcmp(at8.arrays[i].data.data(), at11.arrays[i].data.data(), at8.arrays[i].data.size() * 4))
        << at8.arrays[i].name << " changed during skipped steps";
  }
}

TEST(Robustness, NonFiniteParametersAreNeverSavedAsTheLastGoodState) {
  Config cfg = tiny_config("nan_params");
  cfg.train.max_bad_steps = 2;
  Trainer t(cfg);
  // As if the update of step 9 overflowed: a parameter becomes NaN, and every later loss is NaN.
  t.set_gradient_hook([](int64_t step, nn::ParameterStore& ps) {
    if (step == 8) ps.flat_values().fill(NAN);
  });
  const std::string err = error_of([&] { t.run(); });
  std::cout << "  " << err << "\n";
  EXPECT_NE(err.find("consecutive steps"), std::string::npos) << err;
  EXPECT_NE(err.find("not writing a checkpoint"), std::string::npos) << err;
  auto [path, data] = resolve_and_load(cfg.run.out_dir, "latest");
  EXPECT_EQ(data.ints.at("step"), 8);  // the last periodic checkpoint, with finite values
}

// ---------------------------------------------------------------------------------------------
// Checkpoints that are complete but wrong

CheckpointData saved_run(const std::string& name, Config* out = nullptr) {
  Config cfg = tiny_config(name);
  cfg.train.max_steps = 4;
  Trainer(cfg).run();
  if (out) *out = cfg;
  return resolve_and_load(cfg.run.out_dir, "latest").second;
}

TEST(Robustness, NonFiniteWeightsInACheckpointAreRefusedNamingTheDataset) {
  Config cfg;
  CheckpointData d = saved_run("nan_ckpt", &cfg);
  for (CheckpointArray& a : d.arrays)
    if (a.name == "params/transformer.h.0.mlp.c_fc.weight") a.data[5] = NAN;
  save_checkpoint(cfg.run.out_dir, 5, d, 0);
  Config more = cfg;
  more.train.max_steps = 20;
  std::string err = error_of([&] { Trainer(more).run((fs::path(cfg.run.out_dir) / "ckpt-5.h5").string()); });
  EXPECT_NE(err.find("'params/transformer.h.0.mlp.c_fc.weight' holds nan at element 5"), std::string::npos) << err;
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  const std::string file = (fs::path(cfg.run.out_dir) / "ckpt-5.h5").string();
  for (const std::string cmd : {" eval " + file, " sample " + file + " --tokens 5"}) {
    auto [rc, out] = shell(kBinary + cmd);
    EXPECT_EQ(rc, 1) << cmd << ": " << out;
    EXPECT_NE(out.find("params/transformer.h.0.mlp.c_fc.weight"), std::string::npos) << out;
  }
}

TEST(Robustness, InconsistentCheckpointStateIsAUserError) {
  Config cfg;
  CheckpointData d = saved_run("neg_step", &cfg);
  d.ints["step"] = -3;
  save_checkpoint(cfg.run.out_dir, 7, d, 0);
  Config more = cfg;
  more.train.max_steps = 20;
  const std::string file = (fs::path(cfg.run.out_dir) / "ckpt-7.h5").string();
  std::string err = error_of([&] { Trainer(more).run(file); });
  EXPECT_NE(err.find("state value 'step' is -3"), std::string::npos) << err;
  d.ints["step"] = 4;
  d.ints["bad_steps_in_row"] = -1;
  save_checkpoint(cfg.run.out_dir, 7, d, 0);
  err = error_of([&] { Trainer(more).run(file); });
  EXPECT_NE(err.find("'bad_steps_in_row' is -1"), std::string::npos) << err;
}

// A checkpoint whose checksum is right but whose content is not what tilegrad wrote — arrays
// missing, reshaped or non-finite, counters negative, zero or past any run, the loader cursor
// and RNG states cut or stretched, the stored config mutated — resumes, starts a run from it
// (train.init_from), exports or samples, or fails with tg::Error: never another exception or a
// crash. Seeded structural mutations of a real checkpoint, each saved with its checksum.
TEST(Robustness, CheckpointsOfMutatedContentOnlyEverFailWithTgError) {
  Config cfg;
  const CheckpointData original = saved_run("mutated_content", &cfg);
  std::mt19937_64 rng(5);
  const int64_t kInts[] = {-1, 0, 1, 3, 4, 5, 1000, int64_t(1) << 40, INT64_MAX, INT64_MIN};
  int resumed = 0, rejected = 0;
  for (int trial = 0; trial < 120; ++trial) {
    CheckpointData d = original;
    const int n = 1 + int(rng() % 3);
    std::string what;
    for (int k = 0; k < n; ++k) {
      switch (rng() % 7) {
        case 0: {  // an array removed
          const size_t i = rng() % d.arrays.size();
          what += "removed " + d.arrays[i].name + "; ";
          d.arrays.erase(d.arrays.begin() + long(i));
          break;
        }
        case 1: {  // an array reshaped (its values resized to match)
          CheckpointArray& a = d.arrays[rng() % d.arrays.size()];
          if (rng() % 2 || a.shape.empty()) a.shape.push_back(int64_t(1 + rng() % 3));
          else a.shape[rng() % a.shape.size()] = int64_t(rng() % 20);
          int64_t numel = 1;
          for (int64_t dim : a.shape) numel *= dim;
          a.data.resize(size_t(numel), 0.25f);
          what += "reshaped " + a.name + "; ";
          break;
        }
        case 2: {  // a non-finite value
          CheckpointArray& a = d.arrays[rng() % d.arrays.size()];
          if (!a.data.empty()) a.data[rng() % a.data.size()] = rng() % 2 ? NAN : -INFINITY;
          what += "non-finite in " + a.name + "; ";
          break;
        }
        case 3: {  // a counter set to an edge value, or removed
          auto it = d.ints.begin();
          std::advance(it, long(rng() % d.ints.size()));
          if (rng() % 5 == 0) {
            what += "removed int " + it->first + "; ";
            d.ints.erase(it);
          } else {
            it->second = kInts[rng() % (sizeof kInts / sizeof kInts[0])];
            what += "int " + it->first + " = " + std::to_string(it->second) + "; ";
          }
          break;
        }
        case 4: {  // a u64 array cut, stretched or filled with extremes
          if (d.u64_arrays.empty()) break;
          auto it = d.u64_arrays.begin();
          std::advance(it, long(rng() % d.u64_arrays.size()));
          switch (rng() % 3) {
            case 0: it->second.resize(rng() % (it->second.size() + 1)); break;
            case 1: it->second.push_back(rng()); break;
            case 2: for (uint64_t& v : it->second) v = rng() % 2 ? UINT64_MAX : rng(); break;
          }
          what += "u64 " + it->first + "; ";
          break;
        }
        case 5: {  // the stored config mutated
          auto it = d.strings.find("config_yaml");
          if (it != d.strings.end()) it->second = tg::testing::mutate(it->second, rng);
          what += "config_yaml; ";
          break;
        }
        case 6:  // the format's name or version
          if (rng() % 2) d.version = int(rng() % 5) - 1;
          else d.format = "other";
          what += "format; ";
          break;
      }
    }
    const std::string run_dir = (fs::path(cfg.run.out_dir) / ("t" + std::to_string(trial))).string();
    std::string file;
    try {
      file = save_checkpoint(run_dir, 4, d, 0);
    } catch (const Error&) {
      continue;  // a shape the writer itself refuses
    }
    SCOPED_TRACE("trial " + std::to_string(trial) + ": " + what);
    Config more = cfg;
    more.run.out_dir = run_dir;
    more.train.max_steps = 6;
    more.run.eval_every = 0;
    auto each = [&](const char* use, const std::function<void()>& fn) {
      try {
        fn();
        ++resumed;
      } catch (const Error&) {
        ++rejected;
      } catch (const std::exception& e) {
        ADD_FAILURE() << use << " escaped as " << typeid(e).name() << ": " << e.what();
      }
    };
    each("resume", [&] { Trainer(more).run(file); });
    each("export", [&] {
      auto [path, data] = resolve_and_load(file, "latest");
      export_hf(data, path, run_dir + "/hf", true);
    });
    each("init_from", [&] {
      nn::GPT target(gpt_config_from(cfg.model), 1);
      load_initial_parameters(target, cfg.model, file);
    });
  }
  std::cout << "  " << resumed << " uses succeeded, " << rejected << " were refused with tg::Error\n";
  EXPECT_GT(rejected, 100);
  EXPECT_GT(resumed, 20);
}

// ---------------------------------------------------------------------------------------------
// Sizes are checked before anything is allocated

TEST(Robustness, AbsurdSizesAreRefusedBeforeAllocating) {
  Config c = tiny_config("absurd");
  // A million layers: one line naming the keys, at once (no quadratic work, nothing allocated).
  c.model.n_layer = 1000000;
  c.model.d_model = 1024;
  const std::clock_t t0 = std::clock();
  std::string err = error_of([&] { Trainer(c).run(); });
  EXPECT_LT(double(std::clock() - t0) / CLOCKS_PER_SEC, 30.0);
  EXPECT_NE(err.find("model.n_layer"), std::string::npos) << err;
  EXPECT_NE(err.find("available"), std::string::npos) << err;
  // A batch larger than memory.
  c = tiny_config("absurd_batch");
  c.train.batch_size = 1000000000;
  err = error_of([&] { Trainer(c).run(); });
  EXPECT_NE(err.find("train.batch_size"), std::string::npos) << err;
  // d_model near 2^31: the size arithmetic overflows 64 bits and says so.
  c = tiny_config("absurd_width");
  c.model.d_model = 2147483646;
  c.model.n_head = 2;
  err = error_of([&] { Trainer(c).run(); });
  EXPECT_NE(err.find("overflows 64 bits"), std::string::npos) << err;
  EXPECT_NE(err.find("model.d_model"), std::string::npos) << err;
  // Shapes: a product that overflows is an error naming the shape.
  err = error_of([&] { Tensor::empty({int64_t(1) << 40, int64_t(1) << 40}, DType::f32); });
  EXPECT_NE(err.find("[1099511627776, 1099511627776]"), std::string::npos) << err;
}

TEST(Robustness, FootprintCountsTheParametersExactly) {
  Config c = tiny_config("footprint");
  c.model.n_layer = 3;
  for (bool bias : {true, false})
    for (const char* pos : {"learned", "rope"}) {
      c.model.bias = bias;
      c.model.pos_embedding = pos;
      nn::GPT model(gpt_config_from(c.model), 1);
      EXPECT_EQ(parameter_count(c.model), model.params().numel()) << bias << " " << pos;
    }
}

TEST(Robustness, DeclaringAMillionParametersIsLinear) {
  // CPU time, not wall time (a loaded machine must not fail this): a quadratic duplicate check
  // would take hours here, the hash set well under a second.
  nn::ParameterStore ps;
  const std::clock_t t0 = std::clock();
  for (int i = 0; i < 1000000; ++i) ps.declare("p." + std::to_string(i), {1}, nn::Init::zeros);
  EXPECT_TRUE(ps.has("p.999999"));
  EXPECT_THROW(ps.declare("p.5", {1}, nn::Init::zeros), Error);
  EXPECT_LT(double(std::clock() - t0) / CLOCKS_PER_SEC, 60.0);
}

// ---------------------------------------------------------------------------------------------
// Logs: whole lines, valid UTF-8 JSON

TEST(Robustness, JsonStringsAreValidUtf8) {
  EXPECT_EQ(json_string("plain \"q\" \\ \n"), "\"plain \\\"q\\\" \\\\ \\n\"");
  EXPECT_EQ(json_string("caf\xc3\xa9"), "\"caf\xc3\xa9\"");                   // valid UTF-8 kept
  EXPECT_EQ(json_string("a\xff" "b"), "\"a\\ufffdb\"");                        // a stray byte
  EXPECT_EQ(json_string("\xc3"), "\"\\ufffd\"");                               // a cut sequence
  EXPECT_EQ(json_string("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");         // a surrogate
  EXPECT_EQ(json_string("\xc0\xaf"), "\"\\ufffd\\ufffd\"");                    // overlong
  EXPECT_EQ(json_string("\xf0\x9f\x98\x80"), "\"\xf0\x9f\x98\x80\"");          // 4 bytes
  EXPECT_EQ(json_string(std::string("\x01\x7f", 2)), "\"\\u0001\\u007f\"");
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  EXPECT_TRUE(valid_utf8(json_string(all)));
}

TEST(Robustness, MetricsOfARunWithSamplesAreValidJsonLines) {
  Config cfg = tiny_config("utf8");
  cfg.run.sample_every = 3;
  cfg.run.sample_tokens = 64;
  cfg.model.vocab_size = 256;
  Trainer(cfg).run();
  const fs::path metrics = fs::path(cfg.run.out_dir) / "metrics.jsonl";
  int samples = 0;
  for (const std::string& line : lines_of(metrics)) {
    EXPECT_TRUE(valid_utf8(line)) << line;
    samples += line.find("\"type\":\"sample\"") != std::string::npos;
  }
  EXPECT_EQ(samples, 4);
  if (std::system("python3 -c 'import json' > /dev/null 2>&1") != 0) GTEST_SKIP() << "no python3 to parse JSON";
  auto [rc, out] = shell("python3 -c \"import json,sys; [json.loads(l) for l in open(sys.argv[1], encoding='utf-8')]\" " +
                         metrics.string());
  EXPECT_EQ(rc, 0) << out;
}

// A write that fails part way (here: the file size limit, the same as a full disk for a write)
// leaves whole lines only and reports the file.
TEST(Robustness, AppendFileKeepsWholeLinesWhenAWriteFails) {
  const fs::path dir = corpus_dir() / "append";
  fs::create_directories(dir);
  const std::string path = (dir / "log.txt").string();
  fs::remove(path);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {1000, 1000};
    setrlimit(RLIMIT_FSIZE, &lim);
    AppendFile f;
    f.open(path);
    for (int i = 0; i < 1000; ++i) {
      try {
        f.write_line("line " + std::to_string(i) + " " + std::string(30, 'x'));
      } catch (const Error& e) {
        _exit(std::string(e.what()).find(path) != std::string::npos ? 42 : 2);
      }
    }
    _exit(1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 42);
  std::ifstream in(path, std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), {});
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.back(), '\n');
  EXPECT_LE(all.size(), 1000u);
}

// A log write that fails mid-run (the file size limit: a write fails as on a full disk, for
// every user): the run stops after the step with a checkpoint attempt — which fails here too, the
// checkpoint being larger than the limit — and one message naming both; the logs keep whole lines.
TEST(Robustness, AFailedLogWriteStopsTheRunWithACheckpointAttempt) {
  Config cfg = tiny_config("log_fails");
  cfg.train.max_steps = 100000;
  cfg.run.ckpt_every = 0;
  cfg.run.eval_every = 0;
  fs::create_directories(cfg.run.out_dir);
  const fs::path verdict = fs::path(cfg.run.out_dir).parent_path() / "log_fails.verdict";
  fs::remove(verdict);
  std::fflush(nullptr);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child of a fork has one thread: libgomp's pool of the parent (made by an earlier test in
    // this process) is gone, and a parallel region asking for it would wait forever.
    omp_set_num_threads(1);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {20000, 20000};
    setrlimit(RLIMIT_FSIZE, &lim);
    std::string message;
    try {
      Trainer t(cfg);
      t.run();
    } catch (const Error& e) {
      message = e.what();
    }
    struct rlimit off {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_FSIZE, &off);
    std::ofstream(verdict) << message;
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::ifstream in(verdict);
  const std::string message((std::istreambuf_iterator<char>(in)), {});
  std::cout << "  " << message << "\n";
  EXPECT_TRUE(message.find("metrics.jsonl failed: File too large") != std::string::npos ||
              message.find("train.log failed: File too large") != std::string::npos) << message;
  EXPECT_NE(message.find("training stopped after step"), std::string::npos) << message;
  EXPECT_NE(message.find("the checkpoint attempt failed too"), std::string::npos) << message;
  for (const char* f : {"train.log", "metrics.jsonl"}) {
    std::ifstream log(fs::path(cfg.run.out_dir) / f, std::ios::binary);
    const std::string all((std::istreambuf_iterator<char>(log)), {});
    ASSERT_FALSE(all.empty()) << f;
    EXPECT_EQ(all.back(), '\n') << f << " ends mid-line";
  }
  for (const auto& e : fs::directory_iterator(cfg.run.out_dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// A full disk during training (a 200 KiB tmpfs; root only): the run says so, exits 1 without a
// crash, keeps `latest` on the last complete checkpoint, whole lines in its logs and no temp files.
TEST(Robustness, FullDiskDuringTrainingExitsCleanly) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  Config cfg = tiny_config("fulldisk");
  fs::create_directories(cfg.run.out_dir);
  if (::mount("tmpfs", cfg.run.out_dir.c_str(), "tmpfs", 0, "size=200k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{cfg.run.out_dir};
  // About 100 KB per checkpoint (8k parameters, their two moments, HDF5's overhead): the second does not fit.
  auto [rc, out] = shell(train_command(cfg, "train.max_steps=40 run.ckpt_every=2 run.keep_last=5 "
                                            "run.log_every=1 run.eval_every=0"));
  std::cout << out.substr(out.size() > 600 ? out.size() - 600 : 0) << "\n";
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("No space left on device"), std::string::npos) << out;
  EXPECT_EQ(out.find("internal error"), std::string::npos) << out;
  for (const auto& e : fs::directory_iterator(cfg.run.out_dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
  auto [path, data] = resolve_and_load(cfg.run.out_dir, "latest");
  EXPECT_GT(data.ints.at("step"), 0);
  for (const char* f : {"train.log", "metrics.jsonl"}) {
    std::ifstream in(fs::path(cfg.run.out_dir) / f, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), {});
    if (!all.empty()) EXPECT_EQ(all.back(), '\n') << f << " ends mid-line";
  }
}

// Runs `cmd` under /bin/sh with every file it writes limited to `max_file_bytes` (RLIMIT_FSIZE,
// SIGXFSZ ignored: a write past the limit fails with EFBIG, as one on a full disk fails with
// ENOSPC); stdout and stderr come back through a pipe, which the limit does not cover.
std::pair<int, std::string> shell_with_file_limit(const std::string& cmd, rlim_t max_file_bytes) {
  int fds[2];
  if (::pipe(fds) != 0) return {-1, std::string("pipe: ") + std::strerror(errno)};
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid < 0) return {-1, std::string("fork: ") + std::strerror(errno)};
  if (pid == 0) {
    ::close(fds[0]);
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    signal(SIGXFSZ, SIG_IGN);  // stays ignored across exec
    struct rlimit lim {max_file_bytes, max_file_bytes};
    setrlimit(RLIMIT_FSIZE, &lim);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

// The step numbers of the "step N/M | loss ..." lines of a run's output.
std::vector<int64_t> logged_steps(const std::string& out) {
  std::vector<int64_t> steps;
  static const std::regex step_re("(^|\n)step ([0-9]+)/[0-9]+ \\| loss");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), step_re); it != std::sregex_iterator(); ++it)
    steps.push_back(std::stoll((*it)[2]));
  return steps;
}

void expect_whole_lines_and_no_temp_files(const std::string& dir) {
  for (const char* f : {"train.log", "metrics.jsonl"}) {
    std::ifstream in(fs::path(dir) / f, std::ios::binary);
    const std::string all((std::istreambuf_iterator<char>(in)), {});
    EXPECT_FALSE(all.empty()) << f;
    if (!all.empty()) EXPECT_EQ(all.back(), '\n') << f << " ends mid-line";
  }
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// `tilegrad train` end to end when a log write fails mid-run while checkpoints still fit (every
// file limited to 192 KiB: a checkpoint of this model is about 117 KB, metrics.jsonl passes the
// limit after some 900 steps; one OpenMP thread, as steps this small only wait on a second one).
// The run must say which file failed and why, stop after that step instead of training on without
// its logs, write a checkpoint of that step which `latest` names and which loads (its checksum
// verified) and resumes, and exit 1, not crash.
TEST(Robustness, FailedLogWriteEndToEndStopsWithACheckpointAndExits1) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  Config cfg = tiny_config("log_fails_e2e");
  const int64_t max_steps = 3000;  // far beyond the failure: a run that trains on blind is seen
  auto [rc, out] = shell_with_file_limit(
      "OMP_NUM_THREADS=1 " + train_command(cfg, "train.max_steps=" + std::to_string(max_steps) +
                             " run.ckpt_every=100 run.keep_last=2 run.log_every=1 run.eval_every=0"),
      192 << 10);
  std::cout << out.substr(out.size() > 1500 ? out.size() - 1500 : 0) << "\n";
  EXPECT_EQ(rc, 1) << "expected exit status 1 (a user-facing error), got " << rc;
  EXPECT_EQ(out.find("internal error"), std::string::npos);
  // Which file, why, and what happened.
  std::smatch m;
  const std::regex failed_re("error: writing (\\S+/(metrics\\.jsonl|train\\.log)) failed: File too large; "
                             "stopping after step ([0-9]+) with a checkpoint");
  ASSERT_TRUE(std::regex_search(out, m, failed_re)) << "no line naming the failed log write";
  const int64_t stop_step = std::stoll(m[3]);
  EXPECT_GT(stop_step, 100);  // the failure came after the first periodic checkpoint
  EXPECT_LT(stop_step, max_steps);
  const std::string ckpt = (fs::path(cfg.run.out_dir) / ("ckpt-" + std::to_string(stop_step) + ".h5")).string();
  EXPECT_NE(out.find("training stopped after step " + std::to_string(stop_step) + " with checkpoint " + ckpt +
                     "; free space and resume with --resume latest"),
            std::string::npos);
  // No step after the failed one was trained.
  const std::vector<int64_t> steps = logged_steps(out);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back(), stop_step);
  // `latest` names the checkpoint of that step, complete: it loads with its checksum verified.
  auto [path, data] = resolve_and_load(cfg.run.out_dir, "latest");
  EXPECT_EQ(path, ckpt);
  EXPECT_EQ(data.ints.at("step"), stop_step);
  EXPECT_EQ(load_checkpoint(ckpt).ints.at("step"), stop_step);
  expect_whole_lines_and_no_temp_files(cfg.run.out_dir);
  // With space again the run resumes from it.
  auto [rc2, out2] = shell(train_command(cfg, "train.max_steps=" + std::to_string(stop_step + 2) +
                                              " run.ckpt_every=100 run.keep_last=2 run.log_every=1 run.eval_every=0"
                                              " --resume latest"));
  EXPECT_EQ(rc2, 0) << out2;
  EXPECT_NE(out2.find("resumed from " + ckpt + " at step " + std::to_string(stop_step)), std::string::npos) << out2;
  EXPECT_EQ(resolve_and_load(cfg.run.out_dir, "latest").second.ints.at("step"), stop_step + 2);
}

// The same on a disk that is really full (a tmpfs; root only): after a first checkpoint, the
// logs fill the disk, so the log write fails with ENOSPC and the checkpoint attempt fails too.
// The run says both, exits 1, and `latest` still names the first checkpoint, complete.
TEST(Robustness, LogWriteOnAFullDiskStopsAndKeepsLatest) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  if (::geteuid() != 0)
    GTEST_SKIP() << "mounting a small tmpfs needs root (FailedLogWriteEndToEndStopsWithACheckpointAndExits1 "
                    "covers the failed log write for every user)";
  Config cfg = tiny_config("log_fulldisk");
  fs::create_directories(cfg.run.out_dir);
  if (::mount("tmpfs", cfg.run.out_dir.c_str(), "tmpfs", 0, "size=240k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{cfg.run.out_dir};
  const std::string keys = " run.log_every=1 run.eval_every=0 run.keep_last=2";
  auto [rc1, out1] = shell(train_command(cfg, "train.max_steps=2 run.ckpt_every=2" + keys));
  ASSERT_EQ(rc1, 0) << out1;
  // No periodic checkpoints: the logs are what fills the disk.
  auto [rc, out] =
      shell("OMP_NUM_THREADS=1 " + train_command(cfg, "train.max_steps=5000 run.ckpt_every=0" + keys + " --resume latest"));
  std::cout << out.substr(out.size() > 1500 ? out.size() - 1500 : 0) << "\n";
  EXPECT_EQ(rc, 1);
  EXPECT_EQ(out.find("internal error"), std::string::npos);
  std::smatch m;
  const std::regex failed_re("error: writing \\S+/(metrics\\.jsonl|train\\.log) failed: No space left on device "
                             "\\(the disk is full\\); stopping after step ([0-9]+) with a checkpoint");
  ASSERT_TRUE(std::regex_search(out, m, failed_re)) << "no line naming the failed log write";
  const int64_t stop_step = std::stoll(m[2]);
  EXPECT_LT(stop_step, 5000);
  EXPECT_NE(out.find("training stopped after step " + std::to_string(stop_step) +
                     ", and the checkpoint attempt failed too"),
            std::string::npos);
  const std::vector<int64_t> steps = logged_steps(out);
  ASSERT_FALSE(steps.empty());
  EXPECT_EQ(steps.back(), stop_step);
  auto [path, data] = resolve_and_load(cfg.run.out_dir, "latest");
  EXPECT_EQ(path, (fs::path(cfg.run.out_dir) / "ckpt-2.h5").string());
  EXPECT_EQ(data.ints.at("step"), 2);
  expect_whole_lines_and_no_temp_files(cfg.run.out_dir);
}

// ---------------------------------------------------------------------------------------------
// The command line: every bad value is a user error (exit 1)

TEST(Robustness, BadCommandValuesAreUserErrors) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  Config cfg;
  saved_run("cli_values", &cfg);
  const std::string& dir = cfg.run.out_dir;
  const std::pair<std::string, std::string> cases[] = {
      {" eval " + dir + " --steps -1", "--steps must be ≥ 0"},
      {" sample " + dir + " --tokens 0", "--tokens must be ≥ 1"},
      {" sample " + dir + " --tokens -5", "--tokens must be ≥ 1"},
      {" sample " + dir + " --top-k -1", "--top-k must be ≥ 0"},
      {" sample " + dir + " --seed -5", "--seed must be ≥ 0"},
      {" sample " + dir + " --top-p 0", "--top-p must be in (0, 1]"},
      {" sample " + dir + " --top-p 1.5", "--top-p must be in (0, 1]"},
      {" sample " + dir + " --temperature nan", "--temperature must be"},
      {" prepare --text x --out y --val-fraction 2", "--val-fraction must be in (0, 1)"},
      {" prepare --text x --out y --val-fraction 0", "--val-fraction must be in (0, 1)"},
  };
  for (const auto& [args, message] : cases) {
    auto [rc, out] = shell(kBinary + args);
    EXPECT_EQ(rc, 1) << args << ": " << out;
    EXPECT_NE(out.find(message), std::string::npos) << args << ": " << out;
  }
  // run.out_dir that is a file, or that cannot be created.
  Config c2 = tiny_config("out_is_file");
  fs::create_directories(fs::path(c2.run.out_dir).parent_path());
  std::ofstream(c2.run.out_dir) << "a file";
  auto [rc, out] = shell(train_command(c2, "train.max_steps=2"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("is not a directory"), std::string::npos) << out;
  c2.run.out_dir += "/sub";
  std::tie(rc, out) = shell(train_command(c2, "train.max_steps=2"));
  EXPECT_EQ(rc, 1) << out;
  EXPECT_NE(out.find("run.out_dir"), std::string::npos) << out;
  EXPECT_EQ(out.find("internal error"), std::string::npos) << out;
}

TEST(Robustness, SampleStreamsItsTokens) {
  if (!fs::exists(kBinary)) GTEST_SKIP() << "tilegrad binary not built at " << kBinary;
  Config cfg;
  saved_run("stream", &cfg);
  // A billion tokens would take days: without streaming nothing arrives before the timeout.
  auto [rc, out] = shell("timeout 120 " + kBinary + " sample " + cfg.run.out_dir +
                         " --tokens 1000000000 --prompt ab 2>/dev/null | head -c 40");
  EXPECT_EQ(out.size(), 40u) << out;
  EXPECT_EQ(out.substr(0, 2), "ab");
}

// ---------------------------------------------------------------------------------------------
// The same bits on 1 and 2 threads

TEST(Robustness, CpuTrainingIsBitwiseTheSameOnOneAndTwoThreads) {
  std::vector<std::vector<double>> losses;
  std::vector<Tensor> params;
  const int saved = omp_get_max_threads();
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    Config cfg = tiny_config("threads_" + std::to_string(threads));
    // Large enough that the kernels take their parallel paths (row bands, parallel loops).
    cfg.model.d_model = 64; cfg.model.n_head = 4; cfg.model.n_layer = 2;
    cfg.train.batch_size = 8; cfg.train.max_steps = 4; cfg.run.eval_every = 0; cfg.run.ckpt_every = 0;
    cfg.model.dropout = 0.1;
    Trainer t(cfg);
    t.run();
    losses.push_back(t.losses());
    params.push_back(t.model().params().flat_values().clone());
  }
  omp_set_num_threads(saved);
  ASSERT_EQ(losses[0].size(), losses[1].size());
  for (size_t i = 0; i < losses[0].size(); ++i)
    EXPECT_EQ(std::memcmp(&losses[0][i], &losses[1][i], sizeof(double)), 0)
        << "step " << i + 1 << ": " << losses[0][i] << " vs " << losses[1][i];
  const std::vector<double> p0 = params[0].to_double_vector(), p1 = params[1].to_double_vector();
  size_t differ = 0, first = p0.size();
  for (size_t i = 0; i < p0.size(); ++i)
    if (std::memcmp(&p0[i], &p1[i], sizeof(double)) != 0) {
      ++differ;
      if (first == p0.size()) first = i;
    }
  EXPECT_EQ(differ, 0u) << "first at " << first << ": " << (first < p0.size() ? p0[first] - p1[first] : 0.0);
}

}  // namespace
}  // namespace tg
