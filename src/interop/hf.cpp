// GPT-2 folders for transformers: export and import.
#include "src/interop/hf.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "src/interop/safetensors.h"
#include "src/trainer/state.h"
#include "src/util/error.h"
#include "src/util/files.h"

namespace fs = std::filesystem;

namespace tg {

namespace {

const std::string kParams = "params/";
const std::string kPrefix = "transformer.";
constexpr double kLayerNormEps = 1e-5;  // ops::layernorm's default, GPT-2's layer_norm_epsilon

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool is_bias(const std::string& name) { return ends_with(name, ".bias"); }

// (rows, cols) → (cols, rows).
std::vector<float> transpose(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = v[size_t(r * cols + c)];
  return t;
}

Shape hf_shape(const std::string& name, const Shape& s) {
  return is_conv1d_weight(name) ? Shape{s[1], s[0]} : s;
}

// The shapes a bias-carrying GPT-2 of this config has (GPT-2 always has biases).
ModelConfig with_bias(ModelConfig m) {
  m.bias = true;
  return m;
}

void write_text(const fs::path& p, const std::string& text) { write_file_atomically(p.string(), text, "export"); }

std::string read_text(const fs::path& p) { return read_regular_file(p.string(), "train.init_from"); }

std::string list(const std::vector<std::string>& lines) {
  std::string s;
  for (const std::string& l : lines) s += "\n  " + l;
  return s;
}

// The id of "<|endoftext|>" in a vocab.json, or -1.
int64_t eot_in_vocab(const std::string& vocab_json) {
  try {
    nlohmann::json v = nlohmann::json::parse(vocab_json);
    auto it = v.find("<|endoftext|>");
    if (it != v.end() && it->is_number_integer()) return it->get<int64_t>();
  } catch (const nlohmann::json::exception&) {
  }
  return -1;
}

// A RoPE model as transformers' GPT-NeoX, which computes tilegrad's block exactly with
// rotary_pct 1 (every dimension rotated, pairs (i, i + D/2) as kernels/cpu/rope.h, frequencies
// base^(-2i/D)), use_parallel_residual false (x + attn(ln_1 x), then + mlp(ln_2 x)), the tanh
// GELU and scores scaled by 1/sqrt(D). Its linear layers are nn.Linear, (out, in) like
// tilegrad's; its fused query_key_value is laid out per head, [q_h, k_h, v_h] for each head h,
// where c_attn stacks all q, then all k, then all v; the LM head embed_out is written out (a copy
// of wte).
std::vector<CheckpointArray> to_neox(const std::vector<CheckpointArray>& gpt, const ModelConfig& m) {
  const int64_t C = m.d_model, H = m.n_head, D = C / H;
  std::map<std::string, const CheckpointArray*> by;
  for (const CheckpointArray& a : gpt) by[a.name] = &a;
  std::vector<CheckpointArray> out;
  auto put = [&](const std::string& name, const std::string& from) {
    const CheckpointArray& a = *by.at(from);
    out.push_back({name, a.shape, a.data});
  };
  // (3C, …) rows [q; k; v] → per head [q_h; k_h; v_h].
  auto per_head = [&](const std::string& name, const std::string& from) {
    const CheckpointArray& a = *by.at(from);
    const int64_t cols = a.shape.size() == 2 ? a.shape[1] : 1;
    std::vector<float> v(a.data.size());
    for (int64_t h = 0; h < H; ++h)
      for (int64_t part = 0; part < 3; ++part)
        for (int64_t d = 0; d < D; ++d) {
          const int64_t src = part * C + h * D + d, dst = h * 3 * D + part * D + d;
          std::copy_n(a.data.begin() + src * cols, cols, v.begin() + dst * cols);
        }
    out.push_back({name, a.shape, std::move(v)});
  };
  put("gpt_neox.embed_in.weight", "transformer.wte.weight");
  for (int64_t i = 0; i < m.n_layer; ++i) {
    const std::string t = "transformer.h." + std::to_string(i) + ".", n = "gpt_neox.layers." + std::to_string(i) + ".";
    put(n + "input_layernorm.weight", t + "ln_1.weight");
    put(n + "input_layernorm.bias", t + "ln_1.bias");
    per_head(n + "attention.query_key_value.weight", t + "attn.c_attn.weight");
    per_head(n + "attention.query_key_value.bias", t + "attn.c_attn.bias");
    put(n + "attention.dense.weight", t + "attn.c_proj.weight");
    put(n + "attention.dense.bias", t + "attn.c_proj.bias");
    put(n + "post_attention_layernorm.weight", t + "ln_2.weight");
    put(n + "post_attention_layernorm.bias", t + "ln_2.bias");
    put(n + "mlp.dense_h_to_4h.weight", t + "mlp.c_fc.weight");
    put(n + "mlp.dense_h_to_4h.bias", t + "mlp.c_fc.bias");
    put(n + "mlp.dense_4h_to_h.weight", t + "mlp.c_proj.weight");
    put(n + "mlp.dense_4h_to_h.bias", t + "mlp.c_proj.bias");
  }
  put("gpt_neox.final_layer_norm.weight", "transformer.ln_f.weight");
  put("gpt_neox.final_layer_norm.bias", "transformer.ln_f.bias");
  put("embed_out.weight", "transformer.wte.weight");
  return out;
}

nlohmann::ordered_json neox_config(const ModelConfig& m, const nlohmann::json& eot) {
  return {
      {"architectures", {"GPTNeoXForCausalLM"}},
      {"model_type", "gpt_neox"},
      {"vocab_size", m.vocab_size},
      {"hidden_size", m.d_model},
      {"num_hidden_layers", m.n_layer},
      {"num_attention_heads", m.n_head},
      {"intermediate_size", 4 * int64_t(m.d_model)},
      {"hidden_act", "gelu_new"},
      {"rotary_pct", 1.0},
      {"rotary_emb_base", m.rope_base},
      {"rope_scaling", nullptr},
      {"max_position_embeddings", m.max_seq_len},
      {"layer_norm_eps", kLayerNormEps},
      {"use_parallel_residual", false},
      {"attention_bias", true},
      {"attention_dropout", 0.0},
      {"hidden_dropout", m.dropout},
      {"initializer_range", 0.02},
      {"use_cache", true},
      {"bos_token_id", eot},
      {"eos_token_id", eot},
      {"tie_word_embeddings", false},
      {"torch_dtype", "float32"},
  };
}

}  // namespace

bool is_conv1d_weight(const std::string& name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

std::vector<std::pair<std::string, Shape>> gpt_parameter_shapes(const ModelConfig& m) {
  // Mirrors nn::GPT's constructor (tests/interop checks the two agree).
  const int64_t C = m.d_model;
  std::vector<std::pair<std::string, Shape>> p;
  p.push_back({"transformer.wte.weight", {m.vocab_size, C}});
  if (m.pos_embedding == "learned") p.push_back({"transformer.wpe.weight", {m.max_seq_len, C}});
  auto layernorm = [&](const std::string& prefix) {
    p.push_back({prefix + ".weight", {C}});
    if (m.bias) p.push_back({prefix + ".bias", {C}});
  };
  auto linear = [&](const std::string& prefix, int64_t out, int64_t in) {
    p.push_back({prefix + ".weight", {out, in}});
    if (m.bias) p.push_back({prefix + ".bias", {out}});
  };
  for (int64_t i = 0; i < m.n_layer; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    layernorm(h + "ln_1");
    linear(h + "attn.c_attn", 3 * C, C);
    linear(h + "attn.c_proj", C, C);
    layernorm(h + "ln_2");
    linear(h + "mlp.c_fc", 4 * C, C);
    linear(h + "mlp.c_proj", C, 4 * C);
  }
  layernorm("transformer.ln_f");
  return p;
}

std::vector<std::string> export_hf(const CheckpointData& ckpt, const std::string& path, const std::string& out_dir,
                                   bool force) {
  const Config cfg = checkpoint_config(ckpt, path);
  const ModelConfig& m = cfg.model;
  const bool rope = m.pos_embedding == "rope";
  // The exported configs (GPT-2, GPT-NeoX) have no sliding window: the model would attend otherwise.
  TG_CHECK(m.attention_window == 0, "export --format hf: checkpoint ", path, " was trained with model.attention_window ",
           m.attention_window, ", which a Hugging Face GPT-2 or GPT-NeoX config cannot express");
  // Every parameter of the config, present and shaped as the config says; nothing else.
  std::map<std::string, const CheckpointArray*> stored;
  for (const CheckpointArray& a : ckpt.arrays)
    if (a.name.rfind(kParams, 0) == 0) stored[a.name.substr(kParams.size())] = &a;
  std::vector<std::string> problems;
  std::vector<CheckpointArray> tensors;
  for (const auto& [name, shape] : gpt_parameter_shapes(with_bias(m))) {
    auto it = stored.find(name);
    if (it == stored.end()) {
      if (!m.bias && is_bias(name)) {  // a bias-free model: GPT-2's biases are zeros
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        tensors.push_back({name, shape, std::vector<float>(size_t(n), 0.0f)});
        continue;
      }
      problems.push_back("params/" + name + ": missing (the config's model has it, shape " + shape_str(shape) + ")");
      continue;
    }
    const CheckpointArray& a = *it->second;
    stored.erase(it);
    if (Shape(a.shape) != shape) {
      problems.push_back("params/" + name + ": shape " + shape_str(a.shape) + ", but the config's model has " +
                         shape_str(shape));
      continue;
    }
    if (is_conv1d_weight(name) && !rope)
      tensors.push_back({name, {shape[1], shape[0]}, transpose(a.data, shape[0], shape[1])});
    else
      tensors.push_back({name, a.shape, a.data});
  }
  for (const auto& [name, a] : stored)
    problems.push_back("params/" + name + ": shape " + shape_str(a->shape) + ", not a parameter of the config's model");
  TG_CHECK(problems.empty(), "export --format hf: checkpoint ", path, " does not fit the model of its own config (n_layer ",
           m.n_layer, ", d_model ", m.d_model, ", vocab_size ", m.vocab_size, ", max_seq_len ", m.max_seq_len, "):",
           list(problems));

  TG_CHECK(!out_dir.empty(), "export --format hf: --out is empty; give the folder to write");
  const fs::path out(out_dir);
  if (fs::exists(out)) {
    TG_CHECK(fs::is_directory(out), "export --format hf: --out ", out_dir, " exists and is not a folder");
    TG_CHECK(force || fs::is_empty(out), "export --format hf: --out ", out_dir,
             " is a non-empty folder; choose a new folder, or pass --force to write over the files in it");
  }
  std::error_code ec;
  fs::create_directories(out, ec);
  TG_CHECK(!ec, "export --format hf: cannot create ", out_dir, ": ", ec.message());

  // The end-of-text token: the recorded tokenizer's, else the byte tokenizer's 256 when the
  // vocabulary has it.
  int64_t eot = m.vocab_size > 256 ? 256 : -1;
  auto vocab = ckpt.strings.find("tokenizer/vocab.json");
  auto merges = ckpt.strings.find("tokenizer/merges.txt");
  const bool has_bpe = vocab != ckpt.strings.end() && merges != ckpt.strings.end();
  if (has_bpe) eot = eot_in_vocab(vocab->second);
  const nlohmann::json eot_json = eot >= 0 ? nlohmann::json(eot) : nlohmann::json(nullptr);

  std::vector<std::string> files;
  if (rope) {
    write_safetensors((out / "model.safetensors").string(), to_neox(tensors, m), {{"format", "pt"}});
    files.push_back((out / "model.safetensors").string());
    write_text(out / "config.json", neox_config(m, eot_json).dump(2) + "\n");
    files.push_back((out / "config.json").string());
  } else {
    write_safetensors((out / "model.safetensors").string(), tensors, {{"format", "pt"}});
    files.push_back((out / "model.safetensors").string());
  }

  nlohmann::ordered_json config = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", m.vocab_size},
      {"n_positions", m.max_seq_len},
      {"n_ctx", m.max_seq_len},
      {"n_embd", m.d_model},
      {"n_layer", m.n_layer},
      {"n_head", m.n_head},
      {"n_inner", nullptr},
      {"activation_function", "gelu_new"},
      {"resid_pdrop", m.dropout},
      {"embd_pdrop", m.dropout},
      {"attn_pdrop", 0.0},
      {"layer_norm_epsilon", kLayerNormEps},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"scale_attn_by_inverse_layer_idx", false},
      {"reorder_and_upcast_attn", false},
      {"use_cache", true},
      {"bos_token_id", eot_json},
      {"eos_token_id", eot_json},
      {"tie_word_embeddings", true},
      {"torch_dtype", "float32"},
  };
  if (!rope) {
    write_text(out / "config.json", config.dump(2) + "\n");
    files.push_back((out / "config.json").string());
  }
  nlohmann::ordered_json generation = {{"_from_model_config", true}};
  if (eot >= 0) generation["bos_token_id"] = eot, generation["eos_token_id"] = eot;
  write_text(out / "generation_config.json", generation.dump(2) + "\n");
  files.push_back((out / "generation_config.json").string());

  if (has_bpe) {
    write_text(out / "vocab.json", vocab->second);
    write_text(out / "merges.txt", merges->second);
    nlohmann::ordered_json tok = {{"tokenizer_class", "GPT2Tokenizer"},
                                  {"model_max_length", m.max_seq_len},
                                  {"add_prefix_space", false},
                                  {"bos_token", "<|endoftext|>"},
                                  {"eos_token", "<|endoftext|>"},
                                  {"unk_token", "<|endoftext|>"}};
    write_text(out / "tokenizer_config.json", tok.dump(2) + "\n");
    for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"}) files.push_back((out / f).string());
  }
  return files;
}

namespace {

// A GPT-2 config.json against the model section: every setting that differs, or that
// tilegrad's GPT does not compute, is one line.
void check_hf_config(const fs::path& file, const ModelConfig& m, std::vector<std::string>& problems) {
  nlohmann::json c;
  try {
    c = nlohmann::json::parse(read_text(file));
  } catch (const nlohmann::json::exception& e) {
    TG_CHECK(false, "train.init_from: ", file.string(), " is not valid JSON (", e.what(), ")");
  }
  auto get = [&](const char* key, const nlohmann::json& fallback) { return c.contains(key) ? c[key] : fallback; };
  const std::string type = get("model_type", "").is_string() ? get("model_type", "").get<std::string>() : "";
  if (type != "gpt2") {
    problems.push_back("config.json: model_type '" + type + "' (only gpt2 maps onto tilegrad's GPT)");
    return;
  }
  auto same = [&](const char* key, const char* ours, int64_t value, int64_t fallback) {
    const nlohmann::json v = get(key, fallback);
    if (!v.is_number_integer() || v.get<int64_t>() != value)
      problems.push_back(std::string("config.json: ") + key + " is " + v.dump() + ", model." + ours + " is " +
                         std::to_string(value));
  };
  same("n_layer", "n_layer", m.n_layer, 12);
  same("n_head", "n_head", m.n_head, 12);
  same("n_embd", "d_model", m.d_model, 768);
  same("vocab_size", "vocab_size", m.vocab_size, 50257);
  same("n_positions", "max_seq_len", m.max_seq_len, 1024);
  const nlohmann::json inner = get("n_inner", nullptr);
  if (!inner.is_null() && !(inner.is_number_integer() && inner.get<int64_t>() == 4 * int64_t(m.d_model)))
    problems.push_back("config.json: n_inner is " + inner.dump() + "; tilegrad's MLP is 4 × d_model = " +
                       std::to_string(4 * m.d_model) + " wide");
  const nlohmann::json act = get("activation_function", "gelu_new");
  if (!(act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast"))
    problems.push_back("config.json: activation_function " + act.dump() +
                       "; tilegrad's MLP computes the tanh GELU (gelu_new)");
  const nlohmann::json eps = get("layer_norm_epsilon", 1e-5);
  if (!eps.is_number() || std::abs(eps.get<double>() - kLayerNormEps) > 1e-12)
    problems.push_back("config.json: layer_norm_epsilon " + eps.dump() + "; tilegrad's LayerNorm uses 1e-05");
  if (get("scale_attn_weights", true) != true)
    problems.push_back("config.json: scale_attn_weights false; tilegrad scales attention by 1/sqrt(head dim)");
  if (get("scale_attn_by_inverse_layer_idx", false) != false)
    problems.push_back("config.json: scale_attn_by_inverse_layer_idx true; tilegrad does not scale by layer");
  if (get("tie_word_embeddings", true) != true)
    problems.push_back("config.json: tie_word_embeddings false; tilegrad's LM head is wte");
  if (m.pos_embedding != "learned")
    problems.push_back("model.pos_embedding is " + m.pos_embedding + "; GPT-2 has learned positions (set it to learned)");
}

struct Source {
  std::map<std::string, const CheckpointArray*> tensors;  // by tilegrad name
  std::string what;
};

}  // namespace

std::string load_initial_parameters(nn::GPT& model, const ModelConfig& m, const std::string& path) {
  TG_CHECK(fs::exists(path), "train.init_from: ", path, " does not exist");
  fs::path dir = fs::is_directory(path) ? fs::path(path) : fs::path(path).parent_path();
  const bool hf = fs::is_directory(path) ? fs::exists(dir / "model.safetensors") : ends_with(path, ".safetensors");
  if (fs::is_directory(path) && !hf)
    for (const char* other : {"pytorch_model.bin", "model.safetensors.index.json", "config.json"})
      TG_CHECK(!fs::exists(dir / other), "train.init_from: ", path, " holds ", other,
               " but no model.safetensors; tilegrad reads a Hugging Face model from one model.safetensors file "
               "(save it with model.save_pretrained(DIR, safe_serialization=True, max_shard_size=\"100GB\"))");
  std::vector<std::string> problems;
  std::map<std::string, const CheckpointArray*> by_name;
  CheckpointData ckpt;
  SafetensorsFile st;
  std::string what, file;
  const bool hf_layout = hf;
  if (hf) {
    file = fs::is_directory(path) ? (dir / "model.safetensors").string() : path;
    if (fs::exists(dir / "config.json")) check_hf_config(dir / "config.json", m, problems);
    st = read_safetensors(file);
    // Names with or without GPT2LMHeadModel's "transformer." (GPT2Model saves them without).
    const CheckpointArray* lm_head = nullptr;
    std::vector<std::string> unused;
    for (const CheckpointArray& a : st.tensors) {
      if (ends_with(a.name, ".attn.bias") || ends_with(a.name, ".attn.masked_bias")) continue;  // causal-mask buffers
      if (a.name == "lm_head.weight") {
        lm_head = &a;
        continue;
      }
      by_name[a.name.rfind(kPrefix, 0) == 0 ? a.name : kPrefix + a.name] = &a;
    }
    auto wte = by_name.find("transformer.wte.weight");
    if (lm_head && wte != by_name.end() && lm_head->data != wte->second->data)
      problems.push_back("lm_head.weight differs from transformer.wte.weight; tilegrad's LM head is tied to wte");
    what = "Hugging Face GPT-2 " + file;
  } else {
    auto [found, data] = resolve_and_load(path, "latest");
    ckpt = std::move(data);
    file = found;
    const ModelConfig saved = checkpoint_config(ckpt, file).model;
    if (saved.pos_embedding != m.pos_embedding)
      problems.push_back("model.pos_embedding: config has " + m.pos_embedding + ", checkpoint has " + saved.pos_embedding);
    else if (m.pos_embedding == "rope" && saved.rope_base != m.rope_base)
      problems.push_back("model.rope_base: config has " + std::to_string(m.rope_base) + ", checkpoint has " +
                         std::to_string(saved.rope_base));
    for (const CheckpointArray& a : ckpt.arrays)
      if (a.name.rfind(kParams, 0) == 0) by_name[a.name.substr(kParams.size())] = &a;
    what = "tilegrad checkpoint " + file + " (step " + std::to_string(ckpt.ints.count("step") ? ckpt.ints.at("step") : 0) + ")";
  }

  std::vector<std::pair<const nn::Parameter*, const CheckpointArray*>> plan;
  for (const nn::Parameter& p : model.params().all()) {
    auto it = by_name.find(p.name);
    const Shape want = hf_layout ? hf_shape(p.name, p.value.shape()) : p.value.shape();
    if (it == by_name.end()) {
      problems.push_back(p.name + ": missing (the model has it, shape " + shape_str(want) + ")");
      continue;
    }
    if (Shape(it->second->shape) != want)
      problems.push_back(p.name + ": shape " + shape_str(it->second->shape) + ", the model's is " + shape_str(want));
    else
      plan.push_back({&p, it->second});
    by_name.erase(it);
  }
  for (const auto& [name, a] : by_name) {
    bool zero = true;
    for (float v : a->data) zero = zero && v == 0.0f;
    if (hf_layout && !m.bias && is_bias(name) && zero) continue;  // a bias-free model exported with zero biases
    problems.push_back(name + ": shape " + shape_str(a->shape) + ", not a parameter of the model" +
                       (is_bias(name) && !m.bias ? " (model.bias is false)" : ""));
  }
  TG_CHECK(problems.empty(), "train.init_from: ", what, " does not fit the model (n_layer ", m.n_layer, ", n_head ",
           m.n_head, ", d_model ", m.d_model, ", vocab_size ", m.vocab_size, ", max_seq_len ", m.max_seq_len,
           ", pos_embedding ", m.pos_embedding, ", bias ", m.bias ? "true" : "false", "):", list(problems));
  for (const auto& [p, a] : plan) {
    const Shape& s = p->value.shape();
    std::vector<float> v = hf_layout && is_conv1d_weight(p->name) ? transpose(a->data, s[1], s[0]) : a->data;
    Tensor host = Tensor::empty(s, DType::f32, Device::cpu());
    std::copy(v.begin(), v.end(), host.data<float>());
    Tensor dst = p->value;
    dst.copy_from(host);
  }
  model.params().values_changed();
  return what;
}

}  // namespace tg
