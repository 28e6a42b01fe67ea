// Config loader tests: defaults, --set, round trip, shipped configs, and one test per error kind.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "src/io/config.h"
#include "src/util/error.h"

#ifndef TILEGRAD_SOURCE_DIR
#define TILEGRAD_SOURCE_DIR "/work/main"
#endif

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

namespace {

// A per-process folder so parallel test runs do not trample each other's files.
fs::path temp_dir() {
  static const fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("tilegrad_test_config_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// Removes the temp folder after the last test, so repeated runs leave nothing behind.
class TempDirCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(temp_dir(), ec);
  }
};
const auto* const kCleanup = ::testing::AddGlobalTestEnvironment(new TempDirCleanup);

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path p = temp_dir() / name;
  std::ofstream(p) << text;
  return p.string();
}

// The message of the tg::Error that `fn` throws; fails the test when it throws nothing.
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const tg::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a tg::Error";
  return "";
}

// Loads `text` as a config file called `name` and returns the error message.
std::string load_error(const std::string& name, const std::string& text,
                       const std::vector<std::string>& ov = {}, bool check_data = false) {
  const std::string path = write_temp(name, text);
  return error_of([&] { tg::load_config(path, ov, check_data); });
}

std::string repo(const std::string& rel) { return std::string(TILEGRAD_SOURCE_DIR) + "/" + rel; }

}  // namespace

// ---------------------------------------------------------------------------------------------------------

TEST(Config, DefaultsAreTheDocumentedOnes) {
  const tg::Config c = tg::parse_config("", "empty.yaml", {}, false);
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.model.max_seq_len, 64);
  EXPECT_EQ(c.model.pos_embedding, "learned");
  EXPECT_EQ(c.model.attention, "flash");
  EXPECT_TRUE(c.model.bias);
  EXPECT_EQ(c.model.dropout, 0.0);
  EXPECT_EQ(c.model.rope_base, 10000.0);
  EXPECT_EQ(c.train.grad_accum, 1);
  EXPECT_EQ(c.train.lr_schedule, "cosine");
  EXPECT_EQ(c.train.weight_decay, 0.1);
  EXPECT_EQ(c.train.beta1, 0.9);
  EXPECT_EQ(c.train.beta2, 0.95);
  EXPECT_EQ(c.train.eps, 1e-8);
  EXPECT_EQ(c.train.grad_clip, 1.0);
  EXPECT_EQ(c.train.seed, 1337);
  EXPECT_EQ(c.train.max_bad_steps, 5);
  EXPECT_EQ(c.train.precision, "fp32");
  EXPECT_EQ(c.run.device, "auto");
  EXPECT_EQ(c.run.log_every, 10);
  EXPECT_EQ(c.run.eval_every, 200);
  EXPECT_EQ(c.run.eval_steps, 20);
  EXPECT_EQ(c.run.sample_every, 0);
  EXPECT_EQ(c.run.sample_tokens, 200);
  EXPECT_EQ(c.run.ckpt_every, 500);
  EXPECT_EQ(c.run.keep_last, 3);
  EXPECT_EQ(c.source_path, "empty.yaml");
  tg::Config expected;
  expected.source_path = "empty.yaml";
  EXPECT_EQ(c, expected);
  EXPECT_NO_THROW(tg::validate_config(tg::Config{}));
}

TEST(Config, PartialFileKeepsOtherDefaults) {
  const tg::Config c = tg::parse_config("train:\n  lr: 3e-4\nrun:\n", "p.yaml", {}, false);
  EXPECT_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.train.min_lr, tg::TrainConfig{}.min_lr);
  EXPECT_EQ(c.model, tg::ModelConfig{});
}

TEST(Config, SetOverridesApplyAfterTheFile) {
  const std::string path = write_temp("ov.yaml", "train:\n  lr: 1.0e-3\nmodel:\n  bias: true\n");
  const tg::Config c = tg::load_config(
      path, {"train.lr=3e-4", "model.bias=false", "run.out_dir=runs/x y", "train.lr=5e-4", "data.val=*.bin"},
      false);
  EXPECT_EQ(c.train.lr, 5e-4);  // the last --set of a key wins
  EXPECT_FALSE(c.model.bias);
  EXPECT_EQ(c.run.out_dir, "runs/x y");
  EXPECT_EQ(c.data.val, "*.bin");  // taken verbatim, not parsed as YAML (where '*' starts an alias)
  EXPECT_EQ(c.source_path, path);
}

TEST(Config, DeterministicDefaultsOnAndCanBeSwitchedOff) {
  const std::string path = write_temp("det.yaml", "train:\n  lr: 1.0e-3\n");
  EXPECT_TRUE(tg::load_config(path, {}, false).train.deterministic);
  EXPECT_FALSE(tg::load_config(path, {"train.deterministic=false"}, false).train.deterministic);
  const std::string off = write_temp("det_off.yaml", "train:\n  deterministic: false\n");
  EXPECT_FALSE(tg::load_config(off, {}, false).train.deterministic);
  EXPECT_THAT(load_error("det_bad.yaml", "train:\n  deterministic: sometimes\n"),
              AllOf(HasSubstr("train.deterministic"), HasSubstr("true or false")));
}

TEST(Config, LmHeadChunkDefaultsOffAndRejectsNegativeRows) {
  const std::string path = write_temp("chunk.yaml", "train:\n  lr: 1.0e-3\n");
  EXPECT_EQ(tg::load_config(path, {}, false).train.lm_head_chunk, 0);
  EXPECT_EQ(tg::load_config(path, {"train.lm_head_chunk=2048"}, false).train.lm_head_chunk, 2048);
  EXPECT_THAT(load_error("chunk_bad.yaml", "train:\n  lm_head_chunk: -4\n"), HasSubstr("train.lm_head_chunk"));
}

TEST(Config, RoundTripThroughYaml) {
  tg::Config c = tg::load_config(repo("configs/kjv-tiny.yaml"),
                                 {"model.pos_embedding=rope", "model.rope_base=500000.5", "train.eps=1.5e-10",
                                  "train.lr=0.0003", "train.min_lr=0", "run.out_dir=runs/we\"ird: \\path#1",
                                  "data.train=*train*.bin", "train.max_steps=9000000000"},
                                 false);
  const std::string yaml = tg::config_to_yaml(c);
  const tg::Config back = tg::parse_config(yaml, c.source_path, {}, false);
  EXPECT_EQ(back, c) << yaml;
  // Every key of the reference table appears in the dump, so the dump is the full resolved config.
  for (const tg::ConfigKeyDoc& d : tg::config_reference())
    EXPECT_THAT(yaml, HasSubstr(d.key.substr(d.key.find('.') + 1) + ": ")) << d.key;
}

TEST(Config, ReferenceTableCoversEveryKey) {
  const std::vector<tg::ConfigKeyDoc> ref = tg::config_reference();
  EXPECT_EQ(ref.size(), 11u + 4u + 26u + 11u);
  bool saw_lr = false;
  for (const tg::ConfigKeyDoc& d : ref) {
    EXPECT_FALSE(d.description.empty()) << d.key;
    EXPECT_FALSE(d.type.empty()) << d.key;
    if (d.key == "train.lr") {
      saw_lr = true;
      EXPECT_EQ(d.type, "float > 0");
      EXPECT_EQ(d.default_value, "0.001");
    }
    if (d.key == "model.attention") {
      EXPECT_EQ(d.type, "flash | naive");
    }
    if (d.key == "train.deterministic") {
      EXPECT_EQ(d.type, "bool");
      EXPECT_EQ(d.default_value, "true");
    }
    if (d.key == "train.recompute") {
      EXPECT_EQ(d.type, "bool");
      EXPECT_EQ(d.default_value, "false");
    }
    if (d.key == "train.lm_head_chunk") {
      EXPECT_EQ(d.type, "int >= 0");
      EXPECT_EQ(d.default_value, "0");
    }
  }
  EXPECT_TRUE(saw_lr);
}

TEST(Config, ShippedKjvTinyParses) {
  const tg::Config c = tg::load_config(repo("configs/kjv-tiny.yaml"), {}, false);
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.d_model, 128);
  EXPECT_EQ(c.model.max_seq_len, 64);
  EXPECT_EQ(c.data.train, "data/kjv/train*.bin");
  EXPECT_EQ(c.data.val, "data/kjv/val*.bin");
  EXPECT_EQ(c.train.batch_size, 12);
  EXPECT_EQ(c.train.seq_len, 64);
  EXPECT_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(c.train.min_lr, 1e-4);
  EXPECT_EQ(c.train.warmup_steps, 100);
  EXPECT_EQ(c.train.max_steps, 3000);
  EXPECT_EQ(c.train.weight_decay, 0.1);
  EXPECT_EQ(c.train.beta2, 0.99);
  EXPECT_EQ(c.train.grad_clip, 1.0);
  EXPECT_EQ(c.run.out_dir, "runs/kjv-tiny");
}

TEST(Config, ShippedGpt2SmallParses) {
  const tg::Config c = tg::load_config(repo("configs/gpt2-124m.yaml"), {}, false);
  EXPECT_EQ(c.model.n_layer, 12);
  EXPECT_EQ(c.model.n_head, 12);
  EXPECT_EQ(c.model.d_model, 768);
  EXPECT_EQ(c.model.vocab_size, 50304);
  EXPECT_EQ(c.model.max_seq_len, 1024);
  EXPECT_EQ(c.train.batch_size, 16);
  EXPECT_EQ(c.train.seq_len, 1024);
  EXPECT_EQ(c.train.lr, 6e-4);
  EXPECT_EQ(c.train.min_lr, 6e-5);
  EXPECT_EQ(c.train.warmup_steps, 700);
  EXPECT_EQ(c.train.precision, "bf16");
  EXPECT_EQ(c.run.device, "auto");
  EXPECT_EQ(c.data.train, "data/fineweb/*train*.bin");
}

TEST(Config, ShippedGpt2FinetuneParses) {
  const tg::Config c = tg::load_config(repo("configs/gpt2-finetune.yaml"), {}, false);
  EXPECT_EQ(c.model.vocab_size, 50257);  // GPT-2's own, so its wte loads
  EXPECT_EQ(c.model.max_seq_len, 1024);
  EXPECT_EQ(c.train.init_from, "models/gpt2");
  EXPECT_EQ(c.train.precision, "fp32");
}

TEST(Config, DataGlobsThatMatchPass) {
  const fs::path shards = temp_dir() / "shards";
  fs::create_directories(shards);
  std::ofstream(shards / "train_000.bin") << "x";
  std::ofstream(shards / "val_000.bin") << "x";
  const std::string yaml = "data:\n  train: \"" + (shards / "train_*.bin").string() + "\"\n  val: \"" +
                           (shards / "val_*.bin").string() + "\"\n";
  EXPECT_NO_THROW(tg::parse_config(yaml, "ok.yaml", {}, true));
}

// ---------------------------------------------------------------------------------------------------------
// One test per error kind: each message names the file, the 1-based line and the dotted key.

TEST(ConfigError, UnknownKeySuggestsTheNearestOne) {
  const std::string msg = load_error("unknown_key.yaml", "model:\n  n_layer: 2\ntrain:\n  lrr: 1e-3\n");
  EXPECT_THAT(msg, AllOf(HasSubstr("unknown_key.yaml:4:"), HasSubstr("train.lrr"), HasSubstr("unknown key"),
                         HasSubstr("did you mean 'train.lr'?")));
  // A key under the wrong section points at the right one.
  EXPECT_THAT(
      load_error("wrong_section.yaml", "train:\n  out_dir: x\n"),
      AllOf(HasSubstr("wrong_section.yaml:2:"), HasSubstr("train.out_dir"), HasSubstr("'run.out_dir'")));
}

TEST(ConfigError, UnknownSectionSuggestsTheNearestOne) {
  const std::string msg = load_error("unknown_section.yaml", "model:\n  n_layer: 2\ntrian:\n  lr: 1e-3\n");
  EXPECT_THAT(msg, AllOf(HasSubstr("unknown_section.yaml:3:"), HasSubstr("trian"),
                         HasSubstr("unknown section"), HasSubstr("did you mean 'train'?")));
  // A key written at the top level, without its section.
  EXPECT_THAT(load_error("flat.yaml", "\nlr: 1e-3\n"),
              AllOf(HasSubstr("flat.yaml:2:"), HasSubstr("lr"), HasSubstr("did you mean 'train.lr'?")));
}

TEST(ConfigError, WrongType) {
  const std::string msg = load_error("wrong_type.yaml", "train:\n  seq_len: 32\n  batch_size: abc\n");
  EXPECT_THAT(msg, AllOf(HasSubstr("wrong_type.yaml:3:"),
                         HasSubstr("train.batch_size: expected an integer, got 'abc'")));
  EXPECT_THAT(
      load_error("wrong_type2.yaml", "model:\n  dropout: [0.1]\n"),
      AllOf(HasSubstr("wrong_type2.yaml:2:"), HasSubstr("model.dropout"), HasSubstr("expected a number")));
  EXPECT_THAT(
      load_error("wrong_type3.yaml", "model:\n  bias: maybe\n"),
      AllOf(HasSubstr("wrong_type3.yaml:2:"), HasSubstr("model.bias"), HasSubstr("expected true or false")));
  EXPECT_THAT(load_error("wrong_type4.yaml", "model:\n  n_layer: 2.5\n"),
              AllOf(HasSubstr("wrong_type4.yaml:2:"), HasSubstr("model.n_layer: expected an integer")));
}

TEST(ConfigError, OutOfRange) {
  const std::string msg = load_error("range.yaml", "train:\n  batch_size: 0\n");
  EXPECT_THAT(msg, AllOf(HasSubstr("range.yaml:2:"), HasSubstr("train.batch_size"), HasSubstr("must be >= 1"),
                         HasSubstr("got 0")));
  EXPECT_THAT(load_error("range2.yaml", "model:\n  dropout: 1.0\n"),
              AllOf(HasSubstr("range2.yaml:2:"), HasSubstr("model.dropout"), HasSubstr("must be in [0, 1)")));
  EXPECT_THAT(load_error("range3.yaml", "train:\n\n  lr: -1e-3\n"),
              AllOf(HasSubstr("range3.yaml:3:"), HasSubstr("train.lr"), HasSubstr("must be > 0")));
  EXPECT_THAT(load_error("range4.yaml", "model:\n  n_layer: 99999999999\n"),
              AllOf(HasSubstr("range4.yaml:2:"), HasSubstr("model.n_layer"), HasSubstr("out of range")));
}

TEST(ConfigError, EnumValueNotAllowed) {
  const std::string msg = load_error("enum.yaml", "model:\n  attention: flsh\n");
  EXPECT_THAT(msg, AllOf(HasSubstr("enum.yaml:2:"), HasSubstr("model.attention"),
                         HasSubstr("'flash', 'naive'"), HasSubstr("did you mean 'flash'?")));
}

TEST(ConfigError, DuplicateKeyReportsBothLines) {
  const std::string msg = load_error("dup.yaml", "train:\n  lr: 1e-3\n  seq_len: 32\n  lr: 2e-3\n");
  EXPECT_THAT(msg, AllOf(HasSubstr("dup.yaml:4:"), HasSubstr("train.lr"), HasSubstr("duplicate key"),
                         HasSubstr("line 2"), HasSubstr("line 4")));
  EXPECT_THAT(load_error("dup_section.yaml", "run:\n  log_every: 1\nrun:\n  log_every: 2\n"),
              AllOf(HasSubstr("dup_section.yaml:3:"), HasSubstr("run"), HasSubstr("duplicate key")));
}

TEST(ConfigError, MissingDataFiles) {
  const std::string msg =
      load_error("nodata.yaml", "data:\n  train: \"no/such/dir/train*.bin\"\n  val: x\n", {},
                 /*check_data=*/true);
  EXPECT_THAT(msg, AllOf(HasSubstr("nodata.yaml:2:"), HasSubstr("data.train"),
                         HasSubstr("no/such/dir/train*.bin"), HasSubstr("tilegrad prepare")));
  // Unset is reported too, but only when files are checked.
  EXPECT_THAT(load_error("unset.yaml", "model:\n  bias: true\n", {}, true),
              AllOf(HasSubstr("unset.yaml"), HasSubstr("data.train"), HasSubstr("not set")));
  EXPECT_NO_THROW(tg::parse_config("data:\n  train: \"no/such/*.bin\"\n", "x.yaml", {}, false));
  // Validation data is needed by a run that evaluates; one that never does may leave it unset.
  const std::string train = "data:\n  train: \"" + repo("configs/*.yaml") + "\"\n";
  EXPECT_THAT(load_error("noval.yaml", train, {}, true), AllOf(HasSubstr("data.val"), HasSubstr("not set")));
  EXPECT_NO_THROW(tg::parse_config(train + "run:\n  eval_every: 0\n", "noeval.yaml", {}, true));
}

TEST(ConfigError, BadSetOverride) {
  const std::string path = write_temp("set.yaml", "train:\n  lr: 1e-3\n");
  EXPECT_THAT(error_of([&] { tg::load_config(path, {"train.lr=abc"}, false); }),
              HasSubstr("--set train.lr=abc: train.lr: expected a number, got 'abc'"));
  EXPECT_THAT(error_of([&] { tg::load_config(path, {"train.lr"}, false); }),
              AllOf(HasSubstr("--set train.lr"), HasSubstr("key=value")));
  EXPECT_THAT(
      error_of([&] { tg::load_config(path, {"train.lrr=1"}, false); }),
      AllOf(HasSubstr("--set train.lrr=1"), HasSubstr("unknown key"), HasSubstr("did you mean 'train.lr'?")));
  EXPECT_THAT(error_of([&] { tg::load_config(path, {"trian.lr=1"}, false); }),
              HasSubstr("did you mean 'train.lr'?"));
  EXPECT_THAT(error_of([&] { tg::load_config(path, {"lr=1"}, false); }),
              HasSubstr("did you mean 'train.lr'?"));
  // Range and cross-field errors from an override point at the override.
  EXPECT_THAT(error_of([&] { tg::load_config(path, {"train.batch_size=-2"}, false); }),
              AllOf(HasSubstr("--set train.batch_size=-2"), HasSubstr("must be >= 1")));
}

TEST(ConfigError, MissingConfigFile) {
  const std::string path = (temp_dir() / "does_not_exist.yaml").string();
  EXPECT_THAT(error_of([&] { tg::load_config(path, {}, false); }),
              AllOf(HasSubstr(path), HasSubstr("cannot read config file"), HasSubstr("does not exist")));
  EXPECT_THAT(error_of([&] { tg::load_config(temp_dir().string(), {}, false); }), HasSubstr("directory"));
  // A device never ends and a named pipe blocks its reader: both are refused before any read.
  EXPECT_THAT(error_of([&] { tg::load_config("/dev/zero", {}, false); }),
              AllOf(HasSubstr("/dev/zero"), HasSubstr("is a device")));
  const std::string fifo = (temp_dir() / "config_fifo.yaml").string();
  std::filesystem::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(error_of([&] { tg::load_config(fifo, {}, false); }), HasSubstr("named pipe"));
  std::filesystem::remove(fifo);
}

TEST(ConfigError, YamlSyntaxError) {
  const std::string msg =
      load_error("syntax.yaml", "model:\n  n_layer: 2\n  n_head: [1, 2\ntrain:\n  lr: 1\n");
  EXPECT_THAT(msg, AllOf(HasSubstr("syntax.yaml:"), HasSubstr("YAML syntax error")));
  EXPECT_THAT(load_error("alias.yaml", "data:\n  train: *.bin\n"),
              AllOf(HasSubstr("alias.yaml:2:"), HasSubstr("quote it")));
  EXPECT_THAT(load_error("notmap.yaml", "- a\n- b\n"),
              AllOf(HasSubstr("notmap.yaml:1:"), HasSubstr("mapping")));
  EXPECT_THAT(load_error("sectionscalar.yaml", "train: 5\n"),
              AllOf(HasSubstr("sectionscalar.yaml:1:"), HasSubstr("train"), HasSubstr("expected a mapping")));
  // A second document's keys would otherwise be dropped without a word; a bare trailing '---' is fine.
  EXPECT_THAT(load_error("twodocs.yaml", "train:\n  lr: 1.0e-3\n---\ntrain:\n  batch_size: 8\n"),
              AllOf(HasSubstr("twodocs.yaml:4:"), HasSubstr("second YAML document")));
  EXPECT_EQ(tg::parse_config("train:\n  lr: 1.0e-3\n---\n", "trailing.yaml", {}, false).train.lr, 1.0e-3);
}

TEST(ConfigError, CrossFieldChecks) {
  EXPECT_THAT(load_error("heads.yaml", "model:\n  n_head: 6\n  d_model: 100\n"),
              AllOf(HasSubstr("heads.yaml:3:"), HasSubstr("model.d_model"),
                    HasSubstr("model.n_head (6, line 2)"), HasSubstr("96 or 102")));
  EXPECT_THAT(load_error("seqlen.yaml", "model:\n  max_seq_len: 32\n"),
              AllOf(HasSubstr("seqlen.yaml:2:"), HasSubstr("train.seq_len"), HasSubstr("max_seq_len")));
  EXPECT_NO_THROW(
      tg::parse_config("model:\n  max_seq_len: 32\n  pos_embedding: rope\n", "rope.yaml", {}, false));
  EXPECT_THAT(
      load_error("minlr.yaml", "train:\n  lr: 1e-3\n  min_lr: 1e-2\n"),
      AllOf(HasSubstr("minlr.yaml:3:"), HasSubstr("train.min_lr"), HasSubstr("train.lr (0.001, line 2)")));
  EXPECT_THAT(load_error("warmup.yaml", "train:\n  max_steps: 10\n"),
              AllOf(HasSubstr("warmup.yaml:2:"), HasSubstr("train.warmup_steps"),
                    HasSubstr("--set train.warmup_steps=1")));
  EXPECT_THAT(load_error("bf16.yaml", "train:\n  precision: bf16\nrun:\n  device: cpu\n"),
              AllOf(HasSubstr("bf16.yaml:2:"), HasSubstr("train.precision"), HasSubstr("line 4")));
  EXPECT_THAT(load_error("oddrope.yaml", "model:\n  pos_embedding: rope\n  n_head: 2\n  d_model: 6\n"),
              AllOf(HasSubstr("oddrope.yaml:2:"), HasSubstr("model.pos_embedding"), HasSubstr("even")));
  EXPECT_THAT(load_error("offload.yaml", "train:\n  offload_activations: true\n"),
              AllOf(HasSubstr("offload.yaml:2:"), HasSubstr("train.offload_activations"), HasSubstr("train.recompute")));
  EXPECT_THAT(load_error("pieces.yaml", "model:\n  dropout: 0.1\ntrain:\n  recompute_rows: 4096\n"),
              AllOf(HasSubstr("pieces.yaml:4:"), HasSubstr("train.recompute_rows"), HasSubstr("model.dropout 0.1")));
  // validate_config on a Config built in code names the source and the key.
  tg::Config c;
  c.source_path = "code.yaml";
  c.train.beta2 = 1.0;
  EXPECT_THAT(error_of([&] { tg::validate_config(c); }),
              AllOf(HasSubstr("code.yaml"), HasSubstr("train.beta2")));
}

namespace {
// A table cell's text with its pipes escaped, so that "learned | rope" stays one cell.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// The Markdown table of every config key, as docs/config.md holds it.
std::string config_table() {
  std::string t = "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const tg::ConfigKeyDoc& d : tg::config_reference())
    t += "| `" + d.key + "` | " + cell(d.type) + " | `" + d.default_value + "` | " + cell(d.description) + " |\n";
  return t;
}
}  // namespace

// docs/config.md's table is generated from the option table that parses configs: on a mismatch
// the test writes the current table to the build folder and names the command that installs it.
TEST(Config, DocumentedTableMatchesTheOptionTable) {
  const std::string path = std::string(TILEGRAD_SOURCE_DIR) + "/docs/config.md";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  std::stringstream doc;
  doc << in.rdbuf();
  const std::string begin = "<!-- begin generated table -->\n", end = "<!-- end generated table -->";
  const std::string text = doc.str();
  const size_t a = text.find(begin), b = text.find(end);
  ASSERT_TRUE(a != std::string::npos && b != std::string::npos && a < b) << path << " lacks the table markers";
  const std::string table = text.substr(a + begin.size(), b - a - begin.size());
  if (table != config_table()) {
    const std::string fresh = std::string(TILEGRAD_BINARY_DIR) + "/config.md";
    std::ofstream(fresh) << text.substr(0, a + begin.size()) << config_table() << text.substr(b);
    FAIL() << path << "'s table differs from the option table (src/io/config.cpp); the current one is in "
           << fresh << ": cp " << fresh << " " << path;
  }
}

// The attention masks' keys: the window is a model key (non-negative), and a document mask needs an
// end-of-text id inside the vocabulary, named with both keys' sources.
TEST(Config, AttentionMaskKeys) {
  const std::string path = write_temp("masks.yaml", "model:\n  vocab_size: 257\n  attention_window: 128\n"
                                                    "data:\n  document_mask: true\n");
  const tg::Config c = tg::load_config(path, {}, false);
  EXPECT_EQ(c.model.attention_window, 128);
  EXPECT_TRUE(c.data.document_mask);
  EXPECT_EQ(c.data.eot_token, 256);  // what `tilegrad prepare` writes between byte-level files
  const tg::Config d = tg::parse_config("", "empty.yaml", {}, false);
  EXPECT_EQ(d.model.attention_window, 0);
  EXPECT_FALSE(d.data.document_mask);
  EXPECT_THAT(load_error("window_bad.yaml", "model:\n  attention_window: -1\n"),
              AllOf(HasSubstr("window_bad.yaml:2:"), HasSubstr("model.attention_window"), HasSubstr("must be >= 0")));
  EXPECT_THAT(load_error("eot_bad.yaml", "data:\n  document_mask: true\n"),
              AllOf(HasSubstr("data.eot_token"), HasSubstr("outside the vocabulary"), HasSubstr("model.vocab_size 256")));
  EXPECT_THAT(load_error("eot_bad2.yaml", "model:\n  vocab_size: 300\ndata:\n  document_mask: true\n  eot_token: 300\n"),
              AllOf(HasSubstr("eot_bad2.yaml:5:"), HasSubstr("data.eot_token"), HasSubstr("300")));
  // A larger vocabulary than byte-level data's needs the id named: 256 is an ordinary token there.
  EXPECT_THAT(load_error("eot_unset.yaml", "model:\n  vocab_size: 50304\ndata:\n  document_mask: true\n"),
              AllOf(HasSubstr("eot_unset.yaml:4:"), HasSubstr("data.eot_token is not set"), HasSubstr("50256")));
  const tg::Config gpt2 = tg::load_config(
      write_temp("eot_gpt2.yaml", "model:\n  vocab_size: 50304\ndata:\n  document_mask: true\n  eot_token: 50256\n"), {},
      false);
  EXPECT_EQ(gpt2.data.eot_token, 50256);
  // Off, the id is not checked (the default 256 with a 256-token vocabulary is fine).
  EXPECT_EQ(tg::load_config(write_temp("eot_off.yaml", "data:\n  document_mask: false\n"), {}, false).data.eot_token,
            256);
}
