// Reverse-mode automatic differentiation over the recorded tape.
#include "src/autograd/autograd.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "src/tensor/accumulate.h"
#include "src/tensor/offload.h"

namespace tg {

namespace {
thread_local bool t_grad_enabled = true;
// While set, backward() reports no leaf final: checkpoint_rows runs one backward per piece over
// the same leaves and lets only the last one report.
thread_local bool t_hold_leaf_reports = false;

// How many backward() calls this thread is inside: the outermost one zeroes, as it ends, the
// leaves still waiting for a first write (GradSink::zero_unwritten); nested ones (tg::checkpoint's)
// leave them for it.
thread_local int t_backward_depth = 0;

struct HoldLeafReports {
  bool previous = t_hold_leaf_reports;
  explicit HoldLeafReports(bool hold) { t_hold_leaf_reports = hold; }
  ~HoldLeafReports() { t_hold_leaf_reports = previous; }
};

struct RecordingOn {
  bool previous = t_grad_enabled;
  RecordingOn() { t_grad_enabled = true; }
  ~RecordingOn() { t_grad_enabled = previous; }
};

// A tensor that stands for `t` in a node's inputs where the node no longer needs t's values: the
// same shape, dtype, device and producing node, but no memory. The engine reads only those.
Tensor edge_only(const Tensor& t) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(0, t.device(), MemCategory::activations);
  impl->shape = t.shape();
  impl->dtype = t.dtype();
  impl->requires_grad = t.requires_grad();
  impl->grad_fn = t.grad_fn();
  return Tensor(impl);
}

// The sinks one backward() handed gradients to, flushed when it ends, or, if a closure throws,
// discarded: nothing is carried into the next backward().
class SinksUsed {
 public:
  GradSink& of(const Tensor& leaf) {
    GradSink* s = grad_sink_of(leaf);
    if (!s) s = &own_;
    for (GradSink* u : used_)
      if (u == s) return *s;
    used_.push_back(s);
    return *s;
  }
  void flush() {
    for (GradSink* s : used_) s->flush();
    if (t_backward_depth == 1)
      for (GradSink* s : used_) s->zero_unwritten();
    flushed_ = true;
  }
  ~SinksUsed() {
    if (!flushed_)
      for (GradSink* s : used_) s->discard();
  }

 private:
  GradSink own_;  // for the leaves bound to no sink
  std::vector<GradSink*> used_;
  bool flushed_ = false;
};
}  // namespace

GradHandOver::GradHandOver(std::vector<Tensor> available, std::vector<Tensor> accumulator_leaves,
                           std::vector<GradSink*> accumulator_sinks, std::vector<bool> complete)
    : available_(std::move(available)),
      taken_(available_.size(), false),
      accumulator_leaves_(std::move(accumulator_leaves)),
      accumulator_sinks_(std::move(accumulator_sinks)),
      complete_(std::move(complete)) {}

Tensor GradHandOver::accumulator(size_t input, bool* first_write) {
  if (first_write) *first_write = false;
  if (input >= accumulator_leaves_.size() || !accumulator_leaves_[input].defined()) return Tensor();
  return accumulator_sinks_[input]->accumulator(accumulator_leaves_[input], first_write);
}

Tensor GradHandOver::take(size_t input) {
  if (input >= available_.size() || taken_[input]) return Tensor();
  Tensor g = available_[input];
  if (g.defined()) taken_[input] = true;
  return g;
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

void record(Tensor& output, std::string op, std::vector<Tensor> inputs, BackwardHandOverFn backward_fn) {
  if (!t_grad_enabled) return;
  bool any = false;
  for (const Tensor& t : inputs) any = any || (t.defined() && t.requires_grad());
  if (!any) return;
  // A node reads its inputs' shapes, dtypes, devices and producing nodes, never their values:
  // the values a backward needs are what its closure captures. So a non-leaf input is held as an
  // edge without memory, and a tensor no closure captured is freed when the forward drops it (a
  // projection's output once the residual add has read it), not when the backward reaches it
  // (docs/memory.md). Leaves that need a gradient stay whole: their sinks and fp32 gradients are
  // found through them; the others (an additive mask, say) take no part in the backward.
  for (Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (t.grad_fn()) t = edge_only(t);
    else if (!t.requires_grad()) t = Tensor();
  }
  auto node = std::make_shared<Node>();
  node->op = std::move(op);
  node->inputs = std::move(inputs);
  node->backward = std::move(backward_fn);
  output.impl()->grad_fn = std::move(node);
  output.impl()->requires_grad = true;
}

void record(Tensor& output, std::string op, std::vector<Tensor> inputs, BackwardFn backward_fn) {
  if (!t_grad_enabled) return;
  record(output, std::move(op), std::move(inputs),
         BackwardHandOverFn([fn = std::move(backward_fn)](const Tensor& g, GradHandOver&) { return fn(g); }));
}

void record_cast(Tensor& output, const Tensor& x) {
  record(output, "cast", {x}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  if (output.grad_fn()) output.grad_fn()->passes_to_leaf = x.is_leaf();
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
  struct Depth {
    Depth() { ++t_backward_depth; }
    ~Depth() { --t_backward_depth; }
  } depth;
  SinksUsed sinks;

  if (root.is_leaf()) {
    sinks.of(root).add(root, seed);
    sinks.flush();
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

  // For the leaves whose sink has a ready hook: how many nodes still to walk read each one.
  auto reported = [](const Tensor& in) {
    if (t_hold_leaf_reports || !in.defined() || in.grad_fn() || !in.requires_grad()) return false;
    const GradSink* s = grad_sink_of(in);
    return s && s->wants_final();
  };
  std::unordered_map<TensorImpl*, int> leaf_readers;
  for (Node* node : order)
    for (const Tensor& in : node->inputs)
      if (reported(in)) ++leaf_readers[in.impl()];
  auto walked = [&](Node* node) {
    if (leaf_readers.empty()) return;
    for (const Tensor& in : node->inputs)
      if (reported(in) && --leaf_readers[in.impl()] == 0) sinks.of(in).leaf_final(in);
  };

  // For each node's output: how many nodes still to walk read it (GradHandOver::complete).
  std::unordered_map<Node*, int> readers;
  auto read_nodes = [](Node* node) {  // the distinct nodes whose outputs `node` reads
    std::vector<Node*> read;
    for (const Tensor& in : node->inputs)
      if (in.defined() && in.grad_fn() && std::find(read.begin(), read.end(), in.grad_fn().get()) == read.end())
        read.push_back(in.grad_fn().get());
    return read;
  };
  for (Node* node : order)
    for (Node* r : read_nodes(node)) ++readers[r];
  auto unread = [&](Node* node) {
    for (Node* r : read_nodes(node)) --readers[r];
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
      unread(node);
      continue;
    }
    Tensor grad_out = found->second;
    pending.erase(found);
    for (const Tensor& in : node->inputs)
      if (in.defined() && in.grad_fn()) keep.push_back(in.grad_fn());
    // What the closure may take over: the gradients already pending for its (non-leaf) inputs.
    std::vector<Tensor> available(node->inputs.size());
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Tensor& in = node->inputs[i];
      if (!in.defined() || !in.grad_fn()) continue;
      // The same tensor twice among the inputs would be handed over twice: offer it to neither.
      bool repeated = false;
      for (size_t j = 0; j < node->inputs.size(); ++j)
        repeated = repeated || (j != i && node->inputs[j].defined() && node->inputs[j].grad_fn() == in.grad_fn());
      auto p = pending.find(in.grad_fn().get());
      if (!repeated && p != pending.end()) available[i] = p->second;
    }
    // What the closure may add into: the fp32 gradients of the leaves its inputs are casts of,
    // asked of their sinks when the closure asks (GradHandOver::accumulator).
    std::vector<Tensor> accumulator_leaves(node->inputs.size());
    std::vector<GradSink*> accumulator_sinks(node->inputs.size(), nullptr);
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Tensor& in = node->inputs[i];
      if (!in.defined() || !in.grad_fn() || !in.grad_fn()->passes_to_leaf) continue;
      const Tensor& leaf = in.grad_fn()->inputs.front();
      if (leaf.defined() && leaf.requires_grad()) {
        accumulator_leaves[i] = leaf;
        accumulator_sinks[i] = &sinks.of(leaf);
      }
    }
    // Which inputs this node is the last reader of.
    std::vector<bool> complete(node->inputs.size(), false);
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Tensor& in = node->inputs[i];
      complete[i] = in.defined() && in.grad_fn() && readers[in.grad_fn().get()] == 1;
    }
    unread(node);
    GradHandOver hand_over(std::move(available), std::move(accumulator_leaves), std::move(accumulator_sinks),
                           std::move(complete));
    std::vector<Tensor> grads = node->backward(grad_out, hand_over);
    TG_ASSERT(grads.size() == node->inputs.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      Tensor& in = node->inputs[i];
      Tensor& g = grads[i];
      if (!in.defined() || !in.requires_grad()) continue;
      if (!g.defined()) {
        // A closure that took the pending gradient and returns none added both into an
        // accumulator itself: nothing is left pending.
        if (hand_over.taken(i)) pending.erase(in.grad_fn().get());
        continue;
      }
      TG_CHECK(g.shape() == in.shape() && g.device() == in.device() && is_floating(g.dtype()),
               "backward of ", node->op, ": gradient ", g.desc(), " does not match input ", i, " ", in.desc());
      if (in.grad_fn()) {
        if (g.dtype() != in.dtype()) g = g.to(in.dtype());
        auto p = pending.find(in.grad_fn().get());
        if (p == pending.end()) {
          pending.emplace(in.grad_fn().get(), g);
        } else if (hand_over.taken(i)) {
          p->second = g;  // the closure added the pending gradient into g itself
        } else {
          // Out of place (a closure may hand the same tensor to several inputs), in one pass.
          p->second = sum_of(p->second, g);
        }
      } else {
        sinks.of(in).add(in, g);
      }
    }
    walked(node);
    // Free the graph as we go: saved tensors and closures die here.
    node->backward = nullptr;
    node->inputs.clear();
  }
  sinks.flush();
  root.impl()->grad_fn.reset();
}

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs,
                  bool offload_inputs) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = fn(inputs);
  }
  // What the backward runs fn again from: the inputs themselves, or their parked copies.
  std::vector<Tensor> kept = inputs, edges = inputs;
  std::vector<ParkedTensor> parked(inputs.size());
  if (offload_inputs && grad_enabled())
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].defined() && inputs[i].device().is_cuda() && inputs[i].grad_fn()) {
        parked[i] = ParkedTensor(inputs[i]);
        kept[i] = Tensor();
        edges[i] = edge_only(inputs[i]);
      }
  record(out, "checkpoint", edges, [fn, kept, parked, edges](const Tensor& grad_out) {
    // The second run records (closures run with recording off), from leaves that stand for the
    // inputs, so its backward stops at them.
    std::vector<Tensor> leaves;
    Tensor again;
    {
      RecordingOn recording;
      for (size_t i = 0; i < edges.size(); ++i) {
        const Tensor& in = edges[i];
        Tensor leaf = parked[i].defined() ? parked[i].restore() : kept[i].defined() ? kept[i].detach() : Tensor();
        if (leaf.defined() && in.requires_grad()) leaf.set_requires_grad(true);
        leaves.push_back(leaf);
      }
      again = fn(leaves);
    }
    std::vector<Tensor> grads(edges.size());
    if (again.requires_grad()) {
      backward(again, grad_out);
      for (size_t i = 0; i < leaves.size(); ++i)
        if (leaves[i].defined() && leaves[i].requires_grad()) grads[i] = leaves[i].grad();
    }
    return grads;
  });
  return out;
}

Tensor checkpoint_rows(const std::function<Tensor(const std::vector<Tensor>&, int64_t t0)>& fn,
                       const std::vector<Tensor>& inputs, int64_t rows) {
  TG_CHECK(!inputs.empty() && rows > 0, "checkpoint_rows: needs inputs and a positive number of rows, got ", rows);
  const Tensor& first = inputs[0];
  TG_CHECK(first.defined() && first.dim() == 3, "checkpoint_rows: inputs must be (B, T, ·), got ",
           first.defined() ? first.desc() : "undefined");
  const int64_t B = first.size(0), T = first.size(1);
  for (const Tensor& in : inputs)
    TG_CHECK(in.defined() && in.dim() == 3 && in.size(0) == B && in.size(1) == T && in.device() == first.device(),
             "checkpoint_rows: every input must be (", B, ", ", T, ", ·) on ", first.device().str(), ", got ",
             in.defined() ? in.desc() : "undefined");
  // The rows of sequence b from position t0 on, n of them, of a (B, T, K) tensor: contiguous.
  auto piece = [T](const Tensor& x, int64_t b, int64_t t0, int64_t n) {
    return Tensor::view_of(x, (b * T + t0) * x.size(2), {1, n, x.size(2)});
  };
  Tensor out;
  {
    NoGradGuard no_grad;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t0 = 0; t0 < T; t0 += rows) {
        const int64_t n = std::min(rows, T - t0);
        std::vector<Tensor> in;
        for (const Tensor& x : inputs) in.push_back(piece(x, b, t0, n));
        Tensor y = fn(in, t0);
        TG_CHECK(y.dim() == 3 && y.size(0) == 1 && y.size(1) == n, "checkpoint_rows: fn gave ", y.desc(),
                 " for ", n, " rows");
        if (!out.defined()) out = Tensor::empty({B, T, y.size(2)}, y.dtype(), y.device());
        piece(out, b, t0, n).copy_from(y);
      }
  }
  record(out, "checkpoint_rows", inputs, [fn, inputs, rows, B, T, piece](const Tensor& grad_out) {
    std::vector<Tensor> grads(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].requires_grad()) grads[i] = Tensor::empty(inputs[i].shape(), inputs[i].dtype(), inputs[i].device());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t0 = 0; t0 < T; t0 += rows) {
        const int64_t n = std::min(rows, T - t0);
        const bool last = b == B - 1 && t0 + rows >= T;
        std::vector<Tensor> leaves;
        Tensor again;
        {
          RecordingOn recording;
          for (const Tensor& x : inputs) {
            Tensor leaf = piece(x, b, t0, n).detach();
            if (x.requires_grad()) leaf.set_requires_grad(true);
            leaves.push_back(leaf);
          }
          again = fn(leaves, t0);
        }
        if (!again.requires_grad()) continue;
        {
          HoldLeafReports hold(!last);
          backward(again, piece(grad_out, b, t0, n));
        }
        for (size_t i = 0; i < inputs.size(); ++i) {
          if (!grads[i].defined()) continue;
          Tensor g = leaves[i].grad();
          if (g.defined()) piece(grads[i], b, t0, n).copy_from(g.dtype() == grads[i].dtype() ? g : g.to(grads[i].dtype()));
          else piece(grads[i], b, t0, n).copy_from(Tensor::zeros(leaves[i].shape(), grads[i].dtype(), grads[i].device()));
        }
      }
    return grads;
  });
  return out;
}

void Tensor::backward() const { tg::backward(*this); }

}  // namespace tg
