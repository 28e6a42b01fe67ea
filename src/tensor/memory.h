// Memory accounting: every allocation is charged to a device and a category, so the log,
// the memory tool and the tests can say where the bytes went (current and peak).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "src/tensor/dtype.h"

namespace tg {

enum class MemCategory : uint8_t { params, grads, optimizer, activations, workspace, count };
constexpr int kNumMemCategories = int(MemCategory::count);
const char* mem_category_name(MemCategory c);

struct MemoryStats {
  std::array<int64_t, kNumMemCategories> current{};
  std::array<int64_t, kNumMemCategories> peak{};  // peak of each category on its own
  int64_t current_total = 0;
  int64_t peak_total = 0;  // peak of the sum
  int64_t largest_allocation = 0;  // since the last reset_peak: catches a T×T buffer
};

MemoryStats memory_stats(Device d);
// Restarts peak tracking from the current level (used around a region under measurement).
void reset_peak_memory(Device d);

// New storage is charged to the innermost scope's category (activations by default).
class MemoryCategoryScope {
 public:
  explicit MemoryCategoryScope(MemCategory c);
  ~MemoryCategoryScope();
  MemoryCategoryScope(const MemoryCategoryScope&) = delete;
  MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;

 private:
  MemCategory previous_;
};
MemCategory current_mem_category();

// A block of device memory, freed (and uncharged) when the last handle goes.
struct Storage {
  Storage(size_t nbytes, Device device, MemCategory category);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  MemCategory category;
};

// Low-level charge/uncharge used by Storage and by backends that allocate on their own.
void memory_charge(Device d, MemCategory c, int64_t bytes);
void memory_uncharge(Device d, MemCategory c, int64_t bytes);

std::string format_bytes(int64_t bytes);

}  // namespace tg
