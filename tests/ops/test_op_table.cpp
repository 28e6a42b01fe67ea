// The op table: every op's forward against an independent double-precision reference (in f64
// tightly, in f32 loosely) and its backward against central finite differences in f64. The cases
// are the op specification's (tests/op_specs.h), which also feeds the GPU parity tables.
#include <gtest/gtest.h>

#include <set>

#include "src/ops/gradcheck.h"
#include "tests/op_specs.h"
#include "tests/test_util.h"

namespace tg {
namespace {

using testing::OpSpec;
using testing::random_tensor;
using testing::rel_error;
using testing::Vec;
using OpCase = OpSpec;

// Every entry has GPU rows or says why not, and every name is taken once: a new op without a GPU
// row fails here, on any machine.
TEST(OpSpecs, EveryOpHasAGpuRowOrSaysWhy) {
  std::set<std::string> names, gpu_names;
  for (const OpSpec& s : testing::op_specs()) {
    EXPECT_TRUE(names.insert(s.name).second) << "two entries named " << s.name;
    EXPECT_NE(s.gpu.empty(), s.no_gpu.empty()) << s.name << ": GPU rows or a reason why there are none, not both";
    EXPECT_GT(s.tol_f32, 0) << s.name;
    EXPECT_TRUE(s.op && s.reference) << s.name;
    for (const testing::GpuSample& g : s.gpu) {
      EXPECT_TRUE(gpu_names.insert(g.name).second) << "two GPU rows named " << g.name;
      EXPECT_TRUE(g.op) << g.name;
      EXPECT_FALSE(g.inputs.empty()) << g.name;
      EXPECT_GT(g.tol_f32, 0) << g.name;
      EXPECT_GE(g.tol_bf16, g.tol_f32) << g.name;
    }
  }
  EXPECT_GE(gpu_names.size(), 30u);  // the parity table's rows
}

class OpTable : public ::testing::TestWithParam<OpCase> {};

std::vector<Tensor> make_inputs(const OpCase& c, DType dtype) {
  std::vector<Tensor> xs;
  for (size_t i = 0; i < c.inputs.size(); ++i) xs.push_back(random_tensor(c.inputs[i], 100 + i, dtype));
  return xs;
}

TEST_P(OpTable, ForwardMatchesDoubleReference) {
  const OpCase& c = GetParam();
  std::vector<Vec> host;
  for (const Tensor& x : make_inputs(c, DType::f64)) host.push_back(x.to_double_vector());
  Vec expected = c.reference(host);
  Vec got64 = c.op(make_inputs(c, DType::f64)).to_double_vector();
  EXPECT_LT(rel_error(got64, expected), 1e-12) << c.name << " in f64";
  Tensor out32 = c.op(make_inputs(c, DType::f32));
  EXPECT_EQ(out32.dtype(), DType::f32);
  EXPECT_LT(rel_error(out32.to_double_vector(), expected), c.tol_f32) << c.name << " in f32";
}

TEST_P(OpTable, BackwardMatchesFiniteDifferences) {
  const OpCase& c = GetParam();
  std::vector<Tensor> xs = make_inputs(c, DType::f64);
  for (Tensor& x : xs) x.set_requires_grad(true);
  GradCheckResult r = gradcheck(c.op, xs);
  EXPECT_TRUE(r.ok) << c.name << ": " << r.detail << " (max abs error " << r.max_abs_error << ")";
}

INSTANTIATE_TEST_SUITE_P(Ops, OpTable, ::testing::ValuesIn(testing::op_specs()),
                         [](const ::testing::TestParamInfo<OpCase>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n) if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace tg
