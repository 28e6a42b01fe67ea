// Bucketed, overlapped gradient reduction and ZeRO-1 sharding (see grad_sync.h).
#include "src/dist/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_map>

#include "src/optim/adamw.h"

#ifdef TILEGRAD_HAVE_CUDA
#include <cuda_runtime.h>

#include "kernels/cuda/check.cuh"
#endif

namespace tg::dist {

// Which parameter a leaf is, and the exposed communication time: on the GPU a pair of timing events on the compute stream
// around finish()'s wait, read one step later (when they are long done); on the CPU the host's
// time inside finish().
struct GradientSync::Internals {
  std::unordered_map<TensorImpl*, size_t> param_of_leaf;
  double seconds = 0;
#ifdef TILEGRAD_HAVE_CUDA
  cudaEvent_t before = nullptr, after = nullptr;
  bool recorded = false;
#endif
};

GradientSync::GradientSync(Communicator& comm, nn::ParameterStore& params, int zero_stage, int64_t bucket_bytes)
    : comm_(comm), params_(params), zero_stage_(zero_stage), grads_(params.flat_grads()), internals_(new Internals) {
  TG_CHECK(zero_stage == 0 || zero_stage == 1, "train.zero: ", zero_stage, " is not a ZeRO stage tilegrad has; use 0 or 1");
  TG_CHECK(bucket_bytes >= 0, "train.bucket_mb must be >= 0");
  TG_CHECK(grads_.dtype() == DType::f32, "data-parallel training reduces f32 gradients, got ", grads_.desc());
  const int64_t W = comm.world_size(), n = params.numel();
  // Bucket boundaries at multiples of W, so each bucket but the last splits into W equal slices.
  int64_t per_bucket = bucket_bytes == 0 ? n : std::max<int64_t>(W, bucket_bytes / 4 / W * W);
  for (int64_t at = 0; at < n; at += per_bucket) {
    Bucket b;
    b.range = {at, std::min(per_bucket, n - at)};
    b.split = b.range.length / W * W;
    buckets_.push_back(b);
  }
  // Which buckets each parameter overlaps.
  const auto& all = params.all();
  buckets_of_param_.resize(all.size());
  for (size_t i = 0; i < all.size(); ++i) {
    internals_->param_of_leaf[all[i].value.impl()] = i;
    const int64_t lo = all[i].offset, hi = lo + all[i].value.numel();
    for (size_t k = 0; k < buckets_.size(); ++k)
      if (lo < buckets_[k].range.offset + buckets_[k].range.length && buckets_[k].range.offset < hi && hi > lo) {
        buckets_of_param_[i].push_back(k);
        ++buckets_[k].readers;
      }
  }
  // What this rank updates.
  if (zero_stage_ == 0 || W == 1) {
    owned_.push_back({0, n});
  } else {
    for (const Bucket& b : buckets_) {
      const int64_t slice = b.split / W;
      if (slice > 0) owned_.push_back({b.range.offset + comm.rank() * slice, slice});
      if (b.split < b.range.length) owned_.push_back({b.range.offset + b.split, b.range.length - b.split});
    }
  }
#ifdef TILEGRAD_HAVE_CUDA
  if (grads_.device().is_cuda()) {
    TG_CUDA_CHECK(cudaEventCreate(&internals_->before));
    TG_CUDA_CHECK(cudaEventCreate(&internals_->after));
  }
#endif
}

GradientSync::~GradientSync() {
#ifdef TILEGRAD_HAVE_CUDA
  if (internals_->before) cudaEventDestroy(internals_->before);
  if (internals_->after) cudaEventDestroy(internals_->after);
#endif
}

GradSink::ReadyScope GradientSync::overlap() {
  for (Bucket& b : buckets_) b.waiting = b.readers, b.started = false;
  return GradSink::ReadyScope(params_.grad_sink(), [this](const Tensor& leaf) { on_final(leaf); });
}

void GradientSync::on_final(const Tensor& leaf) {
  auto it = internals_->param_of_leaf.find(leaf.impl());
  if (it == internals_->param_of_leaf.end()) return;  // not a parameter of this store
  // The graph is the same on every rank, so buckets become ready in the same order everywhere,
  // and collectives, which match by order, pair up.
  for (size_t k : buckets_of_param_[it->second])
    if (--buckets_[k].waiting == 0) start(k);
}

void GradientSync::start(size_t k) {
  Bucket& b = buckets_[k];
  if (b.started) return;
  b.started = true;
  if (comm_.world_size() == 1) return;
  if (b.split > 0) {
    Tensor part = Tensor::view_of(grads_, b.range.offset, {b.split});
    if (zero_stage_ == 1) comm_.reduce_scatter_async(part, "gradient bucket");
    else comm_.all_reduce_async(part, ReduceOp::sum, "gradient bucket");
  }
  if (b.split < b.range.length)  // the last few elements, updated by every rank
    comm_.all_reduce_async(Tensor::view_of(grads_, b.range.offset + b.split, {b.range.length - b.split}),
                           ReduceOp::sum, "gradient tail");
}

void GradientSync::finish() {
  const auto t0 = std::chrono::steady_clock::now();
#ifdef TILEGRAD_HAVE_CUDA
  const bool gpu = grads_.device().is_cuda();
  if (gpu) {
    if (internals_->recorded) {  // the last step's pair, long done
      float ms = 0;
      TG_CUDA_CHECK(cudaEventSynchronize(internals_->after));
      TG_CUDA_CHECK(cudaEventElapsedTime(&ms, internals_->before, internals_->after));
      internals_->seconds += ms / 1e3;
    }
    TG_CUDA_CHECK(cudaEventRecord(internals_->before, cudaStreamPerThread));
  }
#endif
  for (size_t k = 0; k < buckets_.size(); ++k) start(k);
  comm_.wait();
  ++synced_steps_;
#ifdef TILEGRAD_HAVE_CUDA
  if (gpu) {
    TG_CUDA_CHECK(cudaEventRecord(internals_->after, cudaStreamPerThread));
    internals_->recorded = true;
    return;
  }
#endif
  internals_->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double GradientSync::exposed_seconds() {
#ifdef TILEGRAD_HAVE_CUDA
  if (internals_->recorded) {
    float ms = 0;
    TG_CUDA_CHECK(cudaEventSynchronize(internals_->after));
    TG_CUDA_CHECK(cudaEventElapsedTime(&ms, internals_->before, internals_->after));
    internals_->recorded = false;
    internals_->seconds += ms / 1e3;
  }
#endif
  return internals_->seconds;
}

std::vector<nn::FlatRange> GradientSync::norm_ranges() const {
  if (zero_stage_ == 0 || comm_.world_size() == 1) return owned_;
  std::vector<nn::FlatRange> ranges;
  for (const Bucket& b : buckets_) {
    const int64_t slice = b.split / comm_.world_size();
    if (slice > 0) ranges.push_back({b.range.offset + comm_.rank() * slice, slice});
    if (b.split < b.range.length && comm_.rank() == 0) ranges.push_back({b.range.offset + b.split, b.range.length - b.split});
  }
  return ranges;
}

double GradientSync::grad_norm() {
  if (zero_stage_ == 0 || comm_.world_size() == 1) return optim::grad_norm(params_);
  const double mine = optim::grad_sum_squares(params_, norm_ranges());
  return std::sqrt(comm_.all_reduce_values({mine}, ReduceOp::sum, "gradient norm")[0]);
}

void GradientSync::grad_sum_squares_to(const Tensor& out) {
  if (zero_stage_ == 0 || comm_.world_size() == 1) return optim::grad_sum_squares_to(params_, {}, out);
  optim::grad_sum_squares_to(params_, norm_ranges(), out);
  comm_.all_reduce(out, ReduceOp::sum, "gradient norm");
}

void GradientSync::gather_parameters() {
  if (zero_stage_ == 0 || comm_.world_size() == 1) return;
  Tensor values = params_.flat_values();
  for (const Bucket& b : buckets_)
    if (b.split > 0) comm_.all_gather_async(Tensor::view_of(values, b.range.offset, {b.split}), "parameter bucket");
  comm_.wait();
  params_.values_changed();
}

Tensor GradientSync::gather_full(const Tensor& compact, const char* what) {
  if (owned_.size() == 1 && owned_[0].length == params_.numel()) return compact;
  Tensor full = Tensor::zeros({params_.numel()}, compact.dtype(), compact.device());
  int64_t at = 0;
  for (const nn::FlatRange& r : owned_) {
    Tensor::view_of(full, r.offset, {r.length}).copy_from(Tensor::view_of(compact, at, {r.length}));
    at += r.length;
  }
  for (const Bucket& b : buckets_)
    if (b.split > 0) comm_.all_gather_async(Tensor::view_of(full, b.range.offset, {b.split}), what);
  comm_.wait();
  return full;
}

void GradientSync::take_owned(const Tensor& full, const Tensor& compact) const {
  int64_t at = 0;
  for (const nn::FlatRange& r : owned_) {
    Tensor::view_of(compact, at, {r.length}).copy_from(Tensor::view_of(full, r.offset, {r.length}));
    at += r.length;
  }
}

}  // namespace tg::dist
