// Byte-level tokenizer implementation.
#include "src/data/tokenizer.h"

#include "src/util/error.h"

namespace tg {

namespace {
constexpr const char* kEndOfTextText = "<|endoftext|>";

void append_token(std::string& out, int id) {
  if (id >= 0 && id < kByteVocab) {
    out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  } else if (id == kEndOfText) {
    out += kEndOfTextText;
  } else {
    throw Error(detail::concat("byte tokenizer cannot decode token id ", id, ": valid ids are 0..",
                               kByteVocab - 1, " (bytes) and ", kEndOfText,
                               " (end of text); the model's vocab_size is larger than the "
                               "byte tokenizer's"));
  }
}

template <typename Int>
std::string decode_all(const std::vector<Int>& tokens) {
  std::string out;
  out.reserve(tokens.size());
  for (Int t : tokens) append_token(out, static_cast<int>(t));
  return out;
}
}  // namespace

std::vector<uint16_t> ByteTokenizer::encode(const std::string& text) {
  std::vector<uint16_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<uint16_t>& tokens) { return decode_all(tokens); }
std::string ByteTokenizer::decode(const std::vector<int32_t>& tokens) { return decode_all(tokens); }

std::string ByteTokenizer::decode_token(int id) {
  std::string out;
  append_token(out, id);
  return out;
}

}  // namespace tg
