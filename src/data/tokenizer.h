// Byte-level tokenizer: each byte is its own token, plus one end-of-text token.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tg {

// Ids 0..255 are the bytes themselves; id 256 is end-of-text, which separates documents.
// A model that sees EOT needs vocab_size >= 257 (kByteVocab + 1); a stream of plain bytes
// (one text file, see prepare_text) only needs 256.
constexpr int kByteVocab = 256;
constexpr int kEndOfText = 256;

struct ByteTokenizer {
  // Bytes to ids; never emits kEndOfText (documents are joined by the caller).
  static std::vector<uint16_t> encode(const std::string& text);
  // Ids to bytes; kEndOfText becomes "<|endoftext|>". Ids above kEndOfText throw tg::Error
  // (they come from a model with a larger vocabulary than this tokenizer).
  static std::string decode(const std::vector<uint16_t>& tokens);
  static std::string decode(const std::vector<int32_t>& tokens);
  static std::string decode_token(int id);
};

}  // namespace tg
