// CUDA runtime glue for the tensor library: stream-ordered allocation from CUDA's memory pool,
// host/device copies, memset, dtype conversion, and device discovery.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

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
