// Training config: one struct per concern, read from YAML (keys == field names) plus --set overrides.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tg {

// The network's shape. Defaults describe a tiny byte-level model that trains on a CPU in minutes.
struct ModelConfig {
  int n_layer = 4;                        // transformer blocks
  int n_head = 4;                         // attention heads per block; must divide d_model
  int d_model = 128;                      // residual stream width
  int vocab_size = 256;                   // token ids are uint16 in the shards, so at most 65536
  int max_seq_len = 64;                   // context length the position embedding is sized for
  std::string pos_embedding = "learned";  // "learned" (GPT-2 wpe table) or "rope"
  std::string attention = "flash";  // "flash" (fused kernel) or "naive" (composite ops, the test oracle)
  bool bias = true;                 // biases in Linear and LayerNorm, as in GPT-2
  double dropout = 0.0;             // in [0, 1); 0 disables dropout
  double rope_base = 10000.0;       // RoPE frequency base; only read when pos_embedding is "rope"
  int attention_window = 0;         // sliding window: query i sees keys i−W < j ≤ i; 0: full causal
  bool operator==(const ModelConfig&) const = default;
};

// Token shards. Globs are expanded with glob(3); relative ones are relative to the current directory.
struct DataConfig {
  std::string train = "";  // glob of training shards, e.g. "data/kjv/train*.bin"; required to train
  std::string val = "";    // glob of validation shards; required to train
  bool document_mask = false;  // tokens attend only within their document (documents end at eot_token)
  int eot_token = 256;         // end-of-text id: what `tilegrad prepare` writes between byte-level files
  bool operator==(const DataConfig&) const = default;
};

// Optimisation.
struct TrainConfig {
  int batch_size = 8;               // sequences per micro-batch per rank
  int seq_len = 64;                 // tokens per sequence; <= model.max_seq_len with learned positions
  int grad_accum = 1;               // micro-batches accumulated per optimizer step
  std::int64_t max_steps = 1000;    // optimizer steps
  double lr = 1e-3;                 // peak learning rate, reached after warmup
  double min_lr = 1e-4;             // floor of the cosine and wsd decays; <= lr
  std::int64_t warmup_steps = 100;  // linear warmup from 0 to lr; <= max_steps
  std::string lr_schedule =
      "cosine";                    // "cosine" (warmup then cosine to min_lr), "constant" or "wsd"
  std::int64_t decay_steps = 0;    // wsd: steps of the final linear decay to min_lr; 0 = max_steps / 5
  double weight_decay = 0.1;       // AdamW decoupled decay, applied to matrices only
  double beta1 = 0.9;              // AdamW first-moment decay
  double beta2 = 0.95;             // AdamW second-moment decay
  double eps = 1e-8;               // AdamW denominator epsilon
  double grad_clip = 1.0;          // max global grad norm; 0 disables clipping
  std::int64_t seed = 1337;        // seeds parameter init, data order and sampling
  int max_bad_steps = 5;           // consecutive non-finite-loss steps tolerated (skipped) before aborting
  std::string precision = "fp32";  // "fp32" or "bf16" (bf16 compute, fp32 master weights; CUDA only)
  bool deterministic = true;       // false: GPU kernels may sum in a run-dependent order (faster attention backward)
  int lm_head_chunk = 0;           // > 0: the LM head and loss make this many rows of logits at a time; 0: all at once
  bool recompute = false;          // true: each block recomputed in the backward from its input (long context)
  int recompute_rows = 0;          // > 0: a block's token-wise parts run this many positions at a time; 0: whole
  bool offload_activations = false;  // true (with recompute): recomputed blocks' inputs wait in host memory
  bool cuda_graph = false;         // true: each micro-batch's forward and backward replayed as one CUDA graph
  int zero = 0;                    // data parallelism: 0 replicates AdamW's state, 1 shards it across ranks
  double bucket_mb = 25.0;         // data parallelism: MiB of gradients per overlapped reduction; 0 = one after the backward
  std::string init_from = "";      // a new run's initial parameters: a tilegrad checkpoint or a Hugging Face GPT-2 folder
  bool operator==(const TrainConfig&) const = default;
};

// Where and how often to write things.
struct RunConfig {
  std::string out_dir = "runs/default";  // run directory: log, metrics.jsonl, checkpoints, samples
  std::string device = "auto";           // "auto" (cuda when a GPU is present), "cpu" or "cuda"
  std::int64_t log_every = 10;           // steps between log lines
  std::int64_t eval_every = 200;         // steps between validation evals; 0 = never
  int eval_steps = 20;                   // validation batches per eval
  std::int64_t sample_every = 0;         // steps between generated samples; 0 = never
  int sample_tokens = 200;               // tokens per generated sample
  std::int64_t ckpt_every = 500;         // steps between checkpoints; 0 = never
  int keep_last = 3;                     // checkpoints kept on disk; 0 keeps all
  bool keep_best = false;                // keep the checkpoint of the lowest val loss as RUN_DIR/best
  double comm_timeout_s = 600.0;         // data parallelism: seconds a collective may take before the rank gives up
  bool operator==(const RunConfig&) const = default;
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  RunConfig run;
  std::string source_path;  // where it was loaded from (for messages); not a YAML key
  bool operator==(const Config&) const = default;
};

// Reads `path`, applies `overrides` ("train.lr=3e-4", in order, after the file), validates, and (when
// check_data_files) checks that data.train and data.val each match at least one file.
// Throws tg::Error naming the file, line and dotted key on any mistake.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                   bool check_data_files = true);

// The same from YAML text; `source_name` stands in for the file name in messages and source_path.
Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {}, bool check_data_files = false);

// The resolved config with every field; parse_config of it gives back an equal Config (source_path aside).
std::string config_to_yaml(const Config& c);

// Range/enum checks of every field and the cross-field checks (d_model % n_head, seq_len vs max_seq_len,
// min_lr <= lr, ...). parse_config already calls it; call it again after changing a Config in code.
void validate_config(const Config& c);

// One row per key, for --help and the README's config reference.
struct ConfigKeyDoc {
  std::string key;            // dotted, e.g. "train.lr"
  std::string type;           // e.g. "int >= 1", "float in [0, 1)", "learned | rope"
  std::string default_value;  // as it would be written in YAML
  std::string description;
};
std::vector<ConfigKeyDoc> config_reference();

}  // namespace tg
