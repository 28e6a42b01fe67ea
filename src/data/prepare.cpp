// Streams text files through the byte tokenizer into llm.c train/val shards.
#include "src/data/prepare.h"

#include <omp.h>
#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "src/data/shards.h"
#include "src/data/tokenizer.h"
#include "src/util/error.h"
#include "src/util/files.h"

namespace tg {

namespace fs = std::filesystem;

namespace {

// Collects tokens and writes a shard each time `cap` tokens have accumulated, so memory stays
// bounded by one shard however large the corpus is.
class ShardSink {
 public:
  ShardSink(std::string dir, std::string prefix, int64_t cap, std::vector<std::string>& files)
      : dir_(std::move(dir)), prefix_(std::move(prefix)), cap_(cap), files_(files) {}

  void push(uint16_t token) {
    buf_.push_back(token);
    ++count_;
    if (static_cast<int64_t>(buf_.size()) == cap_) flush();
  }
  void finish() {
    if (!buf_.empty()) flush();
  }
  int64_t count() const { return count_; }

 private:
  void flush() {
    char name[32];
    std::snprintf(name, sizeof(name), "%s_%06d.bin", prefix_.c_str(), index_++);
    const std::string path = (fs::path(dir_) / name).string();
    write_llmc_shard(path, buf_);
    files_.push_back(path);
    buf_.clear();
  }

  std::string dir_, prefix_;
  int64_t cap_;
  std::vector<std::string>& files_;
  std::vector<uint16_t> buf_;
  int index_ = 0;
  int64_t count_ = 0;
};

class Progress {
 public:
  Progress(bool enabled, int64_t total) : enabled_(enabled), total_(total) {}
  void update(int64_t done) {
    if (!enabled_) return;
    const int pct = static_cast<int>(100 * done / total_);
    if (pct == last_pct_) return;  // at most one redraw per percent
    last_pct_ = pct;
    std::fprintf(stderr, "\rprepare: %3d%% (%.1f / %.1f MB)", pct, done / 1e6, total_ / 1e6);
    if (done == total_) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  int64_t total_;
  int last_pct_ = -1;
};

// True for names prepare writes: train_NNNNNN.bin or val_NNNNNN.bin.
bool is_shard_name(const std::string& name) {
  for (const std::string prefix : {"train_", "val_"}) {
    if (name.size() != prefix.size() + 10 || name.compare(0, prefix.size(), prefix) != 0) continue;
    bool digits = true;
    for (size_t i = prefix.size(); i < prefix.size() + 6; ++i)
      digits = digits && std::isdigit(static_cast<unsigned char>(name[i]));
    if (digits && name.compare(prefix.size() + 6, 4, ".bin") == 0) return true;
  }
  return false;
}

// Checked now rather than after minutes of tokenizing a large corpus: the directory, its
// permissions and, when the shards' size is known (`need_bytes` > 0), the free space.
void ensure_writable_dir(const std::string& out_dir, int64_t need_bytes) {
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  TG_CHECK(!ec, "prepare: cannot create output directory '", out_dir, "': ", ec.message());
  TG_CHECK(fs::is_directory(out_dir), "prepare: output path '", out_dir, "' exists and is not a directory");
  TG_CHECK(::access(out_dir.c_str(), W_OK | X_OK) == 0, "prepare: output directory '", out_dir, "' is not writable (",
           std::strerror(errno), "); choose another --out directory or fix its permissions");
  const fs::space_info space = fs::space(out_dir, ec);
  if (ec || need_bytes <= 0) return;
  uintmax_t available = space.available;  // and the space of the earlier shards this preparation replaces
  for (const auto& entry : fs::directory_iterator(out_dir, ec))
    if (is_shard_name(entry.path().filename().string())) available += entry.file_size(ec);
  if (available < uintmax_t(need_bytes))
    throw Error(detail::concat("prepare: the shards need about ", (need_bytes + (1 << 20) - 1) >> 20, " MiB but '",
                               out_dir, "' has ", available >> 20,
                               " MiB free; free some space or choose another --out directory"));
}

// Deletes shards a previous preparation left behind that this one did not overwrite.
void remove_stale_shards(const std::string& out_dir, const std::vector<std::string>& keep) {
  for (const auto& entry : fs::directory_iterator(out_dir)) {
    const std::string name = entry.path().filename().string();
    if (!is_shard_name(name)) continue;
    bool kept = false;
    for (const auto& k : keep) kept = kept || fs::path(k).filename() == name;
    if (!kept) fs::remove(entry.path());
  }
}

std::string read_whole(const std::string& path) { return read_regular_file(path, "prepare: input file"); }

PrepareResult prepare_bpe(const std::vector<std::string>& inputs, const std::string& out_dir, double val_fraction,
                          int64_t max_shard_tokens, const BpeTokenizer& tok) {
  TG_CHECK(tok.vocab_size() <= 65536, "prepare: the tokenizer has ", tok.vocab_size(),
           " ids, but shards store uint16 ids (at most 65536)");
  TG_CHECK(inputs.size() == 1 || tok.end_of_text() >= 0,
           "prepare: several input files are joined by <|endoftext|>, which the tokenizer's vocabulary lacks");
  ensure_writable_dir(out_dir, 0);  // the token count is known only once encoded
  // Documents in parallel, each thread with its own cache of encoded pieces; fewer documents
  // than threads: one after the other, each cut into pieces encoded in parallel.
  std::vector<std::vector<uint16_t>> docs(inputs.size());
  std::vector<std::string> errors(inputs.size());
  if (int64_t(inputs.size()) < int64_t(omp_get_max_threads())) {
    for (size_t f = 0; f < inputs.size(); ++f)
      for (int32_t id : tok.encode_parallel(read_whole(inputs[f]))) docs[f].push_back(uint16_t(id));
  } else
#pragma omp parallel
  {
    BpeTokenizer::Cache cache;
#pragma omp for schedule(dynamic, 1)
    for (int64_t f = 0; f < int64_t(inputs.size()); ++f) {
      try {
        for (int32_t id : tok.encode(read_whole(inputs[size_t(f)]), &cache)) docs[size_t(f)].push_back(uint16_t(id));
      } catch (const std::exception& e) {
        errors[size_t(f)] = e.what();
      }
    }
  }
  for (const std::string& e : errors) TG_CHECK(e.empty(), e);
  int64_t total = 0;
  for (const auto& d : docs) total += int64_t(d.size());
  total += int64_t(inputs.size()) - 1;
  const auto n_train = static_cast<int64_t>((1.0 - val_fraction) * static_cast<double>(total));
  TG_CHECK(n_train > 0 && n_train < total, "prepare: ", total, " tokens with val_fraction ", val_fraction, " give ",
           n_train, " train and ", total - n_train,
           " validation tokens; both need at least one (use more text or another val_fraction)");
  PrepareResult result;
  ShardSink train(out_dir, "train", max_shard_tokens, result.files);
  std::vector<std::string> val_files;
  ShardSink val(out_dir, "val", max_shard_tokens, val_files);
  int64_t pos = 0;
  auto emit = [&](uint16_t t) {
    if (pos++ < n_train) train.push(t); else val.push(t);
  };
  for (size_t f = 0; f < docs.size(); ++f) {
    if (f > 0) emit(uint16_t(tok.end_of_text()));
    for (uint16_t t : docs[f]) emit(t);
    std::vector<uint16_t>().swap(docs[f]);
  }
  train.finish();
  val.finish();
  result.files.insert(result.files.end(), val_files.begin(), val_files.end());
  result.train_tokens = train.count();
  result.val_tokens = val.count();
  remove_stale_shards(out_dir, result.files);
  tok.save(out_dir);
  return result;
}

}  // namespace

PrepareResult prepare_text(const std::vector<std::string>& inputs, const std::string& out_dir,
                           double val_fraction, bool progress, int64_t max_shard_tokens,
                           const BpeTokenizer* tokenizer) {
  TG_CHECK(!inputs.empty(), "prepare: no input text files given");
  TG_CHECK(std::isfinite(val_fraction) && val_fraction > 0.0 && val_fraction < 1.0,
           "prepare: val_fraction must be in (0, 1), got ", val_fraction, " (e.g. 0.01 = last 1%)");
  TG_CHECK(max_shard_tokens > 0 && max_shard_tokens <= INT32_MAX,
           "prepare: max_shard_tokens must be in [1, 2^31-1], got ", max_shard_tokens);

  int64_t total_bytes = 0;
  for (const auto& in : inputs) {
    std::error_code ec;
    TG_CHECK(fs::is_regular_file(in, ec), "prepare: input file '", in, "' does not exist or is not a regular file");
    const auto size = static_cast<int64_t>(fs::file_size(in, ec));
    TG_CHECK(!ec, "prepare: cannot get size of '", in, "': ", ec.message());
    TG_CHECK(size > 0, "prepare: input file '", in, "' is empty");
    total_bytes += size;
  }
  if (tokenizer) return prepare_bpe(inputs, out_dir, val_fraction, max_shard_tokens, *tokenizer);
  const bool with_eot = inputs.size() > 1;
  const int64_t total = total_bytes + (with_eot ? static_cast<int64_t>(inputs.size()) - 1 : 0);
  // Same expression as the reference script: n = int(0.99 * len(data)) for val_fraction 0.01
  // (1.0 - 0.01 == 0.99 exactly in double), truncation toward zero.
  const auto n_train = static_cast<int64_t>((1.0 - val_fraction) * static_cast<double>(total));
  TG_CHECK(n_train > 0 && n_train < total, "prepare: ", total, " tokens with val_fraction ",
           val_fraction, " give ", n_train, " train and ", total - n_train,
           " validation tokens; both need at least one (use more text or another val_fraction)");

  // Two bytes a token and a 1 KiB header a shard (files of the same names there are replaced).
  ensure_writable_dir(out_dir, 2 * total + 2048 * (total / max_shard_tokens + 2));

  PrepareResult result;
  ShardSink train(out_dir, "train", max_shard_tokens, result.files);
  std::vector<std::string> val_files;
  ShardSink val(out_dir, "val", max_shard_tokens, val_files);
  int64_t pos = 0;
  auto emit = [&](uint16_t t) {
    if (pos++ < n_train) train.push(t); else val.push(t);
  };

  Progress bar(progress && total_bytes > 1'000'000 && isatty(fileno(stderr)), total_bytes);
  int64_t bytes_done = 0;
  std::vector<char> chunk(1 << 20);
  for (size_t f = 0; f < inputs.size(); ++f) {
    if (f > 0) emit(static_cast<uint16_t>(kEndOfText));
    std::ifstream in(inputs[f], std::ios::binary);
    TG_CHECK(in, "prepare: cannot open input file '", inputs[f], "'");
    while (in) {
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      const auto got = in.gcount();
      // Byte tokenizer inlined: id = byte value (see ByteTokenizer::encode).
      for (std::streamsize i = 0; i < got; ++i) emit(static_cast<unsigned char>(chunk[i]));
      bytes_done += got;
      bar.update(bytes_done);
    }
    TG_CHECK(in.eof(), "prepare: error reading input file '", inputs[f], "'");
  }
  TG_CHECK(pos == total, "prepare: input files changed size while being read (expected ", total,
           " tokens, got ", pos, ")");
  train.finish();
  val.finish();
  result.files.insert(result.files.end(), val_files.begin(), val_files.end());
  result.train_tokens = train.count();
  result.val_tokens = val.count();
  remove_stale_shards(out_dir, result.files);
  for (const char* f : {"vocab.json", "merges.txt"}) fs::remove(fs::path(out_dir) / f);  // not this data's tokenizer
  return result;
}

}  // namespace tg
