// Training with document masks on packed King James Bible verses (each verse its own document,
// separated by the end-of-text token `tilegrad prepare` writes between files): the loss falls, and
// the mask changes the run relative to unmasked training on the same batches; on a GPU the run
// tracks the CPU's.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "src/data/prepare.h"
#include "src/data/tokenizer.h"
#include "src/trainer/state.h"
#include "src/trainer/trainer.h"

namespace tg {
namespace {

namespace fs = std::filesystem;

// The text of a passage from the bible-kjv package's `bible` command, one verse a line; empty
// when the command is missing.
std::vector<std::string> kjv_verses(const std::string& range) {
  std::vector<std::string> lines;
  FILE* p = ::popen(("bible -f '" + range + "' 2>/dev/null").c_str(), "r");
  if (!p) return lines;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) {
    std::string s(buf);
    if (s.size() > 1) lines.push_back(s);
  }
  ::pclose(p);
  return lines;
}

Config masked_config(const fs::path& dir, const std::string& run, bool document_mask) {
  Config c;
  c.run.device = "cpu";
  c.model.n_layer = 1, c.model.n_head = 2, c.model.d_model = 32, c.model.max_seq_len = 64;
  c.model.vocab_size = kEndOfText + 1;  // bytes and the end-of-text id
  c.data.train = (dir / "data" / "train_*.bin").string();
  c.data.val = (dir / "data" / "val_*.bin").string();
  c.data.document_mask = document_mask;
  c.data.eot_token = kEndOfText;
  c.train.batch_size = 8, c.train.seq_len = 64, c.train.max_steps = 30, c.train.warmup_steps = 2;
  c.train.lr = 3e-3, c.train.min_lr = 3e-4;
  c.run.out_dir = (dir / run).string();
  c.run.log_every = 10, c.run.eval_every = 0, c.run.ckpt_every = 0, c.run.sample_every = 0;
  fs::remove_all(c.run.out_dir);
  return c;
}

// Each text a file of its own, prepared into DIR/data: one document per text.
void prepare_documents(const fs::path& dir, const std::vector<std::string>& texts) {
  fs::create_directories(dir / "texts");
  std::vector<std::string> files;
  for (size_t i = 0; i < texts.size(); ++i) {
    files.push_back((dir / "texts" / ("t" + std::to_string(1000 + i) + ".txt")).string());
    std::ofstream(files.back()) << texts[i];
  }
  prepare_text(files, (dir / "data").string(), 0.1, false);
}

TEST(DocumentMask, TrainsOnPackedVersesAndChangesTheLoss) {
  const std::vector<std::string> verses = kjv_verses("ruth1:1-ruth4:22");
  if (verses.size() < 50) GTEST_SKIP() << "the bible-kjv package is not installed (tools/install_deps.sh bible-kjv)";
  const fs::path dir = fs::temp_directory_path() / ("tilegrad_docmask_test_" + std::to_string(getpid()));
  prepare_documents(dir, verses);

  Trainer masked(masked_config(dir, "masked", true));
  masked.run();
  Trainer plain(masked_config(dir, "plain", false));
  plain.run();
  const std::vector<double>& lm = masked.losses();
  const std::vector<double>& lp = plain.losses();
  ASSERT_EQ(lm.size(), 30u);
  ASSERT_EQ(lp.size(), 30u);
  double last = 0;
  for (size_t i = 25; i < 30; ++i) last += lm[i] / 5;
  EXPECT_LT(last, lm[0] - 1.0) << "first loss " << lm[0] << ", mean of the last five " << last;
  // The same batches: the first step's loss already differs, since its rows hold verse boundaries.
  EXPECT_NE(lm[0], lp[0]);
  EXPECT_NE(lm.back(), lp.back());
  fs::remove_all(dir);
}

// On the GPU the document starts come from the batch's host copy (no read from the device in the
// step): the run tracks the CPU's, which would not hold were they another batch's.
TEST(DocumentMask, GpuRunTracksTheCpuRun) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine (or built without CUDA)";
  const fs::path dir = fs::temp_directory_path() / ("tilegrad_docmask_gpu_test_" + std::to_string(getpid()));
  std::vector<std::string> texts;  // documents of 11 to 72 bytes, a few in every 64-token row
  for (int i = 0; i < 300; ++i)
    texts.push_back("Document " + std::to_string(i) + std::string(size_t(i * 7 % 60), char('a' + i % 26)) + ".");
  prepare_documents(dir, texts);
  Config c = masked_config(dir, "cpu", true);
  c.train.max_steps = 10;
  Trainer cpu(c);
  cpu.run();
  c = masked_config(dir, "cuda", true);
  c.train.max_steps = 10, c.run.device = "cuda";
  Trainer gpu(c);
  gpu.run();
  ASSERT_EQ(gpu.losses().size(), cpu.losses().size());
  for (size_t i = 0; i < cpu.losses().size(); ++i)
    EXPECT_NEAR(gpu.losses()[i], cpu.losses()[i], 1e-3) << "step " << i + 1;
  fs::remove_all(dir);
}

// The window is part of the model: the config a checkpoint records builds a model with it (so
// `tilegrad sample` and `eval` attend as training did), and resuming with another window fails.
TEST(AttentionWindow, TravelsWithTheModelConfig) {
  ModelConfig m;
  m.attention_window = 7;
  EXPECT_EQ(gpt_config_from(m).attention_window, 7);
  ModelConfig other = m;
  other.attention_window = 0;
  try {
    check_model_compatible(other, m, "ckpt.h5");
    ADD_FAILURE() << "expected tg::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.attention_window: config has 0, checkpoint has 7"), std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW(check_model_compatible(m, m, "ckpt.h5"));
}

}  // namespace
}  // namespace tg
