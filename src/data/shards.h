// Token shards on disk: llm.c's headered format and nanoGPT's raw uint16 .bin, plus glob expansion.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tg {

// llm.c shard header: 256 int32 (1024 bytes); [0] magic, [1] version, [2] token count.
constexpr int32_t kLlmcMagic = 20240520;
constexpr int32_t kLlmcVersion = 1;
constexpr int64_t kLlmcHeaderBytes = 256 * sizeof(int32_t);

enum class ShardFormat { kLlmc, kRaw };

struct TokenShard {
  std::string path;
  std::vector<uint16_t> tokens;
  ShardFormat format = ShardFormat::kLlmc;
};

// Reads an llm.c or raw nanoGPT shard. The format is detected from the first int32: equal to
// kLlmcMagic means llm.c, anything else means raw uint16 tokens with no header. Every token id
// is checked against vocab_size so a tokenizer/model mismatch fails here, not as a silent
// out-of-range embedding lookup. Throws tg::Error naming the file on any problem.
TokenShard read_shard(const std::string& path, int vocab_size);

// Writes tokens as an llm.c shard: to `path.tmp` first, then renamed, so a crash never leaves
// a half-written file under the final name.
void write_llmc_shard(const std::string& path, const std::vector<uint16_t>& tokens);

// Files matching a shell glob (e.g. "data/shakespeare/train_*.bin"), sorted by name so the
// shard order (and therefore the data stream) does not depend on the filesystem. A pattern
// without wildcards matches itself if the file exists. Throws tg::Error if nothing matches.
std::vector<std::string> expand_glob(const std::string& pattern);

}  // namespace tg
