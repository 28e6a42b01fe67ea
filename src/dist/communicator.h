// Collectives over the ranks of a data-parallel job, on flat buffers: one interface, three
// backends — single process (no-ops), MPI (CPU tensors) and NCCL (GPU tensors, on a stream of
// its own). Ranks are started by a launcher (mpirun, srun); a process started without one is
// world size 1 and never touches MPI.
//
// Collectives match by order, not by name: every rank must call the same collectives, in the
// same order, with the same sizes. A collective that does not finish within the timeout (a peer
// died or hangs) or that fails ends the process: the message names the collective, its sequence
// number and the training step, the communicator is aborted and the process exits with status
// kExitCommFailure, which makes the launcher end the other ranks.
#pragma once
#include <sched.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "src/tensor/tensor.h"

namespace tg::dist {

// Exit status of a rank that gave up on a collective.
constexpr int kExitCommFailure = 4;

enum class ReduceOp { sum, avg, max, min };

// Where this process sits in its job, as the launcher says: Open MPI's OMPI_COMM_WORLD_*,
// Slurm's SLURM_PROCID/NTASKS/LOCALID, PMI_RANK/PMI_SIZE (MPICH, Intel MPI), or none.
struct Placement {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;        // rank among the processes on this node: picks the GPU
  std::string launcher = "";  // "mpirun", "srun", "pmi", or "" when started without a launcher
};
Placement placement_from_environment();

class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  virtual std::string backend() const = 0;  // "single", "mpi" or "nccl"

  // Asynchronous collectives, in place on a contiguous f32 or f64 tensor on this communicator's
  // device; `what` names the buffer in error messages. They return at once. On the GPU the
  // collective runs on the communicator's stream after the work queued so far on the compute
  // stream; on the CPU it runs on the communicator's thread, so the caller must not touch the
  // buffer until wait() returns.
  virtual void all_reduce_async(const Tensor& buf, ReduceOp op, const char* what) = 0;
  // Sum; n = buf.numel() must be a multiple of W. Rank r's slice [r·n/W, (r+1)·n/W) receives the
  // sum of every rank's slice r; the rest of buf is left undefined.
  virtual void reduce_scatter_async(const Tensor& buf, const char* what) = 0;
  // n a multiple of W: rank r's slice [r·n/W, (r+1)·n/W) is copied to that slice on every rank.
  virtual void all_gather_async(const Tensor& buf, const char* what) = 0;
  virtual void broadcast_async(const Tensor& buf, int root, const char* what) = 0;
  // Orders everything started so far before what comes next: on the GPU the compute stream waits
  // for the communicator's stream (the host does not block); on the CPU the host blocks until the
  // collectives are done.
  virtual void wait() = 0;
  // Blocks the host until every rank has arrived.
  virtual void barrier(const char* what) = 0;

  // The blocking forms: the collective, then wait().
  void all_reduce(const Tensor& buf, ReduceOp op, const char* what) { all_reduce_async(buf, op, what), wait(); }
  void broadcast(const Tensor& buf, int root, const char* what) { broadcast_async(buf, root, what), wait(); }
  void reduce_scatter(const Tensor& buf, const char* what) { reduce_scatter_async(buf, what), wait(); }
  void all_gather(const Tensor& buf, const char* what) { all_gather_async(buf, what), wait(); }

  // Host values through the communicator (copied to and from its device when that is a GPU):
  // every rank gets the reduction of everyone's `values`. For the decisions every rank must take
  // alike (skip a step, stop, save), and for losses.
  std::vector<double> all_reduce_values(std::vector<double> values, ReduceOp op, const char* what);
  // True on every rank when `ok` is true on every rank.
  bool all_agree(bool ok, const char* what);

  // Seconds a collective may take before the process gives up (run.comm_timeout_s).
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }
  // Why this rank runs as many OpenMP threads as it does, for the log; empty when nothing chose
  // (see the MPI backend: ranks that share a node's CPUs share them out).
  const std::string& cpu_threads_note() const { return cpu_threads_note_; }
  // The training step named in failure messages.
  void set_step(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

 protected:
  Communicator(const Placement& p, Device device) : rank_(p.rank), world_size_(p.world_size), local_rank_(p.local_rank), device_(device) {}
  // Prints "tilegrad: rank R (host H): <message>", aborts the backend and ends the process.
  [[noreturn]] void give_up(const std::string& message);
  virtual void abort_backend() {}
  // "run.comm_timeout_s = 600 s"
  std::string timeout_text() const;
  // "all_reduce 'gradients' (collective #12, step 40)"
  std::string describe(const char* op, const char* what, int64_t seq) const;

  int rank_, world_size_, local_rank_;
  Device device_;
  double timeout_s_ = 600;
  int64_t step_ = 0;
  std::string cpu_threads_note_;
};

// The communicator for this process: MPI for a CPU run and NCCL for a GPU run (each rank on the
// GPU local_rank mod the GPUs it sees); the single-process one at world size 1, except under
// mpirun, where one rank still gets MPI or NCCL. Throws tg::Error naming what is missing when the
// launch needs a backend this build lacks.
std::unique_ptr<Communicator> make_communicator(const Placement& placement, Device device, double timeout_s);
// A world-size-1 communicator (for code that takes one; nothing is sent anywhere).
std::unique_ptr<Communicator> make_single_communicator(Device device);

// Whether this build can run multi-rank jobs on the CPU (MPI) and GPU (NCCL).
bool have_mpi();
bool have_nccl();
// After an error on this rank: in a multi-rank job, ends the process at once with `status` (the
// launcher then ends the other ranks; finalising MPI would wait for ranks blocked in a
// collective). Returns when the process is not part of one.
void leave_job_on_error(int status);
// The OpenMP threads a CPU rank runs when the ranks on its node have the affinity masks
// `on_node` (its own, `mine`, among them): each CPU of `mine` counts as 1 / (the masks that hold
// it), and the sum, at least 1, is the share. Ranks bound to CPUs of their own keep them all;
// ranks with the same mask split it evenly.
int cpu_threads_of_share(const cpu_set_t& mine, const std::vector<cpu_set_t>& on_node);
// "rank 2 of 4 on host node2" in a job of several ranks, "" otherwise: errors start with it, so
// that a failure on one node of a job says where it happened.
std::string rank_and_host();
// "host cuda:0 (NVIDIA H200, bus 0000:19:00.0)": what each rank logs once.
std::string describe_placement(const Placement& p, Device device);

}  // namespace tg::dist
