// Hugging Face interoperability: safetensors, export to a GPT2LMHeadModel folder, import from
// one or from a tilegrad checkpoint, and (with transformers) the same loss and greedy tokens.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "src/interop/hf.h"
#include "src/interop/safetensors.h"
#include "src/trainer/generate.h"
#include "src/trainer/state.h"
#include "tests/interop/interop_util.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using namespace tg;
using ::testing::HasSubstr;

namespace {

// A scratch folder per test, named after this file.
struct TempDir : interop_test::TempDir {
  TempDir() : interop_test::TempDir("tg_hf_test_") {}
};
using interop_test::read_file;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

Config small_config(const std::string& pos = "learned", bool bias = true) {
  Config c;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.d_model = 16;
  c.model.vocab_size = 300;
  c.model.max_seq_len = 24;
  c.model.pos_embedding = pos;
  c.model.bias = bias;
  c.train.seq_len = 16;
  c.run.out_dir = "unused";
  return c;
}

// A model whose parameters are far from their initialisation (std 0.3 noise, LayerNorm weights
// around 1), so its logits are peaked and greedy choices are not near-ties.
std::unique_ptr<nn::GPT> noisy_model(const Config& c, uint64_t seed) {
  auto m = std::make_unique<nn::GPT>(gpt_config_from(c.model), seed);
  uint64_t k = 0;
  for (const nn::Parameter& p : m->params().all()) {
    const bool ln_weight = p.name.find("ln_") != std::string::npos && p.name.ends_with(".weight");
    Tensor noise = tg::testing::random_tensor(p.value.shape(), seed * 1000 + k++, DType::f32, ln_weight ? 0.1 : 0.3);
    if (ln_weight) noise = ops::add(noise, Tensor::full(p.value.shape(), 1.0, DType::f32));
    Tensor dst = p.value;
    dst.copy_from(noise);
  }
  return m;
}

// Saves the model as a tilegrad checkpoint (step 7, no optimizer state); returns its path.
std::string save_model(const nn::GPT& m, const Config& c, const fs::path& dir) {
  TrainState s;
  s.step = 7;
  return save_checkpoint(dir.string(), 7, make_checkpoint(m, nullptr, s, config_to_yaml(c)), 0);
}

std::vector<float> flat(const nn::GPT& m) { return m.params().flat_values().to_float_vector(); }

}  // namespace

TEST(Safetensors, RoundTripAndLayout) {
  TempDir dir;
  const std::string path = (dir.path / "t.safetensors").string();
  std::vector<CheckpointArray> in = {{"a.weight", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"b", {}, {-7.5f}}, {"c", {0}, {}}};
  write_safetensors(path, in);
  const std::string bytes = read_file(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 7 * 4);
  nlohmann::json h = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(h["__metadata__"]["format"], "pt");
  EXPECT_EQ(h["a.weight"]["dtype"], "F32");
  EXPECT_EQ(h["a.weight"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(h["a.weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(h["b"]["data_offsets"], nlohmann::json({24, 28}));
  float first;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  EXPECT_EQ(first, 1.0f);
  SafetensorsFile back = read_safetensors(path);
  ASSERT_EQ(back.tensors.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.tensors[i].name, in[i].name);
    EXPECT_EQ(back.tensors[i].shape, in[i].shape);
    EXPECT_EQ(back.tensors[i].data, in[i].data);
  }
  EXPECT_EQ(back.metadata.at("format"), "pt");
}

TEST(Safetensors, HalfPrecisionAndBadFiles) {
  TempDir dir;
  // A BF16 and an F16 tensor written by hand.
  std::string header = R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},"y":{"dtype":"F16","shape":[2],"data_offsets":[4,8]}})";
  std::string file(8, '\0');
  uint64_t n = header.size();
  std::memcpy(file.data(), &n, 8);
  file += header;
  const uint16_t vals[] = {0x3f80, 0xc040, 0x3c00, 0x0001};  // bf16 1, -3; f16 1, smallest subnormal
  file.append(reinterpret_cast<const char*>(vals), 8);
  std::ofstream(dir.path / "h.safetensors", std::ios::binary) << file;
  SafetensorsFile f = read_safetensors((dir.path / "h.safetensors").string());
  EXPECT_EQ(f.tensors[0].data, (std::vector<float>{1.0f, -3.0f}));
  EXPECT_EQ(f.tensors[1].data, (std::vector<float>{1.0f, 5.9604645e-08f}));
  // Truncated: the data ends before the offsets say.
  std::ofstream(dir.path / "short.safetensors", std::ios::binary) << file.substr(0, file.size() - 2);
  EXPECT_THAT(error_of([&] { read_safetensors((dir.path / "short.safetensors").string()); }),
              HasSubstr("fall outside"));
  std::ofstream(dir.path / "junk.safetensors", std::ios::binary) << "not a safetensors file at all";
  EXPECT_THAT(error_of([&] { read_safetensors((dir.path / "junk.safetensors").string()); }),
              HasSubstr("header length"));
}

TEST(HfExport, ParameterShapesMatchTheModel) {
  for (const auto& [pos, bias] : {std::pair{"learned", true}, {"rope", true}, {"learned", false}}) {
    Config c = small_config(pos, bias);
    nn::GPT m(gpt_config_from(c.model), 1);
    auto shapes = gpt_parameter_shapes(c.model);
    ASSERT_EQ(shapes.size(), m.params().all().size()) << pos << bias;
    for (size_t i = 0; i < shapes.size(); ++i) {
      EXPECT_EQ(shapes[i].first, m.params().all()[i].name);
      EXPECT_EQ(shapes[i].second, m.params().all()[i].value.shape());
    }
  }
}

TEST(HfExport, WritesGpt2FolderAndImportsBitwise) {
  TempDir dir;
  Config c = small_config();
  auto m = noisy_model(c, 3);
  const std::string ckpt = save_model(*m, c, dir.path / "run");
  auto [path, data] = resolve_and_load(ckpt, "latest");
  std::vector<std::string> files = export_hf(data, path, (dir.path / "hf").string(), false);
  EXPECT_EQ(files.size(), 3u);
  nlohmann::json cfg = nlohmann::json::parse(read_file(dir.path / "hf/config.json"));
  EXPECT_EQ(cfg["model_type"], "gpt2");
  EXPECT_EQ(cfg["n_positions"], 24);
  EXPECT_EQ(cfg["vocab_size"], 300);
  EXPECT_EQ(cfg["activation_function"], "gelu_new");
  EXPECT_EQ(cfg["eos_token_id"], 256);
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  SafetensorsFile st = read_safetensors((dir.path / "hf/model.safetensors").string());
  std::map<std::string, CheckpointArray> by_name;
  for (const CheckpointArray& a : st.tensors) by_name[a.name] = a;
  EXPECT_EQ(by_name.size(), m->params().all().size());  // no lm_head (tied), no attention buffers
  // Conv1D weights transposed: c_fc is (C, 4C) there; element (i, j) is tilegrad's (j, i).
  const CheckpointArray& fc = by_name.at("transformer.h.1.mlp.c_fc.weight");
  EXPECT_EQ(fc.shape, (std::vector<int64_t>{16, 64}));
  std::vector<float> ours = m->params().get("transformer.h.1.mlp.c_fc.weight").to_float_vector();
  EXPECT_EQ(fc.data[size_t(3 * 64 + 5)], ours[size_t(5 * 16 + 3)]);
  EXPECT_EQ(by_name.at("transformer.wte.weight").data, m->params().get("transformer.wte.weight").to_float_vector());

  // Import into a differently initialised model: bitwise the same parameters.
  nn::GPT from_hf(gpt_config_from(c.model), 99);
  EXPECT_THAT(load_initial_parameters(from_hf, c.model, (dir.path / "hf").string()), HasSubstr("Hugging Face"));
  EXPECT_EQ(flat(from_hf), flat(*m));
  nn::GPT from_ckpt(gpt_config_from(c.model), 98);
  EXPECT_THAT(load_initial_parameters(from_ckpt, c.model, (dir.path / "run").string()), HasSubstr("step 7"));
  EXPECT_EQ(flat(from_ckpt), flat(*m));
  // And back out: the same model.safetensors byte for byte.
  save_model(from_hf, c, dir.path / "run2");
  auto [path2, data2] = resolve_and_load((dir.path / "run2").string(), "latest");
  export_hf(data2, path2, (dir.path / "hf2").string(), false);
  EXPECT_EQ(read_file(dir.path / "hf2/model.safetensors"), read_file(dir.path / "hf/model.safetensors"));
}

TEST(HfExport, BiasFreeModelExportsZeroBiases) {
  TempDir dir;
  Config c = small_config("learned", false);
  auto m = noisy_model(c, 4);
  auto [path, data] = resolve_and_load(save_model(*m, c, dir.path / "run"), "latest");
  export_hf(data, path, (dir.path / "hf").string(), false);
  SafetensorsFile st = read_safetensors((dir.path / "hf/model.safetensors").string());
  bool saw = false;
  for (const CheckpointArray& a : st.tensors)
    if (a.name == "transformer.h.0.attn.c_attn.bias") {
      saw = true;
      EXPECT_EQ(a.data, std::vector<float>(48, 0.0f));
    }
  EXPECT_TRUE(saw);
  nn::GPT back(gpt_config_from(c.model), 5);
  load_initial_parameters(back, c.model, (dir.path / "hf").string());
  EXPECT_EQ(flat(back), flat(*m));
}

TEST(HfExport, Errors) {
  TempDir dir;
  Config c = small_config();
  nn::GPT m(gpt_config_from(c.model), 1);
  auto [path, data] = resolve_and_load(save_model(m, c, dir.path / "run"), "latest");
  // A non-empty output folder needs --force.
  fs::create_directories(dir.path / "full");
  std::ofstream(dir.path / "full/keep.txt") << "x";
  EXPECT_THAT(error_of([&] { export_hf(data, path, (dir.path / "full").string(), false); }),
              HasSubstr("non-empty folder"));
  export_hf(data, path, (dir.path / "full").string(), true);
  EXPECT_TRUE(fs::exists(dir.path / "full/model.safetensors"));
  EXPECT_TRUE(fs::exists(dir.path / "full/keep.txt"));
  // Arrays that do not fit the stored config: each one listed.
  CheckpointData bad = data;
  for (CheckpointArray& a : bad.arrays)
    if (a.name == "params/transformer.wpe.weight") a.shape = {12, 32};
  std::erase_if(bad.arrays, [](const CheckpointArray& a) { return a.name == "params/transformer.ln_f.bias"; });
  const std::string e = error_of([&] { export_hf(bad, path, (dir.path / "bad").string(), false); });
  EXPECT_THAT(e, HasSubstr("params/transformer.wpe.weight: shape [12, 32], but the config's model has [24, 16]"));
  EXPECT_THAT(e, HasSubstr("params/transformer.ln_f.bias: missing"));
  EXPECT_FALSE(fs::exists(dir.path / "bad"));
}

TEST(HfImport, EveryMismatchIsListed) {
  TempDir dir;
  Config c = small_config();
  nn::GPT m(gpt_config_from(c.model), 1);
  auto [path, data] = resolve_and_load(save_model(m, c, dir.path / "run"), "latest");
  export_hf(data, path, (dir.path / "hf").string(), false);
  Config other = small_config();
  other.model.n_layer = 3;
  other.model.max_seq_len = 32;
  nn::GPT target(gpt_config_from(other.model), 2);
  std::string e = error_of([&] { load_initial_parameters(target, other.model, (dir.path / "hf").string()); });
  EXPECT_THAT(e, HasSubstr("config.json: n_layer is 2, model.n_layer is 3"));
  EXPECT_THAT(e, HasSubstr("config.json: n_positions is 24, model.max_seq_len is 32"));
  EXPECT_THAT(e, HasSubstr("transformer.wpe.weight: shape [24, 16], the model's is [32, 16]"));
  EXPECT_THAT(e, HasSubstr("transformer.h.2.ln_1.weight: missing"));
  e = error_of([&] { load_initial_parameters(target, other.model, (dir.path / "run").string()); });
  EXPECT_THAT(e, HasSubstr("transformer.h.2.mlp.c_fc.weight: missing"));
  EXPECT_THAT(e, HasSubstr("transformer.wpe.weight: shape [24, 16], the model's is [32, 16]"));
  // Too few layers in the model: the file's extra layers are listed as left over.
  Config fewer = small_config();
  fewer.model.n_layer = 1;
  nn::GPT small(gpt_config_from(fewer.model), 2);
  e = error_of([&] { load_initial_parameters(small, fewer.model, (dir.path / "hf/model.safetensors").string()); });
  EXPECT_THAT(e, HasSubstr("transformer.h.1.attn.c_attn.weight: shape [16, 48], not a parameter of the model"));
  // GPT2Model's names (no "transformer."), the causal-mask buffers, a tied lm_head and BF16: read.
  SafetensorsFile st = read_safetensors((dir.path / "hf/model.safetensors").string());
  std::vector<CheckpointArray> hub;
  for (CheckpointArray a : st.tensors) {
    a.name = a.name.substr(std::string("transformer.").size());
    if (a.name == "wte.weight") hub.push_back({"lm_head.weight", a.shape, a.data});
    hub.push_back(a);
  }
  hub.push_back({"h.0.attn.bias", {1, 1, 24, 24}, std::vector<float>(24 * 24, 1.0f)});
  hub.push_back({"h.1.attn.masked_bias", {}, {-1e4f}});
  fs::create_directories(dir.path / "hub");
  write_safetensors((dir.path / "hub/model.safetensors").string(), hub);
  fs::copy_file(dir.path / "hf/config.json", dir.path / "hub/config.json");
  nn::GPT from_hub(gpt_config_from(c.model), 7);
  load_initial_parameters(from_hub, c.model, (dir.path / "hub").string());
  EXPECT_EQ(flat(from_hub), flat(m));
  // An untied lm_head does not fit.
  hub.front().data[0] += 1.0f;
  write_safetensors((dir.path / "hub/model.safetensors").string(), hub);
  EXPECT_THAT(error_of([&] { load_initial_parameters(from_hub, c.model, (dir.path / "hub").string()); }),
              HasSubstr("lm_head.weight differs from transformer.wte.weight"));
  fs::create_directories(dir.path / "bin");
  std::ofstream(dir.path / "bin/pytorch_model.bin") << "x";
  EXPECT_THAT(error_of([&] { load_initial_parameters(small, fewer.model, (dir.path / "bin").string()); }),
              HasSubstr("holds pytorch_model.bin but no model.safetensors"));
  EXPECT_THAT(error_of([&] { load_initial_parameters(small, fewer.model, (dir.path / "nowhere").string()); }),
              HasSubstr("does not exist"));
}

TEST(HfExport, RopeModelBecomesGptNeoX) {
  TempDir dir;
  Config c = small_config("rope");
  c.model.rope_base = 500.0;
  auto m = noisy_model(c, 5);
  auto [path, data] = resolve_and_load(save_model(*m, c, dir.path / "run"), "latest");
  export_hf(data, path, (dir.path / "hf").string(), false);
  nlohmann::json cfg = nlohmann::json::parse(read_file(dir.path / "hf/config.json"));
  EXPECT_EQ(cfg["model_type"], "gpt_neox");
  EXPECT_EQ(cfg["rotary_pct"], 1.0);
  EXPECT_EQ(cfg["rotary_emb_base"], 500.0);
  EXPECT_EQ(cfg["use_parallel_residual"], false);
  SafetensorsFile st = read_safetensors((dir.path / "hf/model.safetensors").string());
  std::map<std::string, CheckpointArray> by_name;
  for (const CheckpointArray& a : st.tensors) by_name[a.name] = a;
  // query_key_value rows per head: head 1's k (rows 1·48 + 16 …) is c_attn's k rows of head 1 (16 + 8 …).
  const CheckpointArray& qkv = by_name.at("gpt_neox.layers.0.attention.query_key_value.bias");
  std::vector<float> ours = m->params().get("transformer.h.0.attn.c_attn.bias").to_float_vector();
  EXPECT_EQ(qkv.data[size_t(1 * 24 + 8 + 3)], ours[size_t(16 + 8 + 3)]);
  EXPECT_EQ(by_name.at("embed_out.weight").data, by_name.at("gpt_neox.embed_in.weight").data);
}

// The exported folder in transformers: loaded with no missing or unexpected weights, the same
// loss on the same tokens (1e-5 relative) and the same greedy tokens; GPT-2 for learned
// positions, GPT-NeoX for RoPE.
void expect_transformers_parity(const std::string& pos) {
  const fs::path src = TILEGRAD_SOURCE_DIR;
  TempDir dir;
  const std::string env_cmd = (src / "tools/python_env.sh").string() + " > " + (dir.path / "py.txt").string() + " 2> " +
                              (dir.path / "py.err").string();
  if (std::system(env_cmd.c_str()) != 0)
    GTEST_SKIP() << "no Python environment with torch and transformers: " << read_file(dir.path / "py.err");
  std::string python = read_file(dir.path / "py.txt");
  python.erase(python.find_last_not_of("\n") + 1);
  if (python.front() != '/') python = (src / python).string();

  Config c = small_config(pos);
  auto m = noisy_model(c, 11);
  m->set_training(false);
  auto [path, data] = resolve_and_load(save_model(*m, c, dir.path / "run"), "latest");
  export_hf(data, path, (dir.path / "hf").string(), false);

  const int64_t T = 24;
  std::vector<int32_t> seq;
  for (int64_t i = 0; i <= T; ++i) seq.push_back(int32_t((i * 37 + 11) % 300));
  std::vector<int32_t> ids(seq.begin(), seq.end() - 1), targets(seq.begin() + 1, seq.end());
  const double loss = m->loss(Tensor::from_ints(ids, {1, T}), Tensor::from_ints(targets, {1, T})).item();
  const std::vector<int32_t> prompt = {5, 260, 17};
  SampleOptions greedy;
  greedy.tokens = 30;  // past max_seq_len: both keep the last 24 tokens as context
  greedy.temperature = 0;
  greedy.kv_cache = false;  // with the cache a RoPE model keeps its whole context, hf_parity.py the window
  const std::vector<int32_t> ours = generate(*m, prompt, greedy);
  {
    std::ofstream tok(dir.path / "tokens.txt");
    for (const std::vector<int32_t>* v : std::initializer_list<const std::vector<int32_t>*>{&ids, &targets, &prompt}) {
      for (int32_t t : *v) tok << t << " ";
      tok << "\n";
    }
  }
  const std::string cmd = python + " " + (src / "tests/interop/hf_parity.py").string() + " " +
                          (dir.path / "hf").string() + " " + (dir.path / "tokens.txt").string() + " 30 > " +
                          (dir.path / "out.json").string() + " 2> " + (dir.path / "err.txt").string();
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file(dir.path / "err.txt");
  nlohmann::json r = nlohmann::json::parse(read_file(dir.path / "out.json"));
  EXPECT_EQ(r["missing"], nlohmann::json::array()) << r.dump();
  EXPECT_EQ(r["unexpected"], nlohmann::json::array()) << r.dump();
  EXPECT_EQ(r["mismatched"], nlohmann::json::array()) << r.dump();
  EXPECT_EQ(r["errors"], nlohmann::json::array()) << r.dump();
  EXPECT_EQ(r["class"], pos == "rope" ? "GPTNeoXForCausalLM" : "GPT2LMHeadModel");
  EXPECT_EQ(r["tied"].get<bool>(), pos != "rope");  // GPT-NeoX gets a copy of wte as embed_out
  EXPECT_THAT(read_file(dir.path / "err.txt"), ::testing::Not(HasSubstr("newly initialized")));
  EXPECT_NEAR(r["loss"].get<double>(), loss, 1e-5 * std::abs(loss)) << "transformers " << r["loss"] << ", tilegrad " << loss;
  EXPECT_EQ(r["greedy"].get<std::vector<int32_t>>(), ours);
}

TEST(HfExport, TransformersLoadsItWithTheSameLossAndGreedyTokens) { expect_transformers_parity("learned"); }
TEST(HfExport, TransformersLoadsRopeAsGptNeoXWithTheSameLossAndGreedyTokens) { expect_transformers_parity("rope"); }
