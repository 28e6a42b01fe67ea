// Where leaves' gradients go (PyTorch's AccumulateGrad): the engine hands every gradient meant for
// a leaf to the leaf's sink and never writes a leaf's .grad itself.
//
// The sink adds the gradient into the leaf's .grad (or makes it the .grad when there is none).
// A gradient of another dtype is folded in: a bf16 gradient of an fp32 parameter (its compute
// copy's, from the cast's backward) is added into the fp32 gradient in one pass, without a
// converted copy. The small folds (≤ kDeferredFoldMaxNumel elements: biases, LayerNorm
// parameters) are collected and added kAddIntoBatchCapacity at a time in one launch, when the
// batch is full and when the backward ends (flush()): on the GPU one launch each would cost
// ~2 µs for a few thousand elements. A gradient added to a leaf whose fold still waits flushes
// the batch first, so the additions keep their order.
//
// The engine also tells the sink when a leaf's gradient is final (every node of the graph that
// reads it has run); with a ready hook installed the sink passes that on once the leaf's folds
// are launched: data-parallel training starts reducing a bucket as soon as all of its parameters
// are final (src/dist/grad_sync.h). The parameter store's parameters share one sink
// (ParameterStore::grad_sink()); a leaf bound to none goes to a sink the backward makes for them.
// A sink serves one backward at a time (nested ones, as tg::checkpoint runs, included).
//
// First writes: a step's gradients need not be zeroed before its backward. The leaves named by
// expect_first_writes() hold no gradient yet, whatever their buffers contain: the first gradient
// each gets is written over the buffer (a copy; a weight-gradient GEMM with beta = 0 through
// accumulator()), later ones are added, and the outermost backward zeroes at its end those that
// got none. ParameterStore::zero_grad_at_first_write() uses it for the 2-D weights.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "src/tensor/accumulate.h"
#include "src/tensor/tensor.h"

namespace tg {

class GradSink {
 public:
  using ReadyHook = std::function<void(const Tensor& leaf)>;
  // Folds up to this many elements wait for a batched launch; larger ones are added at once.
  static constexpr int64_t kDeferredFoldMaxNumel = int64_t(1) << 16;

  GradSink() = default;
  GradSink(const GradSink&) = delete;
  GradSink& operator=(const GradSink&) = delete;
  ~GradSink();

  // leaf.grad += grad (grad: the leaf's shape and device, any floating dtype), or
  // leaf.grad = grad in the leaf's dtype, as a buffer of its own, when the leaf has none.
  void add(const Tensor& leaf, const Tensor& grad);
  // The leaf's gradient is final in this backward: reported to the ready hook, after the leaf's
  // waiting folds are launched.
  void leaf_final(const Tensor& leaf);
  // Launches the waiting folds and reports the leaves that waited for them. The engine calls it
  // when a backward ends.
  void flush();
  // Drops the waiting folds and reports unlaunched (a backward that threw): nothing is carried
  // into the next backward.
  void discard();

  // leaf's gradient buffer when it is fp32 on the GPU, for a node to add its gradient into
  // itself (GradHandOver::accumulator), with the leaf's waiting folds launched first so that the
  // additions keep their order; undefined otherwise. A leaf waiting for its first write is zeroed
  // first, unless first_write is given: then *first_write says whether the buffer holds no
  // gradient yet, and the caller writes the whole of it in that case (beta = 0) instead of adding.
  Tensor accumulator(const Tensor& leaf, bool* first_write = nullptr);

  // The leaves' buffers hold no gradient yet (see above); each leaf's buffer must be its own.
  void expect_first_writes(const std::vector<Tensor>& leaves);
  // Zeroes the buffers of the leaves still waiting for their first gradient, adjacent ones in one
  // pass: the outermost backward calls it as it ends, as none will come.
  void zero_unwritten();

  // Whether leaf_final reports go anywhere (the engine counts readers only then).
  bool wants_final() const { return static_cast<bool>(ready_); }

  // Installs `hook` while the scope lives (the backward of a data-parallel step's last
  // micro-batch): each final leaf of this sink is reported to it.
  class ReadyScope {
   public:
    ReadyScope(GradSink& sink, ReadyHook hook);
    ~ReadyScope();
    ReadyScope(const ReadyScope&) = delete;
    ReadyScope& operator=(const ReadyScope&) = delete;

   private:
    GradSink& sink_;
    ReadyHook previous_;
  };

 private:
  bool fold_waits_for(const Tensor& leaf) const;

  // Marks leaf written; true when it was waiting for its first gradient.
  bool take_first_write(const Tensor& leaf) { return !unwritten_.empty() && unwritten_.erase(leaf.impl()) > 0; }

  std::unordered_map<const TensorImpl*, Tensor> unwritten_;  // expect_first_writes' leaves not written yet
  std::vector<AddJob> deferred_;          // folds waiting for a batched launch
  std::vector<Tensor> ready_after_flush_;  // final leaves whose folds wait
  ReadyHook ready_;
};

// Sends `leaf`'s gradients to `sink` (a parameter store binds its parameters to its sink).
void bind_grad_sink(const Tensor& leaf, std::shared_ptr<GradSink> sink);
// The sink bound to `leaf`, or nullptr.
GradSink* grad_sink_of(const Tensor& leaf);

}  // namespace tg
