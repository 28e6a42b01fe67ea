// The training loop: data → forward → backward → clip → AdamW → schedule, with logging,
// metrics.jsonl, evaluation, samples, atomic checkpoints, exact resume, signal handling and
// skipping of non-finite steps.
#pragma once
#include <cstdint>
#include <fstream>
#include <functional>
#include <memory>
#include <string>

#include "src/data/loader.h"
#include "src/io/config.h"
#include "src/nn/gpt.h"
#include "src/optim/adamw.h"
#include "src/trainer/state.h"

namespace tg {

struct TrainResult {
  int64_t final_step = 0;
  double last_loss = 0;      // mean training loss of the last step taken
  double last_val_loss = -1;  // −1 when no evaluation ran
  bool interrupted = false;   // stopped by SIGINT/SIGTERM (after checkpointing)
  std::string last_checkpoint;
};

class Trainer {
 public:
  explicit Trainer(const Config& config);
  ~Trainer();

  // resume: "" (start fresh; refuses a run directory that already has checkpoints),
  // "latest", or a checkpoint path.
  TrainResult run(const std::string& resume = "");

  // Test hook: called after backward and before clipping, with the step about to be taken;
  // lets tests poison gradients to exercise the non-finite-step path.
  void set_gradient_hook(std::function<void(int64_t step, nn::ParameterStore&)> hook) { grad_hook_ = std::move(hook); }
  // Test hook: called after every completed step (e.g. to raise a signal at a chosen step).
  void set_step_hook(std::function<void(int64_t step)> hook) { step_hook_ = std::move(hook); }

  nn::GPT& model() { return *model_; }
  // Every step's training loss, in order (skipped steps included as NaN/inf).
  const std::vector<double>& losses() const { return losses_; }

 private:
  void log_line(const std::string& s);
  void metrics(const std::string& json);
  std::string save(const char* why);
  void log_sample(int64_t step);

  Config config_;
  std::string config_yaml_;
  std::unique_ptr<nn::GPT> model_;
  std::unique_ptr<optim::AdamW> opt_;
  std::unique_ptr<DataLoader> train_data_, val_data_;
  TrainState state_;
  std::ofstream metrics_file_, log_file_;
  std::function<void(int64_t, nn::ParameterStore&)> grad_hook_;
  std::function<void(int64_t)> step_hook_;
  std::vector<double> losses_;
};

// The device a run.device setting resolves to on this machine ("auto" → cuda when usable).
Device resolve_device(const std::string& setting);

// Installed by Trainer::run: the first SIGINT/SIGTERM asks the loop to stop after the current
// step (with a checkpoint); a second one exits at once.
void install_stop_handlers();
bool stop_requested();
void clear_stop_request();

}  // namespace tg
