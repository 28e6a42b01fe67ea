// ops::mlp's GPU node against the two ops it stands for (what it is on the CPU), linear_gelu then
// linear: the same forward bit for bit; the same gradients bit for bit in fp32, where its backward
// runs their kernels; close, and reproducible, in bf16, where it forms GELU's derivative in
// cuBLASLt's DGELU epilogue instead. (The op table and the GPU parity table check it against the
// definition: tests/op_specs.h.)
#include <gtest/gtest.h>

#include "src/ops/ops.h"
#include "tests/test_util.h"

namespace tg {
namespace {

using testing::bitwise_equal;
using testing::random_tensor;
using testing::rel_error;

struct MlpRun {
  Tensor out;
  std::vector<Tensor> grads;  // x, w_fc, b_fc, w_proj, b_proj (the biases' undefined without them)
};

// GPT's MLP at C = 64 on 96 rows (4C = 256: bf16 on the GPU takes the DGELU epilogue), as one op
// or as the two; backpropagates Σ out ∘ W.
MlpRun run(bool as_one_op, bool with_bias, Device device, DType dtype) {
  const std::vector<Shape> shapes = {{4, 24, 64}, {256, 64}, {256}, {64, 256}, {64}};
  std::vector<Tensor> in;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Tensor t = random_tensor(shapes[i], 40 + i, DType::f32, i == 0 ? 1.0 : 0.1).to(device);
    if (dtype != DType::f32) t = t.to(dtype);
    t.set_requires_grad(true);
    in.push_back(t);
  }
  const Tensor b_fc = with_bias ? in[2] : Tensor(), b_proj = with_bias ? in[4] : Tensor();
  MlpRun r;
  r.out = as_one_op ? ops::mlp(in[0], in[1], b_fc, in[3], b_proj)
                    : ops::linear(ops::linear_gelu(in[0], in[1], b_fc), in[3], b_proj);
  Tensor w = random_tensor(r.out.shape(), 7, DType::f32).to(device);
  if (dtype != DType::f32) w = w.to(dtype);
  ops::sum(ops::mul(r.out, w)).backward();
  for (size_t i = 0; i < in.size(); ++i) r.grads.push_back((with_bias || (i != 2 && i != 4)) ? in[i].grad() : Tensor());
  return r;
}

const char* kInputs[] = {"x", "w_fc", "b_fc", "w_proj", "b_proj"};

void expect_bitwise_equal(const MlpRun& a, const MlpRun& b, const std::string& what) {
  EXPECT_TRUE(bitwise_equal(a.out, b.out)) << what << ": output";
  for (size_t i = 0; i < a.grads.size(); ++i) {
    ASSERT_EQ(a.grads[i].defined(), b.grads[i].defined()) << what << ": gradient of " << kInputs[i];
    if (a.grads[i].defined()) {
      EXPECT_TRUE(bitwise_equal(a.grads[i], b.grads[i])) << what << ": gradient of " << kInputs[i];
    }
  }
}

TEST(Mlp, MatchesLinearGeluThenLinearOnTheGpu) {
#ifndef TILEGRAD_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine";
  const Device gpu = Device::cuda(0);
  for (bool bias : {true, false}) {
    const std::string what = bias ? "with biases" : "without biases";
    expect_bitwise_equal(run(true, bias, gpu, DType::f32), run(false, bias, gpu, DType::f32), "f32 " + what);
    // bf16: dpre from the epilogue is gelu'(pre)·(g·w_proj) with the product in fp32, where the two
    // ops round g·w_proj to bf16 first; the forward is the same calls.
    const MlpRun one = run(true, bias, gpu, DType::bf16), again = run(true, bias, gpu, DType::bf16),
              two = run(false, bias, gpu, DType::bf16);
    expect_bitwise_equal(one, again, "bf16 " + what + ", run twice");
    EXPECT_TRUE(bitwise_equal(one.out, two.out)) << "bf16 " << what << ": output";
    // cuBLASLt has a DGELU algorithm at these sizes (CudaGemm.Dgelu* require it at GPT-2's).
    EXPECT_FALSE(bitwise_equal(one.grads[0], two.grads[0]))
        << "bf16 " << what << ": dx is the two ops' bit for bit, so the DGELU epilogue did not run";
    for (size_t i = 0; i < one.grads.size(); ++i) {
      if (!one.grads[i].defined()) continue;
      EXPECT_LT(rel_error(one.grads[i].to_double_vector(), two.grads[i].to_double_vector()), 2e-2)
          << "bf16 " << what << ": gradient of " << kInputs[i];
    }
  }
#endif
}

}  // namespace
}  // namespace tg
