// Flash attention against the materialised reference at the op level (outputs and all three
// gradients, in double), and the memory guarantee: no T×T buffer on the flash path.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "src/ops/ops.h"
#include "tests/test_util.h"

// Every heap allocation of this test binary goes through here, so the memory test sees the
// kernels' private scratch (std::vector inside the CPU flash kernel) as well as tensor storage.
namespace heap_probe {
std::atomic<size_t> largest{0};
std::atomic<bool> active{false};
}  // namespace heap_probe

void* operator new(size_t n) {
  if (heap_probe::active.load(std::memory_order_relaxed)) {
    size_t cur = heap_probe::largest.load();
    while (n > cur && !heap_probe::largest.compare_exchange_weak(cur, n)) {
    }
  }
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace tg {
namespace {

using testing::random_tensor;
using testing::rel_error;

struct AttnCase { int64_t B, T, H, D; bool causal; };

void PrintTo(const AttnCase& c, std::ostream* os) {
  *os << "B" << c.B << " T" << c.T << " H" << c.H << " D" << c.D << (c.causal ? " causal" : "");
}

class FlashVsNaive : public ::testing::TestWithParam<AttnCase> {};

TEST_P(FlashVsNaive, OutputsAndGradientsAgreeInDouble) {
  const AttnCase c = GetParam();
  Shape s = {c.B, c.T, c.H, c.D};
  Tensor dout = random_tensor(s, 4);
  std::vector<std::vector<double>> results[2];
  for (int kind = 0; kind < 2; ++kind) {
    Tensor q = random_tensor(s, 1), k = random_tensor(s, 2), v = random_tensor(s, 3);
    for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
    Tensor o = kind == 0 ? ops::attention_flash(q, k, v, c.causal) : ops::attention_naive(q, k, v, c.causal);
    ops::sum(ops::mul(o, dout)).backward();
    results[kind] = {o.to_double_vector(), q.grad().to_double_vector(), k.grad().to_double_vector(),
                     v.grad().to_double_vector()};
  }
  const char* names[] = {"O", "dQ", "dK", "dV"};
  for (int i = 0; i < 4; ++i) EXPECT_LT(rel_error(results[0][i], results[1][i]), 1e-12) << names[i];
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, FlashVsNaive,
    ::testing::Values(AttnCase{1, 1, 1, 64, true}, AttnCase{1, 1, 2, 64, false}, AttnCase{2, 37, 2, 64, true},
                      AttnCase{2, 37, 2, 64, false}, AttnCase{1, 100, 1, 128, true}, AttnCase{1, 100, 1, 128, false},
                      AttnCase{2, 70, 3, 40, true}, AttnCase{2, 70, 3, 40, false}, AttnCase{1, 129, 1, 16, true}));

TEST(FlashAttentionMemory, NoTxTBufferOnTheFlashPath) {
  // T = 2048: a T×T score matrix in f32 would be 16 MiB; Q, K, V, O are 2048·16·4 B = 128 KiB each.
  const int64_t T = 2048, D = 16;
  Shape s = {1, T, 1, D};
  Tensor q = random_tensor(s, 1, DType::f32), k = random_tensor(s, 2, DType::f32), v = random_tensor(s, 3, DType::f32);
  for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
  Tensor dout = random_tensor(s, 4, DType::f32);
  reset_peak_memory(Device::cpu());
  const int64_t before = memory_stats(Device::cpu()).current_total;
  heap_probe::largest = 0;
  heap_probe::active = true;
  {
    Tensor o = ops::attention_flash(q, k, v, true);
    ops::sum(ops::mul(o, dout)).backward();
  }
  heap_probe::active = false;
  MemoryStats m = memory_stats(Device::cpu());
  const int64_t txt = T * T * 4;
  EXPECT_LT(m.largest_allocation, txt / 64) << "a tensor of " << m.largest_allocation << " bytes";
  EXPECT_LT(m.peak_total - before, txt / 8) << "tensor memory grew by " << m.peak_total - before << " bytes";
  EXPECT_LT(int64_t(heap_probe::largest.load()), txt / 64) << "a heap allocation of " << heap_probe::largest.load() << " bytes";

  // The same measurement catches the materialised path, so the check can fail.
  reset_peak_memory(Device::cpu());
  { Tensor o = ops::attention_naive(q, k, v, true); }
  EXPECT_GE(memory_stats(Device::cpu()).largest_allocation, txt);
  // And the heap probe sees a T×T std::vector.
  heap_probe::largest = 0;
  heap_probe::active = true;
  { std::vector<float> scores(static_cast<size_t>(T * T)); }
  heap_probe::active = false;
  EXPECT_GE(int64_t(heap_probe::largest.load()), txt);
}

}  // namespace
}  // namespace tg
