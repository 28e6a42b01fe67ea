// Reverse-mode automatic differentiation over the recorded tape.
#include "src/autograd/autograd.h"

#include <unordered_map>
#include <unordered_set>

#include "kernels/cpu/elementwise.h"
#include "kernels/cuda/elementwise.h"
#include "src/ops/ops.h"
#include "src/tensor/dispatch.h"

namespace tg {

namespace {
thread_local bool t_grad_enabled = true;

// The node whose closure is running, and what it may take (see take_pending_gradient).
struct PendingHandOver {
  std::vector<Tensor> available;  // per input: the gradient accumulated so far, or undefined
  std::vector<bool> taken;
};
thread_local PendingHandOver* t_hand_over = nullptr;

// Small bf16 → fp32 leaf-gradient additions waiting for one batched launch (see
// accumulate_converted_later); flushed when full and when backward() ends.
struct DeferredFold {
  Tensor dst, src;
};
thread_local std::vector<DeferredFold> t_deferred_folds;

// The hook of the innermost LeafGradReadyScope, and the final leaves whose report waits for
// their deferred folds to be launched.
thread_local LeafGradReadyHook* t_leaf_ready = nullptr;
thread_local std::vector<Tensor> t_ready_after_flush;

void flush_deferred_folds() {
#ifdef TILEGRAD_HAVE_CUDA
  if (!t_deferred_folds.empty()) {
    std::vector<cuda::AddConvertedJob> jobs;
    for (const DeferredFold& f : t_deferred_folds)
      jobs.push_back({f.dst.data<float>(), f.src.data<bf16>(), f.src.numel()});
    cuda::add_converted_batched(jobs.data(), int(jobs.size()), detail::cuda_stream());
  }
#endif
  t_deferred_folds.clear();  // the sources may be freed now: the stream orders the kernel first
  std::vector<Tensor> ready;
  ready.swap(t_ready_after_flush);
  if (t_leaf_ready)
    for (const Tensor& leaf : ready) (*t_leaf_ready)(leaf);
}

// Whether a deferred fold still waits to add into `leaf`'s gradient.
bool fold_pending_for(const Tensor& leaf) {
  const Tensor g = leaf.grad();
  if (!g.defined()) return false;
  const char* lo = static_cast<const char*>(g.raw());
  for (const DeferredFold& f : t_deferred_folds) {
    const char* d = static_cast<const char*>(f.dst.raw());
    if (d >= lo && d < lo + g.nbytes()) return true;
  }
  return false;
}

void report_final(const Tensor& leaf) {
  if (fold_pending_for(leaf)) t_ready_after_flush.push_back(leaf);
  else (*t_leaf_ready)(leaf);
}
}  // namespace

Tensor take_pending_gradient(size_t input) {
  if (!t_hand_over || input >= t_hand_over->available.size() || t_hand_over->taken[input]) return Tensor();
  Tensor g = t_hand_over->available[input];
  if (g.defined()) t_hand_over->taken[input] = true;
  return g;
}

LeafGradReadyScope::LeafGradReadyScope(LeafGradReadyHook hook) : hook_(std::move(hook)), previous_(t_leaf_ready) {
  t_leaf_ready = &hook_;
}
LeafGradReadyScope::~LeafGradReadyScope() { t_leaf_ready = previous_; }

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

void record(Tensor& output, std::string op, std::vector<Tensor> inputs,
            std::function<std::vector<Tensor>(const Tensor&)> backward_fn) {
  if (!t_grad_enabled) return;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return;
  auto node = std::make_shared<Node>();
  node->op = std::move(op);
  node->inputs = std::move(inputs);
  node->backward = std::move(backward_fn);
  output.impl()->grad_fn = std::move(node);
  output.impl()->requires_grad = true;
}

void accumulate_into(Tensor& dst, const Tensor& src) {
  TG_CHECK(dst.shape() == src.shape() && dst.dtype() == src.dtype() && dst.device() == src.device(),
           "gradient accumulation: ", src.desc(), " into ", dst.desc());
  detail::dispatch("gradient accumulation", dst,
                   [&]<typename T>() { cpu::add_inplace(dst.data<T>(), src.data<T>(), dst.numel()); },
                   [&]<typename T>() {
                     cuda::add_inplace(dst.data<T>(), src.data<T>(), dst.numel(), detail::cuda_stream());
                   });
}

void accumulate_converted_later(const Tensor& dst, const Tensor& src) {
  TG_CHECK(dst.dtype() == DType::f32 && src.dtype() == DType::bf16 && dst.numel() == src.numel() &&
               dst.device().is_cuda() && src.device() == dst.device(),
           "accumulate_converted_later: ", src.desc(), " into ", dst.desc());
  if (int(t_deferred_folds.size()) == cuda::kAddConvertedMaxJobs) flush_deferred_folds();
  t_deferred_folds.push_back({dst, src});
}

void backward(const Tensor& root) {
  TG_CHECK(root.defined() && root.numel() == 1, "backward() needs a one-element tensor, got ",
           root.desc());
  backward(root, Tensor::full(root.shape(), 1.0, root.dtype(), root.device()));
}

void backward(const Tensor& root, const Tensor& seed) {
  TG_CHECK(root.defined() && seed.defined() && seed.shape() == root.shape() && seed.dtype() == root.dtype() &&
               seed.device() == root.device(),
           "backward(): the seed gradient ", seed.desc(), " must match the root ", root.desc());
  TG_CHECK(root.requires_grad(), "backward() on a tensor that does not require grad (",
           root.desc(), "): no parameter it depends on has requires_grad set");
  NoGradGuard no_grad;  // backward closures never record
  // Deferred leaf-gradient additions are flushed at the end; if a closure throws they are
  // dropped, never carried into the next backward().
  struct DropDeferredFolds {
    ~DropDeferredFolds() { t_deferred_folds.clear(), t_ready_after_flush.clear(); }
  } drop_deferred_folds;

  if (root.is_leaf()) {
    if (root.grad().defined()) { Tensor g = root.grad(); accumulate_into(g, seed); }
    else root.impl()->grad = seed.impl_ptr();
    return;
  }

  // Topological order by iterative DFS (deep models would overflow a recursive one).
  std::vector<Node*> order;
  std::unordered_set<Node*> visited;
  std::vector<std::pair<Node*, size_t>> stack{{root.grad_fn().get(), 0}};
  visited.insert(root.grad_fn().get());
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      const Tensor& in = node->inputs[next++];
      if (in.defined() && in.grad_fn() && !visited.count(in.grad_fn().get())) {
        visited.insert(in.grad_fn().get());
        stack.push_back({in.grad_fn().get(), 0});
      }
    } else {
      order.push_back(node);
      stack.pop_back();
    }
  }

  // With a LeafGradReadyHook: how many nodes still to walk read each leaf.
  std::unordered_map<TensorImpl*, int> leaf_readers;
  if (t_leaf_ready)
    for (Node* node : order)
      for (const Tensor& in : node->inputs)
        if (in.defined() && !in.grad_fn() && in.requires_grad()) ++leaf_readers[in.impl()];
  auto walked = [&](Node* node) {
    if (!t_leaf_ready) return;
    for (const Tensor& in : node->inputs)
      if (in.defined() && !in.grad_fn() && in.requires_grad() && --leaf_readers[in.impl()] == 0) report_final(in);
  };

  std::unordered_map<Node*, Tensor> pending;  // gradient of each node's output
  pending[root.grad_fn().get()] = seed;
  // Keep nodes alive while we walk even if tensors holding them are released mid-walk.
  std::vector<std::shared_ptr<Node>> keep;
  keep.push_back(root.grad_fn());
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = *it;
    auto found = pending.find(node);
    if (found == pending.end()) {  // no gradient flows here
      walked(node);
      continue;
    }
    Tensor grad_out = found->second;
    pending.erase(found);
    for (const Tensor& in : node->inputs)
      if (in.defined() && in.grad_fn()) keep.push_back(in.grad_fn());
    // What the closure may take over: the gradients already pending for its (non-leaf) inputs.
    PendingHandOver hand_over;
    hand_over.available.resize(node->inputs.size());
    hand_over.taken.assign(node->inputs.size(), false);
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Tensor& in = node->inputs[i];
      if (!in.defined() || !in.grad_fn()) continue;
      // The same tensor twice among the inputs would be handed over twice: offer it to neither.
      bool repeated = false;
      for (size_t j = 0; j < node->inputs.size(); ++j)
        repeated = repeated || (j != i && node->inputs[j].defined() && node->inputs[j].grad_fn() == in.grad_fn());
      auto p = pending.find(in.grad_fn().get());
      if (!repeated && p != pending.end()) hand_over.available[i] = p->second;
    }
    std::vector<Tensor> grads;
    {
      struct Scope {
        PendingHandOver* previous;
        explicit Scope(PendingHandOver* h) : previous(t_hand_over) { t_hand_over = h; }
        ~Scope() { t_hand_over = previous; }
      } scope(&hand_over);
      grads = node->backward(grad_out);
    }
    TG_ASSERT(grads.size() == node->inputs.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      Tensor& in = node->inputs[i];
      Tensor& g = grads[i];
      if (!in.defined() || !in.requires_grad() || !g.defined()) continue;
      TG_CHECK(g.shape() == in.shape(), "backward of ", node->op, ": gradient ", g.desc(),
               " does not match input ", i, " ", in.desc());
      if (in.grad_fn()) {
        auto p = pending.find(in.grad_fn().get());
        if (p == pending.end()) {
          pending.emplace(in.grad_fn().get(), g);
        } else if (hand_over.taken[i]) {
          p->second = g;  // the closure added the pending gradient into g itself
        } else {
          // Out of place (a closure may hand the same tensor to several inputs), in one pass.
          p->second = ops::add(p->second, g);
        }
      } else if (in.grad().defined()) {
        Tensor dst = in.grad();
        accumulate_into(dst, g);
      } else {
        in.impl()->grad = g.clone().impl_ptr();  // own copy: g may alias a saved buffer
      }
    }
    walked(node);
    // Free the graph as we go: saved tensors and closures die here.
    node->backward = nullptr;
    node->inputs.clear();
  }
  flush_deferred_folds();
  root.impl()->grad_fn.reset();
}

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = fn(inputs);
  }
  record(out, "checkpoint", inputs, [fn, inputs](const Tensor& grad_out) {
    // The second run records (closures run with recording off), from leaves that stand for the
    // inputs, so its backward stops at them.
    struct RecordingOn {
      bool previous = t_grad_enabled;
      RecordingOn() { t_grad_enabled = true; }
      ~RecordingOn() { t_grad_enabled = previous; }
    };
    std::vector<Tensor> leaves;
    Tensor again;
    {
      RecordingOn recording;
      for (const Tensor& in : inputs) {
        Tensor leaf = in.detach();
        if (in.requires_grad()) leaf.set_requires_grad(true);
        leaves.push_back(leaf);
      }
      again = fn(leaves);
    }
    std::vector<Tensor> grads(inputs.size());
    if (again.requires_grad()) {
      backward(again, grad_out);
      for (size_t i = 0; i < leaves.size(); ++i)
        if (leaves[i].requires_grad()) grads[i] = leaves[i].grad();
    }
    return grads;
  });
  return out;
}

void Tensor::backward() const { tg::backward(*this); }

}  // namespace tg
