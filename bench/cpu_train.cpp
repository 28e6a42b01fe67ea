// Benchmark (not a test): training-step throughput of nanoGPT's CPU model (4 layers, 4 heads,
// d 128, T 64, batch 12, byte vocabulary) on the CPU, the figure compared with PyTorch's.
// Usage: cpu_train [steps=100] [warmup=10] [text file for real tokens, else random tokens]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <omp.h>

#include "kernels/cpu/dropout.h"
#include "src/nn/gpt.h"
#include "src/optim/adamw.h"

int main(int argc, char** argv) {
  using namespace tg;
  const int steps = argc > 1 ? std::atoi(argv[1]) : 100;
  const int warmup = argc > 2 ? std::atoi(argv[2]) : 10;
  std::string text;
  if (argc > 3) {
    std::ifstream f(argv[3], std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  const int64_t B = 12, T = 64;
  nn::GPTConfig c;
  c.n_layer = 4; c.n_head = 4; c.d_model = 128; c.vocab_size = 256; c.max_seq_len = T;
  nn::GPT model(c, 1337);
  optim::AdamW opt(model.params(), {0.9, 0.99, 1e-8, 0.1});
  std::vector<int32_t> ids(size_t(B * T)), tgt(size_t(B * T));
  auto fill = [&](int step) {
    for (int64_t b = 0; b < B; ++b) {
      size_t start = text.size() > size_t(T + 1) ? cpu::hash64(uint64_t(step * B + b)) % (text.size() - size_t(T) - 1) : 0;
      for (int64_t t = 0; t < T; ++t) {
        size_t i = size_t(b * T + t);
        ids[i] = text.empty() ? int32_t(cpu::hash64(uint64_t(step) * 7919 + i) % 256) : (unsigned char)text[start + size_t(t)];
        tgt[i] = text.empty() ? int32_t(cpu::hash64(uint64_t(step) * 7919 + i + 1) % 256) : (unsigned char)text[start + size_t(t) + 1];
      }
    }
  };
  double loss = 0;
  auto run = [&](int n, int offset) {
    for (int s = 0; s < n; ++s) {
      fill(offset + s);
      model.params().zero_grad();
      Tensor l = model.loss(Tensor::from_ints(ids, {B, T}), Tensor::from_ints(tgt, {B, T}));
      l.backward();
      optim::clip_grad_norm(model.params(), 1.0);
      opt.step(1e-3);
      loss = l.item();
    }
  };
  run(warmup, 0);
  auto t0 = std::chrono::steady_clock::now();
  run(steps, warmup);
  double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("tilegrad cpu_train: params %lld threads %d steps %d time %.2fs ms/step %.2f tokens/s %.0f loss %.3f\n",
              (long long)model.params().numel(), omp_get_max_threads(), steps, dt, 1000 * dt / steps,
              double(steps) * B * T / dt, loss);
  return 0;
}
