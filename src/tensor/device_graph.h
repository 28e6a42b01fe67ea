// The device work of one call of a function, recorded once and replayed with a single launch (a
// CUDA graph): the launch gaps between a step's ~500 kernels and the host's time to queue them
// are paid once, at capture. What the host computes while recording (shapes, the tape, kernel
// choices) is fixed into the graph, and so are the addresses of everything the work touches:
// the work may only change device memory, and everything it reads from the host (a learning
// rate, a batch) must reach the device before the replay, at an address fixed at capture.
#pragma once
#include <functional>
#include <memory>

#include "src/tensor/tensor.h"

namespace tg {

class DeviceGraph {
 public:
  // Runs `work` with the device's stream in capture mode: nothing executes; the kernels, copies,
  // and stream-ordered allocations and frees it queues become the graph. Anything that waits for
  // the device inside `work` (a copy to the host, a synchronisation) fails with the CUDA call named.
  static DeviceGraph capture(Device device, const std::function<void()>& work);
  void replay() const;  // queues the recorded work on the device's stream
  bool captured() const { return exec_ != nullptr; }

 private:
  std::shared_ptr<void> exec_;  // cudaGraphExec_t, destroyed with the last copy
};

}  // namespace tg
