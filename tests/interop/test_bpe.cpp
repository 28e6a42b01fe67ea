// GPT-2's byte-level BPE: pre-tokenization, encoding and decoding, learning a vocabulary,
// preparing shards with it, and (with transformers) id-for-id parity with GPT2TokenizerFast.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "src/data/bpe.h"
#include "tests/interop/interop_util.h"
#include "src/data/prepare.h"
#include "src/data/shards.h"
#include "src/util/error.h"

namespace fs = std::filesystem;
using namespace tg;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

// A scratch folder per test, named after this file.
struct TempDir : interop_test::TempDir {
  TempDir() : interop_test::TempDir("tg_bpe_test_") {}
};
using interop_test::read_file;

// Text with what a tokenizer gets wrong first: unicode letters, marks, digits of other scripts,
// emoji, runs and kinds of white space (no-break, ideographic, line separator, NEL, vertical
// tab), contractions in both cases, and the special token in the middle of words.
const std::vector<std::string> kSamples = {
    "Hello world! It's a test: they'll've we'RE don't I'm you'd.",
    "  leading spaces and trailing   ",
    "tabs\tand\nnewlines\n\n\nand   runs    of spaces\r\n",
    "unicode: café naïve 日本語のテキスト Ελληνικά ёлка 🙂👍🏽 e\xcc\x81",
    "numbers 12345 3.14 \xd9\xa3\xd9\xa4 \xc2\xbd \xe2\x85\xab x2y",
    "weird spaces: a\xc2\xa0" "b\xe3\x80\x80" "c\xe2\x80\xa8" "d\xc2\x85" "e\x0b" "f \x0c g",
    "special <|endoftext|> tokens<|endoftext|>between<|endoftext|>",
    "",
    "'s's'S 'll'LL ''' ---!!! $$$ (parens) [brackets] {braces}",
    "the the the then them there their theory thesis",
};

std::string corpus() {
  std::string text;
  for (int r = 0; r < 20; ++r)
    for (const std::string& s : kSamples) text += s + "\n";
  text += "The quick brown fox jumps over the lazy dog. " "In the beginning was the word, and the word was with the text.\n";
  return text;
}

BpeTokenizer trained(const fs::path& dir, int64_t vocab_size = 420) {
  std::ofstream(dir / "corpus.txt", std::ios::binary) << corpus();
  BpeTokenizer t = train_bpe({(dir / "corpus.txt").string()}, vocab_size);
  t.save((dir / "tok").string());
  return t;
}

}  // namespace

TEST(Bpe, Gpt2PreTokenization) {
  if (!have_bpe_encoder()) GTEST_SKIP() << "built without ICU (libicu-dev): BPE cannot encode";
  EXPECT_THAT(gpt2_pretokenize("Hello  world"), ElementsAre("Hello", " ", " world"));
  EXPECT_THAT(gpt2_pretokenize("it's 42x!?\n\n"), ElementsAre("it", "'s", " 42", "x", "!?", "\n\n"));
  EXPECT_THAT(gpt2_pretokenize("caf\xc3\xa9  \xe6\x97\xa5\xe6\x9c\xac"), ElementsAre("caf\xc3\xa9", " ", " \xe6\x97\xa5\xe6\x9c\xac"));
  for (const std::string& s : kSamples) {
    std::string joined;
    for (const std::string& p : gpt2_pretokenize(s)) joined += p;
    EXPECT_EQ(joined, s);
  }
}

TEST(Bpe, TrainEncodeDecode) {
  if (!have_bpe_encoder()) GTEST_SKIP() << "built without ICU (libicu-dev): BPE cannot encode";
  TempDir dir;
  BpeTokenizer t = trained(dir.path);
  EXPECT_EQ(t.vocab_size(), 420);
  EXPECT_EQ(t.end_of_text(), 419);
  // Round trip of every sample, byte for byte; the special token is one id.
  for (const std::string& s : kSamples) EXPECT_EQ(t.decode(t.encode(s)), s);
  std::vector<int32_t> ids = t.encode("a<|endoftext|>b");
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], 419);
  // Merges compress the training text.
  EXPECT_LT(t.encode(corpus()).size(), corpus().size() / 2);
  // The written files load back to the same tokenizer.
  BpeTokenizer back = BpeTokenizer::load((dir.path / "tok").string());
  EXPECT_EQ(back.encode(corpus()), t.encode(corpus()));
  BpeTokenizer::Cache cache;
  EXPECT_EQ(back.encode(corpus(), &cache), t.encode(corpus()));
  // Cut into pieces of a few bytes and encoded in parallel: the same ids.
  for (int64_t chunk : {1, 7, 64, 1000}) EXPECT_EQ(t.encode_parallel(corpus(), chunk), t.encode(corpus())) << chunk;
  nlohmann::json vocab = nlohmann::json::parse(read_file(dir.path / "tok/vocab.json"));
  EXPECT_EQ(vocab.size(), 420u);
  EXPECT_EQ(vocab["\xc4\xa0"], 32);  // "Ġ", GPT-2's stand-in for the space byte, is id 32 (the byte)
  EXPECT_THAT(read_file(dir.path / "tok/merges.txt"), ::testing::StartsWith("#version: 0.2\n"));
}

TEST(Bpe, Errors) {
  TempDir dir;
  EXPECT_THROW(BpeTokenizer::load((dir.path / "none").string()), Error);
  fs::create_directories(dir.path / "bad");
  std::ofstream(dir.path / "bad/vocab.json") << R"({"a": 0})";
  std::ofstream(dir.path / "bad/merges.txt") << "#version: 0.2\n";
  try {
    BpeTokenizer::load((dir.path / "bad").string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("lacks the token of byte 0"));
  }
  BpeTokenizer t = trained(dir.path, 300);
  try {
    t.decode({300});
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot decode token id 300"));
  }
  EXPECT_THROW(train_bpe({(dir.path / "corpus.txt").string()}, 100), Error);
  // No text to learn from, or a path that is not a file (a device never ends): clear errors.
  std::ofstream(dir.path / "empty.txt").close();
  try {
    train_bpe({(dir.path / "empty.txt").string()}, 300);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("hold no text"));
  }
  for (const std::string& bad : {dir.path.string(), std::string("/dev/zero")}) {
    try {
      train_bpe({bad}, 300);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), AllOf(HasSubstr("--text"), HasSubstr(bad))) << bad;
    }
  }
}

TEST(Bpe, PrepareWritesItsIdsAndTheTokenizer) {
  if (!have_bpe_encoder()) GTEST_SKIP() << "built without ICU (libicu-dev): BPE cannot encode";
  TempDir dir;
  BpeTokenizer t = trained(dir.path);
  std::ofstream(dir.path / "a.txt", std::ios::binary) << kSamples[0] << kSamples[3];
  std::ofstream(dir.path / "b.txt", std::ios::binary) << kSamples[2] << kSamples[4];
  PrepareResult r = prepare_text({(dir.path / "a.txt").string(), (dir.path / "b.txt").string()},
                                 (dir.path / "data").string(), 0.1, false, kMaxShardTokens, &t);
  std::vector<int32_t> want = t.encode(kSamples[0] + kSamples[3]);
  want.push_back(t.end_of_text());
  for (int32_t id : t.encode(kSamples[2] + kSamples[4])) want.push_back(id);
  std::vector<int32_t> got;
  for (const std::string& f : r.files) {
    TokenShard s = read_shard(f, 420);
    got.insert(got.end(), s.tokens.begin(), s.tokens.end());
  }
  EXPECT_EQ(got, want);
  EXPECT_EQ(r.train_tokens + r.val_tokens, int64_t(want.size()));
  EXPECT_EQ(read_file(dir.path / "data/vocab.json"), t.vocab_json());
  TextCodec codec = codec_for_shards(r.files);
  ASSERT_TRUE(codec.bpe);
  EXPECT_EQ(codec.encode(kSamples[3]), t.encode(kSamples[3]));
  // A byte-level preparation into the same folder removes the tokenizer files.
  prepare_text({(dir.path / "a.txt").string()}, (dir.path / "data").string(), 0.1, false);
  EXPECT_FALSE(fs::exists(dir.path / "data/vocab.json"));
  EXPECT_FALSE(codec_for_shards(r.files).bpe);
}

// Encoding matches transformers' GPT2TokenizerFast id for id on the same files, and its
// tokenizer.json, read alone, encodes the same.
TEST(Bpe, MatchesTransformersGpt2TokenizerFast) {
  if (!have_bpe_encoder()) GTEST_SKIP() << "built without ICU (libicu-dev): BPE cannot encode";
  const fs::path src = TILEGRAD_SOURCE_DIR;
  TempDir dir;
  const std::string env_cmd = (src / "tools/python_env.sh").string() + " > " + (dir.path / "py.txt").string() + " 2> " +
                              (dir.path / "py.err").string();
  if (std::system(env_cmd.c_str()) != 0)
    GTEST_SKIP() << "no Python environment with transformers: " << read_file(dir.path / "py.err");
  std::string python = read_file(dir.path / "py.txt");
  python.erase(python.find_last_not_of("\n") + 1);
  if (python.front() != '/') python = (src / python).string();

  BpeTokenizer t = trained(dir.path);
  std::vector<std::string> samples = kSamples;
  samples.push_back(corpus());
  // The default run's text, the King James Bible (Debian's bible-kjv, which ./test.sh installs).
  const std::string kjv_cmd = "bible -f 'gen1:1-gen4:26' > " + (dir.path / "kjv.txt").string() + " 2>/dev/null";
  const bool have_kjv = std::system(kjv_cmd.c_str()) == 0 && fs::file_size(dir.path / "kjv.txt") > 1000;
  if (have_kjv) samples.push_back(read_file(dir.path / "kjv.txt"));
  else std::cout << "  (no `bible` command: the KJV sample is left out)\n";
  std::ofstream(dir.path / "strings.json") << nlohmann::json(samples).dump();
  const std::string cmd = python + " " + (src / "tests/interop/bpe_parity.py").string() + " " +
                          (dir.path / "tok").string() + " " + (dir.path / "strings.json").string() + " " +
                          (dir.path / "fast").string() + " > " + (dir.path / "out.json").string() + " 2> " +
                          (dir.path / "err.txt").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(dir.path / "err.txt");
  nlohmann::json r = nlohmann::json::parse(read_file(dir.path / "out.json"));
  EXPECT_EQ(r["vocab_size"], 420);
  BpeTokenizer from_json = BpeTokenizer::load((dir.path / "fast").string());
  for (size_t i = 0; i < samples.size(); ++i) {
    const std::vector<int32_t> ours = t.encode(samples[i]);
    EXPECT_EQ(r["ids"][i].get<std::vector<int32_t>>(), ours) << "sample " << i << ": " << samples[i];
    EXPECT_EQ(r["decoded"][i].get<std::string>(), t.decode(ours)) << "sample " << i;
    EXPECT_EQ(from_json.encode(samples[i]), ours) << "tokenizer.json, sample " << i;
  }
}
