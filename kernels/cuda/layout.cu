// CUDA layout kernels and their launchers: the twins of kernels/cpu/permute.h and rope.h.
#include "kernels/cuda/layout.h"

#include <algorithm>
#include <cmath>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/copy_rows.cuh"

namespace tg::cuda {

// ───────────────────────────── kernels ─────────────────────────────

namespace {

// Row maps for copy_rows (see copy_rows.cuh): where output row r comes from and goes to.
struct SwapMap {  // out row (a, n, m) of (A, N, M, D) ← x row (a, m, n) of (A, M, N, D)
  int64_t M, N, D;
  __device__ void operator()(int64_t r, int64_t& src, int64_t& dst) const {
    int64_t m = r % M, an = r / M;
    int64_t n = an % N, a = an / N;
    src = ((a * M + m) * N + n) * D;
    dst = r * D;
  }
};
struct SliceMap {
  int64_t cols, start, len;
  __device__ void operator()(int64_t r, int64_t& src, int64_t& dst) const {
    src = r * cols + start;
    dst = r * len;
  }
};
struct UnsliceMap {
  int64_t cols, start, len;
  __device__ void operator()(int64_t r, int64_t& src, int64_t& dst) const {
    src = r * len;
    dst = r * cols + start;
  }
};

// Block (32, 8): x walks packs of a row, y walks rows (batch·Tq of them). Row r is query
// i = r mod Tq; a pack's elements are masked one by one, so a pack may straddle the diagonal.
template <int V, typename T>
__global__ void causal_mask_kernel(const T* s, T* out, int64_t rows, int64_t Tq, int64_t Tk, float fill) {
  const int64_t kv = Tk / V;
  for (int64_t r = int64_t(blockIdx.y) * blockDim.y + threadIdx.y; r < rows; r += int64_t(gridDim.y) * blockDim.y) {
    const int64_t i = r % Tq;
    for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < kv; p += int64_t(gridDim.x) * blockDim.x) {
      float f[V];
      load_vec<V>(s + r * Tk + p * V, f);
#pragma unroll
      for (int k = 0; k < V; ++k)
        if (p * V + k > i) f[k] = fill;
      store_vec<V>(out + r * Tk + p * V, f);
    }
  }
}

// One block per token (b, t), grid-stride. The half = D/2 rotation coefficients of the token are
// computed once (double, like the CPU) into shared memory and shared by its H heads. Each thread
// then rotates V pairs: V elements from the first half of a head row and the V partners D/2 later.
template <int V, typename T>
__global__ void rope_kernel(const T* x, T* out, int64_t tokens, int64_t Tn, int64_t H, int64_t D, double base,
                            int64_t pos_offset, float direction) {
  extern __shared__ float cs[];  // cos[half], then sin[half]
  const int64_t half = D / 2;
  const int64_t packs_per_head = half / V;
  for (int64_t tok = blockIdx.x; tok < tokens; tok += gridDim.x) {
    const double pos = double(tok % Tn + pos_offset);
    __syncthreads();  // the previous token's coefficients are no longer read
    for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
      double freq = pow(base, -2.0 * double(i) / double(D));
      double sn, cn;
      sincos(pos * freq, &sn, &cn);
      cs[i] = float(cn);
      cs[half + i] = float(direction * sn);
    }
    __syncthreads();
    const T* xt = x + tok * H * D;
    T* ot = out + tok * H * D;
    for (int64_t k = threadIdx.x; k < H * packs_per_head; k += blockDim.x) {
      const int64_t h = k / packs_per_head, i0 = (k % packs_per_head) * V;
      float x1[V], x2[V], o1[V], o2[V];
      load_vec<V>(xt + h * D + i0, x1);
      load_vec<V>(xt + h * D + half + i0, x2);
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const float c = cs[i0 + j], s = cs[half + i0 + j];
        o1[j] = x1[j] * c - x2[j] * s;
        o2[j] = x1[j] * s + x2[j] * c;
      }
      store_vec<V>(ot + h * D + i0, o1);
      store_vec<V>(ot + h * D + half + i0, o2);
    }
  }
}

}  // namespace

// ───────────────────────────── launchers ─────────────────────────────

template <typename T>
void swap_dims12(const T* x, T* out, int64_t A, int64_t M, int64_t N, int64_t D, cudaStream_t stream) {
  require(A >= 0 && M >= 0 && N >= 0 && D >= 0, "swap_dims12", "negative size");
  require(x != out || A * M * N * D == 0, "swap_dims12", "cannot run in place");
  copy_rows(x, out, A * N * M, D, D % kVec<T> == 0, SwapMap{M, N, D}, stream);
}

template <typename T>
void slice_last(const T* x, T* out, int64_t rows, int64_t cols, int64_t start, int64_t len, cudaStream_t stream) {
  require(rows >= 0 && len >= 0 && start >= 0 && start + len <= cols, "slice_last",
          "range [start, start+len) is not inside [0, cols)");
  constexpr int V = kVec<T>;
  copy_rows(x, out, rows, len, cols % V == 0 && start % V == 0 && len % V == 0, SliceMap{cols, start, len}, stream);
}

template <typename T>
void unslice_last(const T* d, T* dx, int64_t rows, int64_t cols, int64_t start, int64_t len, cudaStream_t stream) {
  require(rows >= 0 && len >= 0 && start >= 0 && start + len <= cols, "unslice_last",
          "range [start, start+len) is not inside [0, cols)");
  constexpr int V = kVec<T>;
  copy_rows(d, dx, rows, len, cols % V == 0 && start % V == 0 && len % V == 0, UnsliceMap{cols, start, len}, stream);
}

template <typename T>
void causal_mask(const T* s, T* out, int64_t batch, int64_t Tq, int64_t Tk, float fill, cudaStream_t stream) {
  require(batch >= 0 && Tq >= 0 && Tk >= 0, "causal_mask", "negative size");
  const int64_t rows = batch * Tq;
  if (rows == 0 || Tk == 0) return;
  constexpr int V = kVec<T>;
  const bool vec = Tk % V == 0 && aligned16(s) && aligned16(out);
  const int64_t packs = vec ? Tk / V : Tk;
  dim3 block(32, 8);
  dim3 grid(unsigned(std::min<int64_t>((packs + 31) / 32, 1024)), unsigned(std::min<int64_t>((rows + 7) / 8, 65535)));
  if (vec) {
    causal_mask_kernel<V><<<grid, block, 0, stream>>>(s, out, rows, Tq, Tk, fill);
  } else {
    causal_mask_kernel<1><<<grid, block, 0, stream>>>(s, out, rows, Tq, Tk, fill);
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

template <typename T>
void rope_apply(const T* x, T* out, int64_t B, int64_t T_, int64_t H, int64_t D, double base, int64_t pos_offset,
                int direction, cudaStream_t stream) {
  require(B >= 0 && T_ >= 0 && H >= 0 && D >= 0, "rope_apply", "negative size");
  require(D % 2 == 0, "rope_apply", "head dimension D must be even");
  require(direction == 1 || direction == -1, "rope_apply", "direction must be +1 or -1");
  const int64_t tokens = B * T_;
  if (tokens == 0 || H == 0 || D == 0) return;
  const int64_t half = D / 2;
  const size_t smem = size_t(D) * sizeof(float);
  require(smem <= 48 * 1024, "rope_apply", "head dimension too large");
  constexpr int V = kVec<T>;
  const int threads = 128;
  const unsigned grid = grid_for(tokens, 1, 132 * 64);
  if (half % V == 0 && aligned16(x) && aligned16(out)) {
    rope_kernel<V><<<grid, threads, smem, stream>>>(x, out, tokens, T_, H, D, base, pos_offset, float(direction));
  } else {
    rope_kernel<1><<<grid, threads, smem, stream>>>(x, out, tokens, T_, H, D, base, pos_offset, float(direction));
  }
  TG_CUDA_CHECK(cudaGetLastError());
}

#define TG_INSTANTIATE(T)                                                                                      \
  template void swap_dims12<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);              \
  template void slice_last<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);               \
  template void unslice_last<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, cudaStream_t);             \
  template void causal_mask<T>(const T*, T*, int64_t, int64_t, int64_t, float, cudaStream_t);                \
  template void rope_apply<T>(const T*, T*, int64_t, int64_t, int64_t, int64_t, double, int64_t, int,         \
                              cudaStream_t);
TG_INSTANTIATE(float)
TG_INSTANTIATE(tg::bf16)
#undef TG_INSTANTIATE

}  // namespace tg::cuda
