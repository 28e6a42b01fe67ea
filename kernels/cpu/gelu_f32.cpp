// GELU over float, built twice: for any x86-64 CPU and for x86-64-v3 (AVX2), the second chosen
// at load time where the CPU has it (GCC's target_clones). The default binaries otherwise stop at
// SSE2's four lanes, and GELU is the largest elementwise cost of a CPU training step
// (docs/performance.md, "CPU"). Contraction into FMA is off in this file (CMakeLists.txt), so
// both builds compute every element with the same operations and round alike: the results do not
// depend on the CPU.
#include "kernels/cpu/elementwise.h"

namespace tg::cpu {
namespace {

// The parallel loop stays outside the cloned functions: OpenMP outlines a parallel loop's body
// into a function of its own, which target_clones would not reach.
constexpr int64_t kChunk = 1 << 14;

// f(begin, length) over [0, n) in chunks of kChunk, shared among the OpenMP threads.
template <typename F>
void for_each_chunk(int64_t n, F&& f) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for if (n > kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) f(c * kChunk, std::min(kChunk, n - c * kChunk));
}

__attribute__((target_clones("arch=x86-64-v3", "default")))
void gelu_forward_span(const float* x, float* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = gelu_value(x[i]);
}

__attribute__((target_clones("arch=x86-64-v3", "default")))
void gelu_backward_span(const float* x, const float* dout, float* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dx[i] = gelu_derivative(x[i]) * dout[i];
}

}  // namespace

void gelu_forward_f32(const float* x, float* out, int64_t n) {
  for_each_chunk(n, [&](int64_t begin, int64_t len) { gelu_forward_span(x + begin, out + begin, len); });
}

void gelu_backward_f32(const float* x, const float* dout, float* dx, int64_t n) {
  for_each_chunk(n, [&](int64_t begin, int64_t len) { gelu_backward_span(x + begin, dout + begin, dx + begin, len); });
}

}  // namespace tg::cpu
