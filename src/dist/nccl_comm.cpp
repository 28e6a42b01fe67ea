// The NCCL backend: collectives on GPU tensors, queued on a stream of the communicator's own
// after an event on the compute stream, so a gradient bucket is reduced while the backward's
// kernels go on. MPI only starts it: rank 0's NCCL unique id is broadcast over MPI_COMM_WORLD.
//
// The communicator is non-blocking (config.blocking = 0), the only kind ncclCommAbort can end
// safely: a call may return ncclInProgress, and ncclCommGetAsyncError is polled until it settles.
// A watchdog thread follows the queued collectives by their completion events; one still
// pending after the timeout, or an asynchronous NCCL error, aborts the communicator and ends
// the process (a dead or stuck peer raises no NCCL error by itself: the deadline is what ends it).
#if defined(TILEGRAD_HAVE_NCCL) && defined(TILEGRAD_HAVE_CUDA)
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "kernels/cuda/check.cuh"
#include "src/dist/backends.h"

namespace tg::dist {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(const Tensor& t) {
  TG_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, "NCCL collectives take f32 or f64 buffers, got ",
           t.desc());
  TG_CHECK(t.device().is_cuda(), "the NCCL communicator reduces GPU tensors, got ", t.desc());
  return t.dtype() == DType::f32 ? ncclFloat32 : ncclFloat64;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::min: return ncclMin;
    default: return ncclSum;
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const Placement& p, Device device, double timeout_s) : Communicator(p, device) {
    timeout_s_ = timeout_s;
    TG_CUDA_CHECK(cudaSetDevice(device.index));
    ncclUniqueId id{};
    if (rank_ == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId", __LINE__);
    mpi_broadcast_bytes(&id, int(sizeof id), p);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t rc = ncclCommInitRankConfig(&comm_, world_size_, id, rank_, &config);
    settle(rc, "ncclCommInitRankConfig (joining the other ranks)");
    TG_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TG_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    TG_CUDA_CHECK(cudaEventCreateWithFlags(&comm_done_, cudaEventDisableTiming));
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    stop_ = true;
    watchdog_.join();
    // Every queued collective is done (the caller synchronised), so the communicator ends cleanly.
    cudaStreamSynchronize(stream_);
    for (Pending& q : pending_) cudaEventDestroy(q.done);
    ncclCommFinalize(comm_);
    ncclResult_t state = ncclInProgress;
    while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress) std::this_thread::yield();
    ncclCommDestroy(comm_);
    cudaEventDestroy(ready_);
    cudaEventDestroy(comm_done_);
    cudaStreamDestroy(stream_);
  }

  std::string backend() const override { return "nccl"; }

  void all_reduce_async(const Tensor& buf, ReduceOp op, const char* what) override {
    const ncclDataType_t type = nccl_type(buf);
    start("all_reduce", what, [&] {
      return ncclAllReduce(buf.raw(), buf.raw(), size_t(buf.numel()), type, nccl_op(op), comm_, stream_);
    });
  }

  void reduce_scatter_async(const Tensor& buf, const char* what) override {
    const ncclDataType_t type = nccl_type(buf);
    const size_t slice = slice_of(buf, "reduce_scatter");
    char* p = static_cast<char*>(buf.raw());
    start("reduce_scatter", what, [&] {
      return ncclReduceScatter(p, p + size_t(rank_) * slice * dtype_size(buf.dtype()), slice, type, ncclSum, comm_,
                               stream_);
    });
  }

  void all_gather_async(const Tensor& buf, const char* what) override {
    const ncclDataType_t type = nccl_type(buf);
    const size_t slice = slice_of(buf, "all_gather");
    char* p = static_cast<char*>(buf.raw());
    start("all_gather", what, [&] {
      return ncclAllGather(p + size_t(rank_) * slice * dtype_size(buf.dtype()), p, slice, type, comm_, stream_);
    });
  }

  void broadcast_async(const Tensor& buf, int root, const char* what) override {
    const ncclDataType_t type = nccl_type(buf);
    start("broadcast", what, [&] {
      return ncclBroadcast(buf.raw(), buf.raw(), size_t(buf.numel()), type, root, comm_, stream_);
    });
  }

  void wait() override {
    TG_CUDA_CHECK(cudaEventRecord(comm_done_, stream_));
    TG_CUDA_CHECK(cudaStreamWaitEvent(cudaStreamPerThread, comm_done_, 0));
  }

  void barrier(const char* what) override {
    if (!token_.defined()) token_ = Tensor::zeros({1}, DType::f32, device_);
    all_reduce_async(token_, ReduceOp::sum, what);
    // The host waits here; the watchdog ends the wait if a rank never arrives.
    TG_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 protected:
  void abort_backend() override { ncclCommAbort(comm_); }

 private:
  struct Pending {
    cudaEvent_t done;
    std::string description;
    Clock::time_point started;
  };

  size_t slice_of(const Tensor& buf, const char* op) const {
    TG_CHECK(buf.numel() % world_size_ == 0, op, ": ", buf.numel(), " elements do not split into ", world_size_,
             " equal slices");
    return size_t(buf.numel() / world_size_);
  }

  void check(ncclResult_t rc, const char* call, int line) {
    if (rc != ncclSuccess && rc != ncclInProgress)
      throw std::runtime_error(detail::concat("NCCL error: ", ncclGetErrorString(rc), " in ", call, " at ", __FILE__,
                                              ":", line));
  }

  // A call on the non-blocking communicator returns ncclSuccess, ncclInProgress (still being set
  // up: poll until it settles, up to the timeout) or an error; anything but success gives up.
  void settle(ncclResult_t rc, const std::string& what) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s_);
    while (rc == ncclInProgress) {
      if (Clock::now() > deadline)
        give_up(what + " did not complete within " + timeout_text());
      std::this_thread::yield();
      if (ncclCommGetAsyncError(comm_, &rc) != ncclSuccess) break;
    }
    if (rc != ncclSuccess) give_up(what + " failed: " + ncclGetErrorString(rc) + " (" + ncclGetLastError(comm_) + ")");
  }

  // NCCL calls on one communicator are not thread-safe: the collective and the watchdog's
  // ncclCommGetAsyncError take turns under mu_.
  template <typename Call>
  void start(const char* op, const char* what, Call&& call) {
    const std::string description = describe(op, what, ++seq_);
    TG_CUDA_CHECK(cudaEventRecord(ready_, cudaStreamPerThread));
    TG_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
    std::lock_guard<std::mutex> lock(mu_);
    settle(call(), description);
    Pending q{nullptr, description, Clock::now()};
    TG_CUDA_CHECK(cudaEventCreateWithFlags(&q.done, cudaEventDisableTiming));
    TG_CUDA_CHECK(cudaEventRecord(q.done, stream_));
    pending_.push_back(std::move(q));
  }

  // Collectives on one stream finish in order: only the oldest pending one can be late.
  void watch() {
    cudaSetDevice(device_.index);
    while (!stop_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::unique_lock<std::mutex> lock(mu_);
      while (!pending_.empty() && cudaEventQuery(pending_.front().done) == cudaSuccess) {
        cudaEventDestroy(pending_.front().done);
        pending_.pop_front();
      }
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string what = pending_.empty() ? std::string("a collective") : pending_.front().description;
        lock.unlock();
        give_up(what + " failed: " + ncclGetErrorString(async) + " (" + ncclGetLastError(comm_) + ")");
      }
      if (!pending_.empty() &&
          std::chrono::duration<double>(Clock::now() - pending_.front().started).count() > timeout_s_) {
        const std::string what = pending_.front().description;
        lock.unlock();
        give_up(what + " did not finish within " + timeout_text() +
                ": another rank died, hangs or is still busy; aborting the NCCL communicator");
      }
    }
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, comm_done_ = nullptr;
  Tensor token_;
  int64_t seq_ = 0;
  std::thread watchdog_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::deque<Pending> pending_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(const Placement& placement, Device device, double timeout_s) {
  return std::make_unique<NcclCommunicator>(placement, device, timeout_s);
}

bool have_nccl() { return true; }

}  // namespace tg::dist
#endif  // TILEGRAD_HAVE_NCCL && TILEGRAD_HAVE_CUDA
