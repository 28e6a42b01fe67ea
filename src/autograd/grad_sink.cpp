// The leaf-gradient sink (see grad_sink.h).
#include "src/autograd/grad_sink.h"

#include <algorithm>
#include <utility>

namespace tg {

GradSink::~GradSink() = default;

bool GradSink::fold_waits_for(const Tensor& leaf) const {
  const Tensor g = leaf.grad();
  if (!g.defined() || deferred_.empty()) return false;
  const char* lo = static_cast<const char*>(g.raw());
  for (const AddJob& f : deferred_) {
    const char* d = static_cast<const char*>(f.dst.raw());
    if (d >= lo && d < lo + g.nbytes()) return true;
  }
  return false;
}

void GradSink::add(const Tensor& leaf, const Tensor& grad) {
  TG_CHECK(grad.shape() == leaf.shape() && grad.device() == leaf.device() && is_floating(grad.dtype()),
           "gradient ", grad.desc(), " for the leaf ", leaf.desc());
  Tensor dst = leaf.grad();
  if (!dst.defined()) {
    // A buffer of its own: grad may alias a buffer a node saved.
    leaf.impl()->grad = grad.to(leaf.dtype()).impl_ptr();
    return;
  }
  if (take_first_write(leaf)) {  // nothing in the buffer, and no fold waits for it
    dst.copy_from(grad);
    return;
  }
  // In order: and a batch never adds twice into one buffer.
  if (fold_waits_for(leaf)) flush();
  if (grad.dtype() != dst.dtype() && grad.numel() <= kDeferredFoldMaxNumel) {
    if (int(deferred_.size()) == kAddIntoBatchCapacity) flush();
    deferred_.push_back({dst, grad});  // keeps grad alive until the launch
    return;
  }
  add_into(dst, grad);
}

Tensor GradSink::accumulator(const Tensor& leaf, bool* first_write) {
  Tensor g = leaf.grad();
  if (!g.defined() || g.dtype() != DType::f32 || !g.device().is_cuda() || g.shape() != leaf.shape()) return Tensor();
  if (fold_waits_for(leaf)) flush();
  const bool first = take_first_write(leaf);
  if (first_write) *first_write = first;
  else if (first) g.zero();
  return g;
}

void GradSink::expect_first_writes(const std::vector<Tensor>& leaves) {
  for (const Tensor& leaf : leaves) {
    TG_CHECK(leaf.defined() && leaf.grad().defined(), "expect_first_writes: a leaf without a gradient buffer");
    TG_CHECK(!fold_waits_for(leaf), "expect_first_writes: a fold into ", leaf.desc(), " still waits");
    unwritten_.emplace(leaf.impl(), leaf);
  }
}

void GradSink::zero_unwritten() {
  if (unwritten_.empty()) return;
  std::vector<Tensor> grads;
  for (const auto& [impl, leaf] : unwritten_) grads.push_back(leaf.grad());
  unwritten_.clear();
  // Runs of buffers adjacent in one allocation (a parameter store's flat gradient) in one pass.
  auto begin = [](const Tensor& t) { return static_cast<const char*>(t.raw()); };
  std::sort(grads.begin(), grads.end(), [&](const Tensor& a, const Tensor& b) { return begin(a) < begin(b); });
  for (size_t i = 0; i < grads.size();) {
    int64_t numel = grads[i].numel();
    size_t j = i + 1;
    while (j < grads.size() && grads[j].impl()->storage == grads[i].impl()->storage &&
           grads[j].dtype() == grads[i].dtype() &&
           begin(grads[j]) == begin(grads[i]) + size_t(numel) * dtype_size(grads[i].dtype()))
      numel += grads[j++].numel();
    Tensor::view_of(grads[i], 0, {numel}).zero();
    i = j;
  }
}

void GradSink::leaf_final(const Tensor& leaf) {
  if (take_first_write(leaf)) leaf.grad().zero();  // final without a gradient: none comes
  if (!ready_) return;
  if (fold_waits_for(leaf)) ready_after_flush_.push_back(leaf);
  else ready_(leaf);
}

void GradSink::flush() {
  if (!deferred_.empty()) add_into_batched(deferred_);
  deferred_.clear();  // the sources may be freed now: the stream orders the launch first
  std::vector<Tensor> ready;
  ready.swap(ready_after_flush_);
  if (ready_)
    for (const Tensor& leaf : ready) ready_(leaf);
}

void GradSink::discard() {
  deferred_.clear();
  ready_after_flush_.clear();
  // The leaves waiting for a first write keep waiting: a later backward writes or zeroes them.
}

GradSink::ReadyScope::ReadyScope(GradSink& sink, ReadyHook hook) : sink_(sink), previous_(std::move(sink.ready_)) {
  sink_.ready_ = std::move(hook);
}
GradSink::ReadyScope::~ReadyScope() { sink_.ready_ = std::move(previous_); }

void bind_grad_sink(const Tensor& leaf, std::shared_ptr<GradSink> sink) {
  TG_CHECK(leaf.is_leaf(), "a gradient sink is bound to a leaf, not to ", leaf.desc(), ", the output of an op");
  leaf.impl()->grad_sink = std::move(sink);
}

GradSink* grad_sink_of(const Tensor& leaf) { return leaf.impl()->grad_sink.get(); }

}  // namespace tg
