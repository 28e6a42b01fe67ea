// Memory counters per device and category, and CPU storage allocation.
#include "src/tensor/memory.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>

#include "src/util/error.h"

namespace tg {

namespace {
constexpr int kMaxDevices = 17;  // slot 0: cpu, slots 1..16: cuda:0..15
std::mutex g_mutex;
MemoryStats g_stats[kMaxDevices];
thread_local MemCategory t_category = MemCategory::activations;

int slot(Device d) {
  int s = d.is_cpu() ? 0 : 1 + d.index;
  TG_ASSERT(s >= 0 && s < kMaxDevices);
  return s;
}
}  // namespace

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::params: return "params";
    case MemCategory::grads: return "grads";
    case MemCategory::optimizer: return "optimizer";
    case MemCategory::activations: return "activations";
    case MemCategory::workspace: return "workspace";
    default: return "?";
  }
}

void memory_charge(Device d, MemCategory c, int64_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  MemoryStats& s = g_stats[slot(d)];
  int i = int(c);
  s.current[i] += bytes;
  if (s.current[i] > s.peak[i]) s.peak[i] = s.current[i];
  s.current_total += bytes;
  if (s.current_total > s.peak_total) s.peak_total = s.current_total;
  if (bytes > s.largest_allocation) s.largest_allocation = bytes;
}

void memory_uncharge(Device d, MemCategory c, int64_t bytes) {
  std::lock_guard<std::mutex> lock(g_mutex);
  MemoryStats& s = g_stats[slot(d)];
  s.current[int(c)] -= bytes;
  s.current_total -= bytes;
}

MemoryStats memory_stats(Device d) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_stats[slot(d)];
}

void reset_peak_memory(Device d) {
  std::lock_guard<std::mutex> lock(g_mutex);
  MemoryStats& s = g_stats[slot(d)];
  s.peak = s.current;
  s.peak_total = s.current_total;
  s.largest_allocation = 0;
}

MemoryCategoryScope::MemoryCategoryScope(MemCategory c) : previous_(t_category) { t_category = c; }
MemoryCategoryScope::~MemoryCategoryScope() { t_category = previous_; }
MemCategory current_mem_category() { return t_category; }

// CUDA allocation lives in the CUDA backend; declared here so Storage can route to it.
#ifdef TILEGRAD_HAVE_CUDA
void* cuda_allocate(size_t nbytes, int device);
void cuda_free(void* p, int device);
#endif

Storage::Storage(size_t n, Device dev, MemCategory cat) : nbytes(n), device(dev), category(cat) {
  if (dev.is_cpu()) {
    // 64-byte alignment for vector loads; never zero-sized so data is a valid pointer.
    size_t rounded = ((n + 63) / 64) * 64;
    data = std::aligned_alloc(64, rounded ? rounded : 64);
  } else {
#ifdef TILEGRAD_HAVE_CUDA
    data = cuda_allocate(n, dev.index);  // null when the device is out of memory
#else
    throw Error("tensor on " + dev.str() + " requested, but tilegrad was built without CUDA");
#endif
  }
  if (!data) {
    const MemoryStats s = memory_stats(dev);
    std::string held;
    for (int c = 0; c < kNumMemCategories; ++c)
      held += std::string(c ? ", " : "") + mem_category_name(MemCategory(c)) + " " + format_bytes(s.current[size_t(c)]);
    throw OutOfMemory(detail::concat(
        "out of memory on ", dev.str(), ": allocating ", format_bytes(int64_t(n)), " for ", mem_category_name(cat),
        " while tilegrad holds ", format_bytes(s.current_total), " (", held,
        "); lower train.batch_size or train.seq_len, or set train.lm_head_chunk and train.recompute "
        "(README: Long context)"));
  }
  memory_charge(device, category, int64_t(nbytes));
}

Storage::~Storage() {
  if (device.is_cpu()) {
    std::free(data);
  } else {
#ifdef TILEGRAD_HAVE_CUDA
    cuda_free(data, device.index);
#endif
  }
  memory_uncharge(device, category, int64_t(nbytes));
}

std::string format_bytes(int64_t b) {
  char buf[64];
  double v = double(b);
  if (v >= 1024.0 * 1024 * 1024) std::snprintf(buf, sizeof buf, "%.2f GiB", v / (1024.0 * 1024 * 1024));
  else if (v >= 1024.0 * 1024) std::snprintf(buf, sizeof buf, "%.1f MiB", v / (1024.0 * 1024));
  else if (v >= 1024.0) std::snprintf(buf, sizeof buf, "%.1f KiB", v / 1024.0);
  else std::snprintf(buf, sizeof buf, "%lld B", (long long)b);
  return buf;
}

}  // namespace tg
