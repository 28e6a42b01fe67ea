// Whole-model tests: names and init, gradients, overfitting one batch, determinism.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "kernels/cpu/dropout.h"
#include "src/nn/gpt.h"
#include "src/optim/adamw.h"
#include "tests/test_util.h"

namespace tg {
namespace {

nn::GPTConfig tiny(nn::PosEmbedding pos = nn::PosEmbedding::learned) {
  nn::GPTConfig c;
  c.n_layer = 2; c.n_head = 2; c.d_model = 16; c.vocab_size = 11; c.max_seq_len = 8; c.pos_embedding = pos;
  return c;
}

std::pair<Tensor, Tensor> batch(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  std::vector<int32_t> ids(size_t(B * T)), tgt(size_t(B * T));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = int32_t(cpu::hash64(seed * 1000003 + i) % uint64_t(V));
    tgt[i] = int32_t(cpu::hash64((seed + 1) * 1000003 + i) % uint64_t(V));
  }
  return {Tensor::from_ints(ids, {B, T}), Tensor::from_ints(tgt, {B, T})};
}

TEST(GPT, HuggingFaceNamesShapesAndInit) {
  nn::GPT model(tiny(), 1);
  const auto& ps = model.params();
  EXPECT_EQ(ps.get("transformer.wte.weight").shape(), (Shape{11, 16}));
  EXPECT_EQ(ps.get("transformer.wpe.weight").shape(), (Shape{8, 16}));
  EXPECT_EQ(ps.get("transformer.h.1.attn.c_attn.weight").shape(), (Shape{48, 16}));
  EXPECT_EQ(ps.get("transformer.h.1.mlp.c_proj.weight").shape(), (Shape{16, 64}));
  EXPECT_TRUE(ps.has("transformer.ln_f.bias"));
  EXPECT_FALSE(ps.has("lm_head.weight"));  // tied to wte
  // 12·L·C² + 13·L·C (blocks with biases) + V·C + T·C + 2·C.
  EXPECT_EQ(ps.numel(), 12 * 2 * 16 * 16 + 13 * 2 * 16 + 11 * 16 + 8 * 16 + 2 * 16);
  // GPT-2 init: residual projections have std 0.02/√(2·n_layer).
  nn::GPTConfig big = tiny();
  big.d_model = 256; big.n_head = 4;
  nn::GPT m2(big, 1);
  auto std_of = [](const Tensor& t) {
    double s = 0;
    for (double v : t.to_double_vector()) s += v * v;
    return std::sqrt(s / double(t.numel()));
  };
  EXPECT_NEAR(std_of(m2.params().get("transformer.h.0.mlp.c_fc.weight")), 0.02, 0.001);
  EXPECT_NEAR(std_of(m2.params().get("transformer.h.0.mlp.c_proj.weight")), 0.01, 0.0005);
  EXPECT_EQ(m2.params().get("transformer.h.0.ln_1.weight").to_double_vector()[0], 1.0);
  EXPECT_EQ(m2.params().get("transformer.h.0.ln_1.bias").to_double_vector()[0], 0.0);
}

TEST(GPT, NoBiasModelHasNoBiases) {
  nn::GPTConfig c = tiny();
  c.bias = false;
  nn::GPT model(c, 1);
  for (const auto& p : model.params().all()) EXPECT_EQ(p.name.find(".bias"), std::string::npos) << p.name;
}

TEST(GPT, ModelGradientsMatchFiniteDifferences) {
  // The whole model in double: a few parameter elements against central differences.
  for (auto pos : {nn::PosEmbedding::learned, nn::PosEmbedding::rope}) {
    nn::GPTConfig c = tiny(pos);
    c.n_layer = 1;
    nn::GPT model(c, 3, DType::f64);
    auto [ids, tgt] = batch(2, 5, 11, 9);
    model.loss(ids, tgt).backward();
    Tensor flat = model.params().flat_values();
    Tensor grads = model.params().flat_grads().clone();
    double* p = flat.data<double>();
    NoGradGuard ng;
    for (int64_t i = 0; i < flat.numel(); i += 37) {
      double saved = p[i], eps = 1e-5;
      p[i] = saved + eps;
      double plus = model.loss(ids, tgt).item();
      p[i] = saved - eps;
      double minus = model.loss(ids, tgt).item();
      p[i] = saved;
      EXPECT_NEAR(grads.data<double>()[i], (plus - minus) / (2 * eps), 1e-7) << "flat element " << i;
    }
  }
}

TEST(GPT, FlashAndNaiveModelsAgree) {
  nn::GPTConfig c = tiny();
  nn::GPT flash(c, 5, DType::f64);
  c.attention = ops::AttentionKind::naive;
  nn::GPT naive(c, 5, DType::f64);
  auto [ids, tgt] = batch(3, 8, 11, 2);
  Tensor lf = flash.loss(ids, tgt), ln = naive.loss(ids, tgt);
  EXPECT_NEAR(lf.item(), ln.item(), 1e-12);
  lf.backward();
  ln.backward();
  EXPECT_LT(testing::rel_error(flash.params().flat_grads().to_double_vector(),
                               naive.params().flat_grads().to_double_vector()), 1e-11);
}

TEST(GPT, ChunkedLmHeadGivesTheSameLossAndGradients) {
  // 3 × 8 = 24 rows of logits in chunks of 5 (the last one ragged) against all at once; the
  // tied wte gets its gradient from both the embedding and the head.
  nn::GPT whole(tiny(), 6, DType::f64), chunked(tiny(), 6, DType::f64);
  chunked.set_lm_head_chunk(5);
  EXPECT_EQ(chunked.lm_head_chunk(), 5);
  auto [ids, tgt] = batch(3, 8, 11, 3);
  Tensor lw = whole.loss(ids, tgt), lc = chunked.loss(ids, tgt);
  EXPECT_NEAR(lc.item(), lw.item(), 1e-13);
  lw.backward();
  lc.backward();
  EXPECT_LT(testing::rel_error(chunked.params().flat_grads().to_double_vector(),
                               whole.params().flat_grads().to_double_vector()), 1e-12);
  EXPECT_THROW(chunked.set_lm_head_chunk(-1), Error);
}

TEST(GPT, RecomputedBlocksGiveTheSameLossAndGradients) {
  // With dropout, so the second run of each block must draw the forward's masks again.
  for (double dropout : {0.0, 0.2}) {
    nn::GPTConfig c = tiny();
    c.dropout = dropout;
    nn::GPT kept(c, 8, DType::f64), recomputed(c, 8, DType::f64);
    recomputed.set_recompute(true);
    recomputed.set_lm_head_chunk(7);  // with the chunked head, as a long-context run has them
    auto [ids, tgt] = batch(2, 8, 11, 5);
    Tensor lk = kept.loss(ids, tgt), lr = recomputed.loss(ids, tgt);
    EXPECT_NEAR(lr.item(), lk.item(), 1e-13) << "dropout " << dropout;
    lk.backward();
    lr.backward();
    EXPECT_LT(testing::rel_error(recomputed.params().flat_grads().to_double_vector(),
                                 kept.params().flat_grads().to_double_vector()), 1e-12)
        << "dropout " << dropout;
  }
}

TEST(GPT, BlocksInPiecesGiveTheSameLossAndGradients) {
  // The token-wise parts in pieces of 3 positions (the last one ragged; pieces restart at each
  // sequence of the batch), recomputed or not, learned and rotary positions (RoPE rotates each
  // piece from its own first position), and a document mask: float64, so any piece's error shows.
  for (nn::PosEmbedding pos : {nn::PosEmbedding::learned, nn::PosEmbedding::rope})
    for (bool recompute : {false, true}) {
      nn::GPT whole(tiny(pos), 8, DType::f64), pieces(tiny(pos), 8, DType::f64);
      pieces.set_recompute_rows(3);
      pieces.set_recompute(recompute);
      for (nn::GPT* m : {&whole, &pieces}) m->set_document_eot(2);
      auto [ids, tgt] = batch(2, 8, 11, 5);
      Tensor lw = whole.loss(ids, tgt), lp = pieces.loss(ids, tgt);
      EXPECT_NEAR(lp.item(), lw.item(), 1e-13) << "recompute " << recompute;
      lw.backward();
      lp.backward();
      EXPECT_LT(testing::rel_error(pieces.params().flat_grads().to_double_vector(),
                                   whole.params().flat_grads().to_double_vector()), 1e-12)
          << "recompute " << recompute;
      NoGradGuard no_grad;  // inference in pieces too
      whole.set_training(false), pieces.set_training(false);
      EXPECT_LT(testing::rel_error(pieces.forward(ids).to_double_vector(), whole.forward(ids).to_double_vector()), 1e-13);
    }
  nn::GPTConfig c = tiny();
  c.dropout = 0.1;
  nn::GPT with_dropout(c, 1);
  with_dropout.set_recompute_rows(4);
  auto [ids, tgt] = batch(1, 8, 11, 5);
  EXPECT_THROW(with_dropout.loss(ids, tgt), Error);
  EXPECT_THROW(with_dropout.set_recompute_rows(-1), Error);
}

TEST(GPT, RopeModelRunsPastMaxSeqLen) {
  nn::GPT rope(tiny(nn::PosEmbedding::rope), 1);
  auto [ids, tgt] = batch(1, 20, 11, 4);  // 20 > max_seq_len 8
  EXPECT_TRUE(std::isfinite(rope.loss(ids, tgt).item()));
  nn::GPT learned(tiny(), 1);
  EXPECT_THROW(learned.loss(ids, tgt), Error);
}

double train_steps(nn::GPT& model, const Tensor& ids, const Tensor& tgt, int steps, std::vector<double>* losses) {
  optim::AdamW opt(model.params(), {0.9, 0.95, 1e-8, 0.0});
  double loss = 0;
  for (int s = 0; s < steps; ++s) {
    model.params().zero_grad();
    Tensor l = model.loss(ids, tgt);
    l.backward();
    optim::clip_grad_norm(model.params(), 1.0);
    opt.step(3e-3);
    loss = l.item();
    if (losses) losses->push_back(loss);
  }
  return loss;
}

TEST(GPT, OverfitsOneBatchInSeconds) {
  nn::GPTConfig c;
  c.n_layer = 2; c.n_head = 2; c.d_model = 32; c.vocab_size = 32; c.max_seq_len = 16;
  nn::GPT model(c, 1);
  auto [ids, tgt] = batch(4, 16, 32, 1);
  auto start = std::chrono::steady_clock::now();
  double loss = train_steps(model, ids, tgt, 300, nullptr);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(loss, 0.1) << "after 300 steps";
  EXPECT_LT(seconds, 30.0);
}

TEST(GPT, SameSeedGivesBitwiseEqualLosses) {
  nn::GPTConfig c = tiny();
  c.dropout = 0.1;  // dropout masks come from the seed too
  std::vector<double> a, b;
  auto [ids, tgt] = batch(2, 8, 11, 3);
  nn::GPT m1(c, 42), m2(c, 42);
  train_steps(m1, ids, tgt, 20, &a);
  train_steps(m2, ids, tgt, 20, &b);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i;
  EXPECT_TRUE(testing::bitwise_equal(m1.params().flat_values(), m2.params().flat_values()));
  nn::GPT m3(c, 43);
  std::vector<double> d;
  train_steps(m3, ids, tgt, 1, &d);
  EXPECT_NE(d[0], a[0]);
}

}  // namespace
}  // namespace tg
