// The tape: each differentiable op records a Node holding its inputs and a closure that maps
// the output's gradient to its inputs' gradients. backward() sorts the nodes topologically,
// walks them in reverse, sums the gradients of tensors used more than once, hands leaves'
// gradients to their sinks, and frees the graph as it goes. The engine knows tensors and nodes:
// which kernel adds two gradients on which device is the tensor layer's (src/tensor/accumulate.h).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/autograd/grad_sink.h"
#include "src/tensor/tensor.h"

namespace tg {

// What a backward closure may take over.
//
// take(): for each of its inputs that is a non-leaf tensor used more than once (a residual
// stream), the gradient the other consumers have already accumulated. A closure that takes it
// must return, for that input, the total: its own gradient plus the taken one. The engine then
// stores that instead of adding the two, so the closure can fold the accumulation into its own
// kernel (LayerNorm's backward adds the residual gradient as it writes dx: one pass over the
// tensor fewer).
//
// accumulator(): for an input that is a parameter's compute copy (a cast of a leaf, Node::passes_to_leaf)
// whose leaf keeps an fp32 gradient on the GPU, that gradient buffer. A closure may add its
// gradient for the input into it itself — a weight-gradient GEMM with an fp32 output and beta = 1
// — and then returns no gradient (undefined) for that input: no bf16 gradient is written, and
// no pass folds it into fp32 afterwards. Given first_write, it may also be told that the buffer
// holds no gradient yet (GradSink's first writes): it then writes the buffer whole (beta = 0). Every input offered one belongs to the same backward, so
// the additions keep the engine's order and the result its bits from run to run.
//
// complete(): whether no node still to run reads input `input`: the gradient this closure returns
// for it (with what it took) is then that input's whole gradient. A closure may derive another
// input's gradient from it in its own pass (the residual add's bias summed as the LayerNorm after
// it writes the sum's gradient: ops::add_layernorm).
class GradHandOver {
 public:
  GradHandOver() = default;
  // accumulator_leaves: for each input, the leaf whose fp32 gradient it may add into (undefined
  // when none), and that leaf's sink.
  GradHandOver(std::vector<Tensor> available, std::vector<Tensor> accumulator_leaves,
               std::vector<GradSink*> accumulator_sinks, std::vector<bool> complete = {});
  // The gradient accumulated so far for input `input`, handed over (undefined when there is none,
  // or when it was taken already).
  Tensor take(size_t input);
  bool taken(size_t input) const { return input < taken_.size() && taken_[input]; }
  // The fp32 buffer that input `input`'s gradient may be added into (undefined when none); see
  // GradSink::accumulator for first_write.
  Tensor accumulator(size_t input, bool* first_write = nullptr);
  bool complete(size_t input) const { return input < complete_.size() && complete_[input]; }

 private:
  std::vector<Tensor> available_;
  std::vector<bool> taken_;
  std::vector<Tensor> accumulator_leaves_;
  std::vector<GradSink*> accumulator_sinks_;
  std::vector<bool> complete_;
};

struct Node {
  std::string op;              // for error messages: the op that recorded this node
  std::vector<Tensor> inputs;  // one per differentiable input, in the op's order
  // Set by a cast of a leaf (a parameter's compute copy): the node passes its output's gradient
  // to this leaf unchanged but for the dtype, so a consumer may add into the leaf's gradient
  // directly (GradHandOver::accumulator).
  bool passes_to_leaf = false;
  // Given d(loss)/d(output), returns one gradient per input (undefined: no gradient). A gradient
  // may come in another floating dtype than its input (a cast's backward returns the output's
  // gradient as it is): the engine converts it for a non-leaf input, and the leaf's sink folds
  // it into the leaf's gradient (src/autograd/grad_sink.h).
  std::function<std::vector<Tensor>(const Tensor& grad_output, GradHandOver& hand_over)> backward;
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;
using BackwardHandOverFn = std::function<std::vector<Tensor>(const Tensor& grad_output, GradHandOver& hand_over)>;

bool grad_enabled();

// Disables recording inside its scope (evaluation, optimizer steps, backward closures).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// True when recording is on and at least one input needs a gradient.
bool needs_grad(std::initializer_list<const Tensor*> inputs);

// Attaches a node to `output` when any input requires grad and recording is on.
// Inputs that do not require grad are passed as undefined tensors to `backward`'s
// result slots but still listed, so closures can index inputs by position.
void record(Tensor& output, std::string op, std::vector<Tensor> inputs, BackwardFn backward);
// The same for a closure that may take over its inputs' pending gradients (GradHandOver).
void record(Tensor& output, std::string op, std::vector<Tensor> inputs, BackwardHandOverFn backward);
// The node of a conversion of x (ops::cast, ops::cast_precomputed): its backward returns the
// output's gradient as it is; when x is a leaf, consumers may add into its fp32 gradient
// directly (GradHandOver::accumulator).
void record_cast(Tensor& output, const Tensor& x);

// Backpropagates from `root` (a one-element tensor) with seed gradient 1.
void backward(const Tensor& root);
// Backpropagates from `root` with the seed gradient `grad_root` (root's shape, dtype and device).
// Every leaf's gradient goes to its sink (grad_sink.h): the one bound to it, else one of this
// backward's own that adds into .grad; each sink is flushed before backward() returns. A sink
// with a ready hook hears of each of its leaves whose gradient is final: every node of the graph
// that reads the leaf has run. A leaf no node of the graph reads is never reported.
void backward(const Tensor& root, const Tensor& grad_root);

// Activation recomputation. Runs fn(inputs) without recording, so none of fn's intermediates is
// kept, and records one node on the output; its backward runs fn again, recording, on detached
// copies of the inputs, and backpropagates the output's gradient through that second run: the
// inputs get their gradients from it, and so do the leaves fn reads (parameters), added into
// their .grad by their sinks as any backward adds. fn must give the same output both times (seed
// its dropout from state it restores), and every tensor it reads besides `inputs` must be a leaf
// or made inside fn: the second run's backward would otherwise walk into the outer graph. Like
// any op, the node is recorded only when an input requires grad.
//
// offload_inputs: the inputs that are CUDA tensors made by other ops (not leaves) are parked in
// page-locked host memory until the backward (src/tensor/offload.h), so the node holds none of
// their device memory; the backward copies them back before running fn again.
Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                  bool offload_inputs = false);

// Recomputation in pieces of rows, for a function that works token by token: every input and the
// output are contiguous (B, T, ·), row (b, t) of the output depends only on row (b, t) of each
// input (and on the leaves fn reads, e.g. parameters), and fn learns its rows' first position t0
// (for RoPE). The forward runs fn on `rows` positions of one sequence at a time without
// recording and keeps only the inputs; the backward runs each piece again, recording, and
// backpropagates that piece's gradient through it. So neither pass ever holds more than one
// piece of fn's intermediates: a transformer block's MLP at a million tokens holds a piece of
// its (T, 4C) activations, not all of them. fn's leaves receive each piece's gradient in turn;
// they are reported final (GradSink) once, after the last piece.
Tensor checkpoint_rows(const std::function<Tensor(const std::vector<Tensor>&, int64_t t0)>& fn,
                       const std::vector<Tensor>& inputs, int64_t rows);

}  // namespace tg
