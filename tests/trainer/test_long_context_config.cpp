// The shipped long-context configs: configs/long-tiny.yaml (rotary positions, the chunked LM head,
// recomputed blocks, 8,192-token sequences) trains on the CPU, and configs/gpt2-124m-long.yaml
// parses and validates with the same keys at 262,144 tokens.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "src/data/prepare.h"
#include "src/trainer/trainer.h"

#ifndef TILEGRAD_SOURCE_DIR
#define TILEGRAD_SOURCE_DIR "."
#endif

namespace tg {
namespace {

namespace fs = std::filesystem;

TEST(LongContextConfig, TinyTrainsOnTheCpuAtT8192) {
  const fs::path dir = fs::temp_directory_path() / ("tilegrad_long_config_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "text.txt");  // one shard must hold a window of 8,193 tokens
    for (int i = 0; i < 3000; ++i) f << "In the beginning " << i % 7 << " the word was " << (i * 13) % 11 << ".\n";
  }
  prepare_text({(dir / "text.txt").string()}, (dir / "data").string(), 0.2, false);
  const Config c = load_config(std::string(TILEGRAD_SOURCE_DIR) + "/configs/long-tiny.yaml",
                               {"data.train=" + (dir / "data" / "train_*.bin").string(),
                                "data.val=" + (dir / "data" / "val_*.bin").string(), "run.device=cpu",
                                "run.out_dir=" + (dir / "run").string(), "train.max_steps=2",
                                "train.warmup_steps=1", "run.eval_every=0", "run.ckpt_every=0"});
  ASSERT_EQ(c.train.seq_len, 8192);
  ASSERT_EQ(c.model.pos_embedding, "rope");
  ASSERT_TRUE(c.train.recompute);
  ASSERT_GT(c.train.lm_head_chunk, 0);
  Trainer t(c);
  const TrainResult r = t.run();
  ASSERT_EQ(t.losses().size(), 2u);
  for (double l : t.losses()) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(t.losses().back(), t.losses().front()) << "the model learns";
  EXPECT_EQ(r.final_step, 2);
  EXPECT_TRUE(fs::exists(dir / "run" / "ckpt-2.h5"));
  fs::remove_all(dir);
}

TEST(LongContextConfig, Gpt2SmallLongValidates) {
  const Config c = load_config(std::string(TILEGRAD_SOURCE_DIR) + "/configs/gpt2-124m-long.yaml", {}, false);
  EXPECT_EQ(c.train.seq_len, 262144);
  EXPECT_EQ(c.model.pos_embedding, "rope");
  EXPECT_TRUE(c.train.recompute);
  EXPECT_EQ(c.train.lm_head_chunk, 4096);
  EXPECT_EQ(c.train.precision, "bf16");
}

}  // namespace
}  // namespace tg
