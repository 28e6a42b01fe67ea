// Data-parallel gradient reduction over the flat gradient buffer, overlapped with the backward.
//
// The flat buffer is cut into buckets (contiguous ranges of about train.bucket_mb MiB; their
// boundaries are multiples of the world size W). During the backward of a step's last
// micro-batch the parameter store's gradient sink reports each parameter whose gradient is final
// (src/autograd/grad_sink.h); once every
// parameter that overlaps a bucket is final, the bucket is reduced on the communicator (its
// stream on the GPU, its thread on the CPU) while the backward computes the layers before it.
// finish() starts what is left and orders all of it before the optimizer. Gradients are reduced
// in fp32; each rank's loss is scaled by 1/(W·grad_accum), so the sum over ranks is the mean.
//
// ZeRO-0 all-reduces every bucket and every rank updates every parameter. ZeRO-1
// reduce-scatters each bucket instead: rank r owns slice r of every bucket, keeps AdamW's
// moments for those slices only (1/W of them), updates them, and gather_parameters() all-gathers
// the updated slices. The elements after the last multiple of W (fewer than W) are all-reduced
// and updated by every rank alike.
#pragma once
#include <memory>
#include <vector>

#include "src/autograd/grad_sink.h"
#include "src/dist/communicator.h"
#include "src/nn/parameters.h"

namespace tg::dist {

class GradientSync {
 public:
  // bucket_bytes: fp32 gradient bytes per bucket; 0 makes one bucket of the whole buffer, reduced
  // by finish() after the backward (no overlap).
  GradientSync(Communicator& comm, nn::ParameterStore& params, int zero_stage, int64_t bucket_bytes);
  ~GradientSync();

  int zero_stage() const { return zero_stage_; }
  int num_buckets() const { return int(buckets_.size()); }
  // The ranges of the flat buffers this rank's optimizer updates: everything under ZeRO-0.
  const std::vector<nn::FlatRange>& owned() const { return owned_; }

  // Lives around the backward of a step's last micro-batch: hangs a ready hook off the parameter
  // store's gradient sink that reduces each bucket as soon as its gradients are final.
  GradSink::ReadyScope overlap();
  // After that backward: starts the buckets not started yet, in bucket order, and orders every
  // reduction before the work that follows (the GPU's compute stream waits; the CPU host waits).
  void finish();
  // After finish(): the global L2 norm of the reduced gradients, the same on every rank (ZeRO-1
  // ranks add their slices' squares and all-reduce them).
  double grad_norm();
  // The same norm's square written to `out` (one f64 on the gradients' device) with no host read,
  // for a step decided on the device (optim::AdamW::step_decided).
  void grad_sum_squares_to(const Tensor& out);
  // ZeRO-1, after the optimizer step: each rank's updated slices to every rank.
  void gather_parameters();

  // A full flat tensor (numel) from `compact`, this rank's values for owned() back to back
  // (AdamW's moments under ZeRO-1); collective. Under ZeRO-0 it is `compact` itself.
  Tensor gather_full(const Tensor& compact, const char* what);
  // The owned ranges of `full` (numel), back to back into `compact`.
  void take_owned(const Tensor& full, const Tensor& compact) const;

  // Communication not hidden behind the backward: from the end of the backward until the
  // reductions are done (GPU: measured on the compute stream), summed over the steps so far.
  double exposed_seconds();
  int64_t synced_steps() const { return synced_steps_; }

 private:
  struct Bucket {
    nn::FlatRange range;
    int64_t split = 0;  // range.length rounded down to a multiple of W: the reduce-scattered part
    int waiting = 0;    // parameters of this step's backward not final yet
    int readers = 0;    // parameters that overlap the bucket
    bool started = false;
  };
  // ZeRO-1: the ranges whose squared gradients this rank adds to the global norm (its slices, and
  // on rank 0 also the elements every rank updates), so that each element counts once.
  std::vector<nn::FlatRange> norm_ranges() const;
  void on_final(const Tensor& leaf);
  void start(size_t bucket);

  Communicator& comm_;
  nn::ParameterStore& params_;
  int zero_stage_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> buckets_of_param_;  // per parameter (store order)
  std::vector<nn::FlatRange> owned_;
  Tensor grads_;
  struct Internals;
  std::unique_ptr<Internals> internals_;
  int64_t synced_steps_ = 0;
};

}  // namespace tg::dist
