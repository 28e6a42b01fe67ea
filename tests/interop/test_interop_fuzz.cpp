// Seeded mutation fuzzing of the files a user brings from elsewhere: a Hugging Face GPT-2 folder
// (model.safetensors, config.json) for train.init_from, and a tokenizer (vocab.json and
// merges.txt, or tokenizer.json) for prepare and sampling. Each mutated file must load or fail
// with tg::Error — never another exception, a crash, a hang or an absurd allocation — and a
// tokenizer that loads must encode and decode without one. Inputs that once failed otherwise are
// kept as regression cases.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "src/data/bpe.h"
#include "src/interop/hf.h"
#include "src/interop/safetensors.h"
#include "src/io/checkpoint.h"
#include "src/trainer/state.h"
#include "src/util/error.h"
#include "tests/fuzz_util.h"
#include "tests/interop/interop_util.h"

namespace fs = std::filesystem;
using namespace tg;
using interop_test::read_file;
using tg::testing::mutate;
using tg::testing::mutate_json;

namespace {

struct TempDir : interop_test::TempDir {
  TempDir() : interop_test::TempDir("tg_interop_fuzz_") {}
};

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

// Calls fn for every input; counts the inputs it accepts and those it rejects with tg::Error,
// and fails on any other exception, naming the input.
template <typename Fn>
std::pair<int, int> expect_only_tg_errors(const std::vector<std::string>& inputs, const std::string& what, Fn fn) {
  int accepted = 0, rejected = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    try {
      fn(inputs[i]);
      ++accepted;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      std::string shown = inputs[i].substr(0, 400);
      ADD_FAILURE() << what << " input " << i << " escaped as " << typeid(e).name() << ": " << e.what()
                    << "\n---\n" << shown << "\n---";
    }
  }
  std::cout << "  " << what << ": " << inputs.size() << " inputs, " << accepted << " loaded, " << rejected
            << " rejected\n";
  return {accepted, rejected};
}

// A safetensors file of the given JSON header and `data_bytes` zero bytes after it.
std::string safetensors_bytes(const std::string& header, size_t data_bytes) {
  std::string s(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(s.data(), &n, 8);
  return s + header + std::string(data_bytes, '\0');
}

Config tiny_config() {
  Config c;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.d_model = 8;
  c.model.vocab_size = 260;
  c.model.max_seq_len = 8;
  c.train.seq_len = 8;
  c.run.out_dir = "unused";
  return c;
}

}  // namespace

TEST(Fuzz, SafetensorsReaderOnlyEverThrowsTgError) {
  TempDir dir;
  const fs::path path = dir.path / "m.safetensors";
  write_safetensors(path.string(), {{"a", {3, 4}, std::vector<float>(12, 1.5f)}, {"b", {2}, {1.0f, 2.0f}}},
                    {{"format", "pt"}});
  const std::string original = read_file(path);
  // Kept cases: shapes whose element counts overflow 64 bits to a span that fits, a dimension
  // past int64, an empty tensor, offsets past the data, a header length past the file.
  std::vector<std::string> inputs = {
      safetensors_bytes(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
      safetensors_bytes(R"({"a":{"dtype":"F32","shape":[9223372036854775808,2],"data_offsets":[0,0]}})", 0),
      safetensors_bytes(R"({"a":{"dtype":"F16","shape":[18446744073709551615,2],"data_offsets":[0,4]}})", 4),
      safetensors_bytes(R"({"a":{"dtype":"F32","shape":[0,5],"data_offsets":[0,0]}})", 0),
      safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,0]}})", 4),
      safetensors_bytes(R"({"__metadata__":{"a":1},"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})", 4),
      std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10),
  };
  std::mt19937_64 rng(2024);
  for (int i = 0; i < 1500; ++i) {
    std::string m = original;
    // Mostly the header (the first 8 + n bytes), where the structure is.
    const uint64_t n = *reinterpret_cast<const uint64_t*>(original.data());
    if (i % 3 == 0) {  // a header that parses, its values of other types or sizes
      m = safetensors_bytes(mutate_json(nlohmann::json::parse(original.substr(8, n)), rng).dump(), 0) +
          original.substr(8 + n);
    } else if (rng() % 4) {
      std::string head = mutate(original.substr(8, n), rng);
      m = safetensors_bytes(head, 0).substr(0, 8 + head.size()) + original.substr(8 + n);
      if (rng() % 3 == 0) {  // the stated length off by a little
        uint64_t k = head.size() + (rng() % 17) - 8;
        std::memcpy(m.data(), &k, 8);
      }
    } else {
      m = mutate(original, rng);
    }
    inputs.push_back(std::move(m));
  }
  auto [loaded, rejected] = expect_only_tg_errors(inputs, "safetensors", [&](const std::string& bytes) {
    write_file(path, bytes);
    SafetensorsFile f = read_safetensors(path.string());
    for (const CheckpointArray& a : f.tensors) {
      int64_t numel = 1;
      for (int64_t d : a.shape) {
        EXPECT_GE(d, 0) << a.name;
        numel *= d;
      }
      EXPECT_EQ(size_t(numel), a.data.size()) << a.name;  // the shape describes the values read
    }
  });
  EXPECT_GT(loaded, 20);
  EXPECT_GT(rejected, 300);
}

// A GPT-2 folder as `tilegrad export --format hf` writes it, its files mutated, loaded as a new
// run's initial parameters.
TEST(Fuzz, HuggingFaceFolderImportOnlyEverThrowsTgError) {
  TempDir dir;
  const Config c = tiny_config();
  nn::GPT model(gpt_config_from(c.model), 5);
  TrainState s;
  s.step = 1;
  const std::string ckpt = save_checkpoint((dir.path / "run").string(), 1,
                                           make_checkpoint(model, nullptr, s, config_to_yaml(c)), 0);
  auto [ckpt_path, data] = resolve_and_load(ckpt, "latest");
  const fs::path hf = dir.path / "hf";
  export_hf(data, ckpt_path, hf.string(), false);
  const std::string weights = read_file(hf / "model.safetensors"), config = read_file(hf / "config.json");
  std::vector<std::pair<std::string, std::string>> folders;  // (model.safetensors, config.json)
  folders.push_back({weights, R"({"model_type": "gpt2", "n_embd": 9223372036854775807})"});
  folders.push_back({weights, R"({"model_type": "gpt2", "n_layer": -1, "n_head": 1e300})"});
  folders.push_back({weights, R"([1, 2, 3])"});
  folders.push_back({weights, R"({"activation_function": 7, "layer_norm_epsilon": "x", "n_positions": [8]})"});
  std::mt19937_64 rng(11);
  for (int i = 0; i < 400; ++i) {
    if (i % 4 == 1) folders.push_back({weights, mutate(config, rng)});
    else if (i % 4 == 3) folders.push_back({weights, mutate_json(nlohmann::json::parse(config), rng).dump()});
    else folders.push_back({mutate(weights.substr(0, 8 + 4096), rng) + weights.substr(std::min<size_t>(weights.size(), 8 + 4096)), config});
  }
  std::vector<std::string> keys(folders.size());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = std::to_string(i);
  auto [loaded, rejected] = expect_only_tg_errors(keys, "Hugging Face folder", [&](const std::string& key) {
    const auto& [w, cfg] = folders[std::stoul(key)];
    write_file(hf / "model.safetensors", w);
    write_file(hf / "config.json", cfg);
    nn::GPT target(gpt_config_from(c.model), 6);
    load_initial_parameters(target, c.model, hf.string());
  });
  EXPECT_GT(loaded, 10);
  EXPECT_GT(rejected, 100);
}

// Tokenizer files: a learned vocabulary's vocab.json and merges.txt, and the same as a
// tokenizer.json, mutated. A tokenizer that loads encodes text (where this build can encode) and
// decodes every id it has.
TEST(Fuzz, TokenizerFilesOnlyEverThrowsTgError) {
  TempDir dir;
  if (!have_bpe_encoder()) GTEST_SKIP() << "built without ICU (libicu-dev): no vocabulary can be learned to mutate";
  const std::string text = "the cat sat on the mat; the hat, the bat and the rat sat there.\n"
                           "café 12345 <|endoftext|> 日本語 tabs\tand  spaces\n";
  std::string corpus;
  for (int i = 0; i < 30; ++i) corpus += text;
  write_file(dir.path / "corpus.txt", corpus);
  BpeTokenizer learned = train_bpe({(dir.path / "corpus.txt").string()}, 300);
  const std::string vocab = learned.vocab_json(), merges = learned.merges_txt();
  nlohmann::json tj;
  tj["model"] = {{"type", "BPE"}, {"vocab", nlohmann::json::parse(vocab)}, {"merges", nlohmann::json::array()}};
  for (size_t a = 0, b; (b = merges.find('\n', a)) != std::string::npos; a = b + 1)
    if (merges.compare(a, 8, "#version") != 0 && b > a) tj["model"]["merges"].push_back(merges.substr(a, b - a));
  tj["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}};
  tj["normalizer"] = nullptr;
  tj["added_tokens"] = nlohmann::json::array({{{"id", 299}, {"content", "<|endoftext|>"}}});
  const std::string tokenizer_json = tj.dump(1);

  auto use = [&](const BpeTokenizer& t) {
    std::vector<int32_t> ids = t.encode(text);
    for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < t.vocab_size()) << id;
    std::vector<int32_t> all(size_t(t.vocab_size()));
    for (size_t i = 0; i < all.size(); ++i) all[i] = int32_t(i);
    t.decode(all);
  };
  // Kept cases: an id far past any vocabulary a shard can hold, merges that make tokens the
  // vocabulary lacks, a tokenizer.json whose parts are of the wrong JSON type.
  std::string huge_id = vocab;
  huge_id.insert(1, R"("zzz": 1073741000, )");
  std::vector<std::pair<std::string, std::string>> pairs = {{huge_id, merges},
                                                            {vocab, "#version: 0.2\nt h\nth e\nq q\n"}};
  std::vector<std::string> jsons = {R"({"model": 5})", R"({"model": {"type": "BPE", "vocab": [1]}})",
                                    R"({"model": {"type": "BPE"}, "pre_tokenizer": {"type": "ByteLevel"}, "added_tokens": [3]})",
                                    R"({"model": {"type": "BPE"}, "pre_tokenizer": "ByteLevel"})"};
  std::mt19937_64 rng(31);
  for (int i = 0; i < 300; ++i) {
    if (i % 2) pairs.push_back({vocab, mutate(merges, rng)});
    else pairs.push_back({mutate(vocab, rng), merges});
    jsons.push_back(i % 2 ? mutate(tokenizer_json, rng) : mutate_json(tj, rng).dump());
    if (i % 3 == 0) pairs.push_back({mutate_json(nlohmann::json::parse(vocab), rng).dump(), merges});
  }
  std::vector<std::string> keys(pairs.size());
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = std::to_string(i);
  auto [loaded, rejected] = expect_only_tg_errors(keys, "vocab.json + merges.txt", [&](const std::string& key) {
    const auto& [v, m] = pairs[std::stoul(key)];
    use(BpeTokenizer::from_files(v, m));
  });
  EXPECT_GT(loaded, 50);
  EXPECT_GT(rejected, 50);
  fs::create_directories(dir.path / "tj");
  auto [loaded_tj, rejected_tj] = expect_only_tg_errors(jsons, "tokenizer.json", [&](const std::string& j) {
    write_file(dir.path / "tj/tokenizer.json", j);
    use(BpeTokenizer::load((dir.path / "tj").string()));
  });
  EXPECT_GT(loaded_tj, 5);
  EXPECT_GT(rejected_tj, 50);
}
