// Byte-level BPE (GPT-2): pre-tokenization with ICU's regular expressions, merges by rank.
#include "src/data/bpe.h"

#ifdef TILEGRAD_HAVE_ICU
#include <unicode/regex.h>
#include <unicode/unistr.h>
#endif

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <set>
#include <sstream>

#include "src/data/tokenizer.h"
#include "src/util/error.h"
#include "src/util/files.h"

namespace fs = std::filesystem;

namespace tg {

namespace {

const char* kPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
const std::string kEot = "<|endoftext|>";
constexpr int64_t kMaxTokenIds = 65536;

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += char(c);
  } else if (c < 0x800) {
    s += char(0xc0 | (c >> 6)), s += char(0x80 | (c & 0x3f));
  } else {
    s += char(0xe0 | (c >> 12)), s += char(0x80 | ((c >> 6) & 0x3f)), s += char(0x80 | (c & 0x3f));
  }
  return s;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for 256 + n.
struct ByteMap {
  std::string to_char[256];                         // byte → UTF-8 of its stand-in character
  std::unordered_map<std::string, uint8_t> to_byte;  // and back
  ByteMap() {
    std::vector<int> bs;
    for (int b = '!'; b <= '~'; ++b) bs.push_back(b);
    for (int b = 0xa1; b <= 0xac; ++b) bs.push_back(b);
    for (int b = 0xae; b <= 0xff; ++b) bs.push_back(b);
    std::vector<bool> printable(256, false);
    for (int b : bs) printable[size_t(b)] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = printable[size_t(b)] ? char32_t(b) : char32_t(256 + n++);
      to_char[b] = utf8(c);
      to_byte[to_char[b]] = uint8_t(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

#ifdef TILEGRAD_HAVE_ICU
const icu::RegexPattern& pattern() {
  static const std::unique_ptr<icu::RegexPattern> p = [] {
    UErrorCode status = U_ZERO_ERROR;
    UParseError pe;
    std::unique_ptr<icu::RegexPattern> r(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(kPattern), 0, pe, status));
    TG_CHECK(U_SUCCESS(status), "ICU cannot compile GPT-2's pre-tokenization pattern: ", u_errorName(status));
    return r;
  }();
  return *p;
}
#endif

// The UTF-8 characters of a byte-level token ("Ġthe" → "Ġ", "t", "h", "e").
std::vector<std::string> chars_of(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

std::string read_text(const fs::path& p) { return read_regular_file(p.string(), "tokenizer"); }

std::vector<std::pair<std::string, std::string>> parse_merges(const std::string& text, const std::string& where) {
  std::vector<std::pair<std::string, std::string>> merges;
  std::istringstream in(text);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (n == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    TG_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
             "tokenizer: ", where, " line ", n, " is not two tokens separated by one space: '", line, "'");
    merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
  }
  return merges;
}

std::map<std::string, int32_t> parse_vocab(const nlohmann::json& v, const std::string& where) {
  TG_CHECK(v.is_object(), "tokenizer: ", where, " is not a JSON object of token: id");
  std::map<std::string, int32_t> vocab;
  for (auto it = v.begin(); it != v.end(); ++it) {
    TG_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0, "tokenizer: ", where, ": the id of '", it.key(),
             "' is ", it->dump(), ", not a natural number");
    // Shards store ids in 16 bits (and model.vocab_size is capped to match): a larger id could
    // never be written or trained, and would size the id table by it.
    TG_CHECK(it->get<int64_t>() < kMaxTokenIds, "tokenizer: ", where, ": the id of '", it.key(), "' is ", it->dump(),
             "; token ids are stored in 16 bits, so a vocabulary holds at most ", kMaxTokenIds, " ids");
    vocab[it.key()] = it->get<int32_t>();
  }
  return vocab;
}

nlohmann::json parse_json(const std::string& text, const std::string& where) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TG_CHECK(false, "tokenizer: ", where, " is not valid JSON (", e.what(), ")");
  }
  return {};
}

}  // namespace

bool have_bpe_encoder() {
#ifdef TILEGRAD_HAVE_ICU
  return true;
#else
  return false;
#endif
}

std::vector<std::string> gpt2_pretokenize(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
#ifndef TILEGRAD_HAVE_ICU
  TG_CHECK(false, "encoding text with a BPE tokenizer needs ICU (the Unicode classes of GPT-2's pre-tokenization), "
           "and this tilegrad was built without it; install libicu-dev and rebuild (decoding works without it)");
  return out;
#else
  const icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), int32_t(text.size())));
  UErrorCode status = U_ZERO_ERROR;
  std::unique_ptr<icu::RegexMatcher> m(pattern().matcher(u, status));
  TG_CHECK(U_SUCCESS(status), "ICU cannot match the pre-tokenization pattern: ", u_errorName(status));
  int32_t last = 0;
  while (m->find()) {
    const int32_t s = m->start(status), e = m->end(status);
    TG_ASSERT(U_SUCCESS(status) && s == last);  // the alternatives cover every character
    std::string piece;
    u.tempSubStringBetween(s, e).toUTF8String(piece);
    out.push_back(std::move(piece));
    last = e;
  }
  TG_ASSERT(last == u.length());
  return out;
#endif
}

bool BpeTokenizer::present(const std::string& dir) {
  return (fs::exists(fs::path(dir) / "vocab.json") && fs::exists(fs::path(dir) / "merges.txt")) ||
         fs::exists(fs::path(dir) / "tokenizer.json");
}

BpeTokenizer BpeTokenizer::load(const std::string& dir) {
  const fs::path d(dir);
  TG_CHECK(fs::is_directory(d), "tokenizer: ", dir, " is not a folder (expected one with vocab.json and merges.txt, or tokenizer.json)");
  if (fs::exists(d / "vocab.json") && fs::exists(d / "merges.txt")) {
    BpeTokenizer t = from_files(read_text(d / "vocab.json"), read_text(d / "merges.txt"));
    return t;
  }
  TG_CHECK(fs::exists(d / "tokenizer.json"), "tokenizer: ", dir, " has neither vocab.json and merges.txt nor tokenizer.json");
  const std::string where = (d / "tokenizer.json").string();
  const nlohmann::json j = parse_json(read_text(d / "tokenizer.json"), where);
  // Each part is checked for its JSON type before it is read: nlohmann's accessors throw their
  // own exceptions (or convert out-of-range numbers) on a part of another type.
  auto string_at = [](const nlohmann::json& o, const char* key) {
    return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : std::string();
  };
  TG_CHECK(j.is_object() && j.contains("model") && string_at(j["model"], "type") == "BPE", "tokenizer: ", where,
           " is not a BPE model (its \"model\" needs \"type\": \"BPE\")");
  const nlohmann::json& model = j["model"];
  const nlohmann::json pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : nlohmann::json();
  TG_CHECK(string_at(pre, "type") == "ByteLevel", "tokenizer: ", where, ": the pre_tokenizer is ", pre.dump(),
           "; only GPT-2's ByteLevel pre-tokenization is implemented");
  TG_CHECK(!pre.contains("add_prefix_space") || pre["add_prefix_space"] == false, "tokenizer: ", where,
           ": add_prefix_space ", pre["add_prefix_space"].dump(), " is not implemented (only false is)");
  TG_CHECK(!j.contains("normalizer") || j["normalizer"].is_null(), "tokenizer: ", where,
           ": normalizers are not implemented");
  std::map<std::string, int32_t> vocab =
      parse_vocab(model.contains("vocab") ? model["vocab"] : nlohmann::json(), where + " model.vocab");
  std::vector<std::pair<std::string, std::string>> merges;
  std::string merges_text = "#version: 0.2\n";
  const nlohmann::json no_merges = nlohmann::json::array();
  const nlohmann::json& merge_list = model.contains("merges") ? model["merges"] : no_merges;
  TG_CHECK(merge_list.is_array(), "tokenizer: ", where, ": model.merges is not a list");
  for (const auto& m : merge_list) {
    std::pair<std::string, std::string> p;
    if (m.is_string()) {
      auto one = parse_merges(m.get<std::string>(), where + " model.merges");
      TG_CHECK(one.size() == 1, "tokenizer: ", where, ": bad merge ", m.dump());
      p = one[0];
    } else {
      TG_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), "tokenizer: ", where, ": bad merge ", m.dump());
      p = {m[0].get<std::string>(), m[1].get<std::string>()};
    }
    merges.push_back(p);
    merges_text += p.first + " " + p.second + "\n";
  }
  std::vector<std::pair<std::string, int32_t>> specials;
  const nlohmann::json no_tokens = nlohmann::json::array();
  const nlohmann::json& added = j.contains("added_tokens") ? j["added_tokens"] : no_tokens;
  TG_CHECK(added.is_array(), "tokenizer: ", where, ": added_tokens is not a list");
  for (const auto& a : added) {
    const std::string content = string_at(a, "content");
    const bool id_ok = a.is_object() && a.contains("id") && a["id"].is_number_integer() && a["id"].get<int64_t>() >= 0 &&
                       a["id"].get<int64_t>() < kMaxTokenIds;
    TG_CHECK(!content.empty() && id_ok, "tokenizer: ", where, ": bad added token ", a.dump(),
             " (needs a non-empty \"content\" and an \"id\" in [0, ", kMaxTokenIds, "))");
    const int32_t id = a["id"].get<int32_t>();
    vocab[content] = id;
    specials.push_back({content, id});
  }
  BpeTokenizer t;
  t.vocab_json_ = nlohmann::json(vocab).dump();
  t.merges_txt_ = merges_text;
  t.build(vocab, merges, specials);
  return t;
}

BpeTokenizer BpeTokenizer::from_files(const std::string& vocab_json_text, const std::string& merges_txt_text) {
  BpeTokenizer t;
  std::map<std::string, int32_t> vocab = parse_vocab(parse_json(vocab_json_text, "vocab.json"), "vocab.json");
  t.vocab_json_ = vocab_json_text;
  t.merges_txt_ = merges_txt_text;
  std::vector<std::pair<std::string, int32_t>> specials;
  if (auto it = vocab.find(kEot); it != vocab.end()) specials.push_back(*it);
  t.build(vocab, parse_merges(merges_txt_text, "merges.txt"), specials);
  return t;
}

void BpeTokenizer::build(const std::map<std::string, int32_t>& vocab,
                         const std::vector<std::pair<std::string, std::string>>& merges,
                         const std::vector<std::pair<std::string, int32_t>>& specials) {
  const ByteMap& bm = byte_map();
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab) max_id = std::max(max_id, id);
  vocab_size_ = int64_t(max_id) + 1;
  id_to_bytes_.assign(size_t(vocab_size_), std::string());
  std::vector<bool> special_id(size_t(vocab_size_), false);
  for (const auto& [tok, id] : specials) special_id[size_t(id)] = true;
  for (const auto& [tok, id] : vocab) {
    token_to_id_[tok] = id;
    if (special_id[size_t(id)]) {
      id_to_bytes_[size_t(id)] = tok;
      continue;
    }
    std::string bytes;
    for (const std::string& c : chars_of(tok)) {
      auto b = bm.to_byte.find(c);
      // A token outside the byte alphabet (an added token written as text): kept as its text.
      if (b == bm.to_byte.end()) {
        bytes = tok;
        break;
      }
      bytes += char(b->second);
    }
    id_to_bytes_[size_t(id)] = bytes;
  }
  for (int b = 0; b < 256; ++b)
    TG_CHECK(token_to_id_.count(bm.to_char[b]), "tokenizer: the vocabulary lacks the token of byte ", b,
             " ('", bm.to_char[b], "'); a byte-level BPE needs all 256");
  for (size_t r = 0; r < merges.size(); ++r) merge_rank_.emplace(merges[r].first + " " + merges[r].second, int32_t(r));
  specials_ = specials;
  std::sort(specials_.begin(), specials_.end(), [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  if (auto it = token_to_id_.find(kEot); it != token_to_id_.end()) eot_ = it->second;
}

std::vector<int32_t> BpeTokenizer::encode_piece(const std::string& piece) const {
  const ByteMap& bm = byte_map();
  std::vector<std::string> parts;
  parts.reserve(piece.size());
  for (unsigned char c : piece) parts.push_back(bm.to_char[c]);
  // GPT-2's merge loop: the adjacent pair of lowest rank, merged everywhere (left to right).
  while (parts.size() > 1) {
    int32_t best = INT32_MAX;
    std::string best_key;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      auto it = merge_rank_.find(parts[i] + " " + parts[i + 1]);
      if (it != merge_rank_.end() && it->second < best) best = it->second, best_key = it->first;
    }
    if (best == INT32_MAX) break;
    const size_t sp = best_key.find(' ');
    const std::string a = best_key.substr(0, sp), b = best_key.substr(sp + 1);
    std::vector<std::string> next;
    next.reserve(parts.size());
    for (size_t i = 0; i < parts.size();) {
      if (i + 1 < parts.size() && parts[i] == a && parts[i + 1] == b) {
        next.push_back(a + b);
        i += 2;
      } else {
        next.push_back(parts[i++]);
      }
    }
    parts.swap(next);
  }
  std::vector<int32_t> ids;
  ids.reserve(parts.size());
  for (const std::string& p : parts) {
    auto it = token_to_id_.find(p);
    TG_CHECK(it != token_to_id_.end(), "tokenizer: the merges make '", p, "', which the vocabulary lacks");
    ids.push_back(it->second);
  }
  return ids;
}

void BpeTokenizer::encode_ordinary(const std::string& text, std::vector<int32_t>& out, Cache* cache) const {
  for (const std::string& piece : gpt2_pretokenize(text)) {
    if (cache) {
      auto it = cache->find(piece);
      if (it == cache->end()) it = cache->emplace(piece, encode_piece(piece)).first;
      out.insert(out.end(), it->second.begin(), it->second.end());
    } else {
      std::vector<int32_t> ids = encode_piece(piece);
      out.insert(out.end(), ids.begin(), ids.end());
    }
  }
}

std::vector<int32_t> BpeTokenizer::encode(const std::string& text, Cache* cache) const {
  std::vector<int32_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    // The earliest special token (the longest at the same place).
    size_t best = std::string::npos;
    const std::pair<std::string, int32_t>* which = nullptr;
    for (const auto& s : specials_) {
      const size_t at = text.find(s.first, pos);
      if (at < best) best = at, which = &s;
    }
    encode_ordinary(text.substr(pos, best == std::string::npos ? std::string::npos : best - pos), out, cache);
    if (!which) break;
    out.push_back(which->second);
    pos = best + which->first.size();
  }
  return out;
}

std::vector<int32_t> BpeTokenizer::encode_parallel(const std::string& text, int64_t chunk_bytes) const {
  TG_CHECK(chunk_bytes > 0, "tokenizer: chunk_bytes must be positive");
  // A cut at i (text[i] == '\n', text[i-1] printable ASCII other than space): every piece of
  // GPT-2's pattern that holds a non-space character ends before white space, and white space
  // is matched from its start, so both sides split as the whole text does. A special token never
  // contains a newline, so none is cut either.
  std::vector<size_t> cuts = {0};
  for (size_t next = size_t(chunk_bytes); next < text.size();) {
    size_t i = text.find('\n', next);
    while (i != std::string::npos && !(text[i - 1] > ' ' && text[i - 1] < 0x7f)) i = text.find('\n', i + 1);
    if (i == std::string::npos) break;
    cuts.push_back(i);
    next = i + size_t(chunk_bytes);
  }
  cuts.push_back(text.size());
  const int64_t n = int64_t(cuts.size()) - 1;
  std::vector<std::vector<int32_t>> parts(static_cast<size_t>(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
#pragma omp parallel if (n > 1)
  {
    Cache cache;
#pragma omp for schedule(dynamic, 1)
    for (int64_t c = 0; c < n; ++c) {
      try {
        parts[size_t(c)] = encode(text.substr(cuts[size_t(c)], cuts[size_t(c) + 1] - cuts[size_t(c)]), &cache);
      } catch (const std::exception& e) {
        errors[size_t(c)] = e.what();
      }
    }
  }
  for (const std::string& e : errors) TG_CHECK(e.empty(), e);
  std::vector<int32_t> out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    TG_CHECK(id >= 0 && id < vocab_size_, "tokenizer: cannot decode token id ", id, ": the vocabulary has ids 0..",
             vocab_size_ - 1, " (the model's vocab_size is larger than its tokenizer's)");
    out += id_to_bytes_[size_t(id)];
  }
  return out;
}

std::vector<std::string> BpeTokenizer::save(const std::string& dir) const {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TG_CHECK(!ec, "tokenizer: cannot create ", dir, ": ", ec.message());
  std::vector<std::string> files;
  for (const auto& [name, text] : {std::pair{"vocab.json", &vocab_json_}, {"merges.txt", &merges_txt_}}) {
    const fs::path p = fs::path(dir) / name;
    write_file_atomically(p.string(), *text, "tokenizer");
    files.push_back(p.string());
  }
  return files;
}

BpeTokenizer train_bpe(const std::vector<std::string>& files, int64_t vocab_size) {
  TG_CHECK(!files.empty(), "tokenizer train: no --text files");
  TG_CHECK(vocab_size >= 257 && vocab_size <= 65536, "tokenizer train: --vocab-size ", vocab_size,
           " must be in [257, 65536] (256 bytes + end-of-text at least; shards store uint16 ids)");
  const ByteMap& bm = byte_map();
  // Piece counts over all files (special tokens in the text are not learned from).
  std::unordered_map<std::string, int64_t> counts;
  uint64_t text_bytes = 0;
  for (const std::string& f : files) {
    std::string text = read_regular_file(f, "tokenizer train: --text");
    text_bytes += text.size();
    size_t pos = 0;
    while (pos <= text.size()) {
      size_t at = text.find(kEot, pos);
      for (std::string& p : gpt2_pretokenize(text.substr(pos, at == std::string::npos ? std::string::npos : at - pos)))
        ++counts[p];
      if (at == std::string::npos) break;
      pos = at + kEot.size();
    }
  }
  TG_CHECK(text_bytes > 0, "tokenizer train: the --text files (", files.size(),
           ") hold no text; there is nothing to learn merges from");
  // Tokens: ids 0..255 the bytes, then one per merge.
  std::vector<std::string> token;  // byte-level-mapped text of each id
  std::unordered_map<std::string, int32_t> token_id;
  for (int b = 0; b < 256; ++b) token.push_back(bm.to_char[b]), token_id[bm.to_char[b]] = b;
  struct Word {
    std::vector<int32_t> ids;
    int64_t count;
  };
  std::vector<Word> words;
  words.reserve(counts.size());
  for (auto& [piece, n] : counts) {
    Word w{{}, n};
    for (unsigned char c : piece) w.ids.push_back(c);
    words.push_back(std::move(w));
  }
  std::sort(words.begin(), words.end(), [](const Word& a, const Word& b) { return a.ids < b.ids; });  // deterministic
  auto key = [](int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); };
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::set<size_t>> where;
  for (size_t w = 0; w < words.size(); ++w)
    for (size_t i = 0; i + 1 < words[w].ids.size(); ++i) {
      const uint64_t k = key(words[w].ids[i], words[w].ids[i + 1]);
      pair_count[k] += words[w].count;
      where[k].insert(w);
    }
  // Max-heap on (count, then the smaller pair); stale entries are skipped when popped.
  using Entry = std::pair<int64_t, uint64_t>;
  auto cmp = [](const Entry& x, const Entry& y) { return x.first != y.first ? x.first < y.first : x.second > y.second; };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
  for (const auto& [k, n] : pair_count) heap.push({n, k});
  std::vector<std::pair<std::string, std::string>> merges;
  while (int64_t(token.size()) + 1 < vocab_size && !heap.empty()) {
    const auto [n, k] = heap.top();
    heap.pop();
    auto pc = pair_count.find(k);
    if (pc == pair_count.end() || pc->second != n || n <= 0) continue;
    const int32_t a = int32_t(k >> 32), b = int32_t(k & 0xffffffffu);
    merges.push_back({token[size_t(a)], token[size_t(b)]});
    // Two merge paths can spell the same token ("a"+"bc", "ab"+"c"): one id for it.
    const std::string text = token[size_t(a)] + token[size_t(b)];
    auto [known, added] = token_id.emplace(text, int32_t(token.size()));
    if (added) token.push_back(text);
    const int32_t merged = known->second;
    std::set<uint64_t> touched;
    const std::set<size_t> ws = where[k];
    for (size_t w : ws) {
      Word& word = words[w];
      for (size_t i = 0; i + 1 < word.ids.size(); ++i) {
        const uint64_t q = key(word.ids[i], word.ids[i + 1]);
        pair_count[q] -= word.count;
        touched.insert(q);
      }
      std::vector<int32_t> next;
      for (size_t i = 0; i < word.ids.size();) {
        if (i + 1 < word.ids.size() && word.ids[i] == a && word.ids[i + 1] == b) {
          next.push_back(merged);
          i += 2;
        } else {
          next.push_back(word.ids[i++]);
        }
      }
      word.ids.swap(next);
      for (size_t i = 0; i + 1 < word.ids.size(); ++i) {
        const uint64_t q = key(word.ids[i], word.ids[i + 1]);
        pair_count[q] += word.count;
        where[q].insert(w);
        touched.insert(q);
      }
    }
    for (uint64_t q : touched) {
      auto it = pair_count.find(q);
      if (it->second <= 0) {
        pair_count.erase(it);
        where.erase(q);
      } else {
        heap.push({it->second, q});
      }
    }
  }
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (size_t i = 0; i < token.size(); ++i) vocab[token[i]] = int32_t(i);
  vocab[kEot] = int32_t(token.size());
  std::string merges_text = "#version: 0.2\n";
  for (const auto& [x, y] : merges) merges_text += x + " " + y + "\n";
  return BpeTokenizer::from_files(vocab.dump(), merges_text);
}

std::vector<int32_t> TextCodec::encode(const std::string& text) const {
  if (bpe) return bpe->encode(text);
  if (ids) {
    std::vector<int32_t> out;
    std::istringstream in(text);
    std::string word;
    while (in >> word) {
      int64_t id = -1;
      const bool number = !word.empty() && word.size() <= 9 &&
                          std::all_of(word.begin(), word.end(), [](unsigned char c) { return std::isdigit(c); });
      if (number) id = std::stoll(word);
      TG_CHECK(number, "this model has no tokenizer (none was beside its training shards), so its text is token "
               "ids: '", word, "' is not one; give ids separated by spaces, e.g. \"464 318\", or put the "
               "tokenizer's vocab.json and merges.txt beside the shards and train again");
      out.push_back(int32_t(id));
    }
    return out;
  }
  std::vector<int32_t> out;
  for (uint16_t t : ByteTokenizer::encode(text)) out.push_back(t);
  return out;
}

std::string TextCodec::decode(const std::vector<int32_t>& tokens) const {
  std::string out;
  if (ids) {
    for (int32_t id : tokens) out += " " + std::to_string(id);
    return out;
  }
  if (!bpe) return ByteTokenizer::decode(tokens);
  for (int32_t id : tokens) out += id >= 0 && id < bpe->vocab_size() ? bpe->decode({id}) : "\xEF\xBF\xBD";
  return out;
}

int64_t TextCodec::vocab_size() const { return bpe ? bpe->vocab_size() : ids ? 0 : kByteVocab + 1; }

std::string TextCodec::describe() const {
  if (ids) return "none, text shown as token ids";
  return bpe ? "byte-level BPE (" + std::to_string(bpe->vocab_size()) + " ids)" : "bytes";
}

TextCodec codec_for_vocabulary(TextCodec codec, int64_t model_vocab) {
  codec.ids = !codec.bpe && model_vocab > kByteVocab + 1;
  return codec;
}

TextCodec codec_from_strings(const std::map<std::string, std::string>& strings) {
  auto v = strings.find(kCheckpointVocab), m = strings.find(kCheckpointMerges);
  if (v == strings.end() || m == strings.end()) return {};
  return {std::make_shared<const BpeTokenizer>(BpeTokenizer::from_files(v->second, m->second))};
}

TextCodec codec_for_shards(const std::vector<std::string>& files) {
  if (files.empty()) return {};
  const fs::path dir = fs::path(files.front()).parent_path();
  if (!fs::exists(dir / "vocab.json") || !fs::exists(dir / "merges.txt")) return {};
  return {std::make_shared<const BpeTokenizer>(BpeTokenizer::load(dir.empty() ? "." : dir.string()))};
}

}  // namespace tg
