// `tilegrad bench allreduce`: the communicator's collectives beside NCCL's own
// (bench/reference/torch_allreduce.py).
#include "cli/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "src/dist/communicator.h"
#include "src/trainer/trainer.h"


namespace tg {

// The communicator's collectives timed on flat fp32 buffers, the figure compared with NCCL's own
// (bench/reference/torch_allreduce.py under torchrun, same sizes). Bus bandwidth as nccl-tests
// define it: the bytes over the time, times 2(W − 1)/W for all_reduce and (W − 1)/W for
// reduce_scatter and all_gather (the bytes being the whole buffer), so that it reads against the
// links' speed whatever W.
int bench_allreduce(const cli::Args& a) {
  const char* fn = "tilegrad bench allreduce";
  const std::string collective = a.get("collective", "all_reduce");
  TG_CHECK(collective == "all_reduce" || collective == "reduce_scatter" || collective == "all_gather", fn,
           ": --collective ", collective, " is unknown; give all_reduce, reduce_scatter or all_gather");
  const int64_t iters = a.get_int("steps", 20), warmup = a.get_int("warmup", 5);
  TG_CHECK(iters >= 1, fn, ": --steps ", iters, " times nothing; give at least 1");
  TG_CHECK(warmup >= 0, fn, ": --warmup is negative");
  // Default sizes: a 25-MiB gradient bucket (train.bucket_mb's default) and GPT-2 small's whole
  // fp32 gradient (123,689,472 parameters: 471.8 MiB).
  std::vector<double> sizes_mib;
  {
    std::stringstream list(a.get("mib", "25,471.8"));
    std::string item;
    while (std::getline(list, item, ',')) {
      char* end = nullptr;
      const double v = std::strtod(item.c_str(), &end);
      TG_CHECK(end != item.c_str() && *end == '\0' && v > 0 && v <= 65536, fn, ": --mib takes sizes in MiB, e.g. "
               "25,471.8; got '", item, "'");
      sizes_mib.push_back(v);
    }
  }
  const dist::Placement placement = dist::placement_from_environment();
  const Device device = resolve_device(a.get("device", "auto"), placement.local_rank, "--device");
  set_current_device(device);
  std::unique_ptr<dist::Communicator> comm = dist::make_communicator(placement, device, 600);
  const int W = comm->world_size(), rank = comm->rank();
  const double factor = collective == "all_reduce" ? 2.0 * (W - 1) / W : double(W - 1) / W;
  auto start = [&](const Tensor& buf) {
    if (collective == "all_reduce") comm->all_reduce_async(buf, dist::ReduceOp::sum, "bench buffer");
    else if (collective == "reduce_scatter") comm->reduce_scatter_async(buf, "bench buffer");
    else comm->all_gather_async(buf, "bench buffer");
  };
  auto value_at = [&](const Tensor& buf, int64_t i) { return Tensor::view_of(buf, i, {1}).to(Device::cpu()).item(); };
  for (double mib : sizes_mib) {
    // Whole elements, a multiple of W (the sharded collectives split the buffer evenly).
    const int64_t n = std::max<int64_t>(W, (int64_t(mib * 1048576.0 / 4.0) + W - 1) / W * W), shard = n / W;
    Tensor buf = Tensor::full({n}, double(rank + 1), DType::f32, device);
    // Once for the result: every rank holding r + 1, the sum is W(W + 1)/2; gathered, slice j holds j + 1.
    start(buf);
    comm->wait();
    const int64_t other = ((rank + 1) % W) * shard;  // the first element of the next rank's slice
    const double got = collective == "all_gather" ? value_at(buf, other) : value_at(buf, rank * shard);
    const double want = collective == "all_gather" ? double((rank + 1) % W + 1) : double(W) * (W + 1) / 2.0;
    const bool right = comm->all_agree(got == want, "bench: the collective's result");
    TG_CHECK(right, fn, ": ", collective, " of ", n, " floats gave ", got, " where ", want,
             " was due (on this rank or another): the communicator is wrong");
    for (int64_t i = 0; i < warmup; ++i) start(buf);
    comm->wait();
    device_synchronize(device);
    comm->barrier("bench: before timing");
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < iters; ++i) start(buf);
    comm->wait();
    device_synchronize(device);
    const double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / double(iters);
    const double seconds = comm->all_reduce_values({mine}, dist::ReduceOp::max, "bench: slowest rank")[0];
    const double bytes = double(n) * 4.0, algbw = bytes / seconds / 1e9;
    if (rank == 0)
      std::printf("{\"bench\":\"collective\",\"collective\":\"%s\",\"backend\":\"%s\",\"world_size\":%d,"
                  "\"device\":\"%s\",\"bytes\":%.0f,\"ms\":%.4f,\"algbw_gbs\":%.2f,\"busbw_gbs\":%.2f}\n",
                  collective.c_str(), comm->backend().c_str(), W, device.str().c_str(), bytes, seconds * 1e3, algbw,
                  algbw * factor);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace tg
