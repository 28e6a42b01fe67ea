// Sampling (temperature, top-k, top-p) and deterministic validation loss.
#include "src/trainer/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cpu/dropout.h"

namespace tg {

namespace {
// Restores the model's training flag when leaving scope.
struct EvalMode {
  nn::GPT& m;
  bool was;
  explicit EvalMode(nn::GPT& model) : m(model), was(model.training()) { m.set_training(false); }
  ~EvalMode() { m.set_training(was); }
};
}  // namespace

std::vector<int32_t> generate(nn::GPT& model, const std::vector<int32_t>& prompt, const SampleOptions& opt) {
  TG_CHECK(opt.temperature >= 0, "sample: temperature must be ≥ 0, got ", opt.temperature);
  TG_CHECK(opt.top_k >= 0, "sample: top-k must be ≥ 0, got ", opt.top_k);
  TG_CHECK(opt.top_p > 0 && opt.top_p <= 1, "sample: top-p must be in (0, 1], got ", opt.top_p);
  TG_CHECK(opt.tokens >= 0, "sample: the number of tokens must be ≥ 0, got ", opt.tokens);
  NoGradGuard no_grad;
  EvalMode eval(model);
  const int64_t V = model.config().vocab_size, window = model.config().max_seq_len;
  TG_CHECK(opt.drawable_ids >= 0, "sample: drawable_ids must be ≥ 0, got ", opt.drawable_ids);
  const int64_t drawable = opt.drawable_ids > 0 ? std::min(opt.drawable_ids, V) : V;
  std::vector<int32_t> seq = prompt;
  if (seq.empty()) seq.push_back(int32_t('\n' < V ? '\n' : 0));  // an empty prompt starts at a line break
  std::vector<int32_t> out;
  const bool learned = model.config().pos_embedding == nn::PosEmbedding::learned;
  nn::KVCache cache;
  // The logits at the last position of seq, whose last token the model has not seen yet.
  auto last_logits = [&]() -> std::vector<double> {
    Tensor logits;  // (1, n, V)
    if (!opt.kv_cache) {
      const int64_t n = std::min<int64_t>(int64_t(seq.size()), window);
      logits = model.forward(Tensor::from_ints(std::vector<int32_t>(seq.end() - n, seq.end()), {1, n}));
    } else if (cache.length == 0 || (learned && cache.length + 1 > window)) {
      // The prompt, or a learned-position model whose window slid: (re)fill the cache.
      const int64_t n = learned ? std::min<int64_t>(int64_t(seq.size()), window) : int64_t(seq.size());
      cache.clear();
      logits = model.forward_cached(Tensor::from_ints(std::vector<int32_t>(seq.end() - n, seq.end()), {1, n}), cache);
    } else {
      logits = model.forward_cached(Tensor::from_ints({seq.back()}, {1, 1}), cache);
    }
    const int64_t n = logits.size(1);
    return Tensor::view_of(logits, (n - 1) * V, {V}).to_double_vector();
  };
  for (int64_t i = 0; i < opt.tokens; ++i) {
    std::vector<double> l = last_logits();
    int32_t next;
    if (opt.temperature == 0) {
      next = int32_t(std::max_element(l.begin(), l.begin() + drawable) - l.begin());
    } else {
      std::vector<int32_t> idx(static_cast<size_t>(drawable));
      std::iota(idx.begin(), idx.end(), 0);
      int64_t k = opt.top_k > 0 ? std::min(opt.top_k, drawable) : drawable;
      // Highest logits first; ties by id so the order is deterministic.
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                        [&](int32_t a, int32_t b) { return l[size_t(a)] > l[size_t(b)] || (l[size_t(a)] == l[size_t(b)] && a < b); });
      double mx = l[size_t(idx[0])], z = 0;
      std::vector<double> p(static_cast<size_t>(k));
      for (int64_t j = 0; j < k; ++j) z += p[size_t(j)] = std::exp((l[size_t(idx[size_t(j)])] - mx) / opt.temperature);
      if (opt.top_p < 1) {  // the nucleus: the shortest run of the most likely holding top_p of the mass
        const double target = opt.top_p * z;
        double mass = 0;
        int64_t kept = 0;
        while (kept < k && mass < target) mass += p[size_t(kept++)];
        k = kept, z = mass;
      }
      double u = double(cpu::uniform_from(opt.seed, uint64_t(i))) * z, acc = 0;
      next = idx[size_t(k - 1)];
      for (int64_t j = 0; j < k; ++j) {
        acc += p[size_t(j)];
        if (u < acc) { next = idx[size_t(j)]; break; }
      }
    }
    seq.push_back(next);
    if (opt.on_token) opt.on_token(next);
    else out.push_back(next);
    // Only the last max_seq_len tokens are ever read again (the cache holds a RoPE model's
    // whole context): keep the token list bounded.
    if (int64_t(seq.size()) > 2 * window) seq.erase(seq.begin(), seq.end() - window);
  }
  return out;
}

double evaluate(nn::GPT& model, DataLoader& val, int64_t steps, dist::Communicator* comm) {
  NoGradGuard no_grad;
  EvalMode eval(model);
  const int64_t B = val.batch_size(), T = val.seq_len();
  const int64_t available = val.num_sequential_batches();
  TG_CHECK(available > 0, "validation data (", val.files().size(), " file(s), ", val.total_tokens(),
           " tokens) is too small for one batch of ", B, " × ", T, " tokens; use more validation data or a smaller batch");
  const int64_t W = comm ? comm->world_size() : 1;
  const int64_t n = steps > 0 ? std::min(steps, available) : available;
  std::vector<int32_t> x(static_cast<size_t>(B * T)), y(static_cast<size_t>(B * T));
  val.reset_sequential();
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    val.next_sequential_batch(x.data(), y.data());
    total += model.loss(Tensor::from_ints(x, {B, T}), Tensor::from_ints(y, {B, T})).item();
  }
  if (W > 1) {
    const std::vector<double> sum = comm->all_reduce_values({total, double(n)}, dist::ReduceOp::sum, "validation loss");
    return sum[0] / sum[1];
  }
  return total / double(n);
}

}  // namespace tg
