// The training loop's batches, read ahead on a thread of their own into pinned host memory and
// copied to the device without stopping the host (see batch_prefetch.cpp).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "src/data/loader.h"
#include "src/tensor/tensor.h"

namespace tg {

class BatchPrefetcher {
 public:
  // The batches of steps first_step, first_step + 1, …: for each step its `micro_batches`
  // micro-batches, micro-batch m of this rank reading global rows (m·world + rank)·B… of
  // DataLoader::batch_at, as the training loop consumes them. `data` must outlive this object.
  BatchPrefetcher(const DataLoader& data, int64_t batch, int64_t seq_len, int64_t micro_batches, int world,
                  int rank, int64_t first_step, Device device);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The next micro-batch's (inputs, targets), i32 (B, T) on the device; the copy is queued on the
  // compute stream, so the tensors may be used at once. With host_inputs, also a CPU copy of the
  // inputs there (what the document masks are computed from, without reading the device).
  std::pair<Tensor, Tensor> next(Tensor* host_inputs = nullptr);

 private:
  struct Slot;
  void fill_loop();

  const DataLoader& data_;
  const int64_t B_, T_, k_;
  const int world_, rank_;
  Device device_;
  std::vector<Slot*> slots_;
  std::mutex mutex_;
  std::condition_variable changed_;
  int64_t produced_ = 0, consumed_ = 0;  // micro-batches read, and handed out, since first_step
  const int64_t first_step_;
  bool stopping_ = false;
  std::string error_;  // what the reading thread failed with, rethrown by next()
  std::thread worker_;
};

}  // namespace tg
