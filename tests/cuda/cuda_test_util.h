// Shared by the GPU tests: whether a GPU is there to test on, a checking macro for the raw CUDA
// calls the kernel-level tests make (it throws, so gtest reports the failing call), and raw
// device buffers for the probe tests.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/tensor/tensor.h"

// A GPU test's first line: skips, with the reason, where there is no GPU.
#define REQUIRE_GPU() \
  if (!::tg::testing::have_gpu()) GTEST_SKIP() << "no CUDA GPU on this machine (or built without CUDA)"

#ifdef TILEGRAD_HAVE_CUDA
#include <cuda_runtime_api.h>

#define CHECK_CUDA(call)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess)                                                                       \
      throw std::runtime_error(std::string(#call) + ": " + cudaGetErrorString(e_) + " at line " + \
                               std::to_string(__LINE__));                                        \
  } while (0)
#endif

namespace tg::testing {
inline bool have_gpu() { return cuda_device_count() > 0; }

// ||a − b|| / ||b|| over host values (equal infinities count as no error).
inline double rel_norm(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i]) && a[i] == b[i]) continue;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

#ifdef TILEGRAD_HAVE_CUDA
// Raw device memory for the probe tests, freed on every path out of the test.
struct DeviceBytes {
  void* p = nullptr;
  explicit DeviceBytes(size_t bytes) { CHECK_CUDA(cudaMalloc(&p, bytes)); }
  ~DeviceBytes() { cudaFree(p); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
};
#endif
}  // namespace tg::testing
