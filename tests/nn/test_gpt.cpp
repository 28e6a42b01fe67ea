// Whole-model tests: names and init, gradients, overfitting one batch, determinism.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <sstream>

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

// Random small configurations — head dims 1 to 9 (even with RoPE), sequences of 1 to 19 positions, vocabularies
// of 2 to 40, windows and document masks, the chunked head, recomputed blocks and blocks in pieces,
// all drawn together — against the plain model of the same configuration and weights (the
// materialised attention, nothing chunked or recomputed), in float64: the same loss and gradients;
// and decoding one token at a time through the key/value cache gives the full forward's logits.
// The fixed-shape tests above check each feature alone; this checks them in combination and at
// the sizes where index arithmetic breaks (one position, one head dim, a window past T).
TEST(GPT, RandomConfigurationsAgreeWithThePlainModel) {
  for (uint64_t trial = 0; trial < 60; ++trial) {
    auto draw = [&, k = uint64_t(0)](int64_t lo, int64_t hi) mutable {  // uniform in [lo, hi]
      return lo + int64_t(cpu::hash64(trial * 7919 + k++) % uint64_t(hi - lo + 1));
    };
    nn::GPTConfig c;
    c.n_layer = draw(1, 2);
    c.n_head = draw(1, 3);
    c.pos_embedding = draw(0, 1) ? nn::PosEmbedding::rope : nn::PosEmbedding::learned;
    // RoPE rotates pairs of a head's columns: its head dims are even.
    c.d_model = c.n_head * (c.pos_embedding == nn::PosEmbedding::rope ? 2 * draw(1, 4) : draw(1, 9));
    c.vocab_size = draw(2, 40);
    const int64_t B = draw(1, 3), T = draw(1, 19);
    c.max_seq_len = c.pos_embedding == nn::PosEmbedding::learned ? T + draw(0, 3) : draw(1, 4);
    c.bias = draw(0, 3) != 0;
    c.attention_window = draw(0, 2) ? 0 : draw(1, T + 2);
    const int32_t eot = draw(0, 1) ? int32_t(draw(0, c.vocab_size - 1)) : -1;
    const int64_t chunk = draw(0, 1) ? draw(1, B * T + 1) : 0, pieces = draw(0, 1) ? draw(1, T + 1) : 0;
    const bool recompute = draw(0, 1);
    std::ostringstream what;
    what << "trial " << trial << ": layers " << c.n_layer << ", heads " << c.n_head << " × " << c.d_model / c.n_head
         << ", V " << c.vocab_size << ", B " << B << ", T " << T << ", " << (c.pos_embedding == nn::PosEmbedding::rope ? "rope" : "learned")
         << ", bias " << c.bias << ", window " << c.attention_window << ", eot " << eot << ", chunk " << chunk
         << ", pieces " << pieces << ", recompute " << recompute;
    SCOPED_TRACE(what.str());

    nn::GPT model(c, trial + 1, DType::f64);
    model.set_lm_head_chunk(chunk);
    model.set_recompute_rows(pieces);
    model.set_recompute(recompute);
    model.set_document_eot(eot);
    nn::GPTConfig plain_config = c;
    plain_config.attention = ops::AttentionKind::naive;
    nn::GPT plain(plain_config, trial + 1, DType::f64);
    plain.set_document_eot(eot);
    auto [ids, tgt] = batch(B, T, c.vocab_size, trial);
    Tensor l = model.loss(ids, tgt), lp = plain.loss(ids, tgt);
    ASSERT_TRUE(std::isfinite(l.item()));
    EXPECT_NEAR(l.item(), lp.item(), 1e-12);
    l.backward();
    lp.backward();
    EXPECT_LT(testing::rel_error(model.params().flat_grads().to_double_vector(),
                                 plain.params().flat_grads().to_double_vector()), 1e-11);

    // The first row decoded token by token from a prompt of one or more tokens.
    NoGradGuard no_grad;
    model.set_training(false);
    std::vector<int32_t> row(static_cast<size_t>(T));  // batch()'s first row
    for (size_t i = 0; i < row.size(); ++i) row[i] = int32_t(cpu::hash64(trial * 1000003 + i) % uint64_t(c.vocab_size));
    const std::vector<double> full = model.forward(Tensor::from_ints(row, {1, T})).to_double_vector();
    const int64_t prompt = draw(1, T);
    nn::KVCache cache;
    std::vector<double> decoded =
        model.forward_cached(Tensor::from_ints(std::vector<int32_t>(row.begin(), row.begin() + prompt), {1, prompt}), cache)
            .to_double_vector();
    for (int64_t t = prompt; t < T; ++t) {
      const std::vector<double> one = model.forward_cached(Tensor::from_ints({row[size_t(t)]}, {1, 1}), cache).to_double_vector();
      decoded.insert(decoded.end(), one.begin(), one.end());
    }
    EXPECT_LT(testing::rel_error(decoded, full), 1e-12);
  }
}

}  // namespace
}  // namespace tg
