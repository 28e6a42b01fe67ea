// The backends behind make_communicator (src/dist/communicator.h), each in a file of its own and
// compiled only where its library was found (TILEGRAD_HAVE_MPI, TILEGRAD_HAVE_NCCL).
#pragma once
#include <memory>
#include <string>

#include "src/dist/communicator.h"

namespace tg::dist {

std::unique_ptr<Communicator> make_mpi_communicator(const Placement& placement, Device device);
std::unique_ptr<Communicator> make_nccl_communicator(const Placement& placement, Device device, double timeout_s);

// MPI as a bootstrap for NCCL (the unique id goes from rank 0 to everyone): initialises MPI once
// per process (finalised at exit), then broadcasts `bytes` bytes from rank 0 over all ranks.
void mpi_broadcast_bytes(void* data, int bytes, const Placement& placement);
// True once MPI has been initialised in this process and a multi-rank job is running: an error
// then ends the process at once (see leave_job) instead of finalising MPI, which would wait for
// ranks that are blocked in a collective.
bool in_multi_rank_job();
// "cuda:0 (NVIDIA H200, PCI 0000:19:00.0)" or "cpu".
std::string device_description(Device device);

}  // namespace tg::dist
