// Gradient arithmetic the autograd engine needs without knowing a device or a kernel: adding one
// tensor into another (with the bf16 → fp32 fold of mixed-precision training), a batch of small
// such additions at once, and an out-of-place sum. Each picks the CPU or CUDA kernel by device.
#pragma once
#include <vector>

#include "src/tensor/tensor.h"

namespace tg {

// dst += src, elementwise; same shape and device. src's dtype may differ from dst's: a bf16 src
// is added into an fp32 dst as floats in one pass (no converted copy); other pairs convert src
// to dst's dtype first.
void add_into(const Tensor& dst, const Tensor& src);

// One addition of a batch: dst (fp32) += src (bf16) or any pair add_into takes.
struct AddJob {
  Tensor dst, src;
};
// Up to this many additions go into one launch of add_into_batched: on the GPU its jobs travel as
// one kernel's argument. The destinations must not overlap.
constexpr int kAddIntoBatchCapacity = 128;
// The jobs' additions, as add_into would make them one by one (the same bits), but bf16 → fp32
// ones on the GPU in kernel launches of kAddIntoBatchCapacity jobs instead of one each.
void add_into_batched(const std::vector<AddJob>& jobs);

// a + b (same shape, dtype and device) into a new tensor, in one pass.
Tensor sum_of(const Tensor& a, const Tensor& b);

}  // namespace tg
