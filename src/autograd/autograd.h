// The tape: each differentiable op records a Node holding its inputs and a closure that maps
// the output's gradient to its inputs' gradients. backward() sorts the nodes topologically,
// walks them in reverse, accumulates with +=, and frees the graph as it goes.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/tensor/tensor.h"

namespace tg {

struct Node {
  std::string op;              // for error messages: the op that recorded this node
  std::vector<Tensor> inputs;  // one per differentiable input, in the op's order
  // Given d(loss)/d(output), returns one gradient per input (undefined: no gradient).
  std::function<std::vector<Tensor>(const Tensor& grad_output)> backward;
};

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
void record(Tensor& output, std::string op, std::vector<Tensor> inputs,
            std::function<std::vector<Tensor>(const Tensor&)> backward);

// Backpropagates from `root` (a one-element tensor) with seed gradient 1.
void backward(const Tensor& root);
// Backpropagates from `root` with the seed gradient `grad_root` (root's shape, dtype and device).
void backward(const Tensor& root, const Tensor& grad_root);

// Activation recomputation. Runs fn(inputs) without recording, so none of fn's intermediates is
// kept, and records one node on the output; its backward runs fn again, recording, on detached
// copies of the inputs, and backpropagates the output's gradient through that second run: the
// inputs get their gradients from it, and so do the leaves fn reads (parameters), added into
// their .grad as any backward adds. fn must give the same output both times (seed its dropout
// from state it restores), and every tensor it reads besides `inputs` must be a leaf or made
// inside fn: the second run's backward would otherwise walk into the outer graph. Like any op,
// the node is recorded only when an input requires grad.
Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs);

// For a backward closure while it runs: the gradient other consumers have already accumulated for
// its input `input` (a non-leaf tensor used more than once, like a residual stream), handed over —
// undefined when there is none (or outside a closure). A closure that takes it must return, for
// that input, the total: its own gradient plus the taken one. The engine then stores that instead
// of adding the two, so the closure can fold the accumulation into its own kernel (LayerNorm's
// backward adds the residual gradient as it writes dx: one pass over the tensor fewer).
Tensor take_pending_gradient(size_t input);

// Called during backward() when a leaf's gradient is final: every node of the graph that reads
// the leaf has run and its contribution is added (deferred conversions included; on the GPU,
// queued on the compute stream). Data-parallel training starts reducing a bucket of gradients
// as soon as all of its parameters are final, while the backward goes on (src/dist/grad_sync.h).
// A leaf no node of the graph reads is never reported.
using LeafGradReadyHook = std::function<void(const Tensor& leaf)>;
// Installs `hook` for the backward passes this thread runs while the scope lives.
class LeafGradReadyScope {
 public:
  explicit LeafGradReadyScope(LeafGradReadyHook hook);
  ~LeafGradReadyScope();
  LeafGradReadyScope(const LeafGradReadyScope&) = delete;
  LeafGradReadyScope& operator=(const LeafGradReadyScope&) = delete;

 private:
  LeafGradReadyHook hook_;
  LeafGradReadyHook* previous_;
};

// dst += src (same shape and dtype, no autograd). Used for gradient accumulation.
void accumulate_into(Tensor& dst, const Tensor& src);

// During backward() on the GPU: dst (fp32, a leaf's gradient) += src (bf16), added before
// backward() returns, batched with the other small ones into a launch (cuda::add_converted_batched)
// instead of one launch each. For small tensors (a bias, a LayerNorm weight); src is kept alive
// until then.
void accumulate_converted_later(const Tensor& dst, const Tensor& src);

}  // namespace tg
