// Bad input: shape, dtype and device mismatches and unsupported options throw tg::Error with a
// message naming the op and the shapes.
#include <gtest/gtest.h>

#include "src/nn/gpt.h"
#include "src/ops/ops.h"
#include "src/tensor/memory.h"
#include "tests/test_util.h"

namespace tg {
namespace {

using testing::random_tensor;

// Runs f, expects tg::Error, and checks that every fragment appears in the message.
template <typename F>
void expect_error(F&& f, std::initializer_list<const char*> fragments) {
  try {
    f();
    ADD_FAILURE() << "expected tg::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const char* frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << "'" << frag << "' not in: " << msg;
  }
}

TEST(BadInput, ShapeMismatches) {
  Tensor a = random_tensor({2, 3}, 1), b = random_tensor({3, 2}, 2);
  expect_error([&] { ops::add(a, b); }, {"add", "[3, 2]", "[2, 3]"});
  expect_error([&] { ops::mul(a, b); }, {"mul", "[2, 3]", "[3, 2]"});
  expect_error([&] { ops::linear(a, random_tensor({4, 5}, 3), Tensor()); }, {"linear", "[2, 3]", "[4, 5]"});
  expect_error([&] { ops::linear(a, random_tensor({4, 3}, 3), random_tensor({5}, 4)); }, {"linear", "bias", "[5]"});
  Tensor w_fc = random_tensor({4, 3}, 3), b_fc = random_tensor({4}, 4);
  expect_error([&] { ops::mlp(a, random_tensor({4, 5}, 3), b_fc, random_tensor({3, 4}, 5), Tensor()); },
               {"mlp", "[2, 3]", "[4, 5]"});
  expect_error([&] { ops::mlp(a, w_fc, b_fc, random_tensor({3, 5}, 5), Tensor()); }, {"mlp", "w_proj", "[3, 5]", "[4, 3]"});
  expect_error([&] { ops::mlp(a, w_fc, b_fc, random_tensor({3, 4}, 5), random_tensor({4}, 6)); },
               {"mlp", "b_proj", "[4]", "[3, 4]"});
  expect_error([&] { ops::mlp(a, w_fc, b_fc, Tensor(), Tensor()); }, {"mlp", "w_proj", "undefined"});
  expect_error([&] { ops::matmul(random_tensor({2, 3, 4}, 1), random_tensor({2, 5, 6}, 2)); }, {"matmul", "4 vs 5"});
  expect_error([&] { ops::layernorm(a, random_tensor({4}, 5), Tensor()); }, {"layernorm", "[4]", "[2, 3]"});
  expect_error([&] { ops::transpose12(a); }, {"transpose12", "4-D", "[2, 3]"});
  expect_error([&] { ops::reshape(a, {4, 2}); }, {"reshape", "[4, 2]"});
  expect_error([&] { ops::slice_last(a, 2, 2); }, {"slice_last", "[2, 4)"});
  Tensor q = random_tensor({1, 4, 2, 8}, 1);
  expect_error([&] { ops::attention_flash(q, random_tensor({1, 5, 2, 8}, 2), q, true); }, {"attention_flash", "[1, 5, 2, 8]"});
  expect_error([&] { ops::rope(random_tensor({1, 4, 2, 7}, 1)); }, {"rope", "even", "[1, 4, 2, 7]"});
}

TEST(BadInput, DtypeMismatches) {
  Tensor a64 = random_tensor({2, 3}, 1), a32 = random_tensor({2, 3}, 1, DType::f32);
  expect_error([&] { ops::add(a64, a32); }, {"add", "dtype mismatch", "f64[2, 3]", "f32[2, 3]"});
  Tensor ints = Tensor::from_ints({1, 2}, {2});
  expect_error([&] { ops::gelu(ints); }, {"gelu", "unsupported dtype i32"});
  expect_error([&] { ops::embedding(random_tensor({5, 3}, 1), a64); }, {"embedding", "ids must be i32"});
  expect_error([&] { ops::cross_entropy(random_tensor({3, 5}, 1), Tensor::from_ints({1, 2}, {2})); },
               {"cross_entropy", "targets", "[3, 5]"});
}

TEST(BadInput, OutOfRangeIndicesAndOptions) {
  expect_error([&] { ops::embedding(random_tensor({5, 3}, 1), Tensor::from_ints({1, 7}, {2})); },
               {"embedding", "id 7", "position 1", "5 rows"});
  expect_error([&] { ops::cross_entropy(random_tensor({2, 5}, 1), Tensor::from_ints({1, 9}, {2})); },
               {"cross_entropy", "target 9", "row 1"});
  expect_error([&] { ops::dropout(random_tensor({4}, 1), 1.5, 1); }, {"dropout", "1.5"});
  expect_error([&] { nn::parse_attention("sparse"); }, {"sparse", "flash or naive"});
  expect_error([&] { nn::parse_pos_embedding("alibi"); }, {"alibi", "learned or rope"});
  nn::GPTConfig c;
  c.d_model = 30; c.n_head = 4;
  expect_error([&] { nn::GPT m(c, 1); }, {"d_model 30", "n_head 4"});
}

// Running out of memory is a tg::OutOfMemory that names the device, the request, what tilegrad
// holds and what to change, and charges nothing (2^60 bytes: more than any machine maps).
TEST(BadInput, OutOfMemorySaysWhatRanOutAndWhatToChange) {
  const int64_t before = memory_stats(Device::cpu()).current_total;
  EXPECT_THROW(Tensor::empty({int64_t(1) << 58}, DType::f32), OutOfMemory);
  expect_error([] { Tensor::empty({int64_t(1) << 58}, DType::f32); },
               {"out of memory on cpu", "allocating 1073741824.00 GiB", "tilegrad holds", "train.recompute"});
  EXPECT_EQ(memory_stats(Device::cpu()).current_total, before);
}

TEST(BadInput, DeviceMismatchIsNamed) {
#ifndef TILEGRAD_HAVE_CUDA
  expect_error([&] { Tensor::empty({2}, DType::f32, Device::cuda(0)); }, {"cuda:0", "without CUDA"});
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine: a GPU tensor cannot be made";
  Tensor a = random_tensor({2, 3}, 1, DType::f32), b = random_tensor({2, 3}, 2, DType::f32).to(Device::cuda(0));
  expect_error([&] { ops::add(a, b); }, {"add", "device mismatch", "on cpu", "on cuda:0"});
  expect_error([&] { ops::linear(b, a, Tensor()); }, {"linear", "device mismatch"});
  expect_error([&] { ops::attention_flash(b.view({1, 2, 1, 3}), a.view({1, 2, 1, 3}), b.view({1, 2, 1, 3}), true); },
               {"attention_flash", "device mismatch"});
#endif
}

}  // namespace
}  // namespace tg
