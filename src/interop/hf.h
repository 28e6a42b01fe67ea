// Hugging Face interoperability: a tilegrad checkpoint as a transformers GPT2LMHeadModel folder
// (model.safetensors, config.json, generation_config.json), and parameters for a new run from a
// tilegrad checkpoint or a GPT-2 folder. The mapping is docs/checkpoint.md's "Orientation and
// GPT-2 names": the same names, the four Conv1D weights transposed, lm_head tied to wte.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "src/io/checkpoint.h"
#include "src/io/config.h"
#include "src/nn/gpt.h"

namespace tg {

// The parameters a model config declares, under their GPT-2 names, in tilegrad's layout
// ((out, in) linear weights), in the model's declaration order.
std::vector<std::pair<std::string, Shape>> gpt_parameter_shapes(const ModelConfig& m);

// True for the weights GPT-2 keeps in Conv1D layout (in, out): attn.c_attn, attn.c_proj,
// mlp.c_fc and mlp.c_proj.
bool is_conv1d_weight(const std::string& name);

// Writes `out_dir`/model.safetensors, config.json and generation_config.json (and, when the
// checkpoint records a BPE tokenizer, vocab.json, merges.txt and tokenizer_config.json) for
// transformers' GPT2LMHeadModel, or, for a RoPE model, GPTNeoXForCausalLM (which computes the
// same block; see docs/huggingface.md). `ckpt` is a loaded checkpoint, `path` its file (for
// messages). Errors: parameters missing from the checkpoint or shaped unlike its config (each
// listed), a model trained with a sliding window (neither config has one), `out_dir` an existing
// non-empty folder without `force`.
// Returns the files written.
std::vector<std::string> export_hf(const CheckpointData& ckpt, const std::string& path, const std::string& out_dir,
                                   bool force);

// Fills `model`'s parameters from `path`: a tilegrad checkpoint (a ckpt-*.h5 file, or a run
// folder whose latest checkpoint is used) or a Hugging Face GPT-2 model (a folder with
// model.safetensors and config.json, or a .safetensors file). Every parameter must be present
// with its shape; one error lists every mismatch (missing, shaped differently, left over, and
// config.json settings that tilegrad's GPT does not compute). Returns a one-line description of
// what was read.
std::string load_initial_parameters(nn::GPT& model, const ModelConfig& m, const std::string& path);

}  // namespace tg
