// GPT-2's byte-level BPE tokenizer: the files of Hugging Face's GPT2Tokenizer (vocab.json and
// merges.txt, or tokenizer.json), encoding that matches GPT2TokenizerFast id for id, decoding,
// and learning a new vocabulary from text.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tg {

// GPT-2's pre-tokenization: the text split by
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (Unicode categories and White_Space from ICU). The pieces concatenate to the text; invalid
// UTF-8 bytes become U+FFFD first (as Python's errors="replace").
std::vector<std::string> gpt2_pretokenize(const std::string& text);
// Whether this build can encode with BPE (it needs ICU for the pre-tokenization); decoding always works.
bool have_bpe_encoder();

class BpeTokenizer {
 public:
  // dir holds vocab.json and merges.txt, or tokenizer.json (a ByteLevel BPE model, such as
  // GPT-2's; its added tokens are special tokens). Errors name the file and what is wrong.
  static BpeTokenizer load(const std::string& dir);
  static BpeTokenizer from_files(const std::string& vocab_json_text, const std::string& merges_txt_text);
  // True when dir has a tokenizer load() reads.
  static bool present(const std::string& dir);

  // Text to ids: special tokens ("<|endoftext|>" and tokenizer.json's added tokens) written in the
  // text become their ids; the rest is pre-tokenized and merged. `cache` (one per thread) keeps
  // pieces already encoded.
  using Cache = std::unordered_map<std::string, std::vector<int32_t>>;
  std::vector<int32_t> encode(const std::string& text, Cache* cache = nullptr) const;
  // The same ids, the text cut into pieces of about `chunk_bytes` encoded by OpenMP threads. Cuts
  // fall only before a newline that follows a printable ASCII character, where no pre-tokenized
  // piece can span them, so the result equals encode()'s.
  std::vector<int32_t> encode_parallel(const std::string& text, int64_t chunk_bytes = int64_t(1) << 20) const;
  // Ids to text (bytes; a piece of a multi-byte character may be cut at the ends). Ids outside
  // the vocabulary throw tg::Error.
  std::string decode(const std::vector<int32_t>& ids) const;

  int32_t end_of_text() const { return eot_; }       // the id of "<|endoftext|>", -1 when none
  int64_t vocab_size() const { return vocab_size_; }  // the largest id + 1
  // The vocabulary and merges in GPT-2's file formats (what save() writes, what checkpoints keep).
  const std::string& vocab_json() const { return vocab_json_; }
  const std::string& merges_txt() const { return merges_txt_; }
  // Writes dir/vocab.json and dir/merges.txt; returns their paths.
  std::vector<std::string> save(const std::string& dir) const;

 private:
  void build(const std::map<std::string, int32_t>& vocab, const std::vector<std::pair<std::string, std::string>>& merges,
             const std::vector<std::pair<std::string, int32_t>>& specials);
  std::vector<int32_t> encode_piece(const std::string& piece) const;
  void encode_ordinary(const std::string& text, std::vector<int32_t>& out, Cache* cache) const;

  std::unordered_map<std::string, int32_t> token_to_id_;  // byte-level-mapped token → id
  std::vector<std::string> id_to_bytes_;                   // id → its bytes (special tokens: their text)
  std::unordered_map<std::string, int32_t> merge_rank_;    // "a b" → rank
  std::vector<std::pair<std::string, int32_t>> specials_;  // longest first
  int32_t eot_ = -1;
  int64_t vocab_size_ = 0;
  std::string vocab_json_, merges_txt_;
};

// The text side of a run: its BPE tokenizer, or bytes (ByteTokenizer) when it has none — or,
// for a model whose ids are not bytes and whose tokenizer is unknown (llm.c's GPT-2 shards come
// without one), the ids themselves, written as decimal numbers.
struct TextCodec {
  std::shared_ptr<const BpeTokenizer> bpe;
  bool ids = false;
  // With `ids`, the text is whitespace-separated decimal ids ("464 318 257").
  std::vector<int32_t> encode(const std::string& text) const;
  // Ids the tokenizer does not know (a model's vocabulary may be padded past it) become U+FFFD;
  // with `ids`, each id is " <id>".
  std::string decode(const std::vector<int32_t>& tokens) const;
  std::string describe() const;  // "byte-level BPE (50257 ids)", "bytes" or "none, text shown as token ids"
  // How many ids it can decode: the BPE's vocabulary, the 256 bytes and the end-of-text id, or
  // 0 (every id) with `ids`.
  int64_t vocab_size() const;
};

// `codec` for a model of `model_vocab` ids: without a BPE, ids past the bytes and end-of-text
// (model_vocab > 257) are not bytes, so they are shown as ids.
TextCodec codec_for_vocabulary(TextCodec codec, int64_t model_vocab);

// Checkpoint strings that record a run's tokenizer.
constexpr const char* kCheckpointVocab = "tokenizer/vocab.json";
constexpr const char* kCheckpointMerges = "tokenizer/merges.txt";
// The tokenizer recorded in a checkpoint's strings; bytes when none is.
TextCodec codec_from_strings(const std::map<std::string, std::string>& strings);
// The tokenizer `prepare --tokenizer` left beside the first shard `files` names; bytes when none.
TextCodec codec_for_shards(const std::vector<std::string>& files);

// Learns a byte-level BPE from text files: the 256 byte tokens, then merges of the most frequent
// adjacent pair (ties: the pair of smaller ids) within GPT-2's pre-tokenized pieces until the
// vocabulary has vocab_size - 1 tokens, then "<|endoftext|>" last. Each file is read whole.
BpeTokenizer train_bpe(const std::vector<std::string>& files, int64_t vocab_size);

}  // namespace tg
