// Corpus preparation: text files -> byte tokens -> llm.c train/val shards.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "src/data/bpe.h"

namespace tg {

// Shards are split so that none holds more than this many tokens (llm.c uses 100M too).
constexpr int64_t kMaxShardTokens = 100'000'000;

struct PrepareResult {
  int64_t train_tokens = 0, val_tokens = 0;
  std::vector<std::string> files;  // written shards, train first, in order
};

// Tokenizes `inputs` with the byte tokenizer and writes out_dir/train_000000.bin, ... and
// out_dir/val_000000.bin, ... in llm.c format.
//  - Several inputs are treated as separate documents joined by one kEndOfText between
//    consecutive files (so the data then needs vocab_size >= 257). A single input gets no EOT,
//    so a plain text keeps a 256-token vocabulary.
//  - The LAST val_fraction of the whole token stream is validation, exactly as the usual
//    PyTorch recipe `n = int((1 - val_fraction) * len(data)); train, val = data[:n], data[n:]`.
//  - Stale train_NNNNNN.bin / val_NNNNNN.bin from an earlier run in out_dir are removed, so a
//    glob over out_dir never mixes two preparations.
//  - progress: a percentage bar on stderr, only when the input is over 1 MB and stderr is a
//    terminal (so logs and CI output are not filled with carriage returns).
// The input is streamed; memory use is bounded by one shard (2 bytes x max_shard_tokens).
// Throws tg::Error for a missing or empty input, val_fraction outside (0, 1), an input too
// small to give both splits a token, or an out_dir that cannot be created or written.
// With `tokenizer` (a GPT-2 byte-level BPE), the same with its ids instead of bytes: each input
// file is one document (files in parallel on OpenMP threads, or, when there are fewer files than
// threads, each file cut into pieces encoded in parallel: the same ids), documents joined by
// its "<|endoftext|>"; the tokens are held in memory (2 bytes each) before the shards are written.
// The tokenizer's vocab.json and merges.txt are written into out_dir beside the shards, where
// training finds them (a byte-level preparation removes them).
PrepareResult prepare_text(const std::vector<std::string>& inputs, const std::string& out_dir,
                           double val_fraction, bool progress,
                           int64_t max_shard_tokens = kMaxShardTokens, const BpeTokenizer* tokenizer = nullptr);

}  // namespace tg
