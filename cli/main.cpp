// The `tilegrad` command: prepare, train, sample, eval, plot.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "src/data/bpe.h"
#include "src/data/prepare.h"
#include "src/data/tokenizer.h"
#include "src/interop/hf.h"
#include "src/trainer/footprint.h"
#include "src/trainer/generate.h"
#include "src/trainer/trainer.h"
#include "src/util/files.h"
#include "cli/bench.h"
#include "cli/cli.h"
#include "cli/gnuplot.h"

namespace fs = std::filesystem;
using namespace tg;

namespace {

const char* kProgram = "tilegrad";

// Loads a model for inference from a checkpoint file or a run directory (its latest).
struct Loaded {
  std::unique_ptr<nn::GPT> model;
  Config cfg;
  TextCodec codec;  // the run's tokenizer, recorded in the checkpoint (bytes when none is)
};

// The model on the device `--device` names (auto: the GPU when there is one), computing in the
// run's precision there (bf16 runs in bf16 on a GPU; a CPU computes in fp32).
Loaded load_model(const std::string& where, const std::string& device_setting) {
  const Device device = resolve_device(device_setting, 0, "--device");  // before the checkpoint is read
  auto [path, ckpt] = resolve_and_load(where, "latest");
  Config cfg = checkpoint_config(ckpt, path);
  const int64_t step = ckpt.ints.count("step") ? ckpt.ints.at("step") : -1;
  TG_CHECK(step >= 0, "checkpoint ", path, ": state value 'step' is ", step,
           ", expected >= 0 (the checkpoint is inconsistent; use another one)");
  set_current_device(device);
  check_fits(cfg, device, false);
  const DType compute = device.is_cuda() && cfg.train.precision == "bf16" ? DType::bf16 : DType::f32;
  auto model = std::make_unique<nn::GPT>(gpt_config_from(cfg.model), uint64_t(cfg.train.seed), DType::f32, device, compute);
  model->set_lm_head_chunk(cfg.train.lm_head_chunk);
  model->set_recompute_rows(cfg.train.recompute_rows);
  if (cfg.data.document_mask) model->set_document_eot(cfg.data.eot_token);  // as the run trained
  restore_parameters(*model, ckpt, path);
  TextCodec codec = codec_for_vocabulary(codec_from_strings(ckpt.strings), cfg.model.vocab_size);
  std::cerr << "loaded " << path << " (step " << step << ", tokenizer: " << codec.describe() << ") on "
            << device.str() << (compute == DType::bf16 ? " in bf16" : "") << "\n";
  return {std::move(model), cfg, codec};
}

int cmd_prepare(const cli::Args& a) {
  TG_CHECK(a.has("text") && !a.all("text").empty(), "tilegrad prepare: --text FILE… is required");
  TG_CHECK(a.has("out"), "tilegrad prepare: --out DIR is required");
  const double val_fraction = a.get_double("val-fraction", 0.01);
  TG_CHECK(val_fraction > 0 && val_fraction < 1, "tilegrad prepare: --val-fraction must be in (0, 1), got ",
           a.get("val-fraction", ""));
  std::optional<BpeTokenizer> tok;
  if (a.has("tokenizer")) tok = BpeTokenizer::load(a.get("tokenizer", ""));
  PrepareResult r = prepare_text(a.all("text"), a.get("out", ""), val_fraction, true, kMaxShardTokens,
                                 tok ? &*tok : nullptr);
  if (tok) std::cout << "tokenizer: " << a.get("tokenizer", "") << " (" << tok->vocab_size() << " ids; vocab.json and merges.txt copied to " << a.get("out", "") << ")\n";
  std::cout << "prepared " << r.train_tokens << " train and " << r.val_tokens << " val tokens:\n";
  for (const std::string& f : r.files) std::cout << "  " << f << "\n";
  return 0;
}

int cmd_train(const cli::Args& a) {
  Config cfg = load_config(a.positional[0], a.all("set"), true);
  Trainer trainer(cfg);
  TrainResult r = trainer.run(a.get("resume", ""));
  if (trainer.communicator().rank() != 0) return 0;  // rank 0 reports for the job
  std::cout << "done: step " << r.final_step << ", loss " << r.last_loss;
  if (r.last_val_loss >= 0) std::cout << ", val loss " << r.last_val_loss;
  std::cout << (r.interrupted ? " (interrupted; resume with --resume latest)" : "") << "\n";
  return 0;
}

int cmd_sample(const cli::Args& a) {
  SampleOptions so;
  so.tokens = a.get_int("tokens", 200);
  so.temperature = a.get_double("temperature", 1.0);
  so.top_k = a.get_int("top-k", 0);
  so.top_p = a.get_double("top-p", 1.0);
  const int64_t seed = a.get_int("seed", 1337);
  TG_CHECK(seed >= 0, "tilegrad sample: --seed must be ≥ 0 (as train.seed), got ", seed);
  so.seed = uint64_t(seed);
  TG_CHECK(so.tokens >= 1, "tilegrad sample: --tokens must be ≥ 1, got ", so.tokens);
  TG_CHECK(std::isfinite(so.temperature) && so.temperature >= 0, "tilegrad sample: --temperature must be a finite "
           "number ≥ 0 (0 = greedy), got ", a.get("temperature", ""));
  TG_CHECK(so.top_k >= 0, "tilegrad sample: --top-k must be ≥ 0 (0 = all tokens), got ", so.top_k);
  TG_CHECK(so.top_p > 0 && so.top_p <= 1, "tilegrad sample: --top-p must be in (0, 1] (1 = all tokens), got ",
           a.get("top-p", ""));
  so.kv_cache = !a.has("no-kv-cache");
  auto [model, cfg, codec] = load_model(a.positional[0], a.get("device", "auto"));
  so.drawable_ids = codec.vocab_size();
  std::string prompt = a.get("prompt", "");
  const std::vector<int32_t> prompt_ids = codec.encode(prompt);
  for (int32_t id : prompt_ids)
    TG_CHECK(id >= 0 && id < cfg.model.vocab_size, "tilegrad sample: the prompt's token id ", id,
             " is outside the model's vocabulary (model.vocab_size ", cfg.model.vocab_size, ")");
  // Tokens are printed as they are made (a multi-byte character may arrive over several).
  std::cout << prompt << std::flush;
  so.on_token = [&codec](int32_t t) {
    std::cout << codec.decode({t}) << std::flush;
    TG_CHECK(std::cout.good(), "tilegrad sample: writing to standard output failed");
  };
  const auto start = std::chrono::steady_clock::now();
  generate(*model, prompt_ids, so);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << std::endl;
  std::fprintf(stderr, "sampled %lld tokens in %.2f s (%.1f tokens/s%s)\n", (long long)so.tokens, seconds,
               double(so.tokens) / seconds, so.kv_cache ? ", key/value cache" : "");
  return 0;
}

int cmd_eval(const cli::Args& a) {
  const int64_t steps = a.get_int("steps", 0);
  TG_CHECK(steps >= 0, "tilegrad eval: --steps must be ≥ 0 (0 = the whole data), got ", steps);
  auto [model, cfg, codec] = load_model(a.positional[0], a.get("device", "auto"));
  TG_CHECK(!a.has("data") || !a.get("data", "").empty(), "tilegrad eval: --data is empty; give a glob of token shards");
  std::string glob = a.get("data", cfg.data.val);
  TG_CHECK(!glob.empty(), "tilegrad eval: the checkpoint's config names no validation data; pass --data GLOB");
  DataLoader val(glob, cfg.model.vocab_size, cfg.train.batch_size, cfg.train.seq_len, uint64_t(cfg.train.seed));
  int64_t used = steps > 0 ? std::min(steps, val.num_sequential_batches()) : val.num_sequential_batches();
  double loss = evaluate(*model, val, steps);
  TG_CHECK(std::isfinite(loss), "tilegrad eval: the validation loss is ", loss,
           " (the model's output is not finite on this data)");
  std::printf("val loss %.4f (%lld batches of %d × %d tokens from %s)\n", loss, (long long)used, cfg.train.batch_size,
              cfg.train.seq_len, glob.c_str());
  return 0;
}

int cmd_tokenizer(const cli::Args& a) {
  TG_CHECK(a.positional[0] == "train", "tilegrad tokenizer: unknown action '", a.positional[0], "'; available: train");
  TG_CHECK(a.has("text") && !a.all("text").empty(), "tilegrad tokenizer train: --text FILE… is required");
  TG_CHECK(a.has("out"), "tilegrad tokenizer train: --out DIR is required");
  TG_CHECK(a.has("vocab-size"), "tilegrad tokenizer train: --vocab-size N is required");
  BpeTokenizer tok = train_bpe(a.all("text"), a.get_int("vocab-size", 0));
  for (const std::string& f : tok.save(a.get("out", ""))) std::cout << "wrote " << f << "\n";
  std::cout << tok.vocab_size() << " ids (256 bytes, merges, <|endoftext|> = " << tok.end_of_text() << ")\n";
  return 0;
}

int cmd_export(const cli::Args& a) {
  const std::string format = a.get("format", "hf");
  TG_CHECK(format == "hf", "tilegrad export: unknown --format '", format, "'; available: hf (Hugging Face transformers)");
  TG_CHECK(a.has("out"), "tilegrad export: --out DIR is required");
  auto [path, ckpt] = resolve_and_load(a.positional[0], "latest");
  for (const std::string& f : export_hf(ckpt, path, a.get("out", ""), a.has("force"))) std::cout << "wrote " << f << "\n";
  return 0;
}

int cmd_plot(const cli::Args& a) {
  fs::path dir = a.positional[0];
  fs::path metrics = dir / "metrics.jsonl";
  const std::string problem = regular_file_problem(metrics.string());
  TG_CHECK(problem.empty(), "tilegrad plot: ", metrics.string(), " ", problem, " (is ", dir.string(), " a run directory?)");
  std::istringstream in(read_regular_file(metrics.string(), "tilegrad plot"));
  fs::path out = a.get("out", (dir / "loss.png").string());
  fs::path train_dat = dir / ".plot_train.dat", val_dat = dir / ".plot_val.dat";
  std::ofstream tr(train_dat), va(val_dat);
  std::string line;
  int n_train = 0, n_val = 0;
  while (std::getline(in, line)) {
    // Records as the trainer writes them; a line that is not one (a torn last line) is skipped.
    const nlohmann::json r = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!r.is_object() || !r.contains("type") || !r["type"].is_string() || !r.contains("step") ||
        !r["step"].is_number_integer())
      continue;
    const std::string type = r["type"].get<std::string>(), key = type == "train" ? "loss" : "val_loss";
    if ((type != "train" && type != "eval") || !r.contains(key) || !r[key].is_number()) continue;
    (type == "train" ? tr : va) << r["step"].get<int64_t>() << " " << r[key].dump() << "\n";
    ++(type == "train" ? n_train : n_val);
  }
  tr.close();
  va.close();
  TG_CHECK(n_train + n_val > 0, "tilegrad plot: ", metrics.string(), " has no train or eval records yet");
  const std::string who = "tilegrad plot";
  std::string script = "set xlabel 'step'\nset ylabel 'loss (nats/token)'\nset grid\nplot ";
  if (n_train) script += "'" + gnuplot_quote(who, train_dat.string()) + "' using 1:2 with lines title 'train'";
  if (n_val)
    script += std::string(n_train ? ", " : "") + "'" + gnuplot_quote(who, val_dat.string()) +
              "' using 1:2 with linespoints title 'val'";
  script += "\n";
  struct RemoveData {  // the data files go whether gnuplot succeeds or not
    fs::path a, b;
    ~RemoveData() { fs::remove(a), fs::remove(b); }
  } remove_data{train_dat, val_dat};
  run_gnuplot(who, "pngcairo size 900,540", out.string(), script);
  std::cout << "wrote " << out.string() << "\n";
  return 0;
}

std::vector<cli::Command> commands() {
  return {
      {"prepare",
       "Tokenize text files (bytes, vocabulary 256 plus end-of-text 256 between files; or a GPT-2 BPE with "
       "--tokenizer) into llm.c token shards train_NNNNNN.bin and val_NNNNNN.bin; the validation split is the last "
       "fraction of the text. With --tokenizer its vocab.json and merges.txt are copied beside the shards: a run "
       "on them records the tokenizer in its checkpoints, and sample and eval use it.",
       {},
       {{"--text", "FILE", "input text files", "", true},
        {"--out", "DIR", "output directory for the shards", ""},
        {"--tokenizer", "DIR", "a byte-level BPE: a folder with vocab.json and merges.txt (or tokenizer.json), e.g. "
                               "GPT-2's; each file is one document, joined by <|endoftext|>", "bytes"},
        {"--val-fraction", "F", "fraction of tokens, taken from the end, used for validation", "0.01"}},
       cmd_prepare},
      {"train",
       "Train a GPT from a YAML config (every key: docs/config.md). Writes config.yaml, train.log, metrics.jsonl "
       "and ckpt-<step>.h5 checkpoints into run.out_dir. SIGINT/SIGTERM/SIGHUP finish the step, checkpoint and exit 0; a "
       "second signal exits at once. Data parallel: start one process per GPU (or per CPU rank) with a launcher, "
       "`mpirun -np N tilegrad train CONFIG` on one node (as root add --allow-run-as-root), `mpirun -np N "
       "--hostfile HOSTS …` or `srun --ntasks=N --mpi=pmix --kill-on-bad-exit=1 tilegrad train CONFIG` across nodes: each rank "
       "trains batch_size × grad_accum rows of every step (a global batch W times larger), GPU gradients are reduced "
       "by NCCL and CPU gradients by MPI, and rank 0 writes the logs and checkpoints; see train.zero, "
       "train.bucket_mb and run.comm_timeout_s.",
       {{"CONFIG", "the YAML config file, e.g. configs/kjv-tiny.yaml"}},
       {{"--set", "KEY=VALUE", "override config keys, e.g. --set train.lr=3e-4 run.out_dir=runs/x", "", true},
        {"--resume", "latest|auto|PATH",
         "resume from the run directory's latest complete checkpoint or a given file; auto: latest when the run "
         "directory has a checkpoint, else start fresh (for a job resubmitted after a time limit)", ""}},
       cmd_train,
       [] {
         std::ostringstream os;
         os << "config keys (YAML section.key = --set key; every key has a default):\n";
         for (const ConfigKeyDoc& d : config_reference())
           os << "  " << d.key << " (" << d.type << ", default " << d.default_value << ")\n      " << d.description << "\n";
         return os.str();
       }},
      {"sample",
       "Generate text from a checkpoint (a ckpt-*.h5 file or a run directory, whose latest checkpoint is used).",
       {{"CHECKPOINT", "a checkpoint file or a run directory"}},
       {{"--prompt", "TEXT", "text to continue", "a line break"},
        {"--tokens", "N", "number of tokens to generate", "200"},
        {"--temperature", "T", "softmax temperature; 0 = greedy", "1.0"},
        {"--top-k", "K", "sample only among the K most likely tokens; 0 = all", "0"},
        {"--top-p", "P", "sample only among the most likely tokens whose probabilities first sum to P (nucleus); 1 = all",
         "1"},
        {"--seed", "S", "sampling seed (same seed, same text)", "1337"},
        {"--device", "D", "auto (the GPU when there is one), cpu or cuda", "auto"},
        {"--no-kv-cache", "", "recompute the whole context for every token instead of caching keys and values", ""}},
       cmd_sample},
      {"eval",
       "Validation loss (mean cross-entropy, nats per token) of a checkpoint over sequential, non-overlapping windows.",
       {{"CHECKPOINT", "a checkpoint file or a run directory"}},
       {{"--data", "GLOB", "token shards to evaluate", "the checkpoint config's data.val"},
        {"--steps", "N", "number of batches; 0 = the whole data", "0"},
        {"--device", "D", "auto (the GPU when there is one), cpu or cuda", "auto"}},
       cmd_eval},
      {"tokenizer",
       "`tokenizer train`: learn a byte-level BPE (GPT-2's pre-tokenization, 256 byte tokens, merges, then "
       "<|endoftext|>) from text files and write vocab.json and merges.txt, the files of Hugging Face's "
       "GPT2Tokenizer, for prepare --tokenizer.",
       {{"ACTION", "train"}},
       {{"--text", "FILE", "text files to learn from", "", true},
        {"--vocab-size", "N", "ids in the vocabulary, 257 to 65536", ""},
        {"--out", "DIR", "folder for vocab.json and merges.txt", ""}},
       cmd_tokenizer},
      {"export",
       "Write a checkpoint's model in another framework's format. hf: a folder that transformers loads with "
       "GPT2LMHeadModel.from_pretrained(DIR): model.safetensors, config.json and generation_config.json (and the "
       "BPE tokenizer's vocab.json, merges.txt and tokenizer_config.json when the run used one). A RoPE model "
       "becomes transformers' GPT-NeoX (GPTNeoXForCausalLM; rotary_pct 1, sequential residual), which computes "
       "the same block; AutoModelForCausalLM loads either.",
       {{"CHECKPOINT", "a checkpoint file or a run directory (its latest checkpoint)"}},
       {{"--format", "FORMAT", "output format: hf", "hf"},
        {"--out", "DIR", "output folder; must be new or empty unless --force", ""},
        {"--force", "", "write into a non-empty --out folder, replacing files of the same names", ""}},
       cmd_export},
      {"bench",
       "Benchmarks. `bench train CONFIG`: training steps of the config's model on random tokens: ms/step, "
       "tokens/s, TFLOP/s, MFU (6·N + 12·L·d·T FLOPs per token against the H200's 989 TFLOP/s bf16 peak) and peak "
       "memory. `bench attention`: FlashAttention forward and backward TFLOP/s on the FlashAttention shapes "
       "(B·T = 16384, hidden 2048; d 64 and 128, or 32 / 96 with --head-dim; T 1k to 32k; causal and not). "
       "`bench memory CONFIG`: peak memory and step time of one training step against the sequence length "
       "(T = --min-t, doubling, to --max-t; default 1024 to 131072; one warm-up and one timed step), the model "
       "built afresh for each T, stopping at the first that runs out of memory, with --predict the memory model's "
       "figures beside them. `bench allreduce`, under mpirun or srun: the communicator's collective on fp32 "
       "buffers of --mib sizes, its time and bus bandwidth (nccl-tests' definition: 2(W − 1)/W × bytes / time "
       "for all_reduce), after checking its result. Results print as JSON lines.",
       {{"WHAT", "train, attention, memory or allreduce"},
        {"CONFIG", "for train and memory: a YAML config, e.g. configs/gpt2-124m.yaml", true}},
       {{"--set", "KEY=VALUE", "train and memory: override config keys, e.g. --set train.batch_size=32", "", true},
        {"--steps", "N", "timed steps (train; memory: 1), timed runs, median reported (attention), or timed collectives (allreduce)", "20"},
        {"--warmup", "N", "untimed steps first (memory: 1; attention: untimed forward + backward pairs first; with --protocol reference untimed calls before each timing, default 5 before the forward and 3 before forward + backward, as torch_attention.py)", "5"},
        {"--protocol", "P", "attention: sustained (each mode's calls back to back, host-timed) or reference (torch_attention.py's timing: CUDA events, backward = (forward + backward) − forward)", "sustained"},
        {"--min-t", "T", "attention and memory: the shortest sequence (then T doubles up to --max-t)", "1024"},
        {"--max-t", "T", "attention and memory: the longest sequence (default: attention 32768, memory 131072)", ""},
        {"--predict", "", "memory: the memory model's prediction beside each measurement (peak and categories; docs/memory.md)", ""},
        {"--no-run", "", "memory: print the predictions only, for every T (also those that do not fit); implies --predict", ""},
        {"--series", "LIST", "memory: comma-separated series to run: config (as given), flash (no recompute, whole head), "
                             "flash-recompute-chunk (recompute, the config's lm_head_chunk or 4096), materialised "
                             "(model.attention naive); each stops at its first out-of-memory", "config"},
        {"--out", "DIR", "memory: write DIR/memory.csv (a row per series and T) and DIR/memory.png (needs gnuplot)", ""},
        {"--torch-csv", "FILE", "memory: PyTorch's series for memory.png, from torch_gpt.py memory's --csv file or its JSON lines", ""},
        {"--capacity-gib", "G", "memory: the capacity line of memory.png (default: the device's total memory)", ""},
        {"--head-dim", "D", "attention: only this head dim (32, 64, 96 or 128; 0 = 64 and 128, the shapes of torch_attention.py)", "0"},
        {"--causal", "0|1|2", "attention: 1 the causal shapes only, 0 the non-causal ones only, 2 both", "2"},
        {"--compare", "0|1", "attention: 1 also times the portable mma.sync kernels beside the default (wgmma on H100/H200)", "0"},
        {"--backward", "0|1", "attention: 0 times the forward alone (the backward columns read 0)", "1"},
        {"--atomic", "0|1|2",
         "attention: 0 skips the opt-in atomic-dQ backward (its column reads 0); 2 times its kernel at every shape "
         "(FlashDq::kAtomicKernel), not only where kAtomic takes it",
         "1"},
        {"--window", "W",
         "attention: a sliding window of W keys (causal shapes only), timed beside the same shape's full causal "
         "attention; TF/s count the visible (query, key) pairs exactly",
         "0"},
        {"--docs", "N",
         "attention: N equal documents per row (a document mask; causal shapes only, with --window too), timed "
         "beside the full causal attention; TF/s count the visible pairs exactly",
         "0"},
        {"--mib", "LIST", "allreduce: buffer sizes in MiB, comma-separated (25: a gradient bucket; 471.8: GPT-2 small's fp32 gradient)", "25,471.8"},
        {"--collective", "NAME", "allreduce: all_reduce, reduce_scatter or all_gather (ZeRO-1's two)", "all_reduce"},
        {"--device", "DEVICE", "allreduce: auto (each rank's GPU, else the CPU), cpu or cuda", "auto"},
        {"--variant", "NAME",
         "attention: a wgmma kernel shape of the development registry (docs/kernels.md §4.4) instead of the "
         "launchers' shape, wherever it applies (its kernel, head dim, mask and T); an unknown name lists them",
         ""}},
       [](const cli::Args& a) {
         if (a.positional[0] == "train") {
           TG_CHECK(a.positional.size() == 2, "tilegrad bench train: needs a CONFIG");
           return bench_train(a);
         }
         if (a.positional[0] == "memory") {
           TG_CHECK(a.positional.size() == 2, "tilegrad bench memory: needs a CONFIG");
           return bench_memory(a);
         }
         if (a.positional[0] == "allreduce") {
           TG_CHECK(a.positional.size() == 1, "tilegrad bench allreduce: takes no CONFIG");
           return bench_allreduce(a);
         }
         TG_CHECK(a.positional[0] == "attention", "tilegrad bench: unknown benchmark '", a.positional[0],
                  "'; available: train, attention, memory, allreduce");
         return bench_attention(a);
       }},
      {"plot",
       "Plot train and validation loss against step from RUN_DIR/metrics.jsonl into a PNG (needs gnuplot).",
       {{"RUN_DIR", "a run directory"}},
       {{"--out", "FILE", "output image", "RUN_DIR/loss.png"}},
       cmd_plot},
  };
}

// A command's line in the list: its summary's first sentence (ended by ". ", so that "llm.c" or
// "ckpt-*.h5" do not end it), cut at a word to fit one line.
std::string brief(const std::string& summary) {
  const size_t end = summary.find(". ");
  std::string s = end == std::string::npos ? summary : summary.substr(0, end + 1);
  constexpr size_t kWidth = 112;
  if (s.size() > kWidth) s = s.substr(0, s.rfind(' ', kWidth - 2)) + " …";
  return s;
}

void usage(std::ostream& os) {
  os << "usage: tilegrad <command> [options]\n\ncommands:\n";
  for (const cli::Command& c : commands())
    os << "  " << c.name << std::string(10 - c.name.size(), ' ') << brief(c.summary) << "\n";
  os << "\n`tilegrad <command> --help` describes each command's options.\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    usage(args.empty() ? std::cerr : std::cout);
    return args.empty() ? 2 : 0;
  }
  for (const cli::Command& c : commands()) {
    if (c.name != args[0]) continue;
    std::vector<std::string> rest(args.begin() + 1, args.end());
    for (const std::string& r : rest)
      if (r == "--help" || r == "-h") {
        std::cout << cli::help_text(kProgram, c);
        return 0;
      }
    // In a job of several ranks an error names the rank and host it happened on, and goes out in
    // one write, so that the lines of ranks failing together do not interleave.
    auto report = [](const char* kind, const std::string& what) {
      const std::string where = dist::rank_and_host();
      const std::string line = std::string(kind) + ": " + (where.empty() ? "" : where + ": ") + what + "\n";
      std::fwrite(line.data(), 1, line.size(), stderr);
      std::fflush(stderr);
    };
    try {
      return c.run(cli::parse(kProgram, c, rest));
    } catch (const Error& e) {
      report("error", e.what());
      dist::leave_job_on_error(1);  // a rank that fails alone ends its data-parallel job
      return 1;
    } catch (const std::bad_alloc&) {
      report("error", "out of memory: an allocation failed; make the model or the batch smaller "
                      "(model.n_layer, model.d_model, train.batch_size, train.seq_len)");
      dist::leave_job_on_error(1);
      return 1;
    } catch (const std::exception& e) {
      report("internal error", e.what());
      dist::leave_job_on_error(3);
      return 3;
    }
  }
  std::cerr << "tilegrad: unknown command '" << args[0] << "'\n";
  usage(std::cerr);
  return 2;
}
