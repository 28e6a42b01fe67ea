#include "src/tensor/offload.h"

#include <atomic>
#include <map>
#include <mutex>

#include "src/util/error.h"

namespace tg {

#ifdef TILEGRAD_HAVE_CUDA
void* cuda_pinned_allocate(size_t nbytes);
void cuda_pinned_free(void* p);
void cuda_copy_async(void* dst, const void* src, size_t nbytes);
#endif

namespace {
std::atomic<int64_t> g_parked{0}, g_parked_peak{0};

#ifdef TILEGRAD_HAVE_CUDA
// Freed pinned buffers by size, for the next step's tensors of the same sizes. A buffer goes back
// to the pool when its last ParkedTensor goes; the next copy into it is queued after the copy
// out of it, on the same stream, so reuse needs no wait.
class PinnedPool {
 public:
  std::shared_ptr<void> take(size_t nbytes) {
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(nbytes);
      if (it != free_.end()) {
        p = it->second;
        free_.erase(it);
      }
    }
    if (!p) p = cuda_pinned_allocate(nbytes);
    TG_CHECK(p, "offloading activations: could not page-lock ", nbytes,
             " bytes of host memory for a block input; free host memory, or set train.offload_activations: false");
    return std::shared_ptr<void>(p, [this, nbytes](void* q) {
      std::lock_guard<std::mutex> lock(mu_);
      free_.emplace(nbytes, q);
    });
  }

 private:
  std::mutex mu_;
  std::multimap<size_t, void*> free_;
};

// Never destroyed: buffers may still be returned while static objects are torn down.
PinnedPool& pool() {
  static PinnedPool* p = new PinnedPool;
  return *p;
}
#endif
}  // namespace

ParkedTensor::ParkedTensor(const Tensor& t) {
  TG_CHECK(t.defined(), "ParkedTensor: undefined tensor");
  if (t.device().is_cpu()) {
    kept_ = t;
    return;
  }
#ifdef TILEGRAD_HAVE_CUDA
  shape_ = t.shape(), dtype_ = t.dtype(), device_ = t.device(), nbytes_ = t.nbytes();
  std::shared_ptr<void> buffer = pool().take(nbytes_);
  cuda_copy_async(buffer.get(), t.raw(), nbytes_);
  const int64_t n = int64_t(nbytes_);
  host_ = std::shared_ptr<void>(buffer.get(), [buffer, n](void*) mutable {
    g_parked -= n;
    buffer.reset();
  });
  const int64_t now = g_parked += n;
  for (int64_t peak = g_parked_peak.load(); now > peak && !g_parked_peak.compare_exchange_weak(peak, now);) {
  }
#endif
}

Tensor ParkedTensor::restore() const {
  TG_CHECK(defined(), "ParkedTensor::restore: nothing parked");
  if (kept_.defined()) return kept_;
  Tensor t = Tensor::empty(shape_, dtype_, device_);
#ifdef TILEGRAD_HAVE_CUDA
  cuda_copy_async(t.raw(), host_.get(), nbytes_);
#endif
  return t;
}

int64_t parked_bytes() { return g_parked.load(); }
int64_t parked_bytes_peak() { return g_parked_peak.load(); }

}  // namespace tg
