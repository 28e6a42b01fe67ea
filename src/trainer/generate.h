// Text generation and validation loss: the two ways a run looks at its model without training it.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "src/data/loader.h"
#include "src/dist/communicator.h"
#include "src/nn/gpt.h"

namespace tg {

struct SampleOptions {
  int64_t tokens = 200;
  double temperature = 1.0;  // 0 → greedy
  int64_t top_k = 0;         // 0 → the whole vocabulary
  // Nucleus sampling: only the most likely tokens whose probabilities (after temperature and
  // top-k) first sum to at least top_p are drawn from; 1 → all of them.
  double top_p = 1.0;
  uint64_t seed = 1337;
  // Ids from this one on are never drawn: a model's vocabulary padded past its tokenizer's
  // (GPT-2's 50257 to 50304) has ids no text holds and no decoder knows. 0: every id.
  int64_t drawable_ids = 0;
  // Keys and values of the context kept between tokens (GPT::forward_cached): each new token
  // costs one position's work. A RoPE model then keeps its whole context, past max_seq_len;
  // a learned-position model slides its max_seq_len window as without the cache.
  bool kv_cache = true;
  // When set, each token is handed over as soon as it is drawn (streaming) and generate()
  // returns an empty vector instead of keeping them all.
  std::function<void(int32_t)> on_token;
};

// Continues `prompt` by `tokens` tokens, each drawn from the model's distribution at the last
// position (deterministic for a seed), on the model's device. The context is the last
// max_seq_len tokens (without the cache, or with learned positions) or all of them (RoPE with
// the cache). Returns only the new tokens.
std::vector<int32_t> generate(nn::GPT& model, const std::vector<int32_t>& prompt, const SampleOptions& opt);

// Mean loss over `steps` sequential validation batches (all of them when steps <= 0).
// In a data-parallel run (comm with world size W > 1) each rank evaluates `steps` batches of
// its own (the loader deals batches to ranks in turn) and the mean is over all ranks' batches:
// the same windows, and so the same loss, as one process whose batch is W times larger.
double evaluate(nn::GPT& model, DataLoader& val, int64_t steps, dist::Communicator* comm = nullptr);

}  // namespace tg
