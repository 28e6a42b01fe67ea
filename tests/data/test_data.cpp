// Tests for token shards, the byte tokenizer, corpus preparation and the DataLoader.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "src/data/loader.h"
#include "src/data/prepare.h"
#include "src/data/shards.h"
#include "src/data/tokenizer.h"
#include "src/util/error.h"

#ifndef TILEGRAD_SOURCE_DIR
#define TILEGRAD_SOURCE_DIR "/work/main"
#endif

namespace fs = std::filesystem;
using namespace tg;

namespace {

class DataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("tilegrad_data_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  static void write_bytes(const std::string& p, const void* data, size_t n) {
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  }
  static void write_text(const std::string& p, const std::string& s) { write_bytes(p, s.data(), s.size()); }
  static std::vector<char> read_bytes(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  // An llm.c header with chosen magic/version/count followed by `tokens`.
  void write_header_shard(const std::string& p, int32_t magic, int32_t version, int32_t count,
                          const std::vector<uint16_t>& tokens) {
    std::vector<char> buf(1024 + 2 * tokens.size());
    int32_t header[256] = {magic, version, count};
    std::memcpy(buf.data(), header, 1024);
    if (!tokens.empty()) std::memcpy(buf.data() + 1024, tokens.data(), 2 * tokens.size());
    write_bytes(p, buf.data(), buf.size());
  }

  // Expects `fn` to throw tg::Error whose message contains every string in `parts`.
  template <typename Fn>
  static std::string expect_error(Fn fn, const std::vector<std::string>& parts) {
    try {
      fn();
    } catch (const Error& e) {
      const std::string msg = e.what();
      for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
      std::printf("  [error message] %s\n", msg.c_str());
      return msg;
    }
    ADD_FAILURE() << "expected tg::Error";
    return "";
  }

  fs::path dir_;
};

std::vector<uint16_t> iota_tokens(size_t n, uint16_t start) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>(start + i);
  return t;
}

// ---------------------------------------------------------------- shards

TEST_F(DataTest, LlmcShardRoundTrip) {
  const auto tokens = iota_tokens(1000, 7);
  write_llmc_shard(path("a.bin"), tokens);
  EXPECT_FALSE(fs::exists(path("a.bin.tmp")));
  EXPECT_EQ(fs::file_size(path("a.bin")), 1024u + 2 * tokens.size());
  const auto bytes = read_bytes(path("a.bin"));
  int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 1000);
  const TokenShard s = read_shard(path("a.bin"), 50257);
  EXPECT_EQ(s.format, ShardFormat::kLlmc);
  EXPECT_EQ(s.path, path("a.bin"));
  EXPECT_EQ(s.tokens, tokens);
}

TEST_F(DataTest, RawNanoGptShard) {
  const std::vector<uint16_t> tokens = {5, 0, 50256, 1, 2};
  write_bytes(path("raw.bin"), tokens.data(), 2 * tokens.size());
  const TokenShard s = read_shard(path("raw.bin"), 50257);
  EXPECT_EQ(s.format, ShardFormat::kRaw);
  EXPECT_EQ(s.tokens, tokens);
}

TEST_F(DataTest, BadMagicIsNotTakenAsLlmc) {
  // Without the magic the file is raw tokens; the header's ints then decode to ids a GPT-2
  // vocabulary rejects, so a corrupt header still fails loudly rather than reading as llm.c.
  write_header_shard(path("m.bin"), 20240521, 1, 4, iota_tokens(4, 0));
  expect_error([&] { read_shard(path("m.bin"), 50257); }, {"m.bin", "offset 0", "id 55433"});
}

TEST_F(DataTest, BadVersion) {
  write_header_shard(path("v.bin"), kLlmcMagic, 2, 4, iota_tokens(4, 0));
  expect_error([&] { read_shard(path("v.bin"), 50257); }, {"v.bin", "version 2", "expected 1"});
}

TEST_F(DataTest, TruncatedShard) {
  write_llmc_shard(path("t.bin"), iota_tokens(100, 0));
  fs::resize_file(path("t.bin"), 1024 + 2 * 100 - 2);
  expect_error([&] { read_shard(path("t.bin"), 50257); },
               {"t.bin", "size mismatch", "expected 1224", "1222 bytes"});
  // Count larger than the data in the header.
  write_header_shard(path("c.bin"), kLlmcMagic, 1, 50, iota_tokens(10, 0));
  expect_error([&] { read_shard(path("c.bin"), 50257); }, {"c.bin", "expected 1124", "1044 bytes"});
  // Magic present but not even a whole header.
  write_header_shard(path("h.bin"), kLlmcMagic, 1, 0, {});
  fs::resize_file(path("h.bin"), 500);
  expect_error([&] { read_shard(path("h.bin"), 50257); }, {"h.bin", "500 bytes", "1024-byte header"});
}

TEST_F(DataTest, OddRawSize) {
  write_text(path("odd.bin"), "abc");
  expect_error([&] { read_shard(path("odd.bin"), 257); }, {"odd.bin", "odd", "3 bytes"});
}

TEST_F(DataTest, TokenOutOfVocab) {
  write_llmc_shard(path("big.bin"), {1, 2, 300, 4});
  expect_error([&] { read_shard(path("big.bin"), 257); },
               {"big.bin", "offset 2", "byte 1028", "id 300", "vocab_size 257", "model.vocab_size",
                "re-prepare"});
  const std::vector<uint16_t> raw = {1, 256};
  write_bytes(path("raw.bin"), raw.data(), 4);
  expect_error([&] { read_shard(path("raw.bin"), 256); }, {"offset 1", "byte 2", "id 256"});
  EXPECT_NO_THROW(read_shard(path("raw.bin"), 257));
}

TEST_F(DataTest, MissingFileAndEmptyGlob) {
  expect_error([&] { read_shard(path("nope.bin"), 257); }, {"nope.bin", "does not exist"});
  const std::string pattern = path("train_*.bin");
  expect_error([&] { expand_glob(pattern); }, {pattern, "tilegrad prepare"});
  write_text(path("empty.bin"), "");
  expect_error([&] { read_shard(path("empty.bin"), 257); }, {"empty.bin", "empty"});
}

TEST_F(DataTest, GlobIsSorted) {
  for (const char* n : {"train_000002.bin", "train_000000.bin", "train_000001.bin", "val_000000.bin"})
    write_llmc_shard(path(n), {1});
  const auto files = expand_glob(path("train_*.bin"));
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0], path("train_000000.bin"));
  EXPECT_EQ(files[2], path("train_000002.bin"));
  EXPECT_EQ(expand_glob(path("val_000000.bin")).size(), 1u);  // a plain path matches itself
}

// ---------------------------------------------------------------- tokenizer

TEST(ByteTokenizerTest, RoundTrip) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  all += "héllo wörld\n";
  const auto ids = ByteTokenizer::encode(all);
  ASSERT_EQ(ids.size(), all.size());
  EXPECT_EQ(ids[0], 0);
  EXPECT_EQ(ids[255], 255);
  for (uint16_t id : ids) EXPECT_LT(id, kByteVocab);
  EXPECT_EQ(ByteTokenizer::decode(ids), all);
}

TEST(ByteTokenizerTest, EndOfTextAndInvalidIds) {
  EXPECT_EQ(ByteTokenizer::decode(std::vector<uint16_t>{'a', kEndOfText, 'b'}), "a<|endoftext|>b");
  EXPECT_EQ(ByteTokenizer::decode(std::vector<int32_t>{'h', 'i'}), "hi");
  EXPECT_THROW(ByteTokenizer::decode(std::vector<int32_t>{257}), Error);
  EXPECT_THROW(ByteTokenizer::decode_token(-1), Error);
}

// ---------------------------------------------------------------- prepare

std::string sample_text(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>((i * 131 + 7) % 256));
  return s;
}

TEST_F(DataTest, PrepareSingleFileSplitsLastFractionAsVal) {
  const std::string text = sample_text(1000);
  write_text(path("input.txt"), text);
  const auto r = prepare_text({path("input.txt")}, path("out"), 0.01, false);
  // Reference: n = int(0.99 * len(data)); train = data[:n]; val = data[n:].
  EXPECT_EQ(r.train_tokens, 990);
  EXPECT_EQ(r.val_tokens, 10);
  ASSERT_EQ(r.files.size(), 2u);
  EXPECT_EQ(r.files[0], path("out/train_000000.bin"));
  EXPECT_EQ(r.files[1], path("out/val_000000.bin"));
  const auto train = read_shard(r.files[0], kByteVocab);
  const auto val = read_shard(r.files[1], kByteVocab);  // no EOT: a single text keeps vocab 256
  EXPECT_EQ(train.format, ShardFormat::kLlmc);
  EXPECT_EQ(val.format, ShardFormat::kLlmc);
  EXPECT_EQ(ByteTokenizer::decode(train.tokens), text.substr(0, 990));
  EXPECT_EQ(ByteTokenizer::decode(val.tokens), text.substr(990));
  // The split matches the reference for an odd length and another fraction too.
  write_text(path("b.txt"), text.substr(0, 777));
  const auto r2 = prepare_text({path("b.txt")}, path("out2"), 0.1, false);
  EXPECT_EQ(r2.train_tokens, static_cast<int64_t>(0.9 * 777));  // 699
  EXPECT_EQ(r2.val_tokens, 777 - 699);
}

TEST_F(DataTest, PrepareSeveralFilesJoinsWithEndOfText) {
  write_text(path("a.txt"), "first document");
  write_text(path("b.txt"), "second one, a bit longer than the first");
  const auto r = prepare_text({path("a.txt"), path("b.txt")}, path("out"), 0.25, false);
  const int64_t total = 14 + 39 + 1;
  EXPECT_EQ(r.train_tokens + r.val_tokens, total);
  EXPECT_EQ(r.train_tokens, static_cast<int64_t>(0.75 * total));
  auto all = read_shard(r.files[0], kByteVocab + 1).tokens;
  const auto val = read_shard(r.files[1], kByteVocab + 1).tokens;
  all.insert(all.end(), val.begin(), val.end());
  EXPECT_EQ(ByteTokenizer::decode(all),
            "first document<|endoftext|>second one, a bit longer than the first");
  EXPECT_THROW(read_shard(r.files[0], kByteVocab), Error);  // the EOT needs vocab 257
}

TEST_F(DataTest, PrepareSplitsLargeSplitsIntoShardsAndRemovesStale) {
  const std::string text = sample_text(1000);
  write_text(path("input.txt"), text);
  const auto r = prepare_text({path("input.txt")}, path("out"), 0.01, false, 300);
  ASSERT_EQ(r.files.size(), 5u);  // train 300+300+300+90, val 10
  EXPECT_EQ(r.files[3], path("out/train_000003.bin"));
  EXPECT_EQ(r.files[4], path("out/val_000000.bin"));
  std::string train;
  for (const auto& f : expand_glob(path("out/train_*.bin")))
    train += ByteTokenizer::decode(read_shard(f, kByteVocab).tokens);
  EXPECT_EQ(train, text.substr(0, 990));
  // Re-preparing with bigger shards must not leave train_000001..3 behind for a glob to find.
  write_text(path("out/notes.txt"), "keep me");
  prepare_text({path("input.txt")}, path("out"), 0.01, false);
  EXPECT_EQ(expand_glob(path("out/train_*.bin")).size(), 1u);
  EXPECT_TRUE(fs::exists(path("out/notes.txt")));
}

TEST_F(DataTest, PrepareErrors) {
  write_text(path("in.txt"), sample_text(500));
  write_text(path("empty.txt"), "");
  expect_error([&] { prepare_text({path("missing.txt")}, path("o"), 0.01, false); },
               {"missing.txt", "does not exist"});
  expect_error([&] { prepare_text({path("in.txt"), path("empty.txt")}, path("o"), 0.01, false); },
               {"empty.txt", "empty"});
  expect_error([&] { prepare_text({}, path("o"), 0.01, false); }, {"no input"});
  for (double f : {0.0, 1.0, -0.5, 1.5})
    expect_error([&] { prepare_text({path("in.txt")}, path("o"), f, false); }, {"val_fraction", "(0, 1)"});
  // A regular file where the output directory should go.
  expect_error([&] { prepare_text({path("in.txt")}, path("in.txt/sub"), 0.01, false); },
               {"in.txt/sub"});
  if (geteuid() != 0) {  // root ignores permission bits
    fs::create_directories(path("ro"));
    fs::permissions(path("ro"), fs::perms::owner_read | fs::perms::owner_exec);
    expect_error([&] { prepare_text({path("in.txt")}, path("ro"), 0.01, false); }, {"not writable"});
    fs::permissions(path("ro"), fs::perms::owner_all);
  }
  // One byte: int(0.99 * 1) = 0 train tokens.
  write_text(path("tiny.txt"), "a");
  expect_error([&] { prepare_text({path("tiny.txt")}, path("o"), 0.01, false); },
               {"1 tokens", "0 train", "1 validation"});
  // An existing regular file as the output directory.
  expect_error([&] { prepare_text({path("in.txt")}, path("tiny.txt"), 0.01, false); },
               {"tiny.txt"});
}

// ---------------------------------------------------------------- loader

// Two shards whose tokens are consecutive numbers, disjoint between shards, so each window
// shows where it came from and that it did not cross a boundary.
class LoaderTest : public DataTest {
 protected:
  void SetUp() override {
    DataTest::SetUp();
    write_llmc_shard(path("train_000000.bin"), iota_tokens(100, 0));
    write_llmc_shard(path("train_000001.bin"), iota_tokens(300, 1000));
    glob_ = path("train_*.bin");
  }
  std::string glob_;
};

using Batch = std::pair<std::vector<int32_t>, std::vector<int32_t>>;
Batch next(DataLoader& dl) {
  Batch b{std::vector<int32_t>(dl.batch_size() * dl.seq_len()), std::vector<int32_t>(dl.batch_size() * dl.seq_len())};
  dl.next_batch(b.first.data(), b.second.data());
  return b;
}

TEST_F(LoaderTest, WindowsAreContiguousAndTargetsAreShiftedInputs) {
  DataLoader dl(glob_, 65536, 8, 16, 42);
  EXPECT_EQ(dl.total_tokens(), 400);
  EXPECT_EQ(dl.files().size(), 2u);
  for (int s = 0; s < 50; ++s) {
    const auto [in, tgt] = next(dl);
    for (int b = 0; b < 8; ++b) {
      const int32_t first = in[b * 16];
      const bool shard0 = first < 1000;
      // The last target (first + 16) must still be inside the same shard.
      EXPECT_LE(first + 16, shard0 ? 99 : 1299);
      for (int t = 0; t < 16; ++t) {
        EXPECT_EQ(in[b * 16 + t], first + t);
        EXPECT_EQ(tgt[b * 16 + t], first + t + 1);
      }
    }
  }
  EXPECT_EQ(dl.cursor().step, 50u);
}

TEST_F(LoaderTest, SameSeedSameBatchesDifferentSeedDifferent) {
  DataLoader a(glob_, 65536, 4, 8, 7), b(glob_, 65536, 4, 8, 7), c(glob_, 65536, 4, 8, 8);
  bool any_diff = false;
  for (int s = 0; s < 10; ++s) {
    const auto ba = next(a);
    EXPECT_EQ(ba, next(b));
    any_diff = any_diff || ba != next(c);
  }
  EXPECT_TRUE(any_diff);
}

TEST_F(LoaderTest, RanksDrawDifferentWindowsThatTileTheGlobalBatch) {
  DataLoader r0(glob_, 65536, 4, 8, 3, 0, 2), r1(glob_, 65536, 4, 8, 3, 1, 2);
  DataLoader single(glob_, 65536, 8, 8, 3);
  for (int s = 0; s < 5; ++s) {
    const auto a = next(r0), b = next(r1), all = next(single);
    EXPECT_NE(a.first, b.first);
    // Rank r's rows are rows [r*B, (r+1)*B) of the one-process batch of W*B rows.
    std::vector<int32_t> joined = a.first;
    joined.insert(joined.end(), b.first.begin(), b.first.end());
    EXPECT_EQ(joined, all.first);
  }
}

TEST_F(LoaderTest, SetCursorResumesExactly) {
  DataLoader a(glob_, 65536, 4, 8, 99);
  std::vector<Batch> stream;
  LoaderCursor saved;
  for (int s = 0; s < 10; ++s) {
    if (s == 6) saved = a.cursor();
    stream.push_back(next(a));
  }
  EXPECT_EQ(saved.seed, 99u);
  EXPECT_EQ(saved.step, 6u);
  DataLoader b(glob_, 65536, 4, 8, 12345);  // the seed comes from the cursor
  b.set_cursor(saved);
  for (int s = 6; s < 10; ++s) EXPECT_EQ(next(b), stream[s]);
}

TEST_F(LoaderTest, StartsAreUniformOverValidStarts) {
  // Valid starts: 100-8 = 92 in shard 0, 300-8 = 292 in shard 1.
  DataLoader dl(glob_, 65536, 64, 8, 5);
  int64_t from0 = 0, n = 0;
  std::set<int32_t> starts;
  for (int s = 0; s < 200; ++s) {
    const auto [in, tgt] = next(dl);
    for (int b = 0; b < 64; ++b, ++n) {
      from0 += in[b * 8] < 1000;
      starts.insert(in[b * 8]);
    }
  }
  EXPECT_NEAR(static_cast<double>(from0) / n, 92.0 / 384.0, 0.02);
  EXPECT_EQ(starts.size(), 384u);  // 12800 draws hit every one of the 384 starts
  EXPECT_EQ(*starts.begin(), 0);
  EXPECT_EQ(*starts.rbegin(), 1000 + 291);
}

TEST_F(DataTest, TooShortData) {
  write_llmc_shard(path("s_0.bin"), iota_tokens(5, 0));
  write_llmc_shard(path("s_1.bin"), iota_tokens(8, 0));
  expect_error([&] { DataLoader dl(path("s_*.bin"), 257, 1, 8, 0); },
               {"seq_len 8", "needs 9 tokens", "s_1.bin", "has 8 tokens", "13 in all 2 shards"});
  EXPECT_NO_THROW(DataLoader(path("s_*.bin"), 257, 1, 7, 0));
  expect_error([&] { DataLoader dl(path("x_*.bin"), 257, 1, 8, 0); }, {"x_*.bin", "tilegrad prepare"});
}

TEST_F(DataTest, SequentialModeCoversDataInOrder) {
  write_llmc_shard(path("v_0.bin"), iota_tokens(25, 0));     // windows at 0,4,..,20: 6
  write_llmc_shard(path("v_1.bin"), iota_tokens(17, 1000));  // windows at 0,4,8,12: 4
  const std::vector<int32_t> expected_starts = {0, 4, 8, 12, 16, 20, 1000, 1004, 1008, 1012};
  DataLoader dl(path("v_*.bin"), 65536, 2, 4, 0);
  EXPECT_EQ(dl.num_sequential_batches(), 5);
  std::vector<int32_t> in(8), tgt(8);
  for (int pass = 0; pass < 2; ++pass) {  // reset_sequential starts the same sweep again
    dl.reset_sequential();
    std::vector<int32_t> starts;
    while (dl.next_sequential_batch(in.data(), tgt.data())) {
      for (int b = 0; b < 2; ++b) {
        starts.push_back(in[b * 4]);
        for (int t = 0; t < 4; ++t) {
          EXPECT_EQ(in[b * 4 + t], in[b * 4] + t);
          EXPECT_EQ(tgt[b * 4 + t], in[b * 4] + t + 1);
        }
      }
    }
    EXPECT_EQ(starts, expected_starts);
  }
  // B = 3: 10 windows give 3 full batches; the partial last one is dropped.
  DataLoader dl3(path("v_*.bin"), 65536, 3, 4, 0);
  std::vector<int32_t> in3(12), tgt3(12);
  int batches = 0;
  while (dl3.next_sequential_batch(in3.data(), tgt3.data())) ++batches;
  EXPECT_EQ(batches, 3);
  EXPECT_EQ(in3[0], 1000);  // the third batch holds windows 6, 7, 8
  // Two ranks: 5 batches -> 2 each (batch 4 dropped), dealt round-robin: rank 0 gets
  // batches 0 and 2 (windows 0-1, 4-5), rank 1 batches 1 and 3 (windows 2-3, 6-7).
  DataLoader r0(path("v_*.bin"), 65536, 2, 4, 0, 0, 2), r1(path("v_*.bin"), 65536, 2, 4, 0, 1, 2);
  std::vector<int32_t> s0, s1;
  while (r0.next_sequential_batch(in.data(), tgt.data())) s0.push_back(in[0]);
  while (r1.next_sequential_batch(in.data(), tgt.data())) s1.push_back(in[0]);
  EXPECT_EQ(s0, (std::vector<int32_t>{0, 16}));
  EXPECT_EQ(s1, (std::vector<int32_t>{8, 1000}));
}

TEST_F(DataTest, LoaderRejectsBadArguments) {
  write_llmc_shard(path("d.bin"), iota_tokens(50, 0));
  EXPECT_THROW(DataLoader(path("d.bin"), 65536, 0, 8, 0), Error);
  EXPECT_THROW(DataLoader(path("d.bin"), 65536, 1, 0, 0), Error);
  EXPECT_THROW(DataLoader(path("d.bin"), 65536, 1, 8, 0, 2, 2), Error);
  expect_error([&] { DataLoader dl(path("d.bin"), 40, 1, 8, 0); }, {"offset 40", "vocab_size 40"});
}

}  // namespace
