// Mapping a run's state to and from CheckpointData, with the compatibility checks of a resume.
#include "src/trainer/state.h"

#include <cmath>
#include <cstring>
#include <unordered_map>
#include <sstream>

namespace tg {

namespace {
const char* kParams = "params/";
const char* kMoment1 = "optim/exp_avg/";
const char* kMoment2 = "optim/exp_avg_sq/";

CheckpointArray to_array(const std::string& name, const Tensor& t) {
  Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
  CheckpointArray a;
  a.name = name;
  a.shape = host.shape();
  a.data = host.to_float_vector();
  return a;
}

int64_t get_int(const CheckpointData& c, const std::string& key, const std::string& path) {
  auto it = c.ints.find(key);
  TG_CHECK(it != c.ints.end(), "checkpoint ", path, ": missing state value '", key, "'");
  return it->second;
}

// Every array by name, so restoring P parameters is O(P), not O(P²).
std::unordered_map<std::string, const CheckpointArray*> by_name(const CheckpointData& c) {
  std::unordered_map<std::string, const CheckpointArray*> m;
  for (const CheckpointArray& a : c.arrays) m.emplace(a.name, &a);
  return m;
}

const CheckpointArray* find(const std::unordered_map<std::string, const CheckpointArray*>& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? nullptr : it->second;
}

// Copies a checkpoint array into a (host or device) tensor of the same shape. Weights and
// moments must be finite: a NaN or an infinity is refused, naming the dataset and the element.
void copy_into(Tensor dst, const CheckpointArray& a, const std::string& path) {
  TG_CHECK(Shape(a.shape) == dst.shape(), "checkpoint ", path, ": '", a.name, "' has shape ", shape_str(a.shape),
           " but the model expects ", shape_str(dst.shape()), "; the model config differs from the checkpoint's");
  for (size_t i = 0; i < a.data.size(); ++i)
    TG_CHECK(std::isfinite(a.data[i]), "checkpoint ", path, ": dataset '", a.name, "' holds ", a.data[i],
             " at element ", i, " (the first non-finite value in the file's arrays); refusing to load a model "
             "with non-finite weights or optimizer state; use an earlier checkpoint");
  std::vector<double> v(a.data.begin(), a.data.end());
  dst.copy_from(Tensor::from_vector(v, dst.shape(), DType::f32).to(dst.dtype()));
}
}  // namespace

nn::GPTConfig gpt_config_from(const ModelConfig& m) {
  nn::GPTConfig g;
  g.n_layer = m.n_layer;
  g.n_head = m.n_head;
  g.d_model = m.d_model;
  g.vocab_size = m.vocab_size;
  g.max_seq_len = m.max_seq_len;
  g.pos_embedding = nn::parse_pos_embedding(m.pos_embedding);
  g.attention = nn::parse_attention(m.attention);
  g.bias = m.bias;
  g.dropout = m.dropout;
  g.rope_base = m.rope_base;
  g.attention_window = m.attention_window;
  return g;
}

CheckpointData make_checkpoint(const nn::GPT& model, const optim::AdamW* opt, const TrainState& s,
                               const std::string& config_yaml) {
  TG_ASSERT(!opt || opt->owns_all());
  return opt ? make_checkpoint(model, opt->first_moment(), opt->second_moment(), opt->steps_taken(), s, config_yaml)
             : make_checkpoint(model, Tensor(), Tensor(), 0, s, config_yaml);
}

CheckpointData make_checkpoint(const nn::GPT& model, const Tensor& m, const Tensor& v, int64_t optimizer_steps,
                               const TrainState& s, const std::string& config_yaml) {
  CheckpointData c;
  for (const nn::Parameter& p : model.params().all()) {
    c.arrays.push_back(to_array(kParams + p.name, p.value));
    if (m.defined()) {
      c.arrays.push_back(to_array(kMoment1 + p.name, Tensor::view_of(m, p.offset, p.value.shape())));
      c.arrays.push_back(to_array(kMoment2 + p.name, Tensor::view_of(v, p.offset, p.value.shape())));
    }
  }
  c.ints["step"] = s.step;
  c.ints["tokens_seen"] = s.tokens_seen;
  c.ints["bad_steps_in_row"] = s.bad_steps_in_row;
  c.ints["world_size"] = s.world_size;
  c.ints["global_batch_rows"] = s.global_batch_rows;
  c.ints["optimizer_steps"] = optimizer_steps;
  c.u64_arrays["loader_cursor"] = {s.cursor.seed, s.cursor.step};
  c.u64_arrays["rng/dropout_counter"] = {s.dropout_counter};
  c.strings["config_yaml"] = config_yaml;
  return c;
}

void restore_parameters(nn::GPT& model, const CheckpointData& ckpt, const std::string& path) {
  const auto arrays = by_name(ckpt);
  for (const nn::Parameter& p : model.params().all()) {
    const CheckpointArray* a = find(arrays, kParams + p.name);
    TG_CHECK(a, "checkpoint ", path, ": parameter '", p.name, "' is missing (the model config differs from the checkpoint's)");
    copy_into(p.value, *a, path);
  }
  model.params().values_changed();
}

void restore_optimizer(optim::AdamW& opt, const nn::GPT& model, const CheckpointData& ckpt, const std::string& path) {
  TG_ASSERT(opt.owns_all());
  opt.set_steps_taken(restore_moments(opt.first_moment(), opt.second_moment(), model, ckpt, path));
}

int64_t restore_moments(const Tensor& first_moment, const Tensor& second_moment, const nn::GPT& model,
                        const CheckpointData& ckpt, const std::string& path) {
  const auto arrays = by_name(ckpt);
  for (const nn::Parameter& p : model.params().all()) {
    const CheckpointArray* m = find(arrays, kMoment1 + p.name);
    const CheckpointArray* v = find(arrays, kMoment2 + p.name);
    TG_CHECK(m && v, "checkpoint ", path, ": optimizer moments of '", p.name,
             "' are missing (was it saved for inference only?); cannot resume training from it");
    copy_into(Tensor::view_of(first_moment, p.offset, p.value.shape()), *m, path);
    copy_into(Tensor::view_of(second_moment, p.offset, p.value.shape()), *v, path);
  }
  const int64_t steps = get_int(ckpt, "optimizer_steps", path);
  TG_CHECK(steps >= 0, "checkpoint ", path, ": state value 'optimizer_steps' is ", steps,
           ", which no run writes (the file is inconsistent)");
  return steps;
}

TrainState restore_state(const CheckpointData& ckpt, const std::string& path) {
  TrainState s;
  s.step = get_int(ckpt, "step", path);
  s.tokens_seen = get_int(ckpt, "tokens_seen", path);
  s.bad_steps_in_row = get_int(ckpt, "bad_steps_in_row", path);
  s.world_size = get_int(ckpt, "world_size", path);
  // Written since data parallelism exists; older checkpoints are single-process ones.
  auto rows = ckpt.ints.find("global_batch_rows");
  s.global_batch_rows = rows == ckpt.ints.end() ? 0 : rows->second;
  auto cur = ckpt.u64_arrays.find("loader_cursor");
  TG_CHECK(cur != ckpt.u64_arrays.end() && cur->second.size() == 2, "checkpoint ", path,
           ": missing or malformed 'loader_cursor'");
  s.cursor = {cur->second[0], cur->second[1]};
  auto dc = ckpt.u64_arrays.find("rng/dropout_counter");
  TG_CHECK(dc != ckpt.u64_arrays.end() && dc->second.size() == 1, "checkpoint ", path,
           ": missing or malformed 'rng/dropout_counter'");
  s.dropout_counter = dc->second[0];
  // Values no run writes: the file is inconsistent (edited or damaged before its checksum).
  auto bad = [&](const char* key, int64_t v, const char* want) {
    throw Error(detail::concat("checkpoint ", path, ": state value '", key, "' is ", v, ", expected ", want,
                               " (the checkpoint is inconsistent; use another one)"));
  };
  if (s.step < 0) bad("step", s.step, ">= 0");
  if (s.tokens_seen < 0) bad("tokens_seen", s.tokens_seen, ">= 0");
  if (s.bad_steps_in_row < 0 || s.bad_steps_in_row > s.step) bad("bad_steps_in_row", s.bad_steps_in_row, "in [0, step]");
  if (s.world_size < 1) bad("world_size", s.world_size, ">= 1");
  if (s.global_batch_rows < 0) bad("global_batch_rows", s.global_batch_rows, ">= 0");
  if (s.cursor.step != uint64_t(s.step))
    bad("loader_cursor[1]", int64_t(s.cursor.step), ("the step, " + std::to_string(s.step)).c_str());
  return s;
}

Config checkpoint_config(const CheckpointData& ckpt, const std::string& path) {
  auto it = ckpt.strings.find("config_yaml");
  TG_CHECK(it != ckpt.strings.end(), "checkpoint ", path, ": no stored config ('config_yaml')");
  return parse_config(it->second, path + ":config_yaml", {}, false);
}

void check_model_compatible(const ModelConfig& cur, const ModelConfig& saved, const std::string& path) {
  std::ostringstream diff;
  auto cmp = [&](const char* key, const auto& a, const auto& b) {
    if (!(a == b)) diff << "\n  model." << key << ": config has " << a << ", checkpoint has " << b;
  };
  cmp("n_layer", cur.n_layer, saved.n_layer);
  cmp("n_head", cur.n_head, saved.n_head);
  cmp("d_model", cur.d_model, saved.d_model);
  cmp("vocab_size", cur.vocab_size, saved.vocab_size);
  cmp("max_seq_len", cur.max_seq_len, saved.max_seq_len);
  cmp("pos_embedding", cur.pos_embedding, saved.pos_embedding);
  cmp("bias", cur.bias, saved.bias);
  cmp("rope_base", cur.rope_base, saved.rope_base);
  // The window is what the model learned to attend over: resuming must keep it.
  cmp("attention_window", cur.attention_window, saved.attention_window);
  // attention and dropout change how the model computes, not its parameters: allowed to differ.
  std::string d = diff.str();
  TG_CHECK(d.empty(), "checkpoint ", path, " does not fit this config's model:", d,
           "\n  (resume with the checkpoint's model settings, or start a new run directory)");
}

}  // namespace tg
