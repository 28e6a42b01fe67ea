// Shared by the GPU tests: whether a GPU is there to test on, and a checking macro for the raw
// CUDA calls the kernel-level tests make (it throws, so gtest reports the failing call).
#pragma once
#include <stdexcept>
#include <string>

#include "src/tensor/tensor.h"

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
}  // namespace tg::testing
