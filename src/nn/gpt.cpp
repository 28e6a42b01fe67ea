// GPT forward pass, built from ops so that autograd derives the backward.
#include "src/nn/gpt.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/dropout.h"

namespace tg::nn {

namespace {
constexpr double kLayerNormEps = 1e-5;  // GPT-2's, ops::layernorm's default

std::string layer_name(int64_t i, const std::string& rest) {
  return "transformer.h." + std::to_string(i) + "." + rest;
}
}  // namespace

PosEmbedding parse_pos_embedding(const std::string& s) {
  if (s == "learned") return PosEmbedding::learned;
  if (s == "rope") return PosEmbedding::rope;
  TG_CHECK(false, "unknown position embedding '", s, "': expected learned or rope");
  return PosEmbedding::learned;
}

ops::AttentionKind parse_attention(const std::string& s) {
  if (s == "flash") return ops::AttentionKind::flash;
  if (s == "naive") return ops::AttentionKind::naive;
  TG_CHECK(false, "unknown attention '", s, "': expected flash or naive");
  return ops::AttentionKind::flash;
}

GPT::GPT(const GPTConfig& c, uint64_t seed, DType dtype, Device device, std::optional<DType> compute)
    : config_(c), seed_(seed), device_(device), compute_(compute.value_or(dtype)) {
  TG_CHECK(c.n_layer >= 1 && c.n_head >= 1 && c.d_model >= 1 && c.vocab_size >= 1 && c.max_seq_len >= 1,
           "GPT: n_layer, n_head, d_model, vocab_size and max_seq_len must be positive");
  TG_CHECK(c.d_model % c.n_head == 0, "GPT: d_model ", c.d_model, " is not divisible by n_head ", c.n_head);
  TG_CHECK(c.pos_embedding != PosEmbedding::rope || (c.d_model / c.n_head) % 2 == 0,
           "GPT: RoPE needs an even head dimension, got ", c.d_model / c.n_head);
  TG_CHECK(c.dropout >= 0.0 && c.dropout < 1.0, "GPT: dropout ", c.dropout, " is outside [0, 1)");
  TG_CHECK(c.attention_window >= 0, "GPT: attention_window ", c.attention_window, " is negative (0: full causal)");
  const int64_t C = c.d_model;
  // GPT-2 initialisation: N(0, 0.02); residual projections scaled by 1/√(2·n_layer).
  const double residual_std = 0.02 / std::sqrt(2.0 * double(c.n_layer));
  params_.declare("transformer.wte.weight", {c.vocab_size, C}, Init::normal);
  if (c.pos_embedding == PosEmbedding::learned)
    params_.declare("transformer.wpe.weight", {c.max_seq_len, C}, Init::normal);
  auto layernorm = [&](const std::string& prefix) {
    params_.declare(prefix + ".weight", {C}, Init::ones);
    if (c.bias) params_.declare(prefix + ".bias", {C}, Init::zeros);
  };
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in, double std) {
    params_.declare(prefix + ".weight", {out, in}, Init::normal, std);
    if (c.bias) params_.declare(prefix + ".bias", {out}, Init::zeros);
  };
  for (int64_t i = 0; i < c.n_layer; ++i) {
    layernorm(layer_name(i, "ln_1"));
    linear(layer_name(i, "attn.c_attn"), 3 * C, C, 0.02);
    linear(layer_name(i, "attn.c_proj"), C, C, residual_std);
    layernorm(layer_name(i, "ln_2"));
    linear(layer_name(i, "mlp.c_fc"), 4 * C, C, 0.02);
    linear(layer_name(i, "mlp.c_proj"), C, 4 * C, residual_std);
  }
  layernorm("transformer.ln_f");
  params_.allocate(seed, dtype, device);
  params_.set_compute_dtype(compute_);
}

Tensor GPT::param_of(const Tensor& compute, const std::string& name) const {
  if (!compute.defined()) return ops::cast(params_.get(name), compute_);
  const Parameter& q = params_.find(name);
  return ops::cast_precomputed(q.value, Tensor::view_of(compute, q.offset, q.value.shape()));
}
Tensor GPT::maybe_of(const Tensor& compute, const std::string& name) const {
  return params_.has(name) ? param_of(compute, name) : Tensor();
}
Tensor GPT::p(const std::string& name) const { return param_of(compute_values_, name); }
Tensor GPT::maybe(const std::string& name) const { return maybe_of(compute_values_, name); }

void GPT::set_recompute_rows(int64_t rows) {
  TG_CHECK(rows >= 0, "GPT: recompute_rows is ", rows, "; give a positive number of positions, or 0 for none");
  recompute_rows_ = rows;
}

Tensor GPT::dropout(const Tensor& x, uint64_t site) {
  if (!training_ || config_.dropout == 0.0) return x;
  const uint64_t row_elements = uint64_t(x.numel() / x.size(0));  // x is (B, …)
  return ops::dropout(x, config_.dropout, cpu::hash64(seed_ ^ cpu::hash64(dropout_counter_ * 1024 + site)), true,
                      uint64_t(dropout_first_row_) * row_elements);
}

Tensor GPT::cached_attention(const Tensor& qkv, int64_t i, KVCache& cache) {
  const int64_t n = qkv.size(1), C = config_.d_model, H = config_.n_head, D = C / H;
  const int64_t pos = cache.length, end = pos + n;
  TG_CHECK(qkv.size(0) == 1 && (pos == 0 || n == 1), "GPT.forward_cached: one sequence, and after the prompt one "
           "token at a time; got ", qkv.desc(), " at position ", pos);
  const double rope_base = config_.pos_embedding == PosEmbedding::rope ? config_.rope_base : 0.0;
  std::vector<Tensor> parts = ops::split_last(qkv, 3);
  Tensor q = ops::reshape(parts[0], {1, n, H, D}), k = ops::reshape(parts[1], {1, n, H, D});
  Tensor v = ops::reshape(parts[2], {1, n, H, D});
  if (rope_base > 0) {
    q = ops::rope(q, rope_base, pos);
    k = ops::rope(k, rope_base, pos);
  }
  Tensor::view_of(cache.k[size_t(i)], pos * H * D, {1, n, H, D}).copy_from(k);
  Tensor::view_of(cache.v[size_t(i)], pos * H * D, {1, n, H, D}).copy_from(v);
  // The prompt: the whole causal attention (with the model's window and documents), exactly as
  // forward() computes it.
  if (pos == 0) return ops::self_attention(qkv, H, config_.attention, rope_base, mask_);
  // One new token at position pos: every cached key is in its past, so the masks only start the
  // key range later: the window drops the keys older than W (pos − W < j ≤ pos), documents the
  // keys before the current document's start. softmax(q·Kᵀ/√D)·V per head.
  int64_t first = config_.attention_window > 0 ? std::max<int64_t>(0, end - config_.attention_window) : 0;
  if (document_eot_ >= 0) first = std::max(first, cache.document_start);
  const int64_t n_keys = end - first;
  Tensor keys = ops::transpose12(Tensor::view_of(cache.k[size_t(i)], first * H * D, {1, n_keys, H, D}));  // (1, H, n, D)
  Tensor values = ops::transpose12(Tensor::view_of(cache.v[size_t(i)], first * H * D, {1, n_keys, H, D}));
  Tensor scores = ops::matmul(ops::transpose12(q), keys, false, true);                        // (1, H, 1, n)
  Tensor probs = ops::softmax(ops::scale(scores, 1.0 / std::sqrt(double(D))));
  Tensor y = ops::transpose12(ops::matmul(probs, values));                                   // (1, 1, H, D)
  return ops::reshape(y, {1, 1, C});
}

Tensor GPT::block(const Tensor& x, int64_t i) {
  if (recompute_rows_ > 0) return block_in_pieces(x, i);
  auto [x1, mlp, mlp_bias] = block_branches(
      x, ops::layernorm(x, p(layer_name(i, "ln_1.weight")), maybe(layer_name(i, "ln_1.bias"))), i, nullptr, false);
  return ops::add(x1, mlp);
}

GPT::Branches GPT::block_branches(const Tensor& x, const Tensor& h1, int64_t i, KVCache* cache,
                                  bool biases_at_residual) {
  const int64_t H = config_.n_head;
  auto w = [&](const std::string& rest) { return p(layer_name(i, rest)); };
  auto b = [&](const std::string& rest) { return maybe(layer_name(i, rest)); };

  // Causal self-attention; q, k, v are (B, T, H, D) heads of the fused projection.
  Tensor qkv = ops::linear(h1, w("attn.c_attn.weight"), b("attn.c_attn.bias"));  // (B, T, 3C)
  const double rope_base = config_.pos_embedding == PosEmbedding::rope ? config_.rope_base : 0.0;
  Tensor y = cache ? cached_attention(qkv, i, *cache)
                   : ops::self_attention(qkv, H, config_.attention, rope_base, mask_);  // (B, T, C)
  const Tensor attn_bias = b("attn.c_proj.bias"), mlp_bias = b("mlp.c_proj.bias");
  y = ops::linear(y, w("attn.c_proj.weight"), biases_at_residual ? Tensor() : attn_bias);
  // The residual add and LayerNorm 2 in one pass.
  auto [x1, h] = ops::add_layernorm(x, dropout(y, uint64_t(2 * i)), w("ln_2.weight"), b("ln_2.bias"), 1e-5,
                                    biases_at_residual ? attn_bias : Tensor());

  // MLP, one op: (B, T, C) → (B, T, 4C) → (B, T, C).
  h = ops::mlp(h, w("mlp.c_fc.weight"), b("mlp.c_fc.bias"), w("mlp.c_proj.weight"),
               biases_at_residual ? Tensor() : mlp_bias);
  return {x1, dropout(h, uint64_t(2 * i + 1)), biases_at_residual ? mlp_bias : Tensor()};
}

Tensor GPT::block_in_pieces(const Tensor& x, int64_t i) {
  TG_CHECK(config_.dropout == 0.0 || !training_ || !grad_enabled(), "GPT: train.recompute_rows needs model.dropout 0 "
           "(dropout's masks are drawn over whole tensors); got dropout ", config_.dropout);
  const int64_t C = config_.d_model, H = config_.n_head, D = C / H, rows = recompute_rows_;
  const double rope_base = config_.pos_embedding == PosEmbedding::rope ? config_.rope_base : 0.0;
  // The pieces run again in the backward, after forward() has dropped its compute copy: they take
  // this one's views (made inside each piece, so each piece's graph ends at the parameters).
  const Tensor compute = compute_values_;
  auto w = [this, i, compute](const std::string& rest) { return param_of(compute, layer_name(i, rest)); };
  auto b = [this, i, compute](const std::string& rest) { return maybe_of(compute, layer_name(i, rest)); };

  // LayerNorm 1, the qkv projection and RoPE, piece by piece: qkv with q and k already rotated,
  // so the attention reads all three straight out of it.
  Tensor qkv = checkpoint_rows(
      [=](const std::vector<Tensor>& in, int64_t t0) {
        Tensor h = ops::layernorm(in[0], w("ln_1.weight"), b("ln_1.bias"));
        Tensor qkv = ops::linear(h, w("attn.c_attn.weight"), b("attn.c_attn.bias"));
        if (rope_base <= 0) return qkv;
        const int64_t n = qkv.size(1);
        std::vector<Tensor> parts = ops::split_last(qkv, 3);
        Tensor q = ops::rope(ops::reshape(parts[0], {1, n, H, D}), rope_base, t0);
        Tensor k = ops::rope(ops::reshape(parts[1], {1, n, H, D}), rope_base, t0);
        return ops::concat_last({ops::reshape(q, {1, n, C}), ops::reshape(k, {1, n, C}), parts[2]});
      },
      {x}, rows);
  Tensor y = ops::self_attention(qkv, H, config_.attention, /*rope_base=*/0.0, mask_);  // (B, T, C)
  // The attention's projection and the residual, then the MLP and its residual.
  Tensor x1 = checkpoint_rows(
      [=](const std::vector<Tensor>& in, int64_t) {
        return ops::add(in[0], ops::linear(in[1], w("attn.c_proj.weight"), b("attn.c_proj.bias")));
      },
      {x, y}, rows);
  return checkpoint_rows(
      [=](const std::vector<Tensor>& in, int64_t) {
        Tensor h = ops::layernorm(in[0], w("ln_2.weight"), b("ln_2.bias"));
        h = ops::linear_gelu(h, w("mlp.c_fc.weight"), b("mlp.c_fc.bias"));
        return ops::add(in[0], ops::linear(h, w("mlp.c_proj.weight"), b("mlp.c_proj.bias")));
      },
      {x1}, rows);
}

Tensor GPT::recomputed_block(const Tensor& x, int64_t i) {
  // The backward's second run must see what the forward saw: the same compute copy of the
  // parameters (forward() drops it when it returns) and the same dropout counter, rows and mode.
  return checkpoint(
      [this, i, compute = compute_values_, counter = dropout_counter_, first_row = dropout_first_row_,
       training = training_, mask = mask_](const std::vector<Tensor>& in) {
        struct Restore {
          GPT& m;
          Tensor compute;
          uint64_t counter;
          int64_t first_row;
          bool training;
          ops::AttentionMask mask;
          ~Restore() {
            m.compute_values_ = compute, m.dropout_counter_ = counter, m.dropout_first_row_ = first_row;
            m.training_ = training, m.mask_ = mask;
          }
        } restore{*this, compute_values_, dropout_counter_, dropout_first_row_, training_, mask_};
        compute_values_ = compute, dropout_counter_ = counter, dropout_first_row_ = first_row, training_ = training;
        mask_ = mask;
        return block(in[0], i);
      },
      {x}, offload_activations_);
}

void GPT::set_lm_head_chunk(int64_t rows) {
  TG_CHECK(rows >= 0, "GPT: lm_head_chunk is ", rows, "; give a positive number of rows, or 0 for none");
  lm_head_chunk_ = rows;
}

// Positions first … first+T−1 as a view of the ids 0 … max_seq_len−1, made once on the model's
// device: no pass copies ids from the host (a training step can be recorded as a device graph,
// and a decoded token waits for no copy). The learned table bounds first + T (features checks it).
Tensor GPT::positions(int64_t first, int64_t T) {
  if (!position_ids_.defined()) {
    std::vector<int32_t> all(static_cast<size_t>(config_.max_seq_len));
    for (size_t t = 0; t < all.size(); ++t) all[t] = int32_t(t);
    position_ids_ = Tensor::from_ints(all, {config_.max_seq_len}).to(device_);
  }
  return Tensor::view_of(position_ids_, first, {T});
}

Tensor GPT::forward(const Tensor& ids) {
  auto [x, wte] = features(ids);
  return ops::linear(x, wte, Tensor());  // (B, T, V): lm_head tied to wte
}

std::pair<Tensor, Tensor> GPT::features(const Tensor& ids, KVCache* cache) {
  TG_CHECK(ids.dim() == 2 && ids.dtype() == DType::i32, "GPT.forward: ids must be i32 (B, T), got ",
           ids.desc());
  const int64_t T = ids.size(1), first = cache ? cache->length : 0;
  TG_CHECK(config_.pos_embedding != PosEmbedding::learned || first + T <= config_.max_seq_len,
           "GPT.forward: sequence length ", first + T, " exceeds model.max_seq_len ", config_.max_seq_len,
           " of the learned position table (raise max_seq_len or use pos_embedding: rope)");
  if (training_) ++dropout_counter_;
  // The structured masks of this batch: the model's window, and the document starts computed once
  // from the ids (not a T×T mask) when document masks are on. With a cache the prompt takes both;
  // a decoded token's masks are the start of its key range (cached_attention).
  mask_ = ops::AttentionMask{};
  mask_.window = config_.attention_window;
  // The ids on the host, for the document starts: the copy set_host_ids gave, or the ids
  // themselves on the CPU, or else read back from the device.
  Tensor host_ids;
  if (document_eot_ >= 0)
    host_ids = host_ids_.defined() ? host_ids_ : ids.device().is_cpu() ? ids : ids.to(Device::cpu());
  host_ids_ = Tensor();
  TG_CHECK(!host_ids.defined() || host_ids.shape() == ids.shape(), "GPT.forward: the host ids given by set_host_ids ",
           host_ids.desc(), " are not the shape of the forward's ids ", ids.desc());
  if (document_eot_ >= 0 && first == 0) {
    mask_.doc_start = ops::document_starts(host_ids, document_eot_);
    // On a GPU, copied there once for every layer's attention (forward and backward).
    if (!device_.is_cpu()) mask_ = ops::on_device(mask_, device_);
  }
  // The compute copy of every parameter in one conversion of the flat buffer, not one per
  // parameter (p() then hands out views of it), or the copy the optimizer wrote with its last
  // update (ParameterStore::compute_values); the pass lets go of it when it returns.
  struct ComputeCopy {
    Tensor& slot;
    ~ComputeCopy() { slot = Tensor(); }
  } compute_copy{compute_values_};
  if (compute_ != params_.flat_values().dtype()) {
    NoGradGuard no_grad;
    compute_values_ = params_.compute_values();
  }
  const Tensor wte = p("transformer.wte.weight");  // cast once, used by the embedding and the tied LM head
  Tensor x = ops::embedding(wte, ids);             // (B, T, C)
  if (config_.pos_embedding == PosEmbedding::learned) {
    x = ops::add(x, ops::embedding(p("transformer.wpe.weight"), positions(first, T)));
  }
  x = dropout(x, 1023);
  const bool recomputed = !cache && ((recompute_ && grad_enabled()) || recompute_rows_ > 0);
  Tensor normed;  // the final LayerNorm's output
  if (!recomputed && config_.n_layer > 0) {
    // Each block's output residual add and the LayerNorm after it (the next block's first, or the
    // final one) in one pass: the blocks hand each other the sum and its normalisation.
    // On the GPU the projections' biases go with the residual adds when no dropout stands between
    // (ops::add_layernorm's b_bias): the LayerNorm backward sums their gradients as it writes the
    // residual's, and their column-sum passes are gone (docs/performance.md, table of changes).
    const bool biases_at_residual = device_.is_cuda() && (!training_ || config_.dropout == 0.0);
    Tensor h = ops::layernorm(x, p(layer_name(0, "ln_1.weight")), maybe(layer_name(0, "ln_1.bias")));
    for (int64_t i = 0; i < config_.n_layer; ++i) {
      auto [x1, mlp, mlp_bias] = block_branches(x, h, i, cache, biases_at_residual);
      const bool last = i + 1 == config_.n_layer;
      ops::AddLayerNorm next = ops::add_layernorm(
          x1, mlp, p(last ? "transformer.ln_f.weight" : layer_name(i + 1, "ln_1.weight")),
          maybe(last ? "transformer.ln_f.bias" : layer_name(i + 1, "ln_1.bias")), kLayerNormEps, mlp_bias);
      x = next.sum, h = next.normed;
    }
    normed = h;
  } else {  // each block on its own, recomputed in the backward
    for (int64_t i = 0; i < config_.n_layer; ++i) x = recompute_ && grad_enabled() ? recomputed_block(x, i) : block(x, i);
  }
  if (cache) {
    // The document being decoded starts after the last end-of-text token seen (which itself
    // closes the document before).
    if (document_eot_ >= 0)
      for (int64_t t = 0; t < T; ++t)
        if (host_ids.data<int32_t>()[t] == document_eot_) cache->document_start = first + t + 1;
    cache->length += T;
  }
  if (!normed.defined()) normed = ops::layernorm(x, p("transformer.ln_f.weight"), maybe("transformer.ln_f.bias"));
  return {normed, wte};
}

Tensor GPT::forward_cached(const Tensor& ids, KVCache& cache) {
  TG_CHECK(!grad_enabled() && !training_, "GPT.forward_cached: for inference (no gradients, eval mode)");
  const int64_t n = ids.dim() == 2 ? ids.size(1) : 0, H = config_.n_head, D = config_.d_model / H;
  if (cache.length + n > cache.capacity) {  // grow the buffers geometrically, keeping what they hold
    const int64_t capacity = std::max<int64_t>({2 * cache.capacity, cache.length + n, 256});
    for (int64_t i = 0; i < config_.n_layer; ++i) {
      for (std::vector<Tensor>* buffers : {&cache.k, &cache.v}) {
        Tensor grown = Tensor::empty({capacity, H, D}, compute_, device_);
        if (cache.length > 0)
          Tensor::view_of(grown, 0, {cache.length, H, D})
              .copy_from(Tensor::view_of((*buffers)[size_t(i)], 0, {cache.length, H, D}));
        if (int64_t(buffers->size()) <= i) buffers->push_back(grown);
        else (*buffers)[size_t(i)] = grown;
      }
    }
    cache.capacity = capacity;
  }
  auto [x, wte] = features(ids, &cache);
  return ops::linear(x, wte, Tensor());
}

Tensor GPT::loss(const Tensor& ids, const Tensor& targets) {
  TG_CHECK(targets.shape() == ids.shape() && targets.dtype() == DType::i32, "GPT.loss: targets ",
           targets.desc(), " must be i32 with the shape of ids ", ids.desc());
  const int64_t N = ids.numel();
  // The head and the loss together (lm_head_chunk_ rows of logits at a time, or all of them): the
  // logits are never a tensor of their own, so their gradient is written over them.
  auto [x, wte] = features(ids);
  return ops::linear_cross_entropy(ops::reshape(x, {N, config_.d_model}), wte, targets.view({N}), lm_head_chunk_);
}

}  // namespace tg::nn
