// Structured attention masks at the op level: document starts from token ids, the fused flash
// path against the materialised mask (outputs and gradients, in double), no-op masks bit for bit
// equal to plain causal attention, and the errors (bad masks). The GPU's are
// tests/cuda/test_attention_masks_gpu.cpp and tests/cuda/test_flash_attention.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "src/ops/ops.h"
#include "tests/test_util.h"

namespace tg {
namespace {

using testing::bitwise_equal;
using testing::random_tensor;
using testing::rel_error;

template <typename F>
void expect_error(F&& f, std::initializer_list<const char*> fragments) {
  try {
    f();
    ADD_FAILURE() << "expected tg::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* frag : fragments) EXPECT_NE(msg.find(frag), std::string::npos) << msg << "\nmissing: " << frag;
  }
}

std::vector<int32_t> ints(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

// The end-of-text token is the last token of the document it ends; the next token starts a new
// document. A row starts with a document at position 0 (it may be the tail of an earlier one).
TEST(DocumentStarts, EotClosesItsDocument) {
  const int32_t E = 256;
  Tensor ids = Tensor::from_ints({5, E, 7, 8, E, E, 3, 4, /*row 1*/ E, 1, 2, 3, 4, 5, 6, E}, {2, 8});
  EXPECT_EQ(ints(ops::document_starts(ids, E)),
            (std::vector<int32_t>{0, 0, 2, 2, 2, 5, 6, 6, /*row 1*/ 0, 1, 1, 1, 1, 1, 1, 1}));
  // No end-of-text at all: one document per row.
  EXPECT_EQ(ints(ops::document_starts(Tensor::from_ints({1, 2, 3}, {1, 3}), E)), (std::vector<int32_t>{0, 0, 0}));
}

struct MaskedCase {
  int64_t T, window;
  std::vector<int64_t> lengths;  // empty: no documents
};

TEST(AttentionMasks, FlashMatchesMaterialisedInDouble) {
  const std::vector<MaskedCase> cases = {
      {1, 1, {}}, {17, 4, {}}, {70, 33, {}}, {70, 0, {1, 5, 40}}, {129, 0, {1}}, {129, 20, {3, 64, 1, 50}},
  };
  for (const MaskedCase& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " window=" + std::to_string(c.window));
    const Shape s = {2, c.T, 2, 16};
    ops::AttentionMask mask;
    mask.window = c.window;
    if (!c.lengths.empty()) mask.doc_start = testing::document_starts_of_lengths(2, c.T, c.lengths);
    Tensor dout = random_tensor(s, 4);
    std::vector<std::vector<double>> results[2];
    for (int kind = 0; kind < 2; ++kind) {
      Tensor q = random_tensor(s, 1), k = random_tensor(s, 2), v = random_tensor(s, 3);
      for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
      Tensor o = kind == 0 ? ops::attention_flash(q, k, v, true, mask) : ops::attention_naive(q, k, v, true, mask);
      ops::sum(ops::mul(o, dout)).backward();
      results[kind] = {o.to_double_vector(), q.grad().to_double_vector(), k.grad().to_double_vector(),
                       v.grad().to_double_vector()};
    }
    const char* names[] = {"O", "dQ", "dK", "dV"};
    for (int i = 0; i < 4; ++i) EXPECT_LT(rel_error(results[0][i], results[1][i]), 1e-12) << names[i];
  }
}

// self_attention (the model's entry point) with a mask: the fused node against the composite.
TEST(AttentionMasks, SelfAttentionFlashMatchesNaive) {
  const int64_t B = 2, T = 45, C = 32;
  ops::AttentionMask mask;
  mask.window = 9;
  mask.doc_start = testing::document_starts_of_lengths(B, T, {1, 12, 30, 2});
  std::vector<double> out[2], grad[2];
  for (int kind = 0; kind < 2; ++kind) {
    Tensor qkv = random_tensor({B, T, 3 * C}, 7);
    qkv.set_requires_grad(true);
    Tensor y = ops::self_attention(qkv, 4, kind ? ops::AttentionKind::naive : ops::AttentionKind::flash, 100.0, mask);
    ops::sum(ops::mul(y, random_tensor({B, T, C}, 8))).backward();
    out[kind] = y.to_double_vector(), grad[kind] = qkv.grad().to_double_vector();
  }
  EXPECT_LT(rel_error(out[0], out[1]), 1e-12);
  EXPECT_LT(rel_error(grad[0], grad[1]), 1e-12);
}

// A mask that removes nothing (one document per row, a window ≥ T) is the causal op bit for bit.
TEST(AttentionMasks, NoEffectiveMaskIsCausalBitwise) {
  for (DType dt : {DType::f32, DType::f64}) {
    const int64_t T = 77;
    const Shape s = {2, T, 2, 8};
    auto run = [&](const ops::AttentionMask& mask) {
      Tensor q = random_tensor(s, 1, dt), k = random_tensor(s, 2, dt), v = random_tensor(s, 3, dt);
      for (Tensor* t : {&q, &k, &v}) t->set_requires_grad(true);
      Tensor o = ops::attention_flash(q, k, v, true, mask);
      ops::sum(ops::mul(o, random_tensor(s, 4, dt))).backward();
      return std::vector<Tensor>{o, q.grad(), k.grad(), v.grad()};
    };
    const auto base = run({});
    ops::AttentionMask one_doc, wide;
    one_doc.doc_start = Tensor::from_ints(std::vector<int32_t>(size_t(2 * T), 0), {2, T});
    wide.window = T;
    for (const ops::AttentionMask* m : {&one_doc, &wide}) {
      const auto got = run(*m);
      for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(bitwise_equal(got[i], base[i])) << i;
    }
  }
}

TEST(AttentionMasks, BadMasksAreNamed) {
  const Shape s = {1, 4, 1, 2};
  Tensor q = random_tensor(s, 1);
  ops::AttentionMask neg;
  neg.window = -1;
  expect_error([&] { ops::attention_flash(q, q, q, true, neg); }, {"attention_flash", "window -1", "negative"});
  ops::AttentionMask w;
  w.window = 2;
  expect_error([&] { ops::attention_naive(q, q, q, false, w); }, {"attention_naive", "causal"});
  ops::AttentionMask bad;
  bad.doc_start = Tensor::from_ints({0, 0, 3, 2}, {1, 4});  // decreases
  expect_error([&] { ops::attention_flash(q, q, q, true, bad); }, {"document start", "never decrease"});
  bad.doc_start = Tensor::from_ints({0, 2, 2, 2}, {1, 4});  // start after its position
  expect_error([&] { ops::attention_flash(q, q, q, true, bad); }, {"document start 2", "position 1"});
  bad.doc_start = Tensor::from_ints({0, 0, 0}, {1, 3});
  expect_error([&] { ops::attention_flash(q, q, q, true, bad); }, {"document starts must be i32 (1, 4)"});
}

}  // namespace
}  // namespace tg
