// Backend dispatch shared by ops, autograd and the optimizer: pick the kernel family for a
// tensor's device and instantiate it for its dtype; plus the common input checks of ops.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

#include "kernels/cuda/stream.h"
#include "src/tensor/tensor.h"

namespace tg::detail {

// The stream every CUDA op of this thread runs on (CUDA's per-thread default stream).
inline cudaStream_t cuda_stream() {
#ifdef TILEGRAD_HAVE_CUDA
  return cudaStreamPerThread;
#else
  return nullptr;
#endif
}

// Calls cpu.template operator()<T>() with T ∈ {float, double} for a CPU tensor, or
// gpu.template operator()<T>() with T ∈ {float, bf16} for a CUDA tensor. The GPU lambda is
// only instantiated in CUDA builds.
template <typename CpuF, typename GpuF>
void dispatch(const char* op, const Tensor& t, CpuF&& cpu, GpuF&& gpu) {
  if (t.device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
    switch (t.dtype()) {
      case DType::f32: gpu.template operator()<float>(); return;
      case DType::bf16: gpu.template operator()<bf16>(); return;
      default:
        TG_CHECK(false, op, ": unsupported dtype ", dtype_name(t.dtype()), " on the GPU (", t.desc(),
                 "); use f32 or bf16");
    }
#else
    (void)gpu;
    TG_CHECK(false, op, ": ", t.desc(), " is on a GPU but tilegrad was built without CUDA");
#endif
  }
  switch (t.dtype()) {
    case DType::f32: cpu.template operator()<float>(); break;
    case DType::f64: cpu.template operator()<double>(); break;
    default:
      TG_CHECK(false, op, ": unsupported dtype ", dtype_name(t.dtype()), " on the cpu (", t.desc(),
               "); use f32 or f64");
  }
}

inline void check_defined(const char* op, const Tensor& t, const char* name) {
  TG_CHECK(t.defined(), op, ": input '", name, "' is undefined");
}

// Same dtype and device for all floating inputs of an op.
inline void check_same(const char* op, const Tensor& a, const Tensor& b) {
  TG_CHECK(a.dtype() == b.dtype(), op, ": dtype mismatch: ", a.desc(), " vs ", b.desc());
  TG_CHECK(a.device() == b.device(), op, ": device mismatch: ", a.desc(), " vs ", b.desc());
}

inline Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }

// n fp32 scratch floats on `device`, counted as workspace (kernels' partial sums and the like).
inline Tensor workspace_floats(size_t n, Device device) {
  MemoryCategoryScope ws(MemCategory::workspace);
  return Tensor::empty({int64_t(std::max<size_t>(n, 1))}, DType::f32, device);
}

}  // namespace tg::detail
