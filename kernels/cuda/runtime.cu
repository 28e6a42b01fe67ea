// CUDA runtime glue for the tensor library: stream-ordered allocation from CUDA's memory pool,
// host/device copies, memset, dtype conversion, and device discovery.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/elementwise.h"
#include "src/tensor/tensor.h"

namespace tg {

namespace {
// A release threshold keeps freed blocks in the pool between steps instead of returning them
// to the driver (which would make every step pay cudaMalloc's cost again).
void configure_pool(int device) {
  static bool configured[16] = {};
  if (device < 0 || device >= 16 || configured[device]) return;
  cudaMemPool_t pool;
  TG_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t threshold = UINT64_MAX;
  TG_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  configured[device] = true;
}

}  // namespace

void* cuda_allocate(size_t nbytes, int device) {
  TG_CUDA_CHECK(cudaSetDevice(device));
  configure_pool(device);
  void* p = nullptr;
  const cudaError_t err = cudaMallocAsync(&p, nbytes ? nbytes : 1, cudaStreamPerThread);
  if (err == cudaErrorMemoryAllocation) {  // the caller says what ran out; the error is not sticky
    (void)cudaGetLastError();
    return nullptr;
  }
  TG_CUDA_CHECK(err);
  return p;
}

void cuda_free(void* p, int device) {
  // Runs in a destructor, which must not throw: a failing free is reported and the memory leaked.
  cudaError_t err = cudaFreeAsync(p, cudaStreamPerThread);
  if (err != cudaSuccess)
    std::fprintf(stderr, "tilegrad: cudaFreeAsync failed at %s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err));
}

// Copies into device memory are queued on the stream (an H2D copy from pageable memory returns
// once the source has been staged, so the caller may free it); a copy to the host waits for the
// queued work first, since the caller reads the values next.
void cuda_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  if (dst_dev.is_cuda()) {
    if (src_dev.is_cpu()) {
      // A recorded copy from host memory would read the host buffer at every replay, long after
      // the caller has freed it: refused while a graph is being recorded (device_graph.h).
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      TG_CUDA_CHECK(cudaStreamIsCapturing(cudaStreamPerThread, &capturing));
      TG_CHECK(capturing == cudaStreamCaptureStatusNone, "a copy of ", nbytes,
               " bytes from host memory was queued while a CUDA graph was being recorded; a replay would "
               "read the host buffer after it is gone (put the data on the device before the capture)");
    }
    TG_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, cudaStreamPerThread));
    return;
  }
  TG_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  TG_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
}

// Page-locked host memory, for copies that run on the stream without the host waiting: the
// parked block inputs of src/tensor/offload.h. Null when the host cannot lock that much.
void* cuda_pinned_allocate(size_t nbytes) {
  void* p = nullptr;
  if (cudaMallocHost(&p, nbytes ? nbytes : 1) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

void cuda_pinned_free(void* p) {
  cudaError_t err = cudaFreeHost(p);
  if (err != cudaSuccess)
    std::fprintf(stderr, "tilegrad: cudaFreeHost failed at %s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(err));
}

// A copy in either direction between device memory and page-locked host memory, queued on the
// stream: the host does not wait, and the kernels queued before and after see it in order.
void cuda_copy_async(void* dst, const void* src, size_t nbytes) {
  TG_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, cudaStreamPerThread));
}

// Fills n elements at p with value on the stream, for the dtypes with a fill kernel; false for
// the others (the caller goes through the host).
bool cuda_fill(void* p, DType dtype, double value, int64_t n) {
  switch (dtype) {
    case DType::f32: cuda::fill(static_cast<float*>(p), float(value), n, cudaStreamPerThread); return true;
    case DType::bf16: cuda::fill(static_cast<bf16*>(p), float(value), n, cudaStreamPerThread); return true;
    default: return false;
  }
}

void cuda_zero(void* p, size_t nbytes) { TG_CUDA_CHECK(cudaMemsetAsync(p, 0, nbytes, cudaStreamPerThread)); }

// Device dtype conversion for Tensor::to: f32 ↔ bf16 (the mixed-precision casts).
void cuda_convert(const void* src, DType from, void* dst, DType to, int64_t n) {
  cudaStream_t s = cudaStreamPerThread;
  if (from == DType::f32 && to == DType::bf16) cuda::cast(static_cast<const float*>(src), static_cast<bf16*>(dst), n, s);
  else if (from == DType::bf16 && to == DType::f32) cuda::cast(static_cast<const bf16*>(src), static_cast<float*>(dst), n, s);
  else TG_CHECK(false, "dtype conversion ", dtype_name(from), " → ", dtype_name(to), " is not supported on the GPU");
}

void cuda_set_device(int device) { TG_CUDA_CHECK(cudaSetDevice(device)); }

void cuda_synchronize() { TG_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread)); }

void cuda_mem_get_info(size_t* free_bytes, size_t* total_bytes) { TG_CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes)); }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace tg

namespace tg {

// A graph of the work queued on the stream by `work` (src/tensor/device_graph.h). Memory that
// `work` allocates and frees becomes the graph's own (fixed addresses, reused at every replay);
// memory it allocates and leaves to a later free is released at the next replay
// (AutoFreeOnLaunch), so nothing may outlive the replay that made it. ThreadLocal mode makes a
// call that would wait for the device during capture fail instead of being recorded wrongly.
void* cuda_graph_capture(const std::function<void()>& work) {
  cudaStream_t s = cudaStreamPerThread;
  TG_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    work();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(s, &broken);
    if (broken) (void)cudaGraphDestroy(broken);
    (void)cudaGetLastError();
    throw;
  }
  cudaGraph_t graph = nullptr;
  TG_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  (void)cudaGraphDestroy(graph);
  TG_CUDA_CHECK(err);
  TG_CUDA_CHECK(cudaGraphUpload(exec, s));
  // The graph's memory is a pool of its own: hand what the stream's pool keeps cached from the
  // steps before the capture back to the driver, or both would hold a step's activations.
  int device = 0;
  TG_CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool;
  TG_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  TG_CUDA_CHECK(cudaStreamSynchronize(s));
  TG_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  return exec;
}

void cuda_graph_replay(void* exec) {
  TG_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec), cudaStreamPerThread));
}

void cuda_graph_destroy(void* exec) {
  // Runs in a destructor, which must not throw.
  const cudaError_t err = cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec));
  if (err != cudaSuccess)
    std::fprintf(stderr, "tilegrad: cudaGraphExecDestroy failed at %s:%d: %s\n", __FILE__, __LINE__,
                 cudaGetErrorString(err));
}

}  // namespace tg
