// The launcher's placement, the single-process communicator, and what every backend shares.
#include "src/dist/communicator.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "src/dist/backends.h"

#ifdef TILEGRAD_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tg::dist {

namespace {

// The integer in environment variable `name`, or `fallback` when it is unset.
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  TG_CHECK(*end == '\0' && x >= 0 && x < (1 << 24), "environment variable ", name, "='", v,
           "' is not a rank or size; the launcher sets it (mpirun, srun)");
  return int(x);
}

// This machine's name, as every rank's messages give it.
std::string host_name() {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  return host;
}

class SingleCommunicator final : public Communicator {
 public:
  explicit SingleCommunicator(Device device) : Communicator(Placement{}, device) {}
  std::string backend() const override { return "single"; }
  void all_reduce_async(const Tensor&, ReduceOp, const char*) override {}
  void reduce_scatter_async(const Tensor&, const char*) override {}
  void all_gather_async(const Tensor&, const char*) override {}
  void broadcast_async(const Tensor&, int, const char*) override {}
  void wait() override {}
  void barrier(const char*) override {}
};

}  // namespace

Placement placement_from_environment() {
  Placement p;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) {  // Open MPI's mpirun (or srun with Open MPI's PMIx)
    p.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
    p.world_size = env_int("OMPI_COMM_WORLD_SIZE", 1);
    p.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
    p.launcher = "mpirun";
  } else if (std::getenv("SLURM_NTASKS") && std::getenv("SLURM_PROCID") && std::getenv("SLURM_STEP_ID")) {
    p.rank = env_int("SLURM_PROCID", 0);  // inside a job step: srun started this process
    p.world_size = env_int("SLURM_NTASKS", 1);
    p.local_rank = env_int("SLURM_LOCALID", 0);
    p.launcher = "srun";
  } else if (std::getenv("PMI_SIZE")) {  // MPICH's and Intel MPI's Hydra
    p.rank = env_int("PMI_RANK", 0);
    p.world_size = env_int("PMI_SIZE", 1);
    p.local_rank = env_int("MPI_LOCALRANKID", env_int("PMI_LOCAL_RANK", 0));
    p.launcher = "pmi";
  }
  TG_CHECK(p.world_size >= 1 && p.rank < p.world_size, "the launcher (", p.launcher, ") says rank ", p.rank,
           " of ", p.world_size, " ranks");
  return p;
}

std::string Communicator::describe(const char* op, const char* what, int64_t seq) const {
  return detail::concat(op, " '", what, "' (collective #", seq, ", step ", step_, ")");
}

std::string Communicator::timeout_text() const {
  char b[64];
  std::snprintf(b, sizeof b, "run.comm_timeout_s = %g s", timeout_s_);
  return b;
}

void Communicator::give_up(const std::string& message) {
  std::fprintf(stderr, "tilegrad: rank %d of %d (host %s): %s\n", rank_, world_size_, host_name().c_str(),
               message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  abort_backend();
  // No MPI_Finalize and no destructors: a peer is gone, and either could wait for it forever. The
  // launcher sees the non-zero status and ends the other ranks.
  _exit(kExitCommFailure);
}

std::vector<double> Communicator::all_reduce_values(std::vector<double> values, ReduceOp op, const char* what) {
  if (world_size_ == 1) return values;
  Tensor host = Tensor::from_vector(values, {int64_t(values.size())}, DType::f64);
  Tensor buf = device_.is_cpu() ? host : host.to(device_);
  all_reduce(buf, op, what);
  return (device_.is_cpu() ? buf : buf.to(Device::cpu())).to_double_vector();
}

bool Communicator::all_agree(bool ok, const char* what) {
  if (world_size_ == 1) return ok;
  return all_reduce_values({ok ? 1.0 : 0.0}, ReduceOp::min, what)[0] == 1.0;
}

std::unique_ptr<Communicator> make_single_communicator(Device device) {
  return std::make_unique<SingleCommunicator>(device);
}

std::unique_ptr<Communicator> make_communicator(const Placement& placement, Device device, double timeout_s) {
  std::unique_ptr<Communicator> comm;
  // One rank needs no collectives. Under mpirun it still gets MPI (and NCCL on the GPU), so that
  // `mpirun -np 1` times the communicator at world size 1; a single srun task does not, as Open
  // MPI could not start there without Slurm's PMIx plugin (`srun --mpi=pmix`).
  if (placement.world_size == 1 && placement.launcher != "mpirun" && placement.launcher != "pmi") {
    comm = make_single_communicator(device);
  } else if (device.is_cpu()) {
    TG_CHECK(have_mpi(), "this run was started by ", placement.launcher, " with ", placement.world_size,
             " ranks, but this tilegrad was built without MPI; install libopenmpi-dev and rebuild");
    comm = make_mpi_communicator(placement, device);
  } else {
    TG_CHECK(have_nccl(), "this run was started by ", placement.launcher, " with ", placement.world_size,
             " ranks on the GPU, but this tilegrad was built without NCCL (and MPI to start it); install NCCL "
             "and libopenmpi-dev and rebuild, or train on the CPU (run.device: cpu)");
    comm = make_nccl_communicator(placement, device, timeout_s);
  }
  comm->set_timeout(timeout_s);
  return comm;
}

void leave_job_on_error(int status) {
  if (!in_multi_rank_job()) return;
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(status);
}

std::string device_description(Device device) {
#ifdef TILEGRAD_HAVE_CUDA
  cudaDeviceProp prop{};
  char bus[32] = "?";
  if (device.is_cuda() && cudaGetDeviceProperties(&prop, device.index) == cudaSuccess) {
    cudaDeviceGetPCIBusId(bus, sizeof bus, device.index);
    return detail::concat(device.str(), " (", prop.name, ", PCI ", bus, ")");
  }
#endif
  return device.str();
}

#ifndef TILEGRAD_HAVE_MPI
bool have_mpi() { return false; }
bool in_multi_rank_job() { return false; }
std::unique_ptr<Communicator> make_mpi_communicator(const Placement&, Device) {
  TG_CHECK(false, "this tilegrad was built without MPI; install libopenmpi-dev and rebuild");
  return nullptr;
}
void mpi_broadcast_bytes(void*, int, const Placement&) { TG_CHECK(false, "this tilegrad was built without MPI"); }
#endif
#if !defined(TILEGRAD_HAVE_NCCL) || !defined(TILEGRAD_HAVE_CUDA)
bool have_nccl() { return false; }
std::unique_ptr<Communicator> make_nccl_communicator(const Placement&, Device, double) {
  TG_CHECK(false, "this tilegrad was built without NCCL; install NCCL and libopenmpi-dev and rebuild");
  return nullptr;
}
#endif

std::string rank_and_host() {
  Placement p;
  try {
    p = placement_from_environment();
  } catch (const Error&) {
    return "";  // the launcher's variables are unreadable; the error at hand says more
  }
  if (p.world_size == 1) return "";
  return detail::concat("rank ", p.rank, " of ", p.world_size, " on host ", host_name());
}

int cpu_threads_of_share(const cpu_set_t& mine, const std::vector<cpu_set_t>& on_node) {
  double share = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mine)) continue;
    int holders = 0;
    for (const cpu_set_t& m : on_node) holders += CPU_ISSET(cpu, &m) ? 1 : 0;
    share += 1.0 / double(std::max(holders, 1));
  }
  return std::max(1, int(share + 1e-9));
}

std::string describe_placement(const Placement& p, Device device) {
  return detail::concat("rank ", p.rank, " of ", p.world_size, " (local rank ", p.local_rank, ") on host ", host_name(),
                        ", device ", device_description(device));
}

}  // namespace tg::dist
