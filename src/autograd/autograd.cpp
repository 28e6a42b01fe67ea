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
}

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

void backward(const Tensor& root) {
  TG_CHECK(root.defined() && root.numel() == 1, "backward() needs a one-element tensor, got ",
           root.desc());
  TG_CHECK(root.requires_grad(), "backward() on a tensor that does not require grad (",
           root.desc(), "): no parameter it depends on has requires_grad set");
  NoGradGuard no_grad;  // backward closures never record

  Tensor seed = Tensor::full(root.shape(), 1.0, root.dtype(), root.device());
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

  std::unordered_map<Node*, Tensor> pending;  // gradient of each node's output
  pending[root.grad_fn().get()] = seed;
  // Keep nodes alive while we walk even if tensors holding them are released mid-walk.
  std::vector<std::shared_ptr<Node>> keep;
  keep.push_back(root.grad_fn());
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = *it;
    auto found = pending.find(node);
    if (found == pending.end()) continue;  // no gradient flows here
    Tensor grad_out = found->second;
    pending.erase(found);
    for (const Tensor& in : node->inputs)
      if (in.defined() && in.grad_fn()) keep.push_back(in.grad_fn());
    std::vector<Tensor> grads = node->backward(grad_out);
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
    // Free the graph as we go: saved tensors and closures die here.
    node->backward = nullptr;
    node->inputs.clear();
  }
  root.impl()->grad_fn.reset();
}

void Tensor::backward() const { tg::backward(*this); }

}  // namespace tg
