// The training loop: data → forward → backward → clip → AdamW → schedule, with logging,
// metrics.jsonl, evaluation, samples, atomic checkpoints, exact resume, signal handling and
// skipping of non-finite steps — in one process, or as one rank of a data-parallel job
// (src/dist/): each rank trains on its rows of every global batch, gradients are reduced across
// ranks, and rank 0 alone writes logs, metrics and checkpoints.
#pragma once
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "src/data/bpe.h"
#include "src/data/loader.h"
#include "src/dist/communicator.h"
#include "src/dist/grad_sync.h"
#include "src/io/append_file.h"
#include "src/io/config.h"
#include "src/nn/gpt.h"
#include "src/optim/adamw.h"
#include "src/trainer/state.h"

namespace tg {

struct TrainResult {
  int64_t final_step = 0;
  double last_loss = 0;      // mean training loss of the last step taken
  double last_val_loss = -1;  // −1 when no evaluation ran
  bool interrupted = false;   // stopped by SIGINT/SIGTERM/SIGHUP (after checkpointing)
  std::string last_checkpoint;
};

class Trainer {
 public:
  // comm: the communicator of the ranks this run spans; null makes one from the launcher's
  // environment when run() starts (world size 1 without a launcher).
  explicit Trainer(const Config& config, std::unique_ptr<dist::Communicator> comm = nullptr);
  ~Trainer();

  // resume: "" (start fresh; refuses a run directory that already has checkpoints), "latest",
  // a checkpoint path, or "auto": "latest" when the run directory has a checkpoint, else a fresh
  // start (a job resubmitted after a time limit or a preemption runs the same command).
  TrainResult run(const std::string& resume = "");

  // Test hook: called after backward and before clipping, with the step about to be taken;
  // lets tests poison gradients to exercise the non-finite-step path.
  void set_gradient_hook(std::function<void(int64_t step, nn::ParameterStore&)> hook) { grad_hook_ = std::move(hook); }
  // Test hook: called after every completed step (e.g. to raise a signal at a chosen step).
  void set_step_hook(std::function<void(int64_t step)> hook) { step_hook_ = std::move(hook); }

  nn::GPT& model() { return *model_; }
  dist::Communicator& communicator() { return *comm_; }
  // Communication not hidden behind the backward, seconds summed over the steps of this run.
  double exposed_comm_seconds() { return sync_ ? sync_->exposed_seconds() : 0.0; }
  // Every step's training loss, in order (skipped steps included as NaN/inf).
  const std::vector<double>& losses() const { return losses_; }

 private:
  void log_line(const std::string& s);
  void metrics(const std::string& json);
  // After a failed log or metrics write: every rank stops; a checkpoint is attempted first.
  [[noreturn]] void stop_for_write_error(bool failed_here);
  // prune: apply run.keep_last (the stop after non-finite steps keeps every earlier checkpoint).
  std::string save(const char* why, bool prune = true);
  void log_sample(int64_t step);
  // Runs fn on rank 0 only; every rank learns whether it threw and throws too (rank 0 its own
  // error), so no rank is left waiting in a collective for a rank that failed alone.
  void on_rank0(const char* what, const std::function<void()>& fn);
  // Several ranks: every rank compares its resolved config and data shards with rank 0's, and all
  // stop with the first difference named when one differs.
  void check_ranks_agree(Device device);
  void resume_from(const std::string& resume);
  void init_from(const std::string& path);  // train.init_from
  bool lead() const { return comm_->rank() == 0; }

  Config config_;
  std::unique_ptr<dist::Communicator> comm_;
  std::unique_ptr<dist::GradientSync> sync_;
  std::string config_yaml_;
  // "data.train shards:\n  train_000000.bin, N bytes\n…": the files the run reads, listed once
  // as its loader opens them; checkpoints keep it and the ranks compare it.
  std::string train_shards_;
  std::unique_ptr<nn::GPT> model_;
  std::unique_ptr<optim::AdamW> opt_;
  std::unique_ptr<DataLoader> train_data_, val_data_;
  TextCodec codec_;  // the training data's tokenizer (bytes when prepare had none)
  TrainState state_;
  AppendFile metrics_file_, log_file_;
  std::string write_error_;  // the first failed write to train.log or metrics.jsonl (rank 0)
  std::function<void(int64_t, nn::ParameterStore&)> grad_hook_;
  std::function<void(int64_t)> step_hook_;
  std::vector<double> losses_;
};

// The device a run.device setting resolves to on this machine ("auto" → cuda when usable); a
// data-parallel rank takes the GPU local_rank mod the number it sees. name: the setting as the
// user gave it, for errors (a config key, or a command's option such as "--device").
Device resolve_device(const std::string& setting, int local_rank = 0, const std::string& name = "run.device");

// Why train.cuda_graph cannot replay this run's forward and backward, or "" when it can: a graph
// replays what the host decided while recording it, so the step must be on one GPU (several ranks
// reduce gradients from the backward's hooks) and decide nothing per step on the host (dropout's
// seed, the batch's document starts, recomputation's host-side buffers).
std::string cuda_graph_obstacle(const Config& cfg, int world_size, Device device);

// Installed by Trainer::run: the first SIGINT, SIGTERM or SIGHUP asks the loop to stop after the
// current step (with a checkpoint); a second one exits at once.
void install_stop_handlers();
bool stop_requested();
// A JSON string literal for `s` (metrics.jsonl): always valid UTF-8 and valid JSON. Bytes that
// are not part of well-formed UTF-8 become U+FFFD (written "\ufffd"); control characters are
// escaped.
std::string json_string(const std::string& s);
void clear_stop_request();

}  // namespace tg
