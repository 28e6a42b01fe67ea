// The sm_90a wgmma primitives (kernels/cuda/flash_attention/sm90_ptx.cuh, wgmma.cuh) on the GPU: descriptors,
// the 128-byte swizzle, both operand majors and both A sources, and the accumulator and A
// register layouts, against products computed on the CPU in double.
#include <gtest/gtest.h>

#include "tests/cuda/cuda_test_util.h"

#ifdef TILEGRAD_HAVE_CUDA

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "src/nn/parameters.h"
#include "src/tensor/dtype.h"
#include "tests/cuda/wgmma_probe.h"

namespace tg {
namespace {

constexpr int kN = 64;

std::vector<uint16_t> random_bf16(uint64_t seed, size_t n = kN * kN) {
  std::vector<uint16_t> bits(n);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = float_to_bf16(float(nn::normal_from(seed, 0, i))).bits;
  return bits;
}

double value(uint16_t bits) { return double(bf16_to_float(bf16{bits})); }

using testing::DeviceBytes;

TEST(Wgmma, ProductsMatchTheCpu) {
  if (!testing::have_gpu()) GTEST_SKIP() << "no CUDA GPU: the sm_90a wgmma probe runs on an H100/H200 only";
  const auto a = random_bf16(1), b = random_bf16(2), v = random_bf16(3), v2 = random_bf16(4, 2 * kN * kN);
  DeviceBytes da(a.size() * 2), db(b.size() * 2), dv(v.size() * 2), dv2(v2.size() * 2);
  DeviceBytes ds(kN * kN * sizeof(float)), dout(kN * kN * sizeof(float)), dout2(2 * kN * kN * sizeof(float));
  DeviceBytes dout3(96 * kN * sizeof(float));
  CHECK_CUDA(cudaMemcpy(da.p, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(db.p, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv.p, v.data(), v.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemcpy(dv2.p, v2.data(), v2.size() * 2, cudaMemcpyHostToDevice));
  for (DeviceBytes* out : {&ds, &dout})  // NaN: every element must be written
    CHECK_CUDA(cudaMemset(out->p, 0xFF, kN * kN * sizeof(float)));
  CHECK_CUDA(cudaMemset(dout2.p, 0xFF, 2 * kN * kN * sizeof(float)));
  CHECK_CUDA(cudaMemset(dout3.p, 0xFF, 96 * kN * sizeof(float)));
  auto u16 = [](DeviceBytes& d) { return static_cast<const uint16_t*>(d.p); };
  auto f32 = [](DeviceBytes& d) { return static_cast<float*>(d.p); };
  if (!testing::run_wgmma_probe(u16(da), u16(db), u16(dv), u16(dv2), f32(ds), f32(dout), f32(dout2), f32(dout3)))
    GTEST_SKIP() << "the GPU is not compute capability 9.0: sm_90a code does not run on it";
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> s(kN * kN), o(kN * kN), o2(2 * kN * kN), o3(96 * kN);
  CHECK_CUDA(cudaMemcpy(s.data(), ds.p, s.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(o.data(), dout.p, o.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(o2.data(), dout2.p, o2.size() * sizeof(float), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(o3.data(), dout3.p, o3.size() * sizeof(float), cudaMemcpyDeviceToHost));

  // fp32 accumulation of 64 exact bf16 products: agreement to ~1e-5 of Σ|a|·max|b| per element.
  auto check = [&](const char* what, const std::vector<float>& got, int cols, auto ref_of) {
    int bad = 0;
    for (int i = 0; i < kN; ++i)
      for (int j = 0; j < cols; ++j) {
        double mag = 0;
        for (int k = 0; k < kN; ++k) mag += std::fabs(value(a[i * kN + k]));
        const double ref = ref_of(i, j), tol = 4e-5 * mag * 5;  // |b|, |v| < 5
        if (!(std::fabs(got[size_t(i * cols + j)] - ref) <= tol) && bad++ < 5)
          ADD_FAILURE() << what << " at (" << i << ", " << j << "): " << got[size_t(i * cols + j)] << " vs " << ref;
      }
    EXPECT_EQ(bad, 0) << "wrong elements of " << what;
  };
  check("S = A Bᵀ (K-major shared-memory operands)", s, kN, [&](int i, int j) {
    double r = 0;
    for (int k = 0; k < kN; ++k) r += value(a[i * kN + k]) * value(b[j * kN + k]);
    return r;
  });
  check("O = A V (A in registers, V MN-major)", o, kN, [&](int i, int j) {
    double r = 0;
    for (int k = 0; k < kN; ++k) r += value(a[i * kN + k]) * value(v[k * kN + j]);
    return r;
  });
  check("O = A V at N = 128 (two MN-major panels)", o2, 2 * kN, [&](int i, int j) {
    double r = 0;
    for (int k = 0; k < kN; ++k) r += value(a[i * kN + k]) * value(v2[k * 2 * kN + j]);
    return r;
  });
  check("O = A V at N = 96 (one MN-major panel and half of the next)", o3, 96, [&](int i, int j) {
    double r = 0;
    for (int k = 0; k < kN; ++k) r += value(a[i * kN + k]) * value(v2[k * 2 * kN + j]);
    return r;
  });
}

}  // namespace
}  // namespace tg

#endif  // TILEGRAD_HAVE_CUDA
