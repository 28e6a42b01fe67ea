// The model with structured attention masks: cached decoding with a sliding window equals the
// uncached forward, document masks make a document's logits independent of the documents before
// it, and the fused and composite attention agree under both masks (loss and gradients).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "src/nn/gpt.h"
#include "tests/test_util.h"

namespace tg {
namespace {

nn::GPTConfig small(nn::PosEmbedding pos, int64_t window) {
  nn::GPTConfig c;
  c.n_layer = 2, c.n_head = 2, c.d_model = 16, c.vocab_size = 13, c.max_seq_len = 64, c.pos_embedding = pos;
  c.attention_window = window;
  return c;
}

std::vector<double> forward_logits(nn::GPT& model, const std::vector<int32_t>& ids) {
  return model.forward(Tensor::from_ints(ids, {1, int64_t(ids.size())})).to_double_vector();
}

// The logits of `ids` from the key/value cache: the first `prompt` tokens at once, then one at a time.
std::vector<double> cached_logits(nn::GPT& model, const std::vector<int32_t>& ids, int64_t prompt, nn::KVCache& cache) {
  std::vector<double> out =
      model.forward_cached(Tensor::from_ints(std::vector<int32_t>(ids.begin(), ids.begin() + prompt), {1, prompt}), cache)
          .to_double_vector();
  for (size_t t = size_t(prompt); t < ids.size(); ++t) {
    const std::vector<double> one = model.forward_cached(Tensor::from_ints({ids[t]}, {1, 1}), cache).to_double_vector();
    out.insert(out.end(), one.begin(), one.end());
  }
  return out;
}

// The end-of-text id of the document tests, and a row of four documents packed with it (one of
// them the single token E).
constexpr int32_t E = 12;
const std::vector<int32_t> kPackedDocuments = {1, 2, 3, 4, E, 5, 6, 7, E, E, 8, 9, 10, 11, 1, 2};

double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// Decoding one token at a time after a prompt sees only the last W keys, as the full forward does.
TEST(GPTMasks, CachedDecodingWithAWindowMatchesTheFullForward) {
  for (const nn::PosEmbedding pe : {nn::PosEmbedding::learned, nn::PosEmbedding::rope}) {
    nn::GPT model(small(pe, 5), 3, DType::f64);
    model.set_training(false);
    NoGradGuard no_grad;
    const int64_t n = 40, prompt = 9, V = 13;
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) ids[size_t(t)] = int32_t((t * 7 + 3) % V);
    const std::vector<double> full = forward_logits(model, ids);
    nn::KVCache cache;
    const std::vector<double> cached = cached_logits(model, ids, prompt, cache);
    ASSERT_EQ(cached.size(), full.size());
    EXPECT_LE(max_abs_diff(cached, full), 1e-10);

    // The window matters: the same weights without it give other logits late in the sequence.
    nn::GPT unwindowed(small(pe, 0), 3, DType::f64);
    unwindowed.set_training(false);
    const std::vector<double> plain = forward_logits(unwindowed, ids);
    double diff = 0;
    for (size_t i = size_t((n - 1) * V); i < full.size(); ++i) diff = std::max(diff, std::abs(plain[i] - full[i]));
    EXPECT_GT(diff, 1e-6);
  }
}

// With document masks, decoding one token at a time after a prompt starts each new document's
// keys after the end-of-text token the prompt or the decoding produced, as the full forward does.
TEST(GPTMasks, CachedDecodingWithDocumentsMatchesTheFullForward) {
  for (const int64_t window : {0, 4}) {
    nn::GPT model(small(nn::PosEmbedding::rope, window), 5, DType::f64);
    model.set_document_eot(E);
    model.set_training(false);
    NoGradGuard no_grad;
    const std::vector<int32_t> ids = {1, 2, E, 3, 4, 5, 6, E, 7, 8, 9, E, E, 10, 11, 1, 2, 3, 4, 5};
    const std::vector<double> full = forward_logits(model, ids);
    nn::KVCache cache;
    const std::vector<double> cached = cached_logits(model, ids, 5, cache);
    ASSERT_EQ(cached.size(), full.size());
    EXPECT_LE(max_abs_diff(cached, full), 1e-10) << "window " << window;
    EXPECT_EQ(cache.document_start, 13) << "after the second of two end-of-text tokens in a row";
  }
}

// A small model with document masks on, evaluating.
nn::GPT document_masked_model() {
  nn::GPT model(small(nn::PosEmbedding::learned, 0), 4, DType::f64);
  model.set_document_eot(E);
  model.set_training(false);
  return model;
}

// With document masks, changing a document's tokens (before and including its end-of-text)
// leaves the logits of every later document unchanged, and changes its own.
TEST(GPTMasks, DocumentsDoNotSeeEachOther) {
  nn::GPT model = document_masked_model();
  NoGradGuard no_grad;
  const std::vector<int32_t>& a = kPackedDocuments;
  std::vector<int32_t> b = a;
  b[0] = 9, b[2] = 0, b[3] = 7;  // the first document (positions 0..4, its eot included)
  const std::vector<double> la = forward_logits(model, a), lb = forward_logits(model, b);
  const size_t V = 13;
  for (size_t t = 0; t < a.size(); ++t) {
    double d = 0;
    for (size_t v = 0; v < V; ++v) d = std::max(d, std::abs(la[t * V + v] - lb[t * V + v]));
    if (t >= 5) EXPECT_EQ(d, 0.0) << "position " << t << " of a later document";
    else EXPECT_GT(d, 1e-9) << "position " << t << " of the changed document";
  }
  // Without the mask the change reaches the later documents.
  model.set_document_eot(-1);
  const std::vector<double> ua = forward_logits(model, a), ub = forward_logits(model, b);
  EXPECT_NE(ua[15 * V], ub[15 * V]);
}

// The training loop hands the model its batch's host copy (set_host_ids), so that the document
// starts need no read from the device: they come from that copy, for the next forward only, and
// a copy of another shape is an error.
TEST(GPTMasks, DocumentStartsComeFromTheHostIdsGivenForTheNextForward) {
  nn::GPT model = document_masked_model();
  NoGradGuard no_grad;
  const std::vector<int32_t>& a = kPackedDocuments;
  std::vector<int32_t> other_ends = a;  // the same length, documents ending elsewhere
  other_ends[4] = 3, other_ends[12] = E;
  const std::vector<double> plain = forward_logits(model, a);
  model.set_host_ids(Tensor::from_ints(a, {1, 16}));
  EXPECT_EQ(forward_logits(model, a), plain) << "the same ids given as the host copy";
  model.set_host_ids(Tensor::from_ints(other_ends, {1, 16}));
  EXPECT_NE(forward_logits(model, a), plain) << "the starts must come from the host copy given";
  EXPECT_EQ(forward_logits(model, a), plain) << "the host copy is for one forward only";
  model.set_host_ids(Tensor::from_ints(std::vector<int32_t>(8, 1), {1, 8}));
  EXPECT_THROW(forward_logits(model, a), Error);
}

TEST(GPTMasks, FlashNaiveAndRecomputedAgreeUnderMasks) {
  nn::GPTConfig c = small(nn::PosEmbedding::rope, 6);
  nn::GPT flash(c, 5, DType::f64), recomputed(c, 5, DType::f64);
  c.attention = ops::AttentionKind::naive;
  nn::GPT naive(c, 5, DType::f64);
  recomputed.set_recompute(true);
  for (nn::GPT* m : {&flash, &naive, &recomputed}) m->set_document_eot(12);
  std::vector<int32_t> ids(2 * 40), tgt(2 * 40);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 5 + i / 7) % 13), tgt[i] = int32_t((i * 3 + 1) % 13);
  const Tensor x = Tensor::from_ints(ids, {2, 40}), y = Tensor::from_ints(tgt, {2, 40});
  Tensor lf = flash.loss(x, y), ln = naive.loss(x, y), lr = recomputed.loss(x, y);
  EXPECT_NEAR(lf.item(), ln.item(), 1e-12);
  EXPECT_EQ(lf.item(), lr.item());
  lf.backward(), ln.backward(), lr.backward();
  const auto gf = flash.params().flat_grads().to_double_vector();
  EXPECT_LT(testing::rel_error(gf, naive.params().flat_grads().to_double_vector()), 1e-11);
  EXPECT_LT(testing::rel_error(gf, recomputed.params().flat_grads().to_double_vector()), 1e-12);
}

}  // namespace
}  // namespace tg
