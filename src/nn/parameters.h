// Parameters live in one flat buffer with named views (llm.c's malloc_and_point_parameters),
// and so do their gradients: all-reduce, AdamW and checkpointing are each one operation. Every
// parameter's gradient reaches the flat buffer through the store's one GradSink.
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "src/autograd/grad_sink.h"
#include "src/tensor/tensor.h"

namespace tg::nn {

enum class Init { normal, zeros, ones };

// A contiguous range of the flat parameter (and gradient) buffer: what one data-parallel rank
// updates under ZeRO-1 is a list of these.
struct FlatRange {
  int64_t offset = 0;
  int64_t length = 0;
};

struct Parameter {
  std::string name;  // Hugging Face GPT-2 name, e.g. "transformer.h.0.attn.c_attn.weight"
  Tensor value;      // a view into the flat parameter buffer, requires_grad
  int64_t offset = 0;  // element offset in the flat buffers
  bool decay = false;  // AdamW weight decay applies (2-D weights only)
  Init init = Init::normal;
  double init_std = 0.02;
};

class ParameterStore {
 public:
  // Declares a parameter; call allocate() once all are declared.
  void declare(const std::string& name, const Shape& shape, Init init, double init_std = 0.02);
  // Lays out the flat buffers (decayed parameters first, each group in declaration order),
  // allocates the flat value and grad buffers, points every parameter at its views and
  // initialises values deterministically from `seed` (each element a pure function of
  // seed, parameter index and element index, so the init does not depend on threading).
  void allocate(uint64_t seed, DType dtype = DType::f32, Device device = Device::cpu());

  const std::vector<Parameter>& all() const { return params_; }
  const Tensor& get(const std::string& name) const;
  const Parameter& find(const std::string& name) const;  // value, offset in the flat buffers, …
  bool has(const std::string& name) const;
  int64_t numel() const { return total_; }
  // Decayed parameters (2-D weights) come first in the flat layout: elements [0, decay_numel())
  // take AdamW weight decay and the rest do not, so the update is one sweep with one boundary.
  int64_t decay_numel() const { return decay_total_; }
  Tensor flat_values() const { return values_; }  // (numel)
  Tensor flat_grads() const { return grads_; }    // (numel)

  // The compute copy: the flat values in the model's compute dtype (set_compute_dtype; bf16
  // training), what its forward reads. compute_values() converts the values, unless an
  // optimizer's update wrote the copy as it wrote the values (AdamW on the GPU, owning all of
  // them): then the kept copy is returned as it is, and the forward's conversion pass (0.75 GB
  // over GPT-2 small's 124 M parameters) is gone. Whatever else writes the values (a checkpoint
  // restored, a broadcast, an all-gather) calls values_changed(): the next compute_values()
  // converts again, into the kept buffer.
  void set_compute_dtype(DType dtype) { compute_dtype_ = dtype; }  // after allocate(), which sets the values'
  DType compute_dtype() const { return compute_dtype_; }
  Tensor compute_values();
  // For an optimizer that writes the compute copy with its update: the kept buffer (allocated on
  // the first call), holding the values as they are, which the caller keeps so as it writes them;
  // undefined when the model computes in the values' dtype.
  Tensor compute_copy_buffer();
  void values_changed() { compute_copy_current_ = false; }
  void zero_grad();
  // zero_grad for a step whose backward runs before its gradients are read: on the GPU the 2-D
  // weights' gradients (all but 0.1 % of GPT-2 small's) are not zeroed but wait for their first
  // write (GradSink's first writes: the weight-gradient GEMMs then write them with beta = 0), and
  // the backward zeroes, as it ends, any that got none; the rest are zeroed. A CUDA graph recorded
  // from that backward replays its writes as writes: replay it once per zeroing.
  void zero_grad_at_first_write();
  // Where backward() sends every parameter's gradient: into its view of the flat gradient, bf16
  // gradients (the compute copies') folded into fp32, the small ones batched. Data-parallel
  // training hangs its bucket reductions off it (GradientSync::overlap).
  GradSink& grad_sink() const { return *sink_; }

 private:
  std::vector<Parameter> params_;
  std::vector<Shape> shapes_;
  std::unordered_map<std::string, size_t> index_;  // name → position in params_: O(1) declare and find
  int64_t total_ = 0, decay_total_ = 0;
  Tensor values_, grads_;
  DType compute_dtype_ = DType::f32;
  Tensor compute_copy_;                 // kept once an optimizer writes it (compute_copy_buffer)
  bool compute_copy_current_ = false;  // compute_copy_ holds the values as they are
  std::shared_ptr<GradSink> sink_ = std::make_shared<GradSink>();
};

// A standard normal from a counter-based hash: deterministic for (seed, stream, index).
double normal_from(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace tg::nn
