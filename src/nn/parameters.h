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
  void zero_grad();
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
  std::shared_ptr<GradSink> sink_ = std::make_shared<GradSink>();
};

// A standard normal from a counter-based hash: deterministic for (seed, stream, index).
double normal_from(uint64_t seed, uint64_t stream, uint64_t index);

}  // namespace tg::nn
