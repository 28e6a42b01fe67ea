// The tensor copy engine (TMA) on the GPU, the primitive the attention kernels load with:
// tests/cuda/tma_probe.cu loads two 64 × 64 boxes of a strided bf16 matrix of heads into one
// 128-byte-swizzled shared tile and reads them back through sm90_ptx.cuh's swizzled_offset; each must
// equal the matrix's box, rows past the end and columns past the head's last as zeros.
#include <gtest/gtest.h>

#include "tests/cuda/cuda_test_util.h"

#ifdef TILEGRAD_HAVE_CUDA

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "tests/cuda/tma_probe.h"

namespace tg {
namespace {

using testing::DeviceBytes;

TEST(Tma, SwizzledBoxesMatchTheMatrix) {
  if (!testing::have_gpu()) GTEST_SKIP() << "no CUDA GPU: the sm_90a TMA probe runs on an H100/H200 only";
  // A (100, 192) matrix inside rows of 384 elements, as q sits in a packed (B·T, 3·H·D) qkv
  // buffer, seen as 2 heads of 96 columns; element (r, c) has the raw bits 0x3C00 + (r·192 + c)
  // mod 0x3000: finite bf16 values, distinct over the first 64 rows, NaN between rows (never part
  // of a box).
  const int rows = 100, head_dim = 96, heads = 2, cols = head_dim * heads, stride = 384;
  std::vector<uint16_t> m(size_t(rows) * stride, 0xFFFF);  // NaN between the matrix's rows
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) m[size_t(r) * stride + c] = uint16_t(0x3C00 + ((r * cols + c) % 0x3000));
  DeviceBytes src(m.size() * 2), out0(64 * 64 * 2), out1(64 * 64 * 2);
  CHECK_CUDA(cudaMemcpy(src.p, m.data(), m.size() * 2, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(out0.p, 0xAB, 64 * 64 * 2));
  CHECK_CUDA(cudaMemset(out1.p, 0xAB, 64 * 64 * 2));
  // Box 0: head 1, rows 64-127 (36 rows past the end), its columns 64-127 (32 past the head's
  // last: zeros, not the next head's or row's elements) — the second panel of a head-dim-96 tile.
  // Box 1: head 0, rows 3-66 (a row origin off the 8-row swizzle pattern), columns 0-63, into the
  // same tile on the barrier's next phase.
  const int head[2] = {1, 0}, row0[2] = {64, 3}, col0[2] = {64, 0};
  if (!testing::run_tma_probe(static_cast<const uint16_t*>(src.p), rows, head_dim, heads, stride, head, row0, col0,
                              static_cast<uint16_t*>(out0.p), static_cast<uint16_t*>(out1.p)))
    GTEST_SKIP() << "the GPU is not compute capability 9.0: sm_90a code does not run on it";
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  for (int t = 0; t < 2; ++t) {
    std::vector<uint16_t> got(64 * 64);
    CHECK_CUDA(cudaMemcpy(got.data(), (t == 0 ? out0 : out1).p, got.size() * 2, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int r = 0; r < 64; ++r)
      for (int c = 0; c < 64; ++c) {
        const int mr = row0[t] + r, hc = col0[t] + c;  // the matrix row, the column within the head
        const uint16_t want = mr < rows && hc < head_dim ? m[size_t(mr) * stride + head[t] * head_dim + hc] : uint16_t(0);
        if (got[size_t(r) * 64 + c] != want && bad++ < 5)
          ADD_FAILURE() << "box " << t << " (" << r << ", " << c << "): 0x" << std::hex << got[size_t(r) * 64 + c]
                        << " vs 0x" << want << std::dec;
      }
    EXPECT_EQ(bad, 0) << "box " << t << " differs from the matrix";
  }
}

}  // namespace
}  // namespace tg

#endif  // TILEGRAD_HAVE_CUDA
