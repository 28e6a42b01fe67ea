// Reading, validating and writing token shards (llm.c and raw nanoGPT formats).
#include "src/data/shards.h"

#include <glob.h>

#include <algorithm>
#include <bit>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "src/util/error.h"

namespace tg {

// Both formats store little-endian integers; reading them as native ints relies on that.
static_assert(std::endian::native == std::endian::little, "token shards are little-endian");

namespace fs = std::filesystem;

namespace {

void read_exact(std::ifstream& in, void* dst, int64_t bytes, const std::string& path) {
  in.read(static_cast<char*>(dst), bytes);
  TG_CHECK(in.gcount() == bytes, "token shard '", path, "': read ", in.gcount(), " of ", bytes,
           " bytes (file changed while reading or I/O error)");
}

void check_token_ids(const TokenShard& shard, int vocab_size, int64_t first_token_byte) {
  const auto& t = shard.tokens;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] >= vocab_size) {
      throw Error(detail::concat(
          "token shard '", shard.path, "': token at offset ", i, " (byte ",
          first_token_byte + 2 * static_cast<int64_t>(i), ") has id ", t[i],
          ", which is >= vocab_size ", vocab_size,
          "; check model.vocab_size in the config matches the tokenizer used to prepare the "
          "data, or re-prepare the data (tilegrad prepare)"));
    }
  }
}

}  // namespace

TokenShard read_shard(const std::string& path, int vocab_size) {
  TG_CHECK(vocab_size > 0, "read_shard: vocab_size must be positive, got ", vocab_size);
  std::error_code ec;
  const bool is_file = fs::is_regular_file(path, ec);
  TG_CHECK(!fs::is_directory(path, ec), "token shard '", path, "' is a directory; give a glob of the shards in it, ",
           "e.g. '", (fs::path(path) / "train_*.bin").string(), "'");
  TG_CHECK(is_file, "token shard '", path, "' does not exist or is not a regular file",
           " (prepare data with: tilegrad prepare)");
  const int64_t size = static_cast<int64_t>(fs::file_size(path, ec));
  TG_CHECK(!ec, "token shard '", path, "': cannot get file size: ", ec.message());
  TG_CHECK(size > 0, "token shard '", path, "' is empty (0 bytes)");

  std::ifstream in(path, std::ios::binary);
  TG_CHECK(in, "token shard '", path, "': cannot open for reading");

  TokenShard shard;
  shard.path = path;
  int32_t first = 0;
  if (size >= 4) read_exact(in, &first, 4, path);

  if (size >= 4 && first == kLlmcMagic) {
    shard.format = ShardFormat::kLlmc;
    TG_CHECK(size >= kLlmcHeaderBytes, "token shard '", path, "': llm.c magic found but the file is ",
             size, " bytes, shorter than the ", kLlmcHeaderBytes, "-byte header (truncated file?)");
    int32_t header[256];
    header[0] = first;
    read_exact(in, header + 1, kLlmcHeaderBytes - 4, path);
    TG_CHECK(header[1] == kLlmcVersion, "token shard '", path, "': unsupported llm.c shard version ",
             header[1], ", expected ", kLlmcVersion);
    const int64_t count = header[2];
    TG_CHECK(count >= 0, "token shard '", path, "': negative token count ", count, " in header");
    const int64_t expected = kLlmcHeaderBytes + 2 * count;
    TG_CHECK(size == expected, "token shard '", path, "': file size mismatch: header says ", count,
             " tokens, so expected ", expected, " bytes, but the file is ", size,
             " bytes (truncated or corrupt; re-prepare the data)");
    shard.tokens.resize(count);
    read_exact(in, shard.tokens.data(), 2 * count, path);
    check_token_ids(shard, vocab_size, kLlmcHeaderBytes);
  } else {
    // Raw nanoGPT .bin: no header, so anything not starting with the llm.c magic is tokens.
    shard.format = ShardFormat::kRaw;
    TG_CHECK(size % 2 == 0, "token shard '", path, "': no llm.c header, so read as raw uint16 tokens, ",
             "but the size ", size, " bytes is odd (not a token file, or truncated)");
    shard.tokens.resize(size / 2);
    in.seekg(0);
    read_exact(in, shard.tokens.data(), size, path);
    check_token_ids(shard, vocab_size, 0);
  }
  return shard;
}

void write_llmc_shard(const std::string& path, const std::vector<uint16_t>& tokens) {
  TG_CHECK(tokens.size() <= static_cast<size_t>(INT32_MAX), "write_llmc_shard '", path, "': ",
           tokens.size(), " tokens do not fit the int32 count of the llm.c header");
  int32_t header[256] = {};
  header[0] = kLlmcMagic;
  header[1] = kLlmcVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TG_CHECK(out, "cannot open '", tmp, "' for writing (is the directory writable?)");
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    out.write(reinterpret_cast<const char*>(tokens.data()),
              static_cast<std::streamsize>(tokens.size() * sizeof(uint16_t)));
    out.flush();
    TG_CHECK(out, "error writing '", tmp, "' (disk full?)");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  TG_CHECK(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> files;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  }
  globfree(&g);
  TG_CHECK(rc == 0 || rc == GLOB_NOMATCH, "glob '", pattern, "' failed (read error, code ", rc, ")");
  TG_CHECK(!files.empty(), "no token shards match '", pattern,
           "'; check the data path in the config, or create shards with tilegrad prepare");
  // glob(3) sorts by the locale's collation; sort bytewise so the order is the same everywhere.
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace tg
