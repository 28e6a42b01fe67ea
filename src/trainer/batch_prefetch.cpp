// Batches read ahead. Reading a batch costs the host little, but the device must not wait for it:
// on a GPU the rows go to page-locked buffers, whose copies the driver queues on the stream
// without the stream synchronisation a copy from pageable memory may take. Two slots: one being
// read while the other's copy runs; a slot is refilled only after its copy has completed.
#include "src/trainer/batch_prefetch.h"

#include <cstring>

#include "src/util/error.h"

#ifdef TILEGRAD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/check.cuh"
#endif

namespace tg {

namespace {
constexpr int kSlots = 2;
}

struct BatchPrefetcher::Slot {
  int32_t* inputs = nullptr;
  int32_t* targets = nullptr;
  bool pinned = false;
#ifdef TILEGRAD_HAVE_CUDA
  cudaEvent_t copied = nullptr;  // recorded after the copies out of this slot were queued
#endif
};

BatchPrefetcher::BatchPrefetcher(const DataLoader& data, int64_t batch, int64_t seq_len, int64_t micro_batches,
                                 int world, int rank, int64_t first_step, Device device)
    : data_(data), B_(batch), T_(seq_len), k_(micro_batches), world_(world), rank_(rank), device_(device),
      first_step_(first_step) {
  const size_t bytes = size_t(B_ * T_) * sizeof(int32_t);
  for (int i = 0; i < kSlots; ++i) {
    auto* s = new Slot;
#ifdef TILEGRAD_HAVE_CUDA
    if (device_.is_cuda()) {
      TG_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s->inputs), bytes));
      TG_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&s->targets), bytes));
      TG_CUDA_CHECK(cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming));
      s->pinned = true;
    }
#endif
    if (!s->pinned) {
      s->inputs = new int32_t[size_t(B_ * T_)];
      s->targets = new int32_t[size_t(B_ * T_)];
    }
    slots_.push_back(s);
  }
  int cuda_device = 0;
#ifdef TILEGRAD_HAVE_CUDA
  if (device_.is_cuda()) TG_CUDA_CHECK(cudaGetDevice(&cuda_device));
#endif
  worker_ = std::thread([this, cuda_device] {
#ifdef TILEGRAD_HAVE_CUDA
    if (device_.is_cuda()) cudaSetDevice(cuda_device);  // the slots' events belong to the loop's GPU
#endif
    (void)cuda_device;
    fill_loop();
  });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
  for (Slot* s : slots_) {
#ifdef TILEGRAD_HAVE_CUDA
    if (s->pinned) {
      cudaEventSynchronize(s->copied);  // no copy may still read a freed buffer
      cudaEventDestroy(s->copied);
      cudaFreeHost(s->inputs);
      cudaFreeHost(s->targets);
      delete s;
      continue;
    }
#endif
    delete[] s->inputs;
    delete[] s->targets;
    delete s;
  }
}

void BatchPrefetcher::fill_loop() {
  try {
    for (int64_t i = 0;; ++i) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        changed_.wait(lock, [&] { return stopping_ || i - consumed_ < kSlots; });
        if (stopping_) return;
      }
      Slot* s = slots_[size_t(i % kSlots)];
#ifdef TILEGRAD_HAVE_CUDA
      if (s->pinned && i >= kSlots) TG_CUDA_CHECK(cudaEventSynchronize(s->copied));
#endif
      const int64_t step = first_step_ + i / k_, micro = i % k_;
      data_.batch_at(uint64_t(step), (micro * world_ + rank_) * B_, s->inputs, s->targets);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        produced_ = i + 1;
      }
      changed_.notify_all();
    }
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = e.what();
    stopping_ = true;
    changed_.notify_all();
  }
}

std::pair<Tensor, Tensor> BatchPrefetcher::next(Tensor* host_inputs) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [&] { return produced_ > consumed_ || !error_.empty(); });
    if (produced_ <= consumed_) throw Error("reading the training batches: " + error_);
  }
  Slot* s = slots_[size_t(consumed_ % kSlots)];
  Tensor x = Tensor::empty({B_, T_}, DType::i32, device_);
  Tensor y = Tensor::empty({B_, T_}, DType::i32, device_);
  const size_t bytes = size_t(B_ * T_) * sizeof(int32_t);
#ifdef TILEGRAD_HAVE_CUDA
  if (s->pinned) {
    TG_CUDA_CHECK(cudaMemcpyAsync(x.raw(), s->inputs, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread));
    TG_CUDA_CHECK(cudaMemcpyAsync(y.raw(), s->targets, bytes, cudaMemcpyHostToDevice, cudaStreamPerThread));
    TG_CUDA_CHECK(cudaEventRecord(s->copied, cudaStreamPerThread));
  }
#endif
  if (!s->pinned) {
    std::memcpy(x.raw(), s->inputs, bytes);
    std::memcpy(y.raw(), s->targets, bytes);
  }
  if (host_inputs) {
    *host_inputs = Tensor::empty({B_, T_}, DType::i32, Device::cpu());
    std::memcpy(host_inputs->raw(), s->inputs, bytes);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++consumed_;
  }
  changed_.notify_all();
  return {x, y};
}

}  // namespace tg
