// CUDA elementwise kernels and their launchers: the twins of kernels/cpu/elementwise.h and dropout.h.
#include "kernels/cuda/elementwise.h"

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cpu/hash.h"

namespace tg::cuda {

// ───────────────────────────── kernels ─────────────────────────────

namespace {

constexpr int kThreads = 256;

struct IdentityOp;  // a cast: map1_kernel stores it exactly (below)

// Unary map out[i] = op(x[i], i) in fp32. Packs of V elements cover [0, n/V·V); the remainder
// (< V elements) is done scalar. V = 1 is the fallback for misaligned pointers. out may equal x
// (each element is read and written by one thread), hence no __restrict__.
template <int V, typename TI, typename TO, typename Op>
__global__ void map1_kernel(const TI* x, TO* out, int64_t n, Op op) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / V;
  for (int64_t j = tid; j < nv; j += stride) {
    float f[V];
    load_vec<V>(x + j * V, f);
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = op(f[k], j * V + k);
    // A cast keeps NaN payloads as the CPU does; the other maps round with the hardware's
    // conversion (same numbers, ~5 instructions an element fewer: GELU is that close to its
    // memory time).
    if constexpr (std::is_same_v<Op, IdentityOp>) store_vec<V>(out + j * V, f);
    else store_vec_fast<V>(out + j * V, f);
  }
  const int64_t i = nv * V + tid;
  if (V > 1 && i < n) out[i] = from_float<TO>(op(to_float(x[i]), i));
}

// Binary map out[i] = op(a[i], b[i]); out may alias a (add_inplace), hence no __restrict__.
template <int V, typename T, typename Op>
__global__ void map2_kernel(const T* a, const T* b, T* out, int64_t n, Op op) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / V;
  for (int64_t j = tid; j < nv; j += stride) {
    float fa[V], fb[V];
    load_vec<V>(a + j * V, fa);
    load_vec<V>(b + j * V, fb);
#pragma unroll
    for (int k = 0; k < V; ++k) fa[k] = op(fa[k], fb[k]);
    store_vec_fast<V>(out + j * V, fa);
  }
  const int64_t i = nv * V + tid;
  if (V > 1 && i < n) out[i] = from_float<T>(op(to_float(a[i]), to_float(b[i])));
}

// out (rows, cols) = a + b (cols). Block (32, 8): x walks packs of a row (coalesced), y walks
// rows; a 2-D grid avoids a 64-bit division per element. V > 1 needs cols % V == 0. out may equal a.
template <int V, typename T>
__global__ void add_broadcast_kernel(const T* a, const T* __restrict__ b, T* out, int64_t rows, int64_t cols) {
  const int64_t cv = cols / V;
  for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < rows; r += int64_t(gridDim.y) * blockDim.y) {
    for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < cv; j += int64_t(gridDim.x) * blockDim.x) {
      float fa[V], fb[V];
      load_vec<V>(a + r * cols + j * V, fa);
      load_vec<V>(b + j * V, fb);
#pragma unroll
      for (int k = 0; k < V; ++k) fa[k] += fb[k];
      store_vec<V>(out + r * cols + j * V, fa);
    }
  }
}

template <int V, typename T>
__global__ void fill_kernel(T* __restrict__ x, float value, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / V;
  float f[V];
#pragma unroll
  for (int k = 0; k < V; ++k) f[k] = value;
  for (int64_t j = tid; j < nv; j += stride) store_vec<V>(x + j * V, f);
  const int64_t i = nv * V + tid;
  if (V > 1 && i < n) x[i] = from_float<T>(value);
}

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct ScaleOp {
  float s;
  __device__ float operator()(float x, int64_t) const { return x * s; }
};
struct IdentityOp {
  __device__ float operator()(float x, int64_t) const { return x; }
};

constexpr float kGeluK = 0.7978845608028654f;  // √(2/π)

// GPT-2's tanh GELU, written through the identity ½(1 + tanh u) = σ(2u) = 1 / (1 + e^(−2u)):
// one ex2 and one reciprocal on the special-function unit instead of tanhf's ~35 instructions.
// The tanh form made both kernels compute-bound (84 resp. 113 µs for GPT-2's 16k × 3072 bf16,
// against 50 resp. 75 µs of memory traffic); this form keeps them at the memory. It also stays
// accurate where tanh u → −1: 1 + tanh u would cancel there, σ(2u) does not. Relative error
// ~1e-6 (the approximate exp), far below bf16's 4e-3; the CPU keeps the tanh form.
// For u → −∞ the exponential overflows to +inf and the fast division returns 0 (not NaN).
__device__ __forceinline__ float gelu_sigmoid(float u) { return __fdividef(1.0f, 1.0f + __expf(-2.0f * u)); }

struct GeluOp {
  __device__ float operator()(float v, int64_t) const {
    return v * gelu_sigmoid(kGeluK * (v + 0.044715f * v * v * v));
  }
};
struct GeluBackwardOp {  // (x, dout) → dx
  // d/dv [v·σ(2u)] = σ + 2v·σ(1 − σ)·u',  u' = k(1 + 3·0.044715·v²)
  __device__ float operator()(float v, float d) const {
    const float s = gelu_sigmoid(kGeluK * (v + 0.044715f * v * v * v));
    const float du = kGeluK * (1.0f + 3.0f * 0.044715f * v * v);
    return (s + 2.0f * v * s * (1.0f - s) * du) * d;
  }
};
struct DropoutOp {
  uint64_t seed, first;
  float p, scale;
  __device__ float operator()(float x, int64_t i) const {
    return cpu::uniform_from(seed, first + uint64_t(i)) >= p ? x * scale : 0.0f;
  }
};

template <typename TI, typename TO, typename Op>
void launch_map1(const TI* x, TO* out, int64_t n, Op op, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int V = 16 / int(sizeof(TI) > sizeof(TO) ? sizeof(TI) : sizeof(TO));
  if (aligned16(x) && aligned16(out) && n >= V) {
    map1_kernel<V><<<grid_for(n / V, kThreads), kThreads, 0, stream>>>(x, out, n, op);
  } else {
    map1_kernel<1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, out, n, op);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

template <typename T, typename Op>
void launch_map2(const T* a, const T* b, T* out, int64_t n, Op op, cudaStream_t stream) {
  if (n == 0) return;
  constexpr int V = kVec<T>;
  if (aligned16(a) && aligned16(b) && aligned16(out) && n >= V) {
    map2_kernel<V><<<grid_for(n / V, kThreads), kThreads, 0, stream>>>(a, b, out, n, op);
  } else {
    map2_kernel<1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(a, b, out, n, op);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

// dst (fp32) += src (bf16) converted: the gradient of a bf16 copy of an fp32 parameter added
// straight into the parameter's fp32 gradient, without materialising the converted copy.
template <int V>
__global__ void add_converted_kernel(float* __restrict__ dst, const tg::bf16* __restrict__ src, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = n / V;
  for (int64_t j = tid; j < nv; j += stride) {
    float d[V], g[V];
    load_vec<V>(dst + j * V, d);
    load_vec<V>(src + j * V, g);
#pragma unroll
    for (int k = 0; k < V; ++k) d[k] += g[k];
    store_vec<V>(dst + j * V, d);
  }
  const int64_t i = nv * V + tid;
  if (V > 1 && i < n) dst[i] += to_float(src[i]);
}

struct AddConvertedBatch {
  AddConvertedJob job[kAddConvertedMaxJobs];
};

// Block row y does job y; its blocks stride over the job's elements (scalar: small, any alignment).
__global__ void add_converted_batched_kernel(const AddConvertedBatch batch) {
  const AddConvertedJob j = batch.job[blockIdx.y];
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < j.n; i += int64_t(gridDim.x) * blockDim.x)
    j.dst[i] += to_float(j.src[i]);
}

}  // namespace

// ───────────────────────────── launchers ─────────────────────────────

template <typename T>
void add_forward(const T* a, const T* b, T* out, int64_t rows, int64_t cols, cudaStream_t stream) {
  require(rows >= 0 && cols >= 0, "add_forward", "negative size");
  if (rows == 0 || cols == 0) return;
  if (rows == 1) return launch_map2(a, b, out, cols, AddOp{}, stream);
  constexpr int V = kVec<T>;
  const bool vec = cols % V == 0 && aligned16(a) && aligned16(b) && aligned16(out);
  const int64_t cv = vec ? cols / V : cols;
  dim3 block(32, 8);
  dim3 grid(unsigned(std::min<int64_t>((cv + 31) / 32, 1024)), unsigned(std::min<int64_t>((rows + 7) / 8, 65535)));
  if (vec) {
    add_broadcast_kernel<V><<<grid, block, 0, stream>>>(a, b, out, rows, cols);
  } else {
    add_broadcast_kernel<1><<<grid, block, 0, stream>>>(a, b, out, rows, cols);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

void add_converted_inplace(float* dst, const tg::bf16* src, int64_t n, cudaStream_t stream) {
  require(n >= 0, "add_converted_inplace", "negative size");
  if (n == 0) return;
  if (aligned16(dst) && (reinterpret_cast<uintptr_t>(src) & 7u) == 0 && n >= 4) {
    add_converted_kernel<4><<<grid_for(n / 4, kThreads), kThreads, 0, stream>>>(dst, src, n);
  } else {
    add_converted_kernel<1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, src, n);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

void add_converted_batched(const AddConvertedJob* jobs, int count, cudaStream_t stream) {
  require(count >= 0 && count <= kAddConvertedMaxJobs, "add_converted_batched",
          "between 0 and " + std::to_string(kAddConvertedMaxJobs) + " jobs");
  if (count == 0) return;
  AddConvertedBatch batch{};
  int64_t largest = 0;
  for (int i = 0; i < count; ++i) {
    require(jobs[i].n >= 0, "add_converted_batched", "negative size");
    batch.job[i] = jobs[i];
    largest = std::max(largest, jobs[i].n);
  }
  const dim3 grid(grid_for(largest, kThreads, 16), unsigned(count));
  add_converted_batched_kernel<<<grid, kThreads, 0, stream>>>(batch);
  TG_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void add_inplace(T* dst, const T* src, int64_t n, cudaStream_t stream) {
  require(n >= 0, "add_inplace", "negative size");
  launch_map2<T>(dst, src, dst, n, AddOp{}, stream);
}

// Column sums in two passes. A one-pass kernel over column tiles alone (one block per 32
// columns) left most of the GPU idle for C = 768 (24 blocks) and read 64-byte row pieces; it
// measured 68 µs per bias gradient of GPT-2 small (16384 × 768..3072 bf16), 2.8 ms a step.
// Pass 1: block (tile, chunk) sums the rows of one chunk over kSumTileCols columns (V = 16-byte
// vectors per lane, each warp 512 contiguous bytes per row); its 8 warps fold in order through
// smem into partial[chunk, cols]. Pass 2: column_sum_kernel adds the chunks in order.
constexpr int kSumWarps = 8;
constexpr int64_t kSumTileCols = 256;  // columns per pass-1 block for bf16 (float: 128, two blocks)
constexpr int64_t kSumMinRows = 64;    // rows per chunk at least: below, one pass suffices

int64_t sum_rows_chunks(int64_t rows, int64_t cols) {
  const int64_t tiles = (cols + kSumTileCols - 1) / kSumTileCols;
  const int64_t want = (4 * 132 + tiles - 1) / tiles;  // about 4 blocks per SM of an H100/H200
  return std::clamp<int64_t>(want, 1, std::max<int64_t>(1, rows / kSumMinRows));
}

// The block's per-warp column sums (acc: this lane's V columns) folded over the warps in a fixed
// order through shared memory, one partial per column of the block's 32·V, row chunk blockIdx.y.
template <int V>
__device__ __forceinline__ void fold_column_sums(float (&fold)[kSumWarps][32 * V], const float (&acc)[V], int warp,
                                                 int lane, int64_t c0, int64_t cols, float* __restrict__ partial) {
#pragma unroll
  for (int k = 0; k < V; ++k) fold[warp][lane * V + k] = acc[k];
  __syncthreads();
  for (int i = threadIdx.x; i < 32 * V; i += kSumWarps * 32) {
    if (c0 + i >= cols) break;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < kSumWarps; ++w) s += fold[w][i];
    partial[int64_t(blockIdx.y) * cols + c0 + i] = s;
  }
}

template <int V, typename T>
__global__ void __launch_bounds__(kSumWarps * 32)
    column_partial_sum_kernel(const T* __restrict__ x, float* __restrict__ partial, int64_t rows, int64_t cols,
                              int64_t rows_per_chunk) {
  __shared__ float fold[kSumWarps][32 * V];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c0 = int64_t(blockIdx.x) * 32 * V, c = c0 + lane * V;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc[V] = {};
  if (c < cols) {  // cols % V == 0: a lane's vector is wholly inside or wholly past the end
#pragma unroll 4
    for (int64_t r = r0 + warp; r < r1; r += kSumWarps) {
      float f[V];
      load_vec<V>(x + r * cols + c, f);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += f[k];
    }
  }
  fold_column_sums<V>(fold, acc, warp, lane, c0, cols, partial);
}

// column_partial_sum_kernel fused with the GELU backward that produces its input: each lane
// computes its vector of dx = gelu'(x)·dout, stores it, and adds the stored (rounded) values, in
// the same rows, order and fold as column_partial_sum_kernel over dx. (Written out rather than
// column_partial_sum_kernel with a row-producing functor: that form compiled the plain column sums
// to the same machine code but this kernel to different code — its pointers no longer __restrict__
// parameters — and only this form has been measured on the GPU.)
template <int V, typename T>
__global__ void __launch_bounds__(kSumWarps * 32)
    gelu_backward_partial_sum_kernel(const T* __restrict__ x, const T* __restrict__ dout, T* __restrict__ dx,
                                     float* __restrict__ partial, int64_t rows, int64_t cols, int64_t rows_per_chunk) {
  __shared__ float fold[kSumWarps][32 * V];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t c0 = int64_t(blockIdx.x) * 32 * V, c = c0 + lane * V;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  const GeluBackwardOp op;
  float acc[V] = {};
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = r0 + warp; r < r1; r += kSumWarps) {
      float fx[V], fd[V];
      load_vec<V>(x + r * cols + c, fx);
      load_vec<V>(dout + r * cols + c, fd);
#pragma unroll
      for (int k = 0; k < V; ++k) fx[k] = op(fx[k], fd[k]);
      round_vec_fast<V, T>(fx);  // sum what is stored, as sum_rows over dx would
      store_vec_fast<V>(dx + r * cols + c, fx);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += fx[k];
    }
  }
  fold_column_sums<V>(fold, acc, warp, lane, c0, cols, partial);
}

// Column sums of a matrix of at most 32 rows and many columns (a broadcast's gradient: GPT-2's
// position-embedding gradient is (B, T·C) summed over B = 16): one thread per 16-byte pack of
// columns, adding the rows in order from zero, which is column_sum_kernel's order for rows ≤ 32
// (each of its threads takes one row, then the partials are added in row order), so the sums are
// bitwise the same. column_sum_kernel gives each column 32 threads, half of them idle at 16 rows,
// and reads 64-byte row pieces: 105 µs for that gradient's 25 MB (docs/performance.md, "Where a
// step's time goes").
constexpr int64_t kFewRows = 32;

template <int V, typename T>
__global__ void __launch_bounds__(256)
    sum_few_rows_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t cols) {
  const int64_t packs = cols / V;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += int64_t(gridDim.x) * blockDim.x) {
    float acc[V] = {};
    for (int64_t r = 0; r < rows; ++r) {
      float f[V];
      load_vec<V>(x + r * cols + p * V, f);
#pragma unroll
      for (int k = 0; k < V; ++k) acc[k] += f[k];
    }
    store_vec<V>(out + p * V, acc);
  }
}

size_t sum_rows_scratch_floats(int64_t rows, int64_t cols) {
  return rows <= 0 || cols <= 0 ? 0 : size_t(sum_rows_chunks(rows, cols) * cols);
}

template <typename T>
void sum_rows(const T* x, T* out, int64_t rows, int64_t cols, float* scratch, cudaStream_t stream) {
  require(rows >= 0 && cols >= 0, "sum_rows", "negative size");
  if (cols == 0) return;
  constexpr int V = kVec<T>;
  const int64_t chunks = sum_rows_chunks(rows, cols), col_blocks = (cols + 31) / 32;
  require(col_blocks <= INT32_MAX, "sum_rows", "too many columns");
  const bool packed = cols % V == 0 && aligned16(x) && aligned16(out);
  if (packed && rows <= kFewRows && cols / V >= 32 * 256) {  // a short, wide matrix: a thread per pack
    sum_few_rows_kernel<V><<<grid_for(cols / V, 256), 256, 0, stream>>>(x, out, rows, cols);
    TG_CUDA_CHECK(cudaGetLastError());
    return;
  }
  if (chunks == 1 || cols % V != 0 || !aligned16(x)) {  // few rows, or rows not in 16-byte vectors: one pass
    column_sum_kernel<<<unsigned(col_blocks), dim3(32, 32), 0, stream>>>(x, out, rows, cols);
    TG_CUDA_CHECK(cudaGetLastError());
    return;
  }
  require(scratch != nullptr, "sum_rows", "scratch is null");
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const dim3 grid(unsigned((cols + 32 * V - 1) / (32 * V)), unsigned(chunks));
  column_partial_sum_kernel<V><<<grid, kSumWarps * 32, 0, stream>>>(x, scratch, rows, cols, rows_per_chunk);
  TG_CUDA_CHECK(cudaGetLastError());
  column_sum_kernel<<<unsigned(col_blocks), dim3(32, 32), 0, stream>>>(scratch, out, chunks, cols);
  TG_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void gelu_backward_sum_rows(const T* x, const T* dout, T* dx, T* dbias, int64_t rows, int64_t cols, float* scratch,
                            cudaStream_t stream) {
  require(rows >= 0 && cols >= 0, "gelu_backward_sum_rows", "negative size");
  if (cols == 0) return;
  constexpr int V = kVec<T>;
  const int64_t chunks = sum_rows_chunks(rows, cols);
  if (chunks == 1 || cols % V != 0 || !aligned16(x) || !aligned16(dout) || !aligned16(dx)) {
    // sum_rows's own one-pass cases: the two steps, with sum_rows choosing as it always does.
    gelu_backward(x, dout, dx, rows * cols, stream);
    sum_rows(dx, dbias, rows, cols, scratch, stream);
    return;
  }
  require(scratch != nullptr, "gelu_backward_sum_rows", "scratch is null");
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const dim3 grid(unsigned((cols + 32 * V - 1) / (32 * V)), unsigned(chunks));
  gelu_backward_partial_sum_kernel<V><<<grid, kSumWarps * 32, 0, stream>>>(x, dout, dx, scratch, rows, cols,
                                                                          rows_per_chunk);
  TG_CUDA_CHECK(cudaGetLastError());
  column_sum_kernel<<<unsigned((cols + 31) / 32), dim3(32, 32), 0, stream>>>(scratch, dbias, chunks, cols);
  TG_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void mul_forward(const T* a, const T* b, T* out, int64_t n, cudaStream_t stream) {
  require(n >= 0, "mul_forward", "negative size");
  launch_map2(a, b, out, n, MulOp{}, stream);
}

template <typename T>
void scale_forward(const T* x, T* out, float s, int64_t n, cudaStream_t stream) {
  require(n >= 0, "scale_forward", "negative size");
  launch_map1(x, out, n, ScaleOp{s}, stream);
}

template <typename T>
void gelu_forward(const T* x, T* out, int64_t n, cudaStream_t stream) {
  require(n >= 0, "gelu_forward", "negative size");
  launch_map1(x, out, n, GeluOp{}, stream);
}

template <typename T>
void gelu_backward(const T* x, const T* dout, T* dx, int64_t n, cudaStream_t stream) {
  require(n >= 0, "gelu_backward", "negative size");
  launch_map2(x, dout, dx, n, GeluBackwardOp{}, stream);
}

template <typename Src, typename Dst>
void cast(const Src* x, Dst* out, int64_t n, cudaStream_t stream) {
  require(n >= 0, "cast", "negative size");
  if (n == 0) return;
  if constexpr (std::is_same_v<Src, Dst>) {
    TG_CUDA_CHECK(cudaMemcpyAsync(out, x, size_t(n) * sizeof(Src), cudaMemcpyDeviceToDevice, stream));
  } else {
    launch_map1(x, out, n, IdentityOp{}, stream);
  }
}

template <typename T>
void dropout_apply(const T* x, T* out, int64_t n, float p, uint64_t seed, uint64_t first, cudaStream_t stream) {
  require(n >= 0, "dropout_apply", "negative size");
  require(p >= 0.0f && p <= 1.0f, "dropout_apply", "probability outside [0, 1]");
  // The same fp32 expression as the CPU's T(1) / T(1 − p), so kept values match bitwise.
  const float scale = 1.0f / (1.0f - p);
  launch_map1(x, out, n, DropoutOp{seed, first, p, scale}, stream);
}

template <typename T>
void fill(T* x, float value, int64_t n, cudaStream_t stream) {
  require(n >= 0, "fill", "negative size");
  if (n == 0) return;
  constexpr int V = kVec<T>;
  if (aligned16(x) && n >= V) {
    fill_kernel<V><<<grid_for(n / V, kThreads), kThreads, 0, stream>>>(x, value, n);
  } else {
    fill_kernel<1><<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, value, n);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

#define TG_INSTANTIATE(T)                                                                        \
  template void add_forward<T>(const T*, const T*, T*, int64_t, int64_t, cudaStream_t);           \
  template void add_inplace<T>(T*, const T*, int64_t, cudaStream_t);                             \
  template void sum_rows<T>(const T*, T*, int64_t, int64_t, float*, cudaStream_t);               \
  template void mul_forward<T>(const T*, const T*, T*, int64_t, cudaStream_t);                   \
  template void scale_forward<T>(const T*, T*, float, int64_t, cudaStream_t);                    \
  template void gelu_forward<T>(const T*, T*, int64_t, cudaStream_t);                            \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t, cudaStream_t);                 \
  template void gelu_backward_sum_rows<T>(const T*, const T*, T*, T*, int64_t, int64_t, float*, cudaStream_t); \
  template void dropout_apply<T>(const T*, T*, int64_t, float, uint64_t, uint64_t, cudaStream_t);       \
  template void fill<T>(T*, float, int64_t, cudaStream_t);
TG_INSTANTIATE(float)
TG_INSTANTIATE(tg::bf16)
#undef TG_INSTANTIATE

template void cast<float, float>(const float*, float*, int64_t, cudaStream_t);
template void cast<float, tg::bf16>(const float*, tg::bf16*, int64_t, cudaStream_t);
template void cast<tg::bf16, float>(const tg::bf16*, float*, int64_t, cudaStream_t);
template void cast<tg::bf16, tg::bf16>(const tg::bf16*, tg::bf16*, int64_t, cudaStream_t);

}  // namespace tg::cuda
