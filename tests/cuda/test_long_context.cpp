// Long context on the GPU. The chunked LM head and loss at GPT-2's vocabulary: as accurate as the
// unchunked path (linear, then cross_entropy) against the CPU, bitwise repeatable, and holding
// only a chunk of logits; a bf16 GPT whose loss goes through it tracks one whose loss does not.
// Recomputed blocks: the same loss bit for bit and the same gradients up to bf16 rounding, in
// less memory.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "src/nn/gpt.h"
#include "src/ops/ops.h"
#include "src/tensor/memory.h"
#include "src/tensor/offload.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/test_util.h"

namespace tg {
namespace {

using testing::rel_norm;

struct Result {
  double loss;
  std::vector<double> dx, dw;
  Tensor raw_loss, raw_dx, raw_dw;
};

// chunk < 0: the composite cross_entropy(linear(x, W)); else the chunked op. Upstream gradient 0.75.
Result run(const Tensor& x_host, const Tensor& w_host, const Tensor& targets, int64_t chunk, Device d, DType dt) {
  Tensor x = x_host.to(d).to(dt), w = w_host.to(d).to(dt);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  Tensor loss = chunk < 0 ? ops::cross_entropy(ops::linear(x, w, Tensor()), targets)
                          : ops::linear_cross_entropy(x, w, targets, chunk);
  ops::scale(loss, 0.75).backward();
  return {loss.item(), x.grad().to_double_vector(), w.grad().to_double_vector(), loss, x.grad(), w.grad()};
}

TEST(LinearCrossEntropyGpu, Gpt2VocabularyAsAccurateAsTheUnchunkedPath) {
  REQUIRE_GPU();
  const int64_t N = 1024, C = 256, V = 50304, chunk = 384;  // chunks of 384, 384 and 256 rows
  // Inputs rounded through bf16, so both sides see the same values; logits of spread about 1.
  const Tensor x = testing::random_tensor({N, C}, 1, DType::f32).to(DType::bf16).to(DType::f32);
  const Tensor w = testing::random_tensor({V, C}, 2, DType::f32, 0.06).to(DType::bf16).to(DType::f32);
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) t[size_t(n)] = n % 10 == 3 ? -1 : int32_t((n * 7919) % V);
  const Tensor targets = Tensor::from_ints(t, {N});
  const Result ref = run(x, w, targets, -1, Device::cpu(), DType::f32);

  // fp32 on the GPU: the same sums, tightly.
  const Result f32 = run(x, w, targets, chunk, Device::cuda(0), DType::f32);
  EXPECT_NEAR(f32.loss, ref.loss, 1e-5 * ref.loss);
  EXPECT_LT(rel_norm(f32.dx, ref.dx), 1e-4);
  EXPECT_LT(rel_norm(f32.dw, ref.dw), 1e-4);

  // bf16: within 1.5× the unchunked bf16 path's error (and it is small in itself).
  const Result whole = run(x, w, targets, -1, Device::cuda(0), DType::bf16);
  const Result chunked = run(x, w, targets, chunk, Device::cuda(0), DType::bf16);
  const double e_loss = std::abs(whole.loss - ref.loss) / ref.loss, c_loss = std::abs(chunked.loss - ref.loss) / ref.loss;
  const double e_dx = rel_norm(whole.dx, ref.dx), c_dx = rel_norm(chunked.dx, ref.dx);
  const double e_dw = rel_norm(whole.dw, ref.dw), c_dw = rel_norm(chunked.dw, ref.dw);
  std::printf("bf16 relative errors, unchunked / chunked: loss %.2e / %.2e, dx %.2e / %.2e, dW %.2e / %.2e\n",
              e_loss, c_loss, e_dx, c_dx, e_dw, c_dw);
  EXPECT_LT(c_loss, 1.5 * e_loss + 1e-4);
  EXPECT_LT(c_dx, 1.5 * e_dx + 1e-3);
  EXPECT_LT(c_dw, 1.5 * e_dw + 1e-3);
  EXPECT_LT(c_dx, 2e-2);
  EXPECT_LT(c_dw, 2e-2);

  // Bitwise repeatable.
  const Result again = run(x, w, targets, chunk, Device::cuda(0), DType::bf16);
  EXPECT_TRUE(testing::bitwise_equal(again.raw_loss, chunked.raw_loss));
  EXPECT_TRUE(testing::bitwise_equal(again.raw_dx, chunked.raw_dx));
  EXPECT_TRUE(testing::bitwise_equal(again.raw_dw, chunked.raw_dw));
}

TEST(LinearCrossEntropyGpu, HoldsOnlyAChunkOfLogits) {
  REQUIRE_GPU();
  const int64_t N = 2048, C = 128, V = 50304, chunk = 128;
  const Device d = Device::cuda(0);
  const Tensor x = testing::random_tensor({N, C}, 3, DType::f32);
  const Tensor w = testing::random_tensor({V, C}, 4, DType::f32, 0.05);
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) t[size_t(n)] = int32_t((n * 104729) % V);
  const Tensor targets = Tensor::from_ints(t, {N});
  const int64_t logits_bytes = N * V * 2;  // bf16
  auto peak_of = [&](int64_t c) {
    reset_peak_memory(d);
    run(x, w, targets, c, d, DType::bf16);
    return memory_stats(d);
  };
  const MemoryStats whole = peak_of(-1), chunked = peak_of(chunk);
  std::printf("peak above the start: unchunked %s, chunked %s; largest allocation %s / %s\n",
              format_bytes(whole.peak_total - whole.current_total).c_str(),
              format_bytes(chunked.peak_total - chunked.current_total).c_str(),
              format_bytes(whole.largest_allocation).c_str(), format_bytes(chunked.largest_allocation).c_str());
  EXPECT_GE(whole.largest_allocation, logits_bytes);
  EXPECT_LE(chunked.largest_allocation, V * C * 4);  // the fp32 dW sum, the largest buffer left
  EXPECT_LT(chunked.peak_total - chunked.current_total, whole.peak_total - whole.current_total - logits_bytes);
}

TEST(LinearCrossEntropyGpu, Bf16ModelWithAChunkedHeadTracksTheUnchunkedOne) {
  REQUIRE_GPU();
  nn::GPTConfig c;
  c.n_layer = 2; c.n_head = 4; c.d_model = 128; c.vocab_size = 5003; c.max_seq_len = 64;
  nn::GPT whole(c, 11, DType::f32, Device::cuda(0), DType::bf16), chunked(c, 11, DType::f32, Device::cuda(0), DType::bf16);
  chunked.set_lm_head_chunk(100);  // 4 × 64 = 256 rows: chunks of 100, 100, 56
  std::vector<int32_t> a(256), b(256);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = int32_t((i * 31 + 7) % 5003);
    b[i] = int32_t((i * 57 + 3) % 5003);
  }
  const Tensor ids = Tensor::from_ints(a, {4, 64}).to(Device::cuda(0)), tgt = Tensor::from_ints(b, {4, 64}).to(Device::cuda(0));
  Tensor lw = whole.loss(ids, tgt), lc = chunked.loss(ids, tgt);
  EXPECT_NEAR(lc.item(), lw.item(), 2e-3 * lw.item());
  lw.backward();
  lc.backward();
  EXPECT_LT(rel_norm(chunked.params().flat_grads().to_double_vector(), whole.params().flat_grads().to_double_vector()),
            2e-2);
}

// Asking for more than the GPU has is a tg::OutOfMemory naming the device and what to change, and
// it is not sticky: the next allocation and kernel work.
TEST(OutOfMemoryGpu, IsAClearErrorAndNotSticky) {
  REQUIRE_GPU();
  const Device d = Device::cuda(0);
  const int64_t before = memory_stats(d).current_total;
  try {
    Tensor::empty({int64_t(1) << 38}, DType::f32, d);  // 1 TiB
    ADD_FAILURE() << "no error";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("out of memory on cuda:0: allocating 1024.00 GiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("train.lm_head_chunk"), std::string::npos) << msg;
  }
  EXPECT_EQ(memory_stats(d).current_total, before);
  Tensor x = testing::random_tensor({64, 64}, 1, DType::f32).to(d);
  EXPECT_NEAR(ops::sum(ops::scale(x, 2.0)).item(), 2.0 * ops::sum(x).item(), 1e-3);
}

TEST(RecomputeGpu, Bf16ModelGivesTheSameLossAndGradientsInLessMemory) {
  REQUIRE_GPU();
  nn::GPTConfig c;
  c.n_layer = 4; c.n_head = 4; c.d_model = 128; c.vocab_size = 512; c.max_seq_len = 512;
  const Device d = Device::cuda(0);
  std::vector<int32_t> a(4 * 512), b(4 * 512);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = int32_t((i * 31 + 7) % 512);
    b[i] = int32_t((i * 57 + 3) % 512);
  }
  const Tensor ids = Tensor::from_ints(a, {4, 512}).to(d), tgt = Tensor::from_ints(b, {4, 512}).to(d);
  auto run = [&](bool recompute, double* loss, int64_t* peak) {
    auto model = std::make_unique<nn::GPT>(c, 12, DType::f32, d, DType::bf16);
    model->set_recompute(recompute);
    reset_peak_memory(d);
    const int64_t start = memory_stats(d).current_total;
    Tensor l = model->loss(ids, tgt);
    l.backward();
    *loss = l.item();
    *peak = memory_stats(d).peak_total - start;
    return model->params().flat_grads().to_double_vector();
  };
  double lk = 0, lr = 0;
  int64_t pk = 0, pr = 0;
  const std::vector<double> gk = run(false, &lk, &pk), gr = run(true, &lr, &pr);
  std::printf("peak above the parameters: kept %s, recomputed %s\n", format_bytes(pk).c_str(), format_bytes(pr).c_str());
  EXPECT_EQ(lr, lk);  // the same kernels on the same values
  // The backward differs only in rounding: a recomputed block's input gradient is its LayerNorm's
  // dx rounded to bf16 and then added to the residual's, where the kept graph adds the two inside
  // the LayerNorm kernel in fp32 (3.1e-3 over 4 layers on the H200; in f64 on the CPU the two
  // agree to 1e-12, tests/nn/test_gpt.cpp).
  EXPECT_LT(rel_norm(gr, gk), 1e-2);
  EXPECT_LT(pr, pk * 3 / 4);
}

TEST(RecomputeGpu, PiecesAndOffloadedInputsKeepTheLossAndLowerThePeak) {
  // Recomputed bf16 blocks three ways: as they are, with the token-wise parts in pieces of 128
  // positions (RoPE rotating each piece from its own position), and with the block inputs parked
  // in host memory as well. The loss is the same bit for bit where the kernels are (offloading
  // copies values, it changes no arithmetic), and within bf16 rounding where the pieces' GEMMs
  // see fewer rows; each lever lowers the peak by what docs/memory.md says it saves.
  REQUIRE_GPU();
  nn::GPTConfig c;
  c.n_layer = 4; c.n_head = 4; c.d_model = 128; c.vocab_size = 512; c.max_seq_len = 512;
  c.pos_embedding = nn::PosEmbedding::rope;
  const Device d = Device::cuda(0);
  std::vector<int32_t> a(2 * 1024), b(2 * 1024);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = int32_t((i * 31 + 7) % 512);
    b[i] = int32_t((i * 57 + 3) % 512);
  }
  const Tensor ids = Tensor::from_ints(a, {2, 1024}).to(d), tgt = Tensor::from_ints(b, {2, 1024}).to(d);
  struct Run {
    double loss;
    int64_t peak;
    std::vector<double> grads;
  };
  auto run = [&](int64_t rows, bool offload) {
    auto model = std::make_unique<nn::GPT>(c, 12, DType::f32, d, DType::bf16);
    model->set_recompute(true);
    model->set_recompute_rows(rows);
    model->set_offload_activations(offload);
    model->set_lm_head_chunk(256);
    reset_peak_memory(d);
    const int64_t start = memory_stats(d).current_total;
    Tensor l = model->loss(ids, tgt);
    l.backward();
    Run r{l.item(), memory_stats(d).peak_total - start, model->params().flat_grads().to_double_vector()};
    EXPECT_EQ(parked_bytes(), 0) << "every parked input is released by the backward";
    return r;
  };
  const Run whole = run(0, false), pieces = run(128, false), parked = run(128, true), parked_whole = run(0, true);
  std::printf("peak above the parameters: whole %s, pieces %s, pieces + offload %s, offload %s\n",
              format_bytes(whole.peak).c_str(), format_bytes(pieces.peak).c_str(), format_bytes(parked.peak).c_str(),
              format_bytes(parked_whole.peak).c_str());
  EXPECT_EQ(parked.loss, pieces.loss);
  EXPECT_EQ(parked.grads, pieces.grads);
  EXPECT_EQ(parked_whole.loss, whole.loss);
  EXPECT_EQ(parked_whole.grads, whole.grads);
  EXPECT_NEAR(pieces.loss, whole.loss, 2e-3 * std::fabs(whole.loss));
  EXPECT_LT(rel_norm(pieces.grads, whole.grads), 1e-2);
  const int64_t unit = 2 * 1024 * 128 * 2;  // one (B·T, C) bf16 activation
  EXPECT_LT(pieces.peak, whole.peak - 8 * unit);
  EXPECT_LT(parked.peak, pieces.peak - 2 * unit);
  EXPECT_EQ(parked_bytes_peak(), 4 * unit) << "the four block inputs, parked at once";
}

}  // namespace
}  // namespace tg
