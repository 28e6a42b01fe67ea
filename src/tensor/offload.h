// Activation offloading: a GPU tensor's values parked in page-locked host memory while its device
// memory is freed, and brought back when the backward needs them. Recomputed blocks park their
// inputs this way (train.offload_activations): at a million tokens those inputs are most of what
// a step keeps (docs/memory.md). Both copies are queued on the compute stream, in order with the
// kernels around them: the host never waits, and the device memory the tensor held is reused
// only by work queued after the copy out. Host buffers come from a pool kept for the process, so
// a step does not pay for page-locking again.
#pragma once
#include <cstdint>
#include <memory>

#include "src/tensor/tensor.h"

namespace tg {

class ParkedTensor {
 public:
  ParkedTensor() = default;
  // A CUDA tensor is copied out to host memory; a CPU tensor is kept as it is (nothing to gain).
  explicit ParkedTensor(const Tensor& t);
  bool defined() const { return kept_.defined() || host_ != nullptr; }
  // The values on the tensor's device again: a new device tensor (charged to the current memory
  // category), or the kept CPU tensor.
  Tensor restore() const;

 private:
  Tensor kept_;                 // CPU tensors
  std::shared_ptr<void> host_;  // CUDA tensors: the pinned buffer, returned to the pool when the last copy goes
  Shape shape_;
  DType dtype_ = DType::f32;
  Device device_;
  size_t nbytes_ = 0;
};

// Bytes of host memory the parked tensors hold now and at most so far (for the logs and tests).
int64_t parked_bytes();
int64_t parked_bytes_peak();

}  // namespace tg
