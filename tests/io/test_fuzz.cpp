// Seeded mutation fuzzing of the config and checkpoint parsers, a fixed number of iterations
// (the same inputs in every run): each mutated input must parse or fail with tg::Error —
// never another exception, a hang or a crash. Inputs that once failed otherwise are kept below
// as regression cases.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <yaml-cpp/yaml.h>

#include "src/io/checkpoint.h"
#include "src/io/config.h"
#include "src/util/error.h"
#include "tests/fuzz_util.h"

#ifndef TILEGRAD_SOURCE_DIR
#define TILEGRAD_SOURCE_DIR "."
#endif

namespace fs = std::filesystem;
using namespace tg;
using tg::testing::in_child;
using tg::testing::mutate;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Inputs kept from earlier fuzzing (each once escaped as something other than tg::Error).
const char* const kConfigRegressions[] = {
    "model:\n  n_layer: 99999999999999999999\n",
    "model:\n  d_model: 2147483646\n  n_head: 2\n",
    "train:\n  lr: 1e999\n",
    "train:\n  lr: nan\n",
    "train: [1, 2]\n",
    "model: {n_layer: }\n",
    "? [a]\n: b\n",
    "model:\n  n_layer: &a 1\n  n_head: *a\n",
    "model:\n  n_layer: *nope\n",
    "\xff\xfe",
    "run:\n  out_dir: \"\\x00\"\n",
    "train:\n  max_steps: -9223372036854775808\n",
    "train:\n  seed: 18446744073709551616\n",
};

}  // namespace

TEST(Fuzz, ConfigParserOnlyEverThrowsTgError) {
  std::vector<std::string> seeds = {read_file(fs::path(TILEGRAD_SOURCE_DIR) / "configs" / "kjv-tiny.yaml"),
                                    read_file(fs::path(TILEGRAD_SOURCE_DIR) / "configs" / "gpt2-124m.yaml")};
  for (const std::string& s : seeds) ASSERT_FALSE(s.empty());
  std::vector<std::string> inputs(std::begin(kConfigRegressions), std::end(kConfigRegressions));
  std::mt19937_64 rng(20240520);
  for (int i = 0; i < 3000; ++i) inputs.push_back(mutate(seeds[size_t(i) % seeds.size()], rng));
  int parsed = 0, rejected = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    try {
      Config c = parse_config(inputs[i], "fuzz.yaml", {}, false);
      validate_config(c);
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "input " << i << " escaped as " << typeid(e).name() << ": " << e.what() << "\n---\n"
                    << inputs[i] << "\n---";
    }
  }
  std::cout << "  " << inputs.size() << " configs: " << parsed << " parsed, " << rejected << " rejected\n";
  EXPECT_GT(rejected, 100);
}

// Configs that are valid YAML but not what the parser expects: a value somewhere replaced by one
// of another YAML type or an edge value, a key renamed or removed, a section replaced whole.
TEST(Fuzz, ConfigParserOnlyEverThrowsTgErrorOnWellFormedYaml) {
  const std::string seed = read_file(fs::path(TILEGRAD_SOURCE_DIR) / "configs" / "gpt2-124m-long.yaml");
  ASSERT_FALSE(seed.empty());
  const char* const kValues[] = {"[1, 2]", "{a: 1}", "~", "-1", "0", "1e999", "-1e999", ".nan", ".inf", "0x10",
                                 "0o17", "true", "\"\"", "\"x\"", "99999999999999999999", "-9223372036854775809",
                                 "2147483648", "1.5", "!!binary aGVsbG8=", "&a 3", "[[[[]]]]", "\"\\u0000\""};
  std::mt19937_64 rng(77);
  int parsed = 0, rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    YAML::Node root = YAML::Load(seed);
    const int n = 1 + int(rng() % 3);
    for (int k = 0; k < n; ++k) {
      std::vector<std::string> sections;
      for (auto it = root.begin(); it != root.end(); ++it) sections.push_back(it->first.as<std::string>());
      if (sections.empty()) break;
      const std::string section = sections[rng() % sections.size()];
      if (rng() % 8 == 0) {  // a whole section replaced
        root[section] = YAML::Load(kValues[rng() % std::size(kValues)]);
        continue;
      }
      YAML::Node sec = root[section];
      if (!sec.IsMap() || sec.size() == 0) continue;
      std::vector<std::string> keys;
      for (auto it = sec.begin(); it != sec.end(); ++it) keys.push_back(it->first.as<std::string>());
      const std::string key = keys[rng() % keys.size()];
      switch (rng() % 4) {
        case 0: sec.remove(key); break;
        case 1: sec[key + "x"] = sec[key]; sec.remove(key); break;
        default: sec[key] = YAML::Load(kValues[rng() % std::size(kValues)]); break;
      }
    }
    YAML::Emitter out;
    out << root;
    const std::string text = out.c_str();
    try {
      Config c = parse_config(text, "fuzz.yaml", {}, false);
      validate_config(c);
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "input " << i << " escaped as " << typeid(e).name() << ": " << e.what() << "\n---\n" << text
                    << "\n---";
    }
  }
  std::cout << "  2000 well-formed configs: " << parsed << " parsed, " << rejected << " rejected\n";
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(parsed, 20);
}

// Checkpoints: with their checksum every mutation is rejected before HDF5 opens the file; the
// same mutations of a file without one (an older checkpoint) go to HDF5's own checks, in a child
// process so a crash inside libhdf5 fails this test instead of ending it.
TEST(Fuzz, CheckpointLoaderRejectsMutatedFiles) {
  const fs::path dir = fs::temp_directory_path() / ("tg_fuzz_ckpt_" + std::to_string(getpid()));
  fs::remove_all(dir);
  CheckpointData d;
  d.arrays.push_back({"params/w", {64, 4}, std::vector<float>(256, 0.5f)});
  d.arrays.push_back({"params/s", {}, {2.0f}});
  d.ints = {{"step", 3}};
  d.u64_arrays = {{"loader_cursor", {1, 3}}};
  d.strings = {{"config_yaml", "model:\n  n_layer: 1\n"}};
  const std::string path = save_checkpoint(dir.string(), 3, d, 0);
  const std::string original = read_file(path), sum = read_file(path + ".sum");
  std::mt19937_64 rng(7);
  std::vector<std::string> mutants;
  for (int i = 0; i < 300; ++i) {
    std::string m = mutate(original, rng);
    if (m != original) mutants.push_back(std::move(m));
  }
  const fs::path target = dir / "ckpt-4.h5";
  auto write = [&](const std::string& bytes) { std::ofstream(target, std::ios::binary | std::ios::trunc) << bytes; };
  for (bool with_sum : {true, false}) {
    const std::string outcome = in_child([&] {
      if (with_sum) std::ofstream(target.string() + ".sum") << "crc32c " + sum.substr(7, 8) + " " +
                                                                   std::to_string(original.size()) + " ckpt-4.h5\n";
      else fs::remove(target.string() + ".sum");
      std::freopen("/dev/null", "w", stderr);
      for (const std::string& m : mutants) {
        write(m);
        try {
          CheckpointData got = load_checkpoint(target.string());
          if (with_sum) _exit(3);  // a mutated file passed the whole-file checksum
        } catch (const Error& e) {
          if (with_sum && std::string(e.what()).find("not opening it") == std::string::npos) _exit(4);
        } catch (...) {
          _exit(5);
        }
      }
    });
    EXPECT_EQ(outcome, "") << (with_sum ? "with" : "without") << " the checksum sidecar";
  }
  fs::remove_all(dir);
}
