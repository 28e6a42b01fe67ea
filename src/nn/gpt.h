// The GPT model: token (+ learned position or RoPE) embeddings, n_layer pre-LayerNorm blocks
// of causal self-attention and a GELU MLP, a final LayerNorm and an LM head tied to wte.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "src/nn/parameters.h"
#include "src/ops/ops.h"

namespace tg::nn {

enum class PosEmbedding { learned, rope };

struct GPTConfig {
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t d_model = 128;
  int64_t vocab_size = 256;
  int64_t max_seq_len = 64;  // size of the learned position table; RoPE has no cap
  PosEmbedding pos_embedding = PosEmbedding::learned;
  ops::AttentionKind attention = ops::AttentionKind::flash;
  bool bias = true;       // biases in every Linear and LayerNorm
  double dropout = 0.0;
  double rope_base = 10000.0;
  int64_t attention_window = 0;  // sliding window (keys i − W < j ≤ i); 0: full causal
};

// The keys and values of the tokens a model has seen, per layer, for decoding one token at a
// time (GPT::forward_cached): each layer's rotated keys and values, token-major (capacity, H, D).
struct KVCache {
  std::vector<Tensor> k, v;
  int64_t length = 0;    // tokens cached: the next token's position
  int64_t document_start = 0;  // with document masks: the first position of the document being decoded
  int64_t capacity = 0;  // tokens the buffers hold before they grow
  void clear() { k.clear(), v.clear(), length = capacity = document_start = 0; }
};

class GPT {
 public:
  // Parameters are kept in `dtype` (the master copy: f32, or f64 for gradient checks);
  // activations and matmuls run in `compute` (bf16 for mixed precision on the GPU): a forward
  // reads the parameters in `compute` (ParameterStore::compute_values: one conversion, or the
  // copy the optimizer's update wrote), and the cast's backward brings gradients back to `dtype`.
  GPT(const GPTConfig& config, uint64_t seed, DType dtype = DType::f32, Device device = Device::cpu(),
      std::optional<DType> compute = std::nullopt);  // default: the same as dtype

  Device device() const { return device_; }
  DType compute_dtype() const { return compute_; }

  // ids (B, T) i32 → logits (B, T, V).
  Tensor forward(const Tensor& ids);
  // Inference with a key/value cache: ids (1, n) at positions cache.length… → logits (1, n, V),
  // and their keys and values appended to the cache. On an empty cache this is forward() (the
  // prompt, n ≥ 1); after it, n = 1: the token attends to the cached keys, so a token costs one
  // position's work instead of the whole context's.
  Tensor forward_cached(const Tensor& ids, KVCache& cache);
  // Mean cross-entropy of next-token prediction; targets (B, T) i32, −1 ignored.
  Tensor loss(const Tensor& ids, const Tensor& targets);
  // rows > 0: loss() makes the logits `rows` rows at a time (ops::linear_cross_entropy), so the
  // (B·T, V) logits never exist whole; 0 (the default): forward() then cross_entropy.
  void set_lm_head_chunk(int64_t rows);
  int64_t lm_head_chunk() const { return lm_head_chunk_; }
  // true: each block keeps only its input for the backward, which runs the block again
  // (tg::checkpoint) — activations of one block at a time instead of all n_layer, for about
  // one more forward of the blocks. The same loss bit for bit and the same gradients (in bf16 up
  // to rounding: a block's input gradient is rounded once more before the residual's is added).
  void set_recompute(bool on) { recompute_ = on; }
  // rows > 0: the token-wise parts of every block — the LayerNorms, the projections, RoPE, the
  // MLP and the residual adds — run `rows` positions at a time, each piece again in the backward
  // (tg::checkpoint_rows): a block holds its qkv, attention output and residual (five units)
  // instead of all its intermediates (eighteen and more), for one more forward of those parts.
  // With recompute this is what lets a recomputed block at a million tokens fit beside the rest;
  // inference runs in pieces too. Needs model.dropout 0 when training. 0 (the default): whole.
  void set_recompute_rows(int64_t rows);
  int64_t recompute_rows() const { return recompute_rows_; }
  // true (with recompute): each recomputed block's input is parked in page-locked host memory
  // from its forward until its backward (tg::checkpoint's offload_inputs); a no-op on the CPU.
  void set_offload_activations(bool on) { offload_activations_ = on; }
  // Document masks: with an end-of-text id ≥ 0, each forward computes per-row document starts
  // from its ids (ops::document_starts) and tokens attend only within their document; −1: off.
  void set_document_eot(int32_t eot) { document_eot_ = eot; }
  int32_t document_eot() const { return document_eot_; }
  // The host copy of the next forward's ids, where the caller has one (the training loop's
  // prefetched batch): its document starts are computed from it, not from ids read back from the
  // device, which would make the host wait for the GPU every step. Used by that forward only.
  void set_host_ids(Tensor host_ids) { host_ids_ = std::move(host_ids); }
  bool recompute() const { return recompute_; }

  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }
  const GPTConfig& config() const { return config_; }
  ParameterStore& params() { return params_; }
  const ParameterStore& params() const { return params_; }

  // Dropout draws a fresh mask per forward from (seed, forward counter, site); the counter
  // is part of the training state that checkpoints save. Row b of a batch draws the mask of row
  // first_row + b of a larger batch: data-parallel ranks set their micro-batch's first global
  // row, so a row's mask does not depend on how a global batch is split across ranks.
  uint64_t dropout_counter() const { return dropout_counter_; }
  void set_dropout_counter(uint64_t c) { dropout_counter_ = c; }
  void set_dropout_first_row(int64_t row) { dropout_first_row_ = row; }

 private:
  // ids → (the final LayerNorm's output (B, T, C), wte in the compute dtype): all but the LM head.
  std::pair<Tensor, Tensor> features(const Tensor& ids, KVCache* cache = nullptr);
  Tensor block(const Tensor& x, int64_t layer);  // a whole block (what recomputation runs again)
  // A block's two residual branches from its input x and LayerNorm 1's output h1: the attention
  // branch already added (x1 = x + attention) and the MLP's output; the block's output is
  // x1 + mlp + mlp_bias. With biases_at_residual (no dropout between a projection and its residual
  // add), the two output projections' biases are added with the residual (ops::add_layernorm's
  // b_bias) instead of in their GEMMs, and mlp_bias is the MLP's, for the caller's add; otherwise
  // mlp_bias is undefined.
  struct Branches {
    Tensor x1, mlp, mlp_bias;
  };
  Branches block_branches(const Tensor& x, const Tensor& h1, int64_t layer, KVCache* cache, bool biases_at_residual);
  // Causal self-attention of a block with the cache: stores the new keys and values, attends.
  Tensor cached_attention(const Tensor& qkv, int64_t layer, KVCache& cache);
  Tensor recomputed_block(const Tensor& x, int64_t layer);  // block() under tg::checkpoint
  Tensor block_in_pieces(const Tensor& x, int64_t layer);   // block() under tg::checkpoint_rows
  Tensor p(const std::string& name) const;      // the parameter in the compute dtype
  Tensor maybe(const std::string& name) const;  // same, undefined when the model has no such parameter
  // p() and maybe() from a given compute copy: for closures that outlive forward().
  Tensor param_of(const Tensor& compute, const std::string& name) const;
  Tensor maybe_of(const Tensor& compute, const std::string& name) const;
  Tensor dropout(const Tensor& x, uint64_t site);
  Tensor positions(int64_t first, int64_t T);  // the position ids first … first+T−1

  GPTConfig config_;
  ParameterStore params_;
  uint64_t seed_;
  Device device_;
  DType compute_;
  Tensor compute_values_;  // during forward(): the flat parameter buffer in the compute dtype
  uint64_t dropout_counter_ = 0;
  int64_t dropout_first_row_ = 0;
  bool training_ = true;
  int64_t lm_head_chunk_ = 0;
  bool recompute_ = false;
  int64_t recompute_rows_ = 0;
  bool offload_activations_ = false;
  int32_t document_eot_ = -1;
  Tensor host_ids_;  // set_host_ids: the next forward's ids on the host
  ops::AttentionMask mask_;  // during forward(): the window and this batch's document starts
  // The ids 0 … max_seq_len−1 on the model's device, made at the first pass with learned
  // positions; positions() hands out views of it (a recorded step reads them at a fixed address).
  Tensor position_ids_;
};

// Parses "learned"/"rope" and "flash"/"naive" (errors list the choices).
PosEmbedding parse_pos_embedding(const std::string& s);
ops::AttentionKind parse_attention(const std::string& s);

}  // namespace tg::nn
