// The user-facing ops: each validates its inputs (errors name the op and the shapes), picks
// the backend kernel for the tensor's device and dtype, and records its backward on the tape.
#pragma once
#include <cstdint>
#include <vector>

#include "src/autograd/autograd.h"
#include "src/tensor/tensor.h"

namespace tg::ops {

// --- elementwise and layout ---
Tensor add(const Tensor& a, const Tensor& b);  // b's shape equals a's or a trailing suffix of it
Tensor mul(const Tensor& a, const Tensor& b);  // same shapes
Tensor scale(const Tensor& x, double s);
// Differentiable dtype conversion (f32 ↔ bf16 for mixed precision, f32 ↔ f64 on the CPU).
Tensor cast(const Tensor& x, DType dtype);
// The same node as cast(x, converted.dtype()), for a conversion the caller has already done,
// e.g. a whole flat parameter buffer converted in one kernel (converted: x's values, rounded).
Tensor cast_precomputed(const Tensor& x, const Tensor& converted);
Tensor sum(const Tensor& x);                   // scalar
Tensor mean(const Tensor& x);                  // scalar
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor transpose12(const Tensor& x);           // 4-D: (A, M, N, D) → (A, N, M, D)
Tensor slice_last(const Tensor& x, int64_t start, int64_t len);  // x[..., start:start+len]
std::vector<Tensor> split_last(const Tensor& x, int64_t parts);  // equal parts of the last dim
Tensor concat_last(const std::vector<Tensor>& xs);               // along the last dim; same leading shape

// --- neural-network ops ---
Tensor embedding(const Tensor& weight /*(V, C)*/, const Tensor& ids /*(...) i32*/);  // (..., C)
// x (..., K) · weightᵀ + bias, weight (N, K) as in torch.nn.Linear, bias (N) or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);
// gelu(linear(x, weight, bias)) as one op (GPT's MLP up-projection): the same values and
// gradients; on the GPU its backward forms GELU's derivative and the bias gradient in one pass.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);
// linear(linear_gelu(x, w_fc, b_fc), w_proj, b_proj) as one op (GPT's MLP): the same values and
// gradients (on the CPU it is those two ops); on the GPU one node, whose backward in bf16 forms
// GELU's derivative inside the input-gradient GEMM of the down-projection (cuBLASLt's DGELU
// epilogue), so the (rows, 4C) gradient of the GELU's output is never written. b_fc and b_proj may
// be undefined.
Tensor mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj);
// Batched a (..., M, K) · b (..., K, N), with optional transposes of the last two dims.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
Tensor gelu(const Tensor& x);  // tanh form
Tensor layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// sum = a + b (equal shapes) and normed = layernorm(sum, weight, bias): the same values and the
// same graph as add() followed by layernorm(), the forward in one pass over the rows on the GPU
// (a residual add and the LayerNorm that reads it: the sum is not read back). With b_bias (the
// last dimension), sum = a + add(b, b_bias): a projection's bias added here rather than in its
// GEMM, so that on the GPU its gradient — the column sums of the sum's gradient — is formed by the
// LayerNorm's backward as it writes that gradient, not in a pass of its own.
struct AddLayerNorm {
  Tensor sum, normed;
};
AddLayerNorm add_layernorm(const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias,
                           double eps = 1e-5, const Tensor& b_bias = {});
Tensor softmax(const Tensor& x);  // over the last dimension
// Mean over counted rows of −log softmax(logits)[target]; logits (N, V), targets (N) i32.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index = -1);
// cross_entropy(linear(x, weight, {}), targets) without the (N, V) logits: x (N, C), weight (V, C),
// targets (N) i32. The logits are made chunk_rows rows at a time (0: all at once), and the
// gradients of x and weight are formed chunk by chunk in the forward, so at most 2·chunk_rows·V
// logit-sized elements exist at once. The tied LM head and loss of a long-context model.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets, int64_t chunk_rows,
                            int32_t ignore_index = -1);
// Deterministic from `seed`: element i's keep draw is the hash of (seed, first + i), so a slice of
// rows of a larger tensor gets that tensor's mask when `first` is its first element there.
// Identity (and no node) when p == 0 or !training.
Tensor dropout(const Tensor& x, double p, uint64_t seed, bool training = true, uint64_t first = 0);
// x (B, T, H, D), D even; rotates positions pos_offset..pos_offset+T−1 (inverse: back).
Tensor rope(const Tensor& x, double base = 10000.0, int64_t pos_offset = 0, bool inverse = false);
Tensor causal_mask(const Tensor& scores /*(..., T, T)*/);  // future keys → −inf
// softmax(scale · scores) over the last dim with future keys removed when causal, fused:
// what the materialised attention keeps is P alone. scores (..., T, T).
Tensor attention_softmax(const Tensor& scores, double scale, bool causal);

// --- attention on (B, T, H, D) ---
// Deterministic algorithms (on by default): where the fastest GPU kernel sums in an order that
// varies from run to run (the fused attention backward's dQ, added with unordered atomics), the
// ordered form runs instead, so two runs give the same bits. Process-wide, like PyTorch's
// torch.use_deterministic_algorithms; the trainer sets it from train.deterministic.
void set_deterministic(bool on);
bool deterministic();
enum class AttentionKind { flash, naive };
// Structured masks on top of causal attention: query i of row b sees key j iff
// lo ≤ j ≤ i with lo = max(doc_start[b, i], i − window + 1) (each term only when its mask is on).
// No mask (the default) is today's causal attention, bit for bit.
struct AttentionMask {
  int64_t window = 0;  // sliding window W: keys i − W < j ≤ i; 0: no window
  Tensor doc_start;    // (B, T) i32 CPU: first position of each token's document; undefined: none
  // doc_start copied to the GPU the attention runs on, once per step by the caller (the GPT);
  // undefined: the fused GPU attention copies doc_start itself, once per call.
  Tensor doc_start_device;
  // With doc_start_device: the most tokens any document holds (cpu::longest_document), read with
  // the copy; the GPU backward chooses its kernel shapes by it. 0: not read.
  int64_t longest_document = 0;
  bool any() const { return window > 0 || doc_start.defined(); }
};
// The mask with its document starts on `device` too (doc_start_device, and longest_document read
// with them); the mask itself on the CPU, or when they are already there.
AttentionMask on_device(const AttentionMask& mask, const Device& device);
// Per-row document starts from token ids (B, T) i32: a document starts after each eot token,
// and the eot token is the last token of the document it ends. (B, T) i32 on the CPU.
Tensor document_starts(const Tensor& ids, int32_t eot_token);
// The reference: materialises S = QKᵀ·scale (B, H, T, T), masks, softmax, P·V; built from the ops
// above. With a structured mask, the (B, H, T, T) mask is materialised as an additive 0/−inf bias.
Tensor attention_naive(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const AttentionMask& mask = {});
// Fused: saves only O and the per-row log-sum-exp; the backward recomputes scores block by block.
// Structured masks run on the CPU and in the fused GPU kernels (bf16, head dims 32, 64, 96, 128),
// which skip the key tiles wholly outside each query tile's range; elsewhere on the GPU the
// materialised attention takes them as a bias.
Tensor attention_flash(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const AttentionMask& mask = {});
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, AttentionKind kind,
                 const AttentionMask& mask = {});
// Causal self-attention straight from the fused projection qkv (B, T, 3C) = [q | k | v]:
// splits the heads, applies RoPE to q and k when rope_base > 0, attends, returns (B, T, C).
// The flash kind is one node whose backward hands back d(qkv) in one piece; the naive kind
// is the composite of the ops above (the reference).
Tensor self_attention(const Tensor& qkv, int64_t n_head, AttentionKind kind, double rope_base = 0.0,
                      const AttentionMask& mask = {});

}  // namespace tg::ops
