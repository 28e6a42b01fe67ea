// HDF5 checkpoints: generic named arrays + scalar state, written atomically, verified on read.
// The layout is documented in docs/checkpoint.md; files open in h5py without tilegrad.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace tg {

// One float32 array. A '/' in the name makes nested HDF5 groups
// ("params/transformer.h.0.ln_1.weight" → group "params", dataset "transformer.h.0.ln_1.weight").
struct CheckpointArray {
  std::string name;
  std::vector<int64_t> shape;  // row-major; {} is a scalar (one element)
  std::vector<float> data;     // size == product(shape)
};

// Everything the trainer stores. The checkpoint layer is generic: it does not know what a
// parameter or an optimizer moment is, only names, shapes and values.
struct CheckpointData {
  std::string format = "tilegrad-checkpoint";
  int version = 1;
  std::vector<CheckpointArray> arrays;                      // params, optimizer moments ("optim/m/<name>"), ...
  std::map<std::string, int64_t> ints;                      // step, tokens_seen, world_size, ...
  std::map<std::string, std::vector<uint64_t>> u64_arrays;  // RNG states, loader cursor
  std::map<std::string, std::string> strings;               // "config_yaml": the resolved config
};

// Writes `dir/ckpt-<step>.h5` atomically (the file is built in memory, written to
// `dir/.ckpt-<step>.h5.tmp` with every write checked, fsynced, renamed, dir fsynced), with its
// whole-file CRC-32C in the sidecar `dir/ckpt-<step>.h5.sum` (renamed into place first), then
// points `dir/latest` at it the same way, then prunes to the newest
// `keep_last` checkpoints (keep_last <= 0 keeps all; the newest and the one `latest` names are never
// deleted). Creates `dir` if needed. Returns the final path. Throws tg::Error on failure (a full
// disk included), leaving the previous checkpoints and `latest` untouched and no temp files.
std::string save_checkpoint(const std::string& dir, int64_t step, const CheckpointData& data, int keep_last);

// Reads a checkpoint: first the whole file once against the CRC-32C in `path.sum` (a mismatch
// is an error before HDF5 parses anything; a file without a sidecar, from an older tilegrad,
// loads with a line on stderr saying so), then through HDF5, verifying format name, version and
// every dataset's Fletcher32 checksum. Errors name the file and the dataset/attribute that failed.
CheckpointData load_checkpoint(const std::string& path);

// which == "latest": reads `dir_or_path/latest`; if it is missing or names a file that does not
// load, says so on stderr and falls back to the newest complete ckpt-*.h5 that loads (temporary
// files are never considered). If dir_or_path is itself a file, loads that file; a pointer file
// (RUN/latest, RUN/best) is followed as which == its name.
// which == "best": the checkpoint `dir_or_path/best` names, exactly (an error when there is none).
// Otherwise `which` is a path (absolute, relative to the working directory, or relative to
// dir_or_path); it is loaded without fallback. Returns the path actually loaded and its data.
std::pair<std::string, CheckpointData> resolve_and_load(const std::string& dir_or_path, const std::string& which);

// Names `dir/ckpt-<step>.h5` (which must exist) in the pointer `dir/best`, with its val loss on a
// second line, written atomically like `latest`, then prunes to `keep_last` as save_checkpoint
// does. Pruning never deletes the checkpoint `best` names.
void mark_best(const std::string& dir, int64_t step, double val_loss, int keep_last);
// The checkpoint `dir/best` names (its path) and its val loss; nullopt when there is no `best`,
// or it names no checkpoint file there.
std::optional<std::pair<std::string, double>> read_best(const std::string& dir);

// Complete checkpoints (files named ckpt-<step>.h5) in `dir`, sorted by step ascending.
// Empty if the directory does not exist.
std::vector<std::string> list_checkpoints(const std::string& dir);

}  // namespace tg
