// The MPI backend: collectives on CPU tensors, run one at a time on a thread of the
// communicator's own, so a gradient bucket is reduced while the backward goes on (MPI is
// initialised with MPI_THREAD_SERIALIZED: only that thread calls MPI once it exists). wait()
// blocks for at most the timeout; MPI errors are returned, not fatal (MPI_ERRORS_RETURN), so a
// peer that died ends this rank with a message instead of a hang.
#ifdef TILEGRAD_HAVE_MPI
#include <mpi.h>
#include <omp.h>
#include <sched.h>

#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "src/dist/backends.h"

namespace tg::dist {

namespace {

bool g_multi_rank = false;

void finalize_mpi_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// MPI_Init_thread once per process; MPI_Finalize when the process exits normally.
void ensure_mpi(const Placement& placement) {
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
#ifdef OMPI_MAJOR_VERSION
    // Started by srun, Open MPI learns its rank from Slurm's PMIx plugin (PMIX_RANK) or, where it
    // was built with Slurm's PMI, from PMI-2 (PMI_FD). Without either MPI_Init aborts the job with
    // a page of text that does not name the option.
    TG_CHECK(placement.launcher != "srun" || std::getenv("PMIX_RANK") || std::getenv("PMI_FD"),
             "srun started ", placement.world_size, " ranks without an MPI plugin, and this tilegrad's Open MPI "
             "needs one to connect them: run `srun --mpi=pmix …` (`srun --mpi=list` lists the plugins; "
             "MpiDefault=pmix in slurm.conf makes it the default), or start the ranks with mpirun inside the "
             "allocation");
#endif
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    TG_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed (", rc, ") at ", __FILE__, ":", __LINE__,
             "; start multi-rank runs with mpirun or srun");
    TG_CHECK(provided >= MPI_THREAD_SERIALIZED, "this MPI provides thread level ", provided,
             ", below MPI_THREAD_SERIALIZED, which tilegrad needs (collectives run on a thread of their own)");
    std::atexit(finalize_mpi_at_exit);
  }
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  TG_CHECK(rank == placement.rank && size == placement.world_size, "MPI says rank ", rank, " of ", size,
           ", but the launcher's environment (", placement.launcher, ") says rank ", placement.rank, " of ",
           placement.world_size, "; start every rank with the same launcher");
  g_multi_rank = size > 1;
}

MPI_Datatype mpi_type(const Tensor& t) {
  TG_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, "MPI collectives take f32 or f64 buffers, got ",
           t.desc());
  return t.dtype() == DType::f32 ? MPI_FLOAT : MPI_DOUBLE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
    default: return MPI_SUM;  // avg: sum, then divided by the world size
  }
}

std::string mpi_error(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(text, size_t(len));
}

// Shares the node's CPUs out among the ranks on it, and says how (for the log). OpenMP's default
// is one thread per CPU of the process's affinity mask; mpirun binds each of two ranks to a core
// but more ranks to a whole socket, and srun binds nothing unless Slurm's task plugin does, so
// ranks that share CPUs would each run a thread on every one of them: W threads per core, 2–3×
// slower for two ranks on two cores (docs/data-parallel.md, "Launching"). Each rank runs its share
// of its CPUs (cpu_threads_of_share). OMP_NUM_THREADS, when set, is the user's choice and is left
// alone.
std::string share_cpus_with_local_ranks(MPI_Comm world) {
  if (const char* v = std::getenv("OMP_NUM_THREADS"); v && *v) return "OMP_NUM_THREADS";
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (sched_getaffinity(0, sizeof mine, &mine) != 0) return "";
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS) return "";
  int local_ranks = 1;
  MPI_Comm_size(node, &local_ranks);
  std::vector<cpu_set_t> masks(static_cast<size_t>(local_ranks));
  const int rc = MPI_Allgather(&mine, int(sizeof mine), MPI_BYTE, masks.data(), int(sizeof mine), MPI_BYTE, node);
  MPI_Comm_free(&node);
  if (rc != MPI_SUCCESS) return "";
  const int threads = cpu_threads_of_share(mine, masks);
  if (threads >= omp_get_max_threads()) return "";
  omp_set_num_threads(threads);
  return detail::concat(local_ranks, " ranks on this node share ", CPU_COUNT(&mine),
                        " CPUs; OMP_NUM_THREADS sets the threads per rank");
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const Placement& p, Device device) : Communicator(p, device) {
    TG_CHECK(device.is_cpu(), "the MPI communicator reduces CPU tensors; a GPU run uses NCCL");
    ensure_mpi(p);
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    cpu_threads_note_ = share_cpus_with_local_ranks(comm_);
    worker_ = std::thread([this] { work(); });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    queued_cv_.notify_all();
    worker_.join();
    MPI_Comm_free(&comm_);
  }

  std::string backend() const override { return "mpi"; }

  void all_reduce_async(const Tensor& buf, ReduceOp op, const char* what) override {
    const MPI_Datatype type = mpi_type(buf);
    char* p = static_cast<char*>(buf.raw());
    const int64_t n = buf.numel();
    const size_t elem = dtype_size(buf.dtype());
    const double scale = op == ReduceOp::avg ? 1.0 / world_size_ : 1.0;
    const bool f32 = buf.dtype() == DType::f32;
    enqueue("all_reduce", what, [=, this] {
      for (int64_t at = 0; at < n; at += INT_MAX) {  // MPI counts are ints
        const int count = int(std::min<int64_t>(INT_MAX, n - at));
        if (int rc = MPI_Allreduce(MPI_IN_PLACE, p + at * elem, count, type, mpi_op(op), comm_); rc != MPI_SUCCESS)
          return rc;
      }
      if (scale != 1.0) {
        if (f32) for (int64_t i = 0; i < n; ++i) reinterpret_cast<float*>(p)[i] *= float(scale);
        else for (int64_t i = 0; i < n; ++i) reinterpret_cast<double*>(p)[i] *= scale;
      }
      return MPI_SUCCESS;
    });
  }

  void reduce_scatter_async(const Tensor& buf, const char* what) override {
    const int64_t slice = slice_of(buf, "reduce_scatter");
    const MPI_Datatype type = mpi_type(buf);
    char* p = static_cast<char*>(buf.raw());
    const size_t bytes = size_t(slice) * dtype_size(buf.dtype());
    const int r = rank_;
    enqueue("reduce_scatter", what, [=, this] {
      // In place, MPI leaves rank r's reduced slice at the front of the buffer; move it to slot r.
      const int rc = MPI_Reduce_scatter_block(MPI_IN_PLACE, p, int(slice), type, MPI_SUM, comm_);
      if (rc == MPI_SUCCESS && r > 0) std::memmove(p + size_t(r) * bytes, p, bytes);
      return rc;
    });
  }

  void all_gather_async(const Tensor& buf, const char* what) override {
    const int64_t slice = slice_of(buf, "all_gather");
    const MPI_Datatype type = mpi_type(buf);
    void* p = buf.raw();
    enqueue("all_gather", what, [=, this] {
      return MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, p, int(slice), type, comm_);
    });
  }

  void broadcast_async(const Tensor& buf, int root, const char* what) override {
    const MPI_Datatype type = mpi_type(buf);
    char* p = static_cast<char*>(buf.raw());
    const int64_t n = buf.numel();
    const size_t elem = dtype_size(buf.dtype());
    enqueue("broadcast", what, [=, this] {
      for (int64_t at = 0; at < n; at += INT_MAX) {
        const int count = int(std::min<int64_t>(INT_MAX, n - at));
        if (int rc = MPI_Bcast(p + at * elem, count, type, root, comm_); rc != MPI_SUCCESS) return rc;
      }
      return MPI_SUCCESS;
    });
  }

  void barrier(const char* what) override {
    enqueue("barrier", what, [this] { return MPI_Barrier(comm_); });
    wait();
  }

  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
    while (finished_ < started_ && error_.empty()) {
      if (done_cv_.wait_until(lock, deadline) == std::cv_status::timeout && finished_ < started_ && error_.empty()) {
        const std::string running = running_;
        lock.unlock();
        give_up(running + " did not finish within " + timeout_text() +
                ": another rank died, hangs or is still busy; giving up");
      }
    }
    if (!error_.empty()) {
      const std::string e = error_;
      lock.unlock();
      give_up(e);
    }
  }

 private:
  struct Job {
    std::string description;
    std::function<int()> run;  // an MPI return code
  };

  int64_t slice_of(const Tensor& buf, const char* op) const {
    TG_CHECK(buf.numel() % world_size_ == 0, op, ": ", buf.numel(), " elements do not split into ", world_size_,
             " equal slices");
    const int64_t slice = buf.numel() / world_size_;
    TG_CHECK(slice <= INT_MAX, op, ": a slice of ", slice, " elements is more than MPI's int count allows");
    return slice;
  }

  void enqueue(const char* op, const char* what, std::function<int()> run) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back({describe(op, what, started_ + 1), std::move(run)});
      ++started_;
    }
    queued_cv_.notify_one();
  }

  void work() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      queued_cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ with nothing left
      Job job = std::move(queue_.front());
      queue_.pop_front();
      running_ = job.description;
      lock.unlock();
      const int rc = error_.empty() ? job.run() : MPI_SUCCESS;  // after a failure, run nothing more
      lock.lock();
      if (rc != MPI_SUCCESS && error_.empty()) error_ = job.description + " failed: " + mpi_error(rc);
      ++finished_;
      done_cv_.notify_all();
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable queued_cv_, done_cv_;
  std::deque<Job> queue_;
  int64_t started_ = 0, finished_ = 0;
  std::string running_, error_;
  bool stop_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const Placement& placement, Device device) {
  return std::make_unique<MpiCommunicator>(placement, device);
}

void mpi_broadcast_bytes(void* data, int bytes, const Placement& placement) {
  ensure_mpi(placement);
  const int rc = MPI_Bcast(data, bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
  TG_CHECK(rc == MPI_SUCCESS, "MPI_Bcast failed (", mpi_error(rc), ") at ", __FILE__, ":", __LINE__);
}

bool in_multi_rank_job() { return g_multi_rank; }
bool have_mpi() { return true; }

}  // namespace tg::dist
#endif  // TILEGRAD_HAVE_MPI
