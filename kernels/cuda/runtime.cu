// CUDA runtime glue for the tensor library: stream-ordered allocation from CUDA's memory pool,
// host/device copies, gradient accumulation, and device discovery.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>

#include "kernels/cuda/check.cuh"
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

__global__ void accumulate_f32(float* dst, const float* src, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] += src[i];
}
}  // namespace

void* cuda_allocate(size_t nbytes, int device) {
  TG_CUDA_CHECK(cudaSetDevice(device));
  configure_pool(device);
  void* p = nullptr;
  TG_CUDA_CHECK(cudaMallocAsync(&p, nbytes ? nbytes : 1, cudaStreamPerThread));
  return p;
}

void cuda_free(void* p, int device) {
  // Destructors must not throw: a failing free is reported and ignored.
  if (cudaFreeAsync(p, cudaStreamPerThread) != cudaSuccess) std::abort();
}

void cuda_copy(void* dst, Device dst_dev, const void* src, Device src_dev, size_t nbytes) {
  TG_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
  TG_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDefault));
}

void cuda_accumulate(Tensor& dst, const Tensor& src) {
  TG_CHECK(dst.dtype() == DType::f32, "gradient accumulation on the GPU supports f32, got ", dst.desc());
  int64_t n = dst.numel();
  int threads = 256;
  accumulate_f32<<<unsigned((n + threads - 1) / threads), threads, 0, cudaStreamPerThread>>>(
      dst.data<float>(), src.data<float>(), n);
  TG_CUDA_CHECK(cudaGetLastError());
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

}  // namespace tg
