// DeviceGraph over the CUDA runtime glue (kernels/cuda/runtime.cu).
#include "src/tensor/device_graph.h"

namespace tg {

#ifdef TILEGRAD_HAVE_CUDA
void* cuda_graph_capture(const std::function<void()>& work);
void cuda_graph_replay(void* exec);
void cuda_graph_destroy(void* exec);

DeviceGraph DeviceGraph::capture(Device device, const std::function<void()>& work) {
  TG_CHECK(device.is_cuda(), "DeviceGraph: a graph records GPU work; the device is ", device.str());
  set_current_device(device);
  DeviceGraph g;
  g.exec_ = std::shared_ptr<void>(cuda_graph_capture(work), cuda_graph_destroy);
  return g;
}

void DeviceGraph::replay() const {
  TG_CHECK(captured(), "DeviceGraph::replay: nothing was captured");
  cuda_graph_replay(exec_.get());
}
#else
DeviceGraph DeviceGraph::capture(Device device, const std::function<void()>&) {
  TG_CHECK(false, "DeviceGraph: a graph records GPU work and this build has no CUDA (device ", device.str(), ")");
  return {};
}

void DeviceGraph::replay() const { TG_CHECK(false, "DeviceGraph::replay: this build has no CUDA"); }
#endif

}  // namespace tg
