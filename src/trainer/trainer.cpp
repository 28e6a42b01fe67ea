// The training loop and its bookkeeping.
#include "src/trainer/trainer.h"

#include <fcntl.h>
#include <omp.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "src/data/bpe.h"
#include "src/data/tokenizer.h"
#include "src/interop/hf.h"
#include "src/tensor/device_graph.h"
#include "src/trainer/batch_prefetch.h"
#include "src/trainer/footprint.h"
#include "src/trainer/memory_model.h"
#include "src/trainer/generate.h"

namespace tg {

namespace fs = std::filesystem;

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;

// One training process per run directory: two would interleave their logs and delete each
// other's temporary checkpoint files. An advisory lock on RUN/.lock (flock, released by the
// kernel whenever the process ends, `kill -9` included) holds the owner's pid for the message.
// A file system without locks (some network mounts) is not an error: the run goes on unlocked.
class RunDirectoryLock {
 public:
  explicit RunDirectoryLock(const std::string& dir) {
    const std::string path = (fs::path(dir) / ".lock").string();
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    TG_CHECK(fd_ >= 0, "run.out_dir: cannot create ", path, ": ", std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (err != EWOULDBLOCK) return;  // no locks here
      char pid[32] = {};
      const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
      ::close(fd_);
      fd_ = -1;
      throw Error("run.out_dir: another tilegrad" + (n > 0 ? " (pid " + std::string(pid, size_t(n)) + ")" : std::string()) +
                  " is training in " + dir + "; wait for it to end, or choose another run.out_dir");
    }
    // The pid is for another process's message only: a failed write changes nothing else.
    const std::string me = std::to_string(::getpid());
    if (::ftruncate(fd_, 0) == 0) (void)!::pwrite(fd_, me.data(), me.size(), 0);
  }
  ~RunDirectoryLock() {
    if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the lock
  }
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

void on_stop_signal(int sig) {
  if (g_stop_signal) _exit(128 + sig);  // second signal: leave now
  g_stop_signal = sig;
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string duration(double seconds) {
  int64_t s = int64_t(seconds + 0.5);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(s / 3600), (long long)(s % 3600 / 60));
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(s / 60), (long long)(s % 60));
  return buf;
}

// JSON numbers must be finite: NaN and infinities are written as strings.
std::string json_number(double v) {
  if (std::isnan(v)) return "\"nan\"";
  if (std::isinf(v)) return v > 0 ? "\"inf\"" : "\"-inf\"";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// The shard files a data loader reads, one line each: its name and size.
std::string shard_listing(const DataLoader& d) {
  std::string text;
  for (const std::string& f : d.files()) {
    std::error_code ec;
    const uintmax_t bytes = fs::file_size(f, ec);
    text += "  " + fs::path(f).filename().string() + ", " + (ec ? "size unknown" : std::to_string(bytes) + " bytes") + "\n";
  }
  return text;
}

// What the ranks of a job must share to train one model alike: the resolved config, less the
// paths that only rank 0 reads or that each node may spell its own way (the data globs,
// run.out_dir, train.init_from, the config file's own), and the shard files each data glob
// found, by name and size.
std::string rank_agreement_text(const Config& config, const std::string& train_shards, const DataLoader* val) {
  Config shared = config;
  shared.data.train = shared.data.val = shared.run.out_dir = shared.train.init_from = shared.source_path = "";
  std::string text = config_to_yaml(shared) + train_shards;
  if (val) text += "data.val shards:\n" + shard_listing(*val);
  return text;
}

// Rank 0's `text` on every rank: its length, then its bytes eight to a double (a broadcast copies
// bits), through the communicator's device.
std::string broadcast_text(dist::Communicator& comm, Device device, const std::string& text, const char* what) {
  auto through = [&](Tensor host) {
    Tensor t = device.is_cpu() ? host : host.to(device);
    comm.broadcast(t, 0, what);
    return device.is_cpu() ? t : t.to(Device::cpu());
  };
  Tensor length = Tensor::empty({1}, DType::f64, Device::cpu());
  length.data<double>()[0] = double(text.size());
  const size_t n = size_t(through(length).data<double>()[0]);
  Tensor packed = Tensor::zeros({int64_t((n + 7) / 8)}, DType::f64, Device::cpu());
  if (comm.rank() == 0) std::memcpy(packed.raw(), text.data(), n);
  if (n == 0) return "";
  packed = through(packed);
  return std::string(static_cast<const char*>(packed.raw()), n);
}

// The first line where `mine` and `theirs` differ, named by its section, `whose` naming theirs:
// "train.batch_size: 3 (rank 0: 2)", or "data.train shards: 'train_000000.bin, 1024 bytes' (rank 0: …)".
std::string first_difference(const std::string& mine, const std::string& theirs, const std::string& whose) {
  std::istringstream a(mine), b(theirs);
  std::string la, lb, section;
  auto trim = [](const std::string& l) { return l.substr(std::min(l.find_first_not_of(' '), l.size())); };
  while (true) {
    const bool more_a = bool(std::getline(a, la)), more_b = bool(std::getline(b, lb));
    if (!more_a && !more_b) return "(none)";
    if (more_a && more_b && la == lb) {
      if (!la.empty() && la[0] != ' ' && la[0] != '#' && la.back() == ':') section = la.substr(0, la.size() - 1);
      continue;
    }
    const std::string ta = more_a ? trim(la) : "(nothing)", tb = more_b ? trim(lb) : "(nothing)";
    const size_t ka = ta.find(": "), kb = tb.find(": ");
    if (!section.empty() && ka != std::string::npos && kb != std::string::npos && ta.compare(0, ka, tb, 0, kb) == 0 &&
        ta.find(',') == std::string::npos)
      return section + "." + ta + " (" + whose + ": " + tb.substr(kb + 2) + ")";
    return (section.empty() ? "" : section + ": ") + "'" + ta + "' (" + whose + ": '" + tb + "')";
  }
}

}  // namespace

// Length of the well-formed UTF-8 sequence starting at s[i] (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 when the byte there does not start one.
static size_t utf8_sequence(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return k < s.size() ? static_cast<unsigned char>(s[k]) : 0u; };
  const unsigned c = b(i);
  auto cont = [&](size_t k, unsigned lo = 0x80, unsigned hi = 0xBF) { return b(k) >= lo && b(k) <= hi; };
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c == 0xE0) return cont(i + 1, 0xA0) && cont(i + 2) ? 3 : 0;
  if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) return cont(i + 1) && cont(i + 2) ? 3 : 0;
  if (c == 0xED) return cont(i + 1, 0x80, 0x9F) && cont(i + 2) ? 3 : 0;
  if (c == 0xF0) return cont(i + 1, 0x90) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  if (c >= 0xF1 && c <= 0xF3) return cont(i + 1) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  if (c == 0xF4) return cont(i + 1, 0x80, 0x8F) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  return 0;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = utf8_sequence(s, i);
    if (n == 0) {  // a byte that is not part of valid UTF-8 (the byte-level model's samples): U+FFFD
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (c == '"' || c == '\\') { out += '\\'; out += char(c); }
    else if (c == '\n') out += "\\n";
    else if (c < 0x20 || c == 0x7F) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); out += b; }
    else out.append(s, i, n);
    i += n;
  }
  return out + "\"";
}

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);  // a closed terminal or ssh connection: stop with a checkpoint too
}
bool stop_requested() { return g_stop_signal != 0; }
void clear_stop_request() { g_stop_signal = 0; }

std::string cuda_graph_obstacle(const Config& cfg, int world_size, Device device) {
  if (!device.is_cuda()) return "the run is on " + device.str();
  if (world_size > 1) return "the run has " + std::to_string(world_size) + " ranks";
  if (cfg.model.dropout > 0) return "model.dropout is " + detail::concat(cfg.model.dropout);
  if (cfg.data.document_mask) return "data.document_mask is on";
  if (cfg.train.recompute) return "train.recompute is on";
  if (cfg.train.recompute_rows > 0) return "train.recompute_rows is " + std::to_string(cfg.train.recompute_rows);
  return "";
}

Device resolve_device(const std::string& setting, int local_rank, const std::string& name) {
  const int gpus = cuda_device_count();
  if (setting == "cpu") return Device::cpu();
  if (setting == "auto") return gpus > 0 ? Device::cuda(local_rank % gpus) : Device::cpu();
  // As the user wrote it: a config key takes "key: value", a command-line option "--option value".
  const std::string given = name + (name.rfind("--", 0) == 0 ? " " : ": ");
  TG_CHECK(setting == "cuda", given, "'", setting, "': expected auto, cpu or cuda");
  TG_CHECK(gpus > 0, given, "cuda, but ",
#ifdef TILEGRAD_HAVE_CUDA
           "no CUDA GPU is visible on this machine",
#else
           "this tilegrad was built without CUDA (no nvcc at configure time)",
#endif
           "; use ", given, "cpu or auto");
  return Device::cuda(local_rank % gpus);
}

Trainer::Trainer(const Config& config, std::unique_ptr<dist::Communicator> comm)
    : config_(config), comm_(std::move(comm)) {
  validate_config(config_);
  config_yaml_ = config_to_yaml(config_);
}

Trainer::~Trainer() = default;

// A failed write is remembered, not thrown: the loop stops all ranks together after the step
// (stop_for_write_error), with a checkpoint attempt. Files are written whole lines at a time.
void Trainer::log_line(const std::string& s) {
  if (!lead()) return;
  std::cout << s << std::endl;
  if (!log_file_.is_open() || !write_error_.empty()) return;
  try {
    log_file_.write_line(s);
  } catch (const Error& e) {
    write_error_ = e.what();
  }
}

void Trainer::metrics(const std::string& json) {
  if (!lead() || !metrics_file_.is_open() || !write_error_.empty()) return;
  try {
    metrics_file_.write_line(json);
  } catch (const Error& e) {
    write_error_ = e.what();
  }
}

void Trainer::stop_for_write_error(bool failed_here) {
  const std::string what = failed_here ? write_error_ : "rank 0 could not write the run's logs";
  if (lead()) std::cerr << "error: " << what << "; stopping after step " << state_.step << " with a checkpoint\n";
  std::string path;
  try {
    path = save("the log could not be written");
  } catch (const Error& e) {
    throw Error(detail::concat(what, "; training stopped after step ", state_.step,
                               ", and the checkpoint attempt failed too: ", e.what(),
                               " (the newest complete checkpoint and `latest` are unchanged)"));
  }
  throw Error(detail::concat(what, "; training stopped after step ", state_.step, " with checkpoint ", path,
                             "; free space and resume with --resume latest"));
}

void Trainer::on_rank0(const char* what, const std::function<void()>& fn) {
  std::exception_ptr error;
  if (lead()) {
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (comm_->all_agree(!error, what)) return;
  if (error) std::rethrow_exception(error);
  TG_CHECK(false, what, " failed on rank 0 (its output has the error); rank ", comm_->rank(), " stops too");
}

std::string Trainer::save(const char* why, bool prune) {
  state_.dropout_counter = model_->dropout_counter();
  state_.cursor = {uint64_t(config_.train.seed), uint64_t(state_.step)};
  // Every rank takes part (a ZeRO-1 run gathers AdamW's moments); rank 0 writes the one file.
  const Tensor m = sync_->gather_full(opt_->first_moment(), "AdamW first moments (checkpoint)");
  const Tensor v = sync_->gather_full(opt_->second_moment(), "AdamW second moments (checkpoint)");
  std::string path;
  on_rank0("writing the checkpoint", [&] {
    CheckpointData data = make_checkpoint(*model_, m, v, opt_->steps_taken(), state_, config_yaml_);
    data.strings[kCheckpointTrainShards] = train_shards_;
    if (codec_.bpe) {  // the run's tokenizer travels with its weights (sample, eval, export read it)
      data.strings[kCheckpointVocab] = codec_.bpe->vocab_json();
      data.strings[kCheckpointMerges] = codec_.bpe->merges_txt();
    }
    // A checkpoint is a state to resume from: one with a NaN or an infinity would replace the
    // last good one as `latest`, so none is written.
    for (const CheckpointArray& a : data.arrays)
      for (size_t i = 0; i < a.data.size(); ++i)
        TG_CHECK(std::isfinite(a.data[i]), "not writing a checkpoint at step ", state_.step, ": '", a.name,
                 "' holds ", a.data[i], " at element ", i,
                 " (the parameters or the optimizer state are no longer finite); the newest complete checkpoint "
                 "(`latest`) stays the last good state");
    path = save_checkpoint(config_.run.out_dir, state_.step, data, prune ? config_.run.keep_last : 0);
  });
  log_line("checkpoint " + path + " (" + why + ")");
  return path;
}

// Rank 0 reads the checkpoint; the parameters, AdamW's moments and the counters go to every
// rank from there, so the ranks need no shared file system and the run may have another world
// size than the one that wrote it (ZeRO-1 ranks keep their slices of the moments).
void Trainer::resume_from(const std::string& resume) {
  const TrainConfig& tc = config_.train;
  nn::ParameterStore& params = model_->params();
  Tensor m, v;
  {
    MemoryCategoryScope scope(MemCategory::optimizer);
    m = Tensor::zeros({params.numel()}, DType::f32, model_->device());
    v = Tensor::zeros({params.numel()}, DType::f32, model_->device());
  }
  std::string path, shards_differ;
  int64_t optimizer_steps = 0, dropped_records = 0;
  on_rank0("reading the checkpoint", [&] {
    auto [found, ckpt] = resolve_and_load(config_.run.out_dir, resume);
    path = found;
    if (auto it = ckpt.strings.find(kCheckpointTrainShards); it != ckpt.strings.end()) {
      if (it->second != train_shards_) shards_differ = first_difference(train_shards_, it->second, "the checkpoint's run");
    }
    check_model_compatible(config_.model, checkpoint_config(ckpt, path).model, path);
    restore_parameters(*model_, ckpt, path);
    optimizer_steps = restore_moments(m, v, *model_, ckpt, path);
    state_ = restore_state(ckpt, path);
    TG_CHECK(state_.cursor.seed == uint64_t(tc.seed), "checkpoint ", path, " was trained with train.seed ",
             state_.cursor.seed, " but the config says ", tc.seed, "; an exact resume needs the same seed");
    TG_CHECK(state_.step < tc.max_steps, "--resume: checkpoint ", path, " is at step ", state_.step,
             state_.step == tc.max_steps ? ", which is train.max_steps (" : ", beyond train.max_steps (", tc.max_steps,
             "): nothing left to train; raise train.max_steps (e.g. --set train.max_steps=",
             state_.step + std::max<int64_t>(tc.max_steps, 1), ") to continue");
    // Records of steps after the checkpoint are from the run that is now being repeated: drop
    // them, so every step appears once in metrics.jsonl.
    const std::string metrics_path = metrics_file_.path();
    metrics_file_.close();
    dropped_records = drop_records_after_step(metrics_path, state_.step);
    metrics_file_.open(metrics_path);
  });
  if (comm_->world_size() > 1) {
    comm_->broadcast(params.flat_values(), 0, "parameters (resume)");
    params.values_changed();
    comm_->broadcast(m, 0, "AdamW first moments (resume)");
    comm_->broadcast(v, 0, "AdamW second moments (resume)");
    // The counters, bit for bit, in the payload of doubles.
    const uint64_t fields[] = {uint64_t(state_.step), uint64_t(state_.tokens_seen), uint64_t(state_.bad_steps_in_row),
                               state_.cursor.seed, state_.cursor.step, state_.dropout_counter,
                               uint64_t(state_.world_size), uint64_t(state_.global_batch_rows),
                               uint64_t(optimizer_steps)};
    constexpr int64_t kFields = sizeof fields / sizeof fields[0];
    Tensor packed = Tensor::empty({kFields}, DType::f64, Device::cpu());
    std::memcpy(packed.raw(), fields, sizeof fields);
    if (!model_->device().is_cpu()) packed = packed.to(model_->device());
    comm_->broadcast(packed, 0, "training state (resume)");
    uint64_t got[kFields];
    std::memcpy(got, packed.to(Device::cpu()).raw(), sizeof got);
    state_.step = int64_t(got[0]), state_.tokens_seen = int64_t(got[1]), state_.bad_steps_in_row = int64_t(got[2]);
    state_.cursor = {got[3], got[4]}, state_.dropout_counter = got[5];
    state_.world_size = int64_t(got[6]), state_.global_batch_rows = int64_t(got[7]);
    optimizer_steps = int64_t(got[8]);
  }
  sync_->take_owned(m, opt_->first_moment());
  sync_->take_owned(v, opt_->second_moment());
  opt_->set_steps_taken(optimizer_steps);
  model_->set_dropout_counter(state_.dropout_counter);
  const int64_t rows = int64_t(comm_->world_size()) * tc.batch_size * tc.grad_accum;
  log_line("resumed from " + path + " at step " + std::to_string(state_.step) + " (written by " +
           std::to_string(state_.world_size) + (state_.world_size == 1 ? " rank" : " ranks") + ", this run has " +
           std::to_string(comm_->world_size()) + ")");
  if (!shards_differ.empty())
    log_line("note: the training shards differ from those the checkpoint's run read, at " + shards_differ +
             ": the data order continues by step over these shards, so the batches from here are not those the "
             "interrupted run would have trained on");
  if (dropped_records > 0)
    log_line("metrics.jsonl: removed " + std::to_string(dropped_records) + " records of steps after " +
             std::to_string(state_.step) + " (they are trained again)");
  if (state_.global_batch_rows > 0 && state_.global_batch_rows != rows)
    log_line("note: the global batch is " + std::to_string(rows) + " rows per step (world size × batch_size × "
             "grad_accum); the checkpoint's run took " + std::to_string(state_.global_batch_rows) +
             ": the data stream continues, but each step now reads a different number of rows");
}

// A new run from given weights: rank 0 reads them and every rank receives them; the optimizer
// and the counters start fresh.
void Trainer::init_from(const std::string& path) {
  std::string what;
  on_rank0("reading train.init_from", [&] { what = load_initial_parameters(*model_, config_.model, path); });
  if (comm_->world_size() > 1) {
    comm_->broadcast(model_->params().flat_values(), 0, "parameters (train.init_from)");
    model_->params().values_changed();
  }
  log_line("initial parameters from " + what);
}

void Trainer::log_sample(int64_t step) {
  SampleOptions so;
  so.tokens = config_.run.sample_tokens;
  so.temperature = 1.0;
  so.top_k = 0;
  so.seed = uint64_t(config_.train.seed) ^ uint64_t(step);
  so.drawable_ids = codec_.vocab_size();
  std::vector<int32_t> toks = generate(*model_, {}, so);
  std::string text = codec_.decode(toks);
  log_line("sample at step " + std::to_string(step) + ":\n" + text + "\n---");
  metrics("{\"type\":\"sample\",\"step\":" + std::to_string(step) + ",\"text\":" + json_string(text) + "}");
}

void Trainer::check_ranks_agree(Device device) {
  if (comm_->world_size() == 1) return;
  // The first collective that depends on the config: ranks of another model or batch would
  // otherwise meet in collectives of other sizes, and ranks reading other data would train
  // another model than one process would, silently.
  const std::string mine = rank_agreement_text(config_, train_shards_, val_data_.get());
  const std::string rank0 = broadcast_text(*comm_, device, mine, "the config and data of rank 0");
  const bool same = mine == rank0;
  if (comm_->all_agree(same, "checking the ranks' configs and data")) return;
  TG_CHECK(!same, "the ranks of this job were given different configs or data (see the error of the rank that "
           "differs); every rank needs the same config and the same data shards");
  TG_CHECK(false, "this rank's config or data differs from rank 0's, at ", first_difference(mine, rank0, "rank 0"),
           "; every rank of a job needs the same config and the same data shards (on several nodes: the same "
           "files on each)");
}

TrainResult Trainer::run(const std::string& resume_option) {
  std::string resume = resume_option;
  const TrainConfig& tc = config_.train;
  const RunConfig& rc = config_.run;
  const dist::Placement placement = dist::placement_from_environment();
  const Device device = resolve_device(rc.device, comm_ ? comm_->local_rank() : placement.local_rank);
  set_current_device(device);
  if (!comm_) comm_ = dist::make_communicator(placement, device, rc.comm_timeout_s);
  comm_->set_timeout(rc.comm_timeout_s);
  const int W = comm_->world_size(), rank = comm_->rank();
  const std::string& out = rc.out_dir;
  std::unique_ptr<RunDirectoryLock> run_lock;  // rank 0's, for the whole run
  on_rank0("preparing the run directory", [&] {
    std::error_code ec;
    TG_CHECK(!fs::exists(out, ec) || fs::is_directory(out, ec), "run.out_dir: ", out,
             " exists and is not a directory; choose another run.out_dir");
    fs::create_directories(out, ec);
    TG_CHECK(!ec, "run.out_dir: cannot create the run directory ", out, ": ", ec.message());
    TG_CHECK(::access(out.c_str(), W_OK | X_OK) == 0, "run.out_dir: the run directory ", out,
             " is not writable (", std::strerror(errno), "); choose another run.out_dir or fix its permissions");
    run_lock = std::make_unique<RunDirectoryLock>(out);
    const bool has_checkpoints = !list_checkpoints(out).empty();
    if (resume == "auto") resume = has_checkpoints ? "latest" : "";
    if (resume.empty()) {
      TG_CHECK(!has_checkpoints, "run directory ", out,
               " already has checkpoints; resume with --resume latest, or choose another run.out_dir");
    }
    log_file_.open((fs::path(out) / "train.log").string());
    metrics_file_.open((fs::path(out) / "metrics.jsonl").string());
    const std::string cfg_path = (fs::path(out) / "config.yaml").string();
    std::ofstream cfg(cfg_path, std::ios::trunc);
    cfg << config_yaml_;
    cfg.close();
    TG_CHECK(cfg.good(), "run.out_dir: cannot write ", cfg_path, " (is the disk full?)");
  });
  if (resume_option == "auto") {  // rank 0 looked; the ranks resume (and broadcast) together or not at all
    const bool found = comm_->all_reduce_values({resume == "latest" ? 1.0 : 0.0}, dist::ReduceOp::max,
                                                "--resume auto")[0] > 0;
    resume = found ? "latest" : "";
    log_line(found ? "--resume auto: resuming from the run directory's latest checkpoint"
                   : "--resume auto: no checkpoint in the run directory; starting fresh");
  }
  log_line("tilegrad train: resolved config (" + config_.source_path + ")\n" + config_yaml_);
  log_line("device: " + device.str() + " (run.device: " + rc.device + "), precision: " + tc.precision +
           ", cpu threads: " + std::to_string(omp_get_max_threads()) +
           (comm_->cpu_threads_note().empty() ? "" : " (" + comm_->cpu_threads_note() + ")"));
  if (W > 1) {
    // Every rank says once where it runs (rank 0 also into train.log).
    const std::string where = dist::describe_placement(placement, device);
    if (lead()) log_line("data parallel: " + std::to_string(W) + " ranks over " + comm_->backend() + " (ZeRO-" +
                         std::to_string(tc.zero) + ", buckets of " + fmt("%g", tc.bucket_mb) + " MiB); " + where);
    else std::cout << where << std::endl;
  } else if (!placement.launcher.empty()) {
    // One rank under a launcher: the log shows that the launcher was seen, and what it gave.
    log_line("launched by " + placement.launcher + " as one rank (communicator: " + comm_->backend() + "); " +
             dist::describe_placement(placement, device));
  }

  TG_CHECK(tc.precision == "fp32" || device.is_cuda(), "train.precision: bf16 needs a GPU, but this run is on ",
           device.str(), " (run.device: ", rc.device, "); use train.precision: fp32");
  const DType compute = tc.precision == "bf16" ? DType::bf16 : DType::f32;
  ops::set_deterministic(tc.deterministic);
  check_fits(config_, device, true, W);
  log_line("memory predicted per rank (docs/memory.md): " +
           describe_prediction(predict_memory(config_, device.is_cuda() ? "cuda" : "cpu", W)));
  model_ = std::make_unique<nn::GPT>(gpt_config_from(config_.model), uint64_t(tc.seed), DType::f32, device, compute);
  model_->set_lm_head_chunk(tc.lm_head_chunk);
  model_->set_recompute(tc.recompute);
  model_->set_recompute_rows(tc.recompute_rows);
  model_->set_offload_activations(tc.offload_activations);
  if (config_.data.document_mask) model_->set_document_eot(config_.data.eot_token);
  sync_ = std::make_unique<dist::GradientSync>(*comm_, model_->params(), tc.zero,
                                               int64_t(tc.bucket_mb * double(1 << 20)));
  opt_ = std::make_unique<optim::AdamW>(model_->params(), optim::AdamWConfig{tc.beta1, tc.beta2, tc.eps, tc.weight_decay},
                                        sync_->owned());
  train_data_ = std::make_unique<DataLoader>(config_.data.train, config_.model.vocab_size, tc.batch_size, tc.seq_len,
                                             uint64_t(tc.seed), rank, W);
  train_shards_ = "data.train shards:\n" + shard_listing(*train_data_);
  // A run that never evaluates needs no validation data; given, it is still checked.
  if (!config_.data.val.empty())
    val_data_ = std::make_unique<DataLoader>(config_.data.val, config_.model.vocab_size, tc.batch_size, tc.seq_len,
                                             uint64_t(tc.seed), rank, W);
  TG_CHECK(val_data_ || rc.eval_every == 0, "data.val is not set, but run.eval_every is ", rc.eval_every,
           "; give a glob of validation shards, or set run.eval_every: 0");
  if (rc.eval_every > 0)
    TG_CHECK(val_data_->num_sequential_batches() > 0, "data.val (", val_data_->files().size(), " file(s), ",
             val_data_->total_tokens(), " tokens) is too small for one batch of train.batch_size × train.seq_len = ",
             tc.batch_size, " × ", tc.seq_len, " tokens; use more validation data, smaller batches, or "
             "run.eval_every: 0");
  codec_ = codec_for_vocabulary(codec_for_shards(train_data_->files()), config_.model.vocab_size);
  if (codec_.ids)
    log_line("tokenizer: none beside the training shards and model.vocab_size " +
             std::to_string(config_.model.vocab_size) + " > 257, so samples are shown as token ids (put the "
             "tokenizer's vocab.json and merges.txt beside the shards to see text)");
  if (codec_.bpe) {
    TG_CHECK(codec_.bpe->vocab_size() <= config_.model.vocab_size, "the training data's tokenizer (beside ",
             train_data_->files().front(), ") has ", codec_.bpe->vocab_size(), " ids but model.vocab_size is ",
             config_.model.vocab_size, "; set model.vocab_size to at least ", codec_.bpe->vocab_size());
    log_line("tokenizer: " + codec_.describe() + " from the training data's folder");
  }
  check_ranks_agree(device);
  log_line("model: " + std::to_string(model_->params().numel()) + " parameters; train data " +
           std::to_string(train_data_->total_tokens()) + " tokens, val data " +
           (val_data_ ? std::to_string(val_data_->total_tokens()) + " tokens" : std::string("none (run.eval_every 0)")));

  if (!resume.empty()) {
    resume_from(resume);
    if (!tc.init_from.empty()) log_line("note: train.init_from is ignored on --resume (the checkpoint has the weights)");
  } else if (!tc.init_from.empty()) {
    init_from(tc.init_from);
  }

  const optim::Schedule kind = tc.lr_schedule == "constant" ? optim::Schedule::constant
                               : tc.lr_schedule == "wsd"    ? optim::Schedule::wsd
                                                            : optim::Schedule::cosine;
  optim::LRSchedule schedule{kind, tc.lr, tc.min_lr, tc.warmup_steps, tc.max_steps, tc.decay_steps};
  // run.keep_best: the val loss to beat, from the run directory's `best` (a resumed run's); rank 0
  // reads it and the ranks take its value.
  double best_val_loss = INFINITY;
  if (rc.keep_best) {
    on_rank0("reading the best checkpoint's val loss", [&] {
      if (auto best = read_best(out)) best_val_loss = best->second;
    });
    if (W > 1)
      best_val_loss = comm_->all_reduce_values({lead() ? best_val_loss : INFINITY}, dist::ReduceOp::min,
                                               "the best val loss")[0];
  }
  install_stop_handlers();
  TrainResult result;
  const int64_t B = tc.batch_size, T = tc.seq_len, k = tc.grad_accum;
  const int64_t tokens_per_step = B * T * k * W;  // all ranks
  state_.world_size = W;
  state_.global_batch_rows = B * k * W;
  BatchPrefetcher batches(*train_data_, B, T, k, W, rank, state_.step, device);
  auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = state_.step;
  double window_ms = 0, window_comm_s = sync_->exposed_seconds();
  int64_t window_steps = 0;

  // Each step's {mean loss, squared gradient norm} stays on the model's device, and the device
  // decides there whether the update is taken (optim::AdamW::step_decided): the host reads the
  // records only when it needs them — a log line, an evaluation, a checkpoint, a hook — since a
  // read every step would leave the GPU idle while the host catches up.
  const int64_t capacity = rc.log_every > 0 ? std::clamp<int64_t>(rc.log_every, 1, 1000) : 1000;
  Tensor records;
  {
    MemoryCategoryScope scope(MemCategory::workspace);
    records = Tensor::zeros({capacity, 2}, DType::f64, device);
  }
  // The step being computed writes its record here, at a fixed address (a recorded graph keeps
  // the addresses it saw), and the finished step's record is copied into `records`.
  Tensor step_record;
  {
    MemoryCategoryScope scope(MemCategory::workspace);
    step_record = Tensor::zeros({2}, DType::f64, device);
  }
  const Tensor step_loss = Tensor::view_of(step_record, 0, {1}), step_norm = Tensor::view_of(step_record, 1, {1});
  // One micro-batch: the loss, its share of the step's mean loss, and the backward; with W > 1 the
  // last one's backward reduces the gradient buckets as they complete.
  auto forward_backward = [&](const Tensor& x, const Tensor& y, bool last) {
    Tensor l = model_->loss(x, y);
    optim::add_divided(step_loss, l, double(k * W));
    // Scaled so that the sum over ranks and micro-batches is the mean over the global batch.
    Tensor scaled = ops::scale(l, 1.0 / double(k * W));
    if (last && W > 1) {
      auto overlap = sync_->overlap();  // buckets reduced as the backward goes
      scaled.backward();
    } else {
      scaled.backward();
    }
  };
  // train.cuda_graph: the forward and backward of a micro-batch recorded once and replayed from
  // then on, its batch copied in front of it into inputs at fixed addresses. The run's first step
  // runs as written, so what is allocated once and kept (cuBLASLt's workspace, the attention
  // schedulers' counters, the position ids) exists before the capture and stays outside the graph.
  const std::string graph_obstacle = tc.cuda_graph ? cuda_graph_obstacle(config_, W, device) : "";
  const bool use_graph = tc.cuda_graph && graph_obstacle.empty();
  DeviceGraph micro_graph;
  Tensor graph_x, graph_y;
  if (use_graph) {
    MemoryCategoryScope scope(MemCategory::workspace);
    graph_x = Tensor::zeros({B, T}, DType::i32, device);
    graph_y = Tensor::zeros({B, T}, DType::i32, device);
    log_line("cuda graph: each micro-batch's forward and backward recorded at step " +
             std::to_string(state_.step + 2) + " and replayed as one launch (train.cuda_graph)");
  } else if (tc.cuda_graph) {
    log_line("cuda graph: off, " + graph_obstacle + "; the kernels are launched one by one (train.cuda_graph)");
  }
  int64_t pending = 0;  // steps recorded since the host last read them
  double loss = 0, norm = 0;  // the last step the host has read
  const optim::StepRules rules{tc.grad_clip, tc.max_bad_steps};
  opt_->reset_decision(int32_t(state_.bad_steps_in_row));
  // Reads the pending steps and replays, step by step, what the device decided: the losses, the
  // skipped steps' log lines, and the stop when max_bad_steps non-finite steps came in a row (the
  // device has taken no update since, so the parameters are the last good state).
  auto read_steps = [&] {
    if (pending == 0) return;
    const std::vector<double> host = records.to(Device::cpu()).to_double_vector();
    opt_->decision();  // AdamW's step count, as the device kept it
    const int64_t first = state_.step - pending;
    pending = 0;
    for (int64_t i = 0; i < int64_t(host.size() / 2) && first + i < state_.step; ++i) {
      const int64_t done = first + i + 1;
      loss = host[size_t(2 * i)];
      norm = std::sqrt(host[size_t(2 * i + 1)]);
      losses_.push_back(loss);
      result.last_loss = loss;
      if (std::isfinite(loss) && std::isfinite(norm)) {
        state_.bad_steps_in_row = 0;
        continue;
      }
      ++state_.bad_steps_in_row;
      log_line("step " + std::to_string(done) + ": non-finite " + (std::isfinite(loss) ? "gradient norm" : "loss") +
               " (loss " + fmt("%g", loss) + ", grad norm " + fmt("%g", norm) + "): update skipped (" +
               std::to_string(state_.bad_steps_in_row) + " in a row, limit " + std::to_string(tc.max_bad_steps) + ")");
      metrics("{\"type\":\"skipped\",\"step\":" + std::to_string(done) + ",\"loss\":" + json_number(loss) +
              ",\"grad_norm\":" + json_number(norm) + "}");
      if (state_.bad_steps_in_row >= tc.max_bad_steps) {
        // The run stops at this step: later steps were computed but not applied.
        state_.tokens_seen -= (state_.step - done) * tokens_per_step;
        state_.step = done;
        std::string path;
        try {
          // Nothing is pruned: a run that diverged before its losses became non-finite still has
          // the checkpoints from before, which this newest one may not be.
          path = save("last good state before stopping", /*prune=*/false);
        } catch (const Error& e) {
          throw Error(detail::concat("training stopped: ", state_.bad_steps_in_row,
                                     " consecutive steps with a non-finite loss or gradient norm (train.max_bad_steps = ",
                                     tc.max_bad_steps, "), and ", e.what(), ". Lower train.lr or check the data."));
        }
        TG_CHECK(false, "training stopped: ", state_.bad_steps_in_row,
                 " consecutive steps with a non-finite loss or gradient norm (train.max_bad_steps = ", tc.max_bad_steps,
                 "); the last state with a finite loss is saved in ", path,
                 " and the run's earlier checkpoints are kept (if the loss was already climbing, resume from one "
                 "of them with --resume ckpt-<step>.h5). Lower train.lr or check the data.");
      }
    }
  };

  while (state_.step < tc.max_steps) {
    const int64_t step = state_.step;
    comm_->set_step(step + 1);
    auto t0 = std::chrono::steady_clock::now();
    // The weights' gradients are written by the step's backward, not zeroed before it, except when
    // one recorded micro-batch is replayed for several (its writes would overwrite, not add).
    if (use_graph && k > 1) model_->params().zero_grad();
    else model_->params().zero_grad_at_first_write();
    step_record.zero();
    for (int64_t micro = 0; micro < k; ++micro) {
      // This rank's rows of the global batch, and their dropout masks: keyed by the optimizer
      // step and the global row, whatever the world size and accumulation split.
      const int64_t first_row = (micro * W + rank) * B;
      Tensor host_x;  // with document masks, the inputs' host copy, for their document starts
      auto [x, y] = batches.next(config_.data.document_mask ? &host_x : nullptr);  // rows first_row…, in order
      if (host_x.defined()) model_->set_host_ids(host_x);
      model_->set_dropout_counter(uint64_t(step));
      model_->set_dropout_first_row(first_row);
      if (!use_graph || step == first_step) {
        forward_backward(x, y, micro == k - 1);
        continue;
      }
      graph_x.copy_from(x);
      graph_y.copy_from(y);
      if (!micro_graph.captured()) {
        try {
          micro_graph = DeviceGraph::capture(device, [&] { forward_backward(graph_x, graph_y, false); });
        } catch (const Error& e) {
          throw Error(detail::concat("train.cuda_graph: the forward and backward could not be recorded as a CUDA "
                                     "graph (", e.what(), "); set train.cuda_graph: false"));
        }
      }
      micro_graph.replay();
    }
    if (W > 1) {
      sync_->finish();
      comm_->all_reduce(step_loss, dist::ReduceOp::sum, "training loss");
    }
    if (grad_hook_) grad_hook_(step, model_->params());
    // The norm of the reduced gradients, the same on every rank: the skip is decided alike.
    sync_->grad_sum_squares_to(step_norm);
    const double lr = schedule.at(step);
    opt_->step_decided(lr, step_record, rules);  // clipping happens inside the update
    Tensor::view_of(records, 2 * pending, {2}).copy_from(step_record);
    sync_->gather_parameters();
    ++pending;
    state_.step = step + 1;
    state_.tokens_seen += tokens_per_step;
    const int64_t done = state_.step;
    const bool log_now = rc.log_every > 0 && (done % rc.log_every == 0 || done == tc.max_steps);
    const bool eval_now = rc.eval_every > 0 && (done % rc.eval_every == 0 || done == tc.max_steps);
    const bool save_now = (rc.ckpt_every > 0 && done % rc.ckpt_every == 0) || done == tc.max_steps;
    if (log_now || eval_now || save_now || step_hook_ || pending == capacity) read_steps();
    // Host time per step, plus the wait in the read for the device to finish the queued steps:
    // the window's sum is the device's time for its steps.
    window_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ++window_steps;
    if (log_now) {
      const double avg_ms = window_ms / double(window_steps);
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      const double eta = elapsed / double(done - first_step) * double(tc.max_steps - done);
      const int64_t peak = memory_stats(device).peak_total;
      const double comm_now = sync_->exposed_seconds();
      const double comm_ms = (comm_now - window_comm_s) * 1e3 / double(window_steps);
      std::ostringstream line;
      line << "step " << done << "/" << tc.max_steps << " | loss " << fmt("%.4f", loss) << " | lr " << fmt("%.2e", lr)
           << " | norm " << fmt("%.3f", norm) << " | " << fmt("%.1f", avg_ms) << " ms | "
           << fmt("%.0f", double(tokens_per_step) * 1000.0 / avg_ms) << " tok/s";
      if (W > 1) line << " (" << W << " ranks) | comm " << fmt("%.1f", comm_ms) << " ms exposed";
      line << " | peak " << format_bytes(peak) << (W > 1 ? " per rank" : "") << " | eta " << duration(eta);
      log_line(line.str());
      metrics("{\"type\":\"train\",\"step\":" + std::to_string(done) + ",\"loss\":" + json_number(loss) +
              ",\"lr\":" + json_number(lr) + ",\"grad_norm\":" + json_number(norm) + ",\"ms_per_step\":" +
              json_number(avg_ms) + ",\"tokens_per_s\":" + json_number(double(tokens_per_step) * 1000.0 / avg_ms) +
              ",\"world_size\":" + std::to_string(W) + ",\"comm_exposed_ms\":" + json_number(comm_ms) +
              ",\"peak_bytes\":" + std::to_string(peak) + ",\"tokens_seen\":" + std::to_string(state_.tokens_seen) + "}");
      window_ms = 0;
      window_steps = 0;
      window_comm_s = comm_now;
    }
    if (step_hook_) step_hook_(done);
    // A signal may reach one rank only: all stop when any was asked to, after the same step.
    bool stopping = stop_requested();
    const bool write_failed = !write_error_.empty();
    bool any_write_failed = write_failed;
    if (W > 1) {
      const auto flags = comm_->all_reduce_values({stopping ? 1.0 : 0.0, write_failed ? 1.0 : 0.0},
                                                  dist::ReduceOp::max, "stop flag");
      stopping = flags[0] > 0;
      any_write_failed = flags[1] > 0;
    }
    if (stopping || any_write_failed) read_steps();
    if (any_write_failed) stop_for_write_error(write_failed);
    if (save_now || stopping)
      result.last_checkpoint = save(stopping ? "stop requested by signal" : done == tc.max_steps ? "final" : "periodic");
    // After the checkpoint: whatever evaluation or sampling does, the step's state is saved.
    if (eval_now) {
      result.last_val_loss = evaluate(*model_, *val_data_, rc.eval_steps, comm_.get());
      log_line("step " + std::to_string(done) + " | val loss " + fmt("%.4f", result.last_val_loss));
      metrics("{\"type\":\"eval\",\"step\":" + std::to_string(done) + ",\"val_loss\":" +
              json_number(result.last_val_loss) + "}");
      // The val loss is the ranks' mean, the same on each: they save (a collective) alike.
      if (rc.keep_best && result.last_val_loss < best_val_loss) {
        best_val_loss = result.last_val_loss;
        if (!save_now && !stopping) result.last_checkpoint = save("the lowest val loss so far");
        on_rank0("marking the best checkpoint", [&] { mark_best(out, done, best_val_loss, rc.keep_last); });
        log_line("step " + std::to_string(done) + " | the lowest val loss so far: ckpt-" + std::to_string(done) +
                 ".h5 kept as " + (fs::path(out) / "best").string());
      }
    }
    if (rc.sample_every > 0 && done % rc.sample_every == 0 && lead()) log_sample(done);
    if (stopping) {
      log_line("stopped by signal after step " + std::to_string(done) + "; resume with --resume latest");
      result.interrupted = true;
      clear_stop_request();
      break;
    }
  }
  // The last lines (the final checkpoint's) must have reached the log too.
  bool write_failed = !write_error_.empty();
  if (W > 1) write_failed = !comm_->all_agree(!write_failed, "writing the run's logs");
  TG_CHECK(!write_failed, lead() ? write_error_ : std::string("rank 0 could not write the run's logs"),
           "; the run finished at step ", state_.step, " and its final checkpoint is written");
  result.final_step = state_.step;
  return result;
}

}  // namespace tg
