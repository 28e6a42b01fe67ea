// Seeded mutation fuzzing of the token-shard reader (llm.c header and raw formats): a fixed
// number of mutated files, each read or rejected with tg::Error, never a crash or another
// exception (a header's token count drives an allocation: it must be checked against the file
// size first).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "src/data/shards.h"
#include "src/util/error.h"

namespace fs = std::filesystem;
using namespace tg;

TEST(Fuzz, ShardReaderOnlyEverThrowsTgError) {
  const fs::path dir = fs::temp_directory_path() / ("tg_fuzz_shard_" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::string good = (dir / "good.bin").string();
  std::vector<uint16_t> tokens(500);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = uint16_t(i % 256);
  write_llmc_shard(good, tokens);
  std::ifstream in(good, std::ios::binary);
  const std::string original((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::mt19937_64 rng(99);
  const std::string path = (dir / "m.bin").string();
  int ok = 0, rejected = 0;
  // Kept cases: a header claiming 2^31 − 1 tokens, a negative count, a wrong version.
  auto header_with = [&](int index, int32_t value) {
    std::string s = original;
    std::memcpy(&s[size_t(index) * 4], &value, 4);
    return s;
  };
  std::vector<std::string> inputs = {header_with(2, 2147483647), header_with(2, -1), header_with(1, 7),
                                     original.substr(0, 1000), original.substr(0, 3), std::string(1, '\0')};
  for (int i = 0; i < 1500; ++i) {
    std::string s = original;
    const int n = 1 + int(rng() % 3);
    for (int k = 0; k < n; ++k) {
      const size_t at = rng() % 1024 < 900 ? rng() % 1024 : rng() % s.size();  // mostly the header
      switch (rng() % 3) {
        case 0: s[at % s.size()] = char(s[at % s.size()] ^ (1 << (rng() % 8))); break;
        case 1: s[at % s.size()] = char(rng()); break;
        case 2: s.resize(rng() % s.size()); break;
      }
      if (s.empty()) s = "x";
    }
    inputs.push_back(std::move(s));
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << inputs[i];
    try {
      read_shard(path, 256);
      ++ok;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "input " << i << " escaped as " << typeid(e).name() << ": " << e.what();
    }
  }
  std::cout << "  " << inputs.size() << " shards: " << ok << " read, " << rejected << " rejected\n";
  EXPECT_GT(rejected, 500);
  fs::remove_all(dir);
}
