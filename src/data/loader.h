// DataLoader: deterministic random windows of token shards for training, and an in-order
// sweep for evaluation.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "src/data/shards.h"

namespace tg {

// Everything needed to reproduce the random stream; saved in checkpoints.
struct LoaderCursor {
  uint64_t seed = 0;
  uint64_t step = 0;
};

class DataLoader {
 public:
  // Loads all shards matching `glob` (validated against vocab_size). Each batch row is a window
  // of T+1 tokens: inputs = window[0:T], targets = window[1:T+1].
  //
  // Random mode: the start of row b on `rank` at step s is a pure function of
  // (seed, s, rank * B + b) through splitmix64 (a counter-based hash, so no RNG state to save
  // beyond the cursor and resuming is exact). The start is uniform over all valid starts of all
  // shards (a window never crosses a shard boundary), which picks a shard proportionally to its
  // number of valid starts. Because the hash sees the global row rank * B + b, ranks draw
  // different windows, and W ranks with batch B together see exactly the rows that one process
  // with batch W * B would see. Shards shorter than T+1 tokens contribute no windows.
  DataLoader(const std::string& glob, int vocab_size, int64_t batch_size, int64_t seq_len,
             uint64_t seed, int rank = 0, int world_size = 1);

  // Fills inputs and targets (each (B, T) int32, row-major) and advances the cursor one step.
  void next_batch(int32_t* inputs, int32_t* targets);
  // Rows first_row … first_row + B − 1 of draw `step` (the cursor is neither read nor moved):
  // the window of a row is a pure function of (seed, step, row). Training keys a draw by the
  // optimizer step and numbers the rows of the whole global batch — micro-batch m of rank r
  // starts at row (m·W + r)·B — so every layout of the same global batch (W ranks × B rows ×
  // k micro-batches) reads the same tokens, and a resume at another world size continues the
  // stream.
  void batch_at(uint64_t step, int64_t first_row, int32_t* inputs, int32_t* targets) const;
  LoaderCursor cursor() const { return cursor_; }
  void set_cursor(const LoaderCursor& c) { cursor_ = c; }  // exact resume

  // Sequential mode, for a deterministic validation loss: non-overlapping windows at starts
  // 0, T, 2T, ... of each shard in file order, B consecutive windows per batch; a partial last
  // batch is dropped. Batches are dealt round-robin to ranks and every rank gets the same
  // number (so collective ops over the eval loop cannot hang); leftover batches are dropped.
  void reset_sequential() { seq_batch_ = 0; }
  // Returns false (and leaves the buffers untouched) once this rank's batches are exhausted.
  bool next_sequential_batch(int32_t* inputs, int32_t* targets);
  // Batches one full sequential sweep gives this rank (the same on every rank).
  int64_t num_sequential_batches() const;

  int64_t total_tokens() const { return total_tokens_; }
  const std::vector<std::string>& files() const { return files_; }
  int64_t batch_size() const { return B_; }
  int64_t seq_len() const { return T_; }

 private:
  void copy_window(int64_t shard, int64_t offset, int64_t row, int32_t* inputs, int32_t* targets) const;

  std::vector<std::string> files_;
  std::vector<TokenShard> shards_;
  std::vector<int64_t> start_prefix_;   // cumulative random-mode window starts, size shards+1
  std::vector<int64_t> window_prefix_;  // cumulative sequential windows, size shards+1
  int64_t B_, T_;
  int rank_, world_size_;
  int64_t total_tokens_ = 0;
  LoaderCursor cursor_;
  int64_t seq_batch_ = 0;  // batches this rank has taken in the current sweep
};

}  // namespace tg
