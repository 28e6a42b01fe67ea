// The memory model of one training step (see memory_model.h and docs/memory.md). Each term
// names the buffer it stands for; "unit" is one (B·T, C) activation in the compute dtype.
#include "src/trainer/memory_model.h"

#include "kernels/cpu/adamw.h"

#include <algorithm>
#include <sstream>

#include "src/tensor/memory.h"
#include "src/trainer/footprint.h"
#include "src/util/checked.h"

namespace tg {

namespace {
// Byte counts in checked arithmetic: a config whose sizes overflow int64 is an error naming `what`.
struct Sizes {
  std::string what;
  int64_t mul(int64_t a, int64_t b) const { return checked_mul(a, b, what); }
  int64_t add(std::initializer_list<int64_t> xs) const {
    int64_t s = 0;
    for (int64_t x : xs) s = checked_add(s, x, what);
    return s;
  }
};

// The sizes every phase is made of (predict_memory's symbols; docs/memory.md, "Symbols").
struct StepTerms {
  bool gpu, fused;
  int64_t e, s, B, T, C, L, H;
  int64_t u, lse, scores, ln_stats;           // an activation unit, the attention's statistics, S, a LayerNorm's statistics
  int64_t common, head_dw_pending, loss_scalars;  // held through every phase of the backward
};

// Blocks in pieces (train.recompute_rows, GPT::block_in_pieces): the token-wise parts of a block
// keep only their inputs and run again piece by piece in the backward, so a block keeps the
// attention's inputs, its output o, the residual x1 and the block's output. These phases replace
// the whole-block ones (the head's phase stands; under offload_activations its blocks hold one
// unit).
void add_piece_phases(MemoryPrediction& p, const TrainConfig& t, const StepTerms& k, const Sizes& sizes) {
  auto mul = [&](int64_t a, int64_t b) { return sizes.mul(a, b); };
  auto add = [&](std::initializer_list<int64_t> xs) { return sizes.add(xs); };
  const bool gpu = k.gpu, fused = k.fused;
  const int64_t e = k.e, s = k.s, B = k.B, T = k.T, C = k.C, L = k.L, H = k.H;
  const int64_t u = k.u, lse = k.lse, scores = k.scores, ln_stats = k.ln_stats;
  const int64_t common = k.common, head_dw_pending = k.head_dw_pending, loss_scalars = k.loss_scalars;
  // One piece: `rows` positions of one sequence. Its recorded rerun and backward (the MLP's, the
  // largest) at its peak, in GELU's backward: of LayerNorm 2's output, the pre-activation and
  // GELU output (1 + 4 + 4), c_proj's output and the sum (1 + 1), and the gradients (1 + 4 + 4 +
  // 1), about 16 piece units are held (measured on the CPU: docs/memory.md), with the
  // LayerNorm's statistics and c_fc's and c_proj's weight and bias gradients. The GPU holds about
  // 20 (the T = 32k–262k sweep of the long-context config, docs/memory.md "Measured against
  // predicted on a GPU").
  const int64_t r = std::min<int64_t>(t.recompute_rows, T), pu = mul(mul(r, C), e);
  const int64_t piece_units = gpu ? 20 : 16;
  const int64_t piece = add({mul(piece_units, pu), mul(mul(r, 2), s), mul(add({mul(mul(8, C), C), mul(5, C)}), e)});
  // What a block keeps, its output included: the attention's inputs 3 (the GPU's fused attention
  // reads qkv in place; the CPU's its contiguous q, k, v copies; the materialised one the
  // transposes of q, k and v, and its probabilities P), o 1, x1 1, the output 1, and the
  // attention's statistics.
  const int64_t keep_units = 6, keep_extra = fused ? lse : scores;
  const int64_t kept = add({mul(keep_units, u), keep_extra});
  p.saved_per_block = kept;
  const bool offload = gpu && t.recompute && t.offload_activations;
  // Held besides the block being backpropagated: under recompute the block inputs (L, or under
  // offload only the restored one) and the second run's output; otherwise block 0's input and the
  // L − 1 earlier blocks' tensors.
  const int64_t before = t.recompute ? (offload ? mul(2, u) : mul(L + 1, u)) : add({u, mul(L - 1, kept)});
  // The attention's backward: of the block's own tensors the attention's inputs, o and the
  // statistics (x1 is freed once the MLP's pieces have run backward), with x's gradient from the
  // residual, o's gradient and d(qkv) (1 + 1 + 3), and under recompute the block output's
  // gradient, which the outer backward holds while the block's runs (1); the CPU's attention also
  // holds q's, k's and v's gradients before joining them (3); the materialised one its P, dP and
  // dS (3) with the transposes and the gradients (measured on the CPU: docs/memory.md).
  const int64_t held_grad = t.recompute ? 1 : 0;
  int64_t attn = add({mul(9 + held_grad, u), keep_extra});
  if (!fused) attn = add({mul(6 + held_grad, u), mul(scores, 3)});
  else if (!gpu) attn = add({attn, mul(3, u)});
  int64_t ws = 0;
  if (gpu && fused) ws = (mul(mul(B, H), T) * 4 + 255) / 256 * 256;
  const std::string kind = t.recompute ? "recomputed block" : "last block";
  p.phases.push_back({kind + " backward, attention (blocks in pieces)",
                      add({common, before, attn, head_dw_pending, loss_scalars}), ws});
  // The MLP's pieces run backward first: the block's tensors less its output, the output's
  // gradient and x1's (1 + 1), and one piece. With offloaded inputs the GPU holds one unit less
  // than this count (the same sweep).
  const int64_t mlp_held = offload ? add({before, kept - u, u}) : add({before, kept - u, mul(2, u)});
  p.phases.push_back({kind + " backward, MLP pieces",
                      add({common, mlp_held, piece, ln_stats, head_dw_pending, loss_scalars}), 0});
  if (t.recompute) {
    // The first run, recording nothing: the inputs so far (under offload the one in hand) and the
    // block's tensors with a piece.
    const int64_t inputs = offload ? u : mul(L, u);
    p.phases.push_back({"block forward in pieces (not recorded)", add({common, inputs, kept, piece}), 0});
  }
  p.block_working = attn;
}
}  // namespace

MemoryPrediction predict_memory(const Config& c, const std::string& device_kind, int world_size) {
  const ModelConfig& m = c.model;
  const TrainConfig& t = c.train;
  const std::string what = "the memory model of model.* and train.batch_size, train.seq_len, train.lm_head_chunk";
  const Sizes sizes{what};
  auto mul = [&](int64_t a, int64_t b) { return sizes.mul(a, b); };
  auto add = [&](std::initializer_list<int64_t> xs) { return sizes.add(xs); };
  const bool gpu = device_kind.rfind("cuda", 0) == 0;
  const bool bf16 = t.precision == "bf16";
  // e: the compute dtype's size (activations, logits, the compute copy); s: the statistics'
  // (LayerNorm mean and rstd, attention log-sum-exp, the loss rows): fp32 on the GPU, the
  // compute dtype on the CPU.
  const int64_t e = bf16 ? 2 : 4, s = gpu ? 4 : e;
  const int64_t B = t.batch_size, T = t.seq_len, N = mul(B, T), C = m.d_model, L = m.n_layer, H = m.n_head;
  const int64_t V = m.vocab_size, D = H > 0 ? C / H : C;
  const bool rope = m.pos_embedding == "rope", dropout = m.dropout > 0;
  // The fused attention: every CPU tensor; on the GPU bf16 at head dims 32, 64, 96, 128
  // (ops::self_attention falls back to the materialised composite otherwise).
  const bool fused = m.attention == "flash" && (!gpu || (bf16 && (D == 32 || D == 64 || D == 96 || D == 128)));
  const int64_t u = mul(mul(N, C), e);
  const int64_t scores = mul(mul(mul(mul(B, H), T), T), e);  // one (B, H, T, T) tensor of the materialised attention
  const int64_t lse = mul(mul(mul(B, H), T), s);
  const int64_t ln_stats = mul(mul(N, 2), s);  // one LayerNorm's mean and rstd

  MemoryPrediction p;
  const int64_t P = parameter_count(m);
  p.parameter_count = P;
  p.params = mul(P, 4);
  p.grads = mul(P, 4);
  // ZeRO-1: each rank keeps the moments of its ~1/W of the flat buffer.
  // AdamW's two moments, and the 48-byte state of the step decided on the device.
  p.optimizer = (t.zero == 1 && world_size > 1 ? mul(P, 8) / world_size : mul(P, 8)) +
                int64_t(sizeof(cpu::StepDecision));
  // bf16: GPT::features converts the whole flat buffer once per forward; the blocks' recompute
  // closures and the parameter views in the graph hold it until the backward ends.
  p.compute_copy = bf16 ? mul(P, 2) : 0;
  p.tokens = mul(N, 8);  // ids and targets, int32
  // Learned positions: the int32 position ids the position embedding's backward reads. The token
  // and position rows, their sum and (with dropout) the dropout's input are read by no backward
  // and freed as the forward goes on; block 0's input is counted with the blocks.
  p.embedding = rope ? 0 : mul(T, 4);

  // One recorded block, its output included, its input not (that is the previous block's output).
  // A block keeps what its backward closures read (a node holds no input's memory: autograd.h);
  // the projections' outputs, the residual branches after dropout and the slices are freed as the
  // forward goes on. LayerNorm 1 output 1 unit (read by the qkv projection's backward), attention
  // output o 1, the residual x1 1, LayerNorm 2 output 1, the MLP's pre-activation 4 and GELU
  // output 4, the block output 1 = 13 units, plus the attention's inputs:
  //   GPU fused attention: qkv 3 (read in place), and RoPE's rotated q and k 2;
  //   CPU fused attention: its contiguous q, k, v copies 3 (rotated in place of the copies under
  //     RoPE; qkv itself is freed);
  //   materialised attention: the (B, H, T, D) transposes of q, k, v 3 and the probabilities P,
  //     (B, H, T, T) (the scores S are freed once the softmax has run);
  //   statistics: both LayerNorms' mean and rstd, the fused attention's log-sum-exp (B, H, T).
  int64_t units = 16;
  int64_t block_extra = add({ln_stats, ln_stats});
  if (fused) {
    if (gpu && rope) units += 2;
    block_extra = add({block_extra, lse});
  } else {
    block_extra = add({block_extra, scores});
  }
  p.saved_per_block = add({mul(units, u), block_extra});
  const int64_t block_no_output = p.saved_per_block - u;

  // The weight gradients alive with the largest working set: c_fc's weight and bias (4C × C, 4C).
  // On the GPU in bf16 the weight's gradient is added straight into its fp32 buffer by the GEMM
  // (GradHandOver::accumulator): only the bias's is a tensor of its own.
  const int64_t param_grad_temp =
      gpu && bf16 ? mul(mul(4, C), e) : mul(add({mul(mul(4, C), C), mul(4, C)}), e);
  // The GPU tied head: its dW (bf16) waits for wte's conversion node, which the backward reaches
  // only after the embedding, i.e. through every block's backward.
  const int64_t head_dw_pending = gpu && bf16 ? mul(mul(V, C), e) : 0;
  const int64_t common = add({p.compute_copy, p.tokens, p.embedding});
  // In the backward: the loss (one element) and the backward's seed gradient of it.
  const int64_t loss_scalars = mul(2, s);

  // The LM head (linear_cross_entropy), a chunk of c rows at a time (c = N unchunked): the chunk's
  // logits (c × V, overwritten by their gradient), over all rows the log-sum-exp and row losses
  // (N each, statistics dtype), dx (one unit) and dW (V × C; under bf16 with more than one chunk
  // summed in fp32 and then rounded to bf16 while the fp32 sum is still held).
  const int64_t rows = t.lm_head_chunk > 0 ? std::min<int64_t>(t.lm_head_chunk, std::max<int64_t>(N, 1))
                                           : std::max<int64_t>(N, 1);
  const bool f32_sum = gpu && bf16 && N > rows;
  const int64_t dw = f32_sum ? mul(mul(V, C), 4 + 2) : mul(mul(V, C), e);
  const int64_t head = add({mul(mul(rows, V), e), u, dw, mul(N, 2 * s), s, gpu ? 4 : 0});
  // What the forward keeps when the head runs: every block's saved tensors (or only the block
  // inputs under recompute), block 0's input and the final LayerNorm's output and statistics.
  const int64_t blocks_fwd = t.recompute ? mul(L + 1, u) : add({u, mul(L, p.saved_per_block)});
  const int64_t ln_f = add({u, ln_stats});
  p.phases.push_back({t.lm_head_chunk > 0 ? "head forward (chunked)" : "head forward",
                      add({common, blocks_fwd, ln_f, head}), 0});

  // The backward of the last block (the first one the backward reaches; the later ones hold
  // less, since the earlier blocks' tensors are freed as the walk goes). Its peak is in the
  // MLP's backward. With linear_gelu and linear (the CPU, and the reference): the GELU output
  // (4 units) is freed with the down-projection's node, and the residual's gradient (1), the GELU
  // output's gradient (4), the pre-activation's gradient (4) and the LayerNorm 2 output's gradient
  // (1) are held: the block without its output plus 6 units, and c_fc's weight and bias
  // gradients. With dropout the same: the dropout's backward output is freed with the
  // down-projection's node. In bf16 on the GPU the MLP is one op (ops::mlp) that lets the GELU
  // output go before it makes the pre-activation's gradient inside its GEMM: the residual's
  // gradient (1; with dropout, and the dropout's backward output, 2), the pre-activation's
  // gradient (4) and the LayerNorm 2 output's gradient (1) with the block less its GELU output
  // and output: the block without its output plus 2 units (3 with dropout). In fp32 on the GPU
  // the op's backward also writes the GELU output's gradient (4) before its GELU-backward pass
  // and frees it before the last product: plus 5 units (6). Under recompute the block is run
  // again first, so its tensors exist once more, and the second run's output stays held until
  // its backward returns (1 unit); the earlier blocks keep only their inputs.
  const int64_t mlp_working = !gpu ? 6 : ((bf16 ? 2 : 5) + (dropout ? 1 : 0));
  const int64_t working = add({block_no_output, mul(mlp_working, u), param_grad_temp});
  const int64_t before = t.recompute ? add({mul(L, u), u}) : add({u, mul(L - 1, p.saved_per_block)});
  p.phases.push_back({t.recompute ? "recomputed block backward" : "last block backward",
                      add({common, before, working, head_dw_pending, loss_scalars}), 0});
  if (!fused) {
    // The materialised attention's backward: the softmax backward's dS allocated while dP and P
    // are held: 3 score tensors, with the LayerNorm 1 output and the transposes of q and k (3
    // units), the residual gradient (1) and v's gradient placed into qkv's shape (3 units);
    // under recompute the input's gradient copy (1 unit) too.
    const int64_t attn = add({mul(7 + (t.recompute ? 1 : 0), u), mul(scores, 3), ln_stats});
    p.phases.push_back({"attention backward", add({common, before, attn, head_dw_pending, loss_scalars}), 0});
  }
  if (t.recompute) {
    // The blocks' first run, recording nothing: linear_gelu's pre-activation and output (8
    // units) while qkv (3), the c_proj output, x1 and the LayerNorm 2 output are held (14 units);
    // the materialised attention holds its scores and probabilities with the slices and transposes.
    const int64_t run = fused ? mul(14, u) : add({mul(11, u), mul(scores, 2)});
    p.phases.push_back({"block forward (not recorded)", add({common, mul(L, u), run}), 0});
  }

  if (t.recompute_rows > 0) {  // the head's phase stands; the block phases are the pieces'
    p.phases.resize(1);
    if (gpu && t.recompute && t.offload_activations) p.phases[0].activations -= mul(L, u);
    const int64_t whole_block = p.saved_per_block;
    const StepTerms terms{gpu, fused, e, s, B, T, C, L, H, u, lse, scores, ln_stats, common, head_dw_pending, loss_scalars};
    add_piece_phases(p, t, terms, sizes);
    if (!t.recompute) p.phases[0].activations -= mul(L, whole_block - p.saved_per_block);
  } else if (gpu && t.recompute && t.offload_activations) {
    // Offloaded block inputs: the head holds the last block's output alone; a block's backward
    // its restored input and the second run's output (not the L inputs); the first run the input
    // in hand.
    for (MemoryPhase& ph : p.phases) {
      if (ph.name == "block forward (not recorded)") ph.activations -= mul(L - 1, u);
      else if (ph.name == "recomputed block backward" || ph.name == "attention backward") ph.activations -= mul(L - 1, u);
      else ph.activations -= mul(L, u);
    }
  }

  const MemoryPhase* best = &p.phases[0];
  for (const MemoryPhase& ph : p.phases)
    if (ph.activations + ph.workspace > best->activations + best->workspace) best = &ph;
  p.peak_phase = best->name;
  p.activations = best->activations;
  p.workspace = best->workspace;
  p.total = add({p.params, p.grads, p.optimizer, p.activations, p.workspace});
  p.saved_blocks = t.recompute ? mul(L + 1, u) : mul(L, p.saved_per_block);
  if (gpu && t.recompute && t.offload_activations) p.offloaded = mul(L, u), p.saved_blocks = u;
  p.block_working = working;
  p.head = head;
  // The workspace category's own peak: the GPU attention backward's scratch (the per-row
  // dO·O sums, and the fp32 dQ accumulator when train.deterministic is off).
  if (gpu && fused) {
    auto round256 = [](int64_t b) { return (b + 255) / 256 * 256; };
    int64_t ws = round256(mul(mul(mul(B, H), T), 4));
    if (!t.deterministic) ws = add({ws, round256(mul(mul(mul(B, H), (T + 63) / 64 * 64), D * 4))});
    p.workspace_peak = ws;
  }
  return p;
}

std::string describe_prediction(const MemoryPrediction& p) {
  std::ostringstream os;
  os << "params " << format_bytes(p.params) << ", grads " << format_bytes(p.grads) << ", optimizer "
     << format_bytes(p.optimizer) << ", activations " << format_bytes(p.activations);
  if (p.workspace) os << ", workspace " << format_bytes(p.workspace);
  os << "; peak " << format_bytes(p.total) << " in the " << p.peak_phase;
  if (p.offloaded) os << "; block inputs in host memory " << format_bytes(p.offloaded);
  return os.str();
}

}  // namespace tg
