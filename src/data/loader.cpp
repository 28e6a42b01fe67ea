// DataLoader implementation: counter-based window sampling and the sequential eval sweep.
#include "src/data/loader.h"

#include <algorithm>

#include "src/util/error.h"

namespace tg {

namespace {

// splitmix64 (Steele et al.): a bijective 64-bit mixer, good enough to derive independent
// uniform draws from counters.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, n): multiply-high instead of modulo; the bias is at most n / 2^64.
uint64_t draw_below(uint64_t h, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * n) >> 64);
}

// Index i with prefix[i] <= u < prefix[i+1]; empty shards (equal prefixes) are skipped.
int64_t locate(const std::vector<int64_t>& prefix, int64_t u) {
  return (std::upper_bound(prefix.begin(), prefix.end(), u) - prefix.begin()) - 1;
}

}  // namespace

DataLoader::DataLoader(const std::string& glob, int vocab_size, int64_t batch_size, int64_t seq_len,
                       uint64_t seed, int rank, int world_size)
    : B_(batch_size), T_(seq_len), rank_(rank), world_size_(world_size), cursor_{seed, 0} {
  TG_CHECK(batch_size >= 1, "DataLoader: batch_size must be >= 1, got ", batch_size);
  TG_CHECK(seq_len >= 1, "DataLoader: seq_len must be >= 1, got ", seq_len);
  TG_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "DataLoader: rank ", rank,
           " is not in [0, world_size ", world_size, ")");
  files_ = expand_glob(glob);
  start_prefix_.push_back(0);
  window_prefix_.push_back(0);
  int64_t longest = 0;
  std::string longest_file;
  for (const auto& f : files_) {
    shards_.push_back(read_shard(f, vocab_size));
    const auto n = static_cast<int64_t>(shards_.back().tokens.size());
    total_tokens_ += n;
    if (n > longest || longest_file.empty()) longest = n, longest_file = f;
    // A window is T+1 tokens: starts 0 .. n-T-1 for random draws, and every T-th one of them
    // for the sequential sweep.
    start_prefix_.push_back(start_prefix_.back() + std::max<int64_t>(0, n - T_));
    window_prefix_.push_back(window_prefix_.back() + (n > T_ ? (n - 1) / T_ : 0));
  }
  TG_CHECK(start_prefix_.back() > 0, "token shards matching '", glob, "' are too short for seq_len ",
           T_, ": a window needs ", T_ + 1, " tokens inside one shard, but the longest shard ('",
           longest_file, "') has ", longest, " tokens (", total_tokens_, " in all ", files_.size(),
           " shards); use more data or a smaller seq_len");
}

void DataLoader::copy_window(int64_t shard, int64_t offset, int64_t row, int32_t* inputs,
                             int32_t* targets) const {
  const uint16_t* w = shards_[shard].tokens.data() + offset;  // (T+1,)
  int32_t* in = inputs + row * T_;
  int32_t* tgt = targets + row * T_;
  for (int64_t t = 0; t < T_; ++t) {
    in[t] = w[t];
    tgt[t] = w[t + 1];
  }
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
  batch_at(cursor_.step, int64_t(rank_) * B_, inputs, targets);  // global rows across ranks
  ++cursor_.step;
}

void DataLoader::batch_at(uint64_t step, int64_t first_row, int32_t* inputs, int32_t* targets) const {
  const uint64_t step_key = splitmix64(splitmix64(cursor_.seed) ^ step);
  const auto starts = static_cast<uint64_t>(start_prefix_.back());
  for (int64_t b = 0; b < B_; ++b) {
    const uint64_t row = static_cast<uint64_t>(first_row + b);
    const auto u = static_cast<int64_t>(draw_below(splitmix64(step_key ^ row), starts));
    const int64_t shard = locate(start_prefix_, u);
    copy_window(shard, u - start_prefix_[shard], b, inputs, targets);
  }
}

int64_t DataLoader::num_sequential_batches() const {
  return window_prefix_.back() / B_ / world_size_;
}

bool DataLoader::next_sequential_batch(int32_t* inputs, int32_t* targets) {
  if (seq_batch_ >= num_sequential_batches()) return false;
  const int64_t global_batch = seq_batch_ * world_size_ + rank_;
  for (int64_t b = 0; b < B_; ++b) {
    const int64_t window = global_batch * B_ + b;
    const int64_t shard = locate(window_prefix_, window);
    copy_window(shard, (window - window_prefix_[shard]) * T_, b, inputs, targets);
  }
  ++seq_batch_;
  return true;
}

}  // namespace tg
