// The bridge between a training run and its checkpoint: what is saved (parameters under their
// GPT-2 names, AdamW moments, counters, loader cursor, config) and the checks made on loading.
#pragma once
#include <cstdint>
#include <string>

#include "src/data/loader.h"
#include "src/io/checkpoint.h"
#include "src/io/config.h"
#include "src/nn/gpt.h"
#include "src/optim/adamw.h"

namespace tg {

nn::GPTConfig gpt_config_from(const ModelConfig& m);

// The checkpoint string naming the training shards of the run that wrote it, by name and size: a
// resume on other shards says so (the data order continues by step over whatever the glob finds).
constexpr const char* kCheckpointTrainShards = "train_shards";

// Counters that, with parameters and moments, make a resumed run bitwise equal to a straight one.
struct TrainState {
  int64_t step = 0;         // optimizer steps completed
  int64_t tokens_seen = 0;  // training tokens consumed (all ranks)
  int64_t bad_steps_in_row = 0;
  LoaderCursor cursor;
  uint64_t dropout_counter = 0;
  int64_t world_size = 1;          // data-parallel ranks that wrote the checkpoint
  int64_t global_batch_rows = 0;   // rows per optimizer step over all ranks (W·batch_size·grad_accum)
};

CheckpointData make_checkpoint(const nn::GPT& model, const optim::AdamW* opt, const TrainState& state,
                               const std::string& config_yaml);
// The same with AdamW's moments given whole, (numel) in the flat parameters' layout (a ZeRO-1
// run gathers its shards first); undefined moments save the model alone.
CheckpointData make_checkpoint(const nn::GPT& model, const Tensor& first_moment, const Tensor& second_moment,
                               int64_t optimizer_steps, const TrainState& state, const std::string& config_yaml);

// Copies the checkpoint's parameters into the model; every model parameter must be present with
// its shape (errors name the checkpoint, the parameter and both shapes).
void restore_parameters(nn::GPT& model, const CheckpointData& ckpt, const std::string& path);
void restore_optimizer(optim::AdamW& opt, const nn::GPT& model, const CheckpointData& ckpt, const std::string& path);
// AdamW's moments into whole flat tensors (numel each); returns the optimizer's step count.
int64_t restore_moments(const Tensor& first_moment, const Tensor& second_moment, const nn::GPT& model,
                        const CheckpointData& ckpt, const std::string& path);
TrainState restore_state(const CheckpointData& ckpt, const std::string& path);
// The config stored in a checkpoint (parsed without checking data files).
Config checkpoint_config(const CheckpointData& ckpt, const std::string& path);
// The model sections must agree; lists every field that differs.
void check_model_compatible(const ModelConfig& current, const ModelConfig& saved, const std::string& path);

}  // namespace tg
