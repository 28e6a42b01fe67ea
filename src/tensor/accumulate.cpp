// Device dispatch of gradient additions (see accumulate.h).
#include "src/tensor/accumulate.h"

#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.h"
#include "src/tensor/dispatch.h"

namespace tg {

namespace {
bool is_fold(const Tensor& dst, const Tensor& src) {
  return dst.dtype() == DType::f32 && src.dtype() == DType::bf16 && dst.device().is_cuda();
}

void check_pair(const char* what, const Tensor& dst, const Tensor& src) {
  TG_CHECK(dst.defined() && src.defined() && dst.shape() == src.shape() && dst.device() == src.device() &&
               is_floating(dst.dtype()) && is_floating(src.dtype()),
           what, ": ", src.defined() ? src.desc() : "undefined", " into ", dst.defined() ? dst.desc() : "undefined");
}
}  // namespace

void add_into(const Tensor& dst, const Tensor& src) {
  check_pair("gradient accumulation", dst, src);
  if (is_fold(dst, src)) {
#ifdef TILEGRAD_HAVE_CUDA
    cuda::add_converted_inplace(dst.data<float>(), src.data<bf16>(), src.numel(), detail::cuda_stream());
#endif
    return;
  }
  const Tensor s = src.dtype() == dst.dtype() ? src : src.to(dst.dtype());
  detail::dispatch("gradient accumulation", dst,
                   [&]<typename T>() { cpu::add_inplace(dst.data<T>(), s.data<T>(), dst.numel()); },
                   [&]<typename T>() {
                     cuda::add_inplace(dst.data<T>(), s.data<T>(), dst.numel(), detail::cuda_stream());
                   });
}

void add_into_batched(const std::vector<AddJob>& jobs) {
#ifdef TILEGRAD_HAVE_CUDA
  static_assert(kAddIntoBatchCapacity == cuda::kAddConvertedMaxJobs);
  std::vector<cuda::AddConvertedJob> batch;
  auto launch = [&] {
    if (!batch.empty()) cuda::add_converted_batched(batch.data(), int(batch.size()), detail::cuda_stream());
    batch.clear();
  };
  for (const AddJob& j : jobs) {
    check_pair("batched gradient accumulation", j.dst, j.src);
    if (!is_fold(j.dst, j.src)) {
      add_into(j.dst, j.src);
      continue;
    }
    batch.push_back({j.dst.data<float>(), j.src.data<bf16>(), j.src.numel()});
    if (int(batch.size()) == kAddIntoBatchCapacity) launch();
  }
  launch();
#else
  for (const AddJob& j : jobs) add_into(j.dst, j.src);
#endif
}

Tensor sum_of(const Tensor& a, const Tensor& b) {
  TG_CHECK(a.defined() && b.defined() && a.shape() == b.shape() && a.dtype() == b.dtype() && a.device() == b.device(),
           "gradient sum: ", a.defined() ? a.desc() : "undefined", " + ", b.defined() ? b.desc() : "undefined");
  Tensor out = detail::empty_like(a);
  const int64_t n = a.numel();
  detail::dispatch("gradient sum", a,
                   [&]<typename T>() { cpu::add_forward(a.data<T>(), b.data<T>(), out.data<T>(), 1, n); },
                   [&]<typename T>() {
                     cuda::add_forward(a.data<T>(), b.data<T>(), out.data<T>(), 1, n, detail::cuda_stream());
                   });
  return out;
}

}  // namespace tg
