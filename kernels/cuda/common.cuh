// Device helpers shared by tilegrad's CUDA kernels: fp32 views of float / tg::bf16 elements,
// 16-byte packed loads and stores, deterministic warp reductions, grid sizing and precondition checks.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "src/tensor/dtype.h"

namespace tg::cuda {

// Elements per 16-byte access: 4 floats or 8 bf16.
template <typename T>
constexpr int kVec = int(16 / sizeof(T));

// bf16 → float is exact: the bf16 bits are the top half of the float.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(tg::bf16 x) { return __uint_as_float(uint32_t(x.bits) << 16); }

// float → bf16 with the same bit manipulation as tg::float_to_bf16 (round to nearest even, NaN
// kept quiet), so GPU and CPU roundings are bitwise equal, NaN payloads included.
__device__ __forceinline__ uint32_t float_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
  u += 0x7fffu + ((u >> 16) & 1u);
  return u >> 16;
}

template <typename T>
__device__ __forceinline__ T from_float(float f);
template <>
__device__ __forceinline__ float from_float<float>(float f) { return f; }
template <>
__device__ __forceinline__ tg::bf16 from_float<tg::bf16>(float f) {
  tg::bf16 b;
  b.bits = uint16_t(float_to_bf16_bits(f));
  return b;
}

// V elements of T packed in 32-bit words (as loaded from memory) as floats. Little-endian: a bf16
// element 2k is the low half of word k.
template <int V, typename T>
__device__ __forceinline__ void words_to_floats(const uint32_t (&w)[V * int(sizeof(T)) / 4], float (&f)[V]) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int k = 0; k < V; ++k) f[k] = __uint_as_float(w[k]);
  } else {
#pragma unroll
    for (int k = 0; k < V / 2; ++k) {
      f[2 * k] = __uint_as_float(w[k] << 16);
      f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  }
}

// Loads V consecutive elements at p as floats. V == 1 is a scalar access; otherwise V·sizeof(T)
// must be 8 or 16 bytes and p aligned to that (the launchers check alignment before choosing V).
template <int V, typename T>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[V]) {
  if constexpr (V == 1) {
    f[0] = to_float(*p);
  } else {
    constexpr int kBytes = V * int(sizeof(T));
    static_assert(kBytes == 8 || kBytes == 16, "packed access must be 8 or 16 bytes");
    uint32_t w[kBytes / 4];
    if constexpr (kBytes == 16) {
      uint4 r = *reinterpret_cast<const uint4*>(p);
      w[0] = r.x, w[1] = r.y, w[2] = r.z, w[3] = r.w;
    } else {
      uint2 r = *reinterpret_cast<const uint2*>(p);
      w[0] = r.x, w[1] = r.y;
    }
    words_to_floats<V, T>(w, f);
  }
}

// The V elements of T in one 16-byte pack as floats: load_vec's conversion, for kernels that
// issue their 16-byte loads early (a row ahead) and convert when they use the values.
template <int V, typename T>
__device__ __forceinline__ void unpack_vec(const uint4& r, float (&f)[V]) {
  static_assert(V * int(sizeof(T)) == 16, "one 16-byte pack");
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
  words_to_floats<V, T>(w, f);
}

// Stores V floats to p as T (rounded to nearest even for bf16); same size/alignment rules as load_vec.
template <int V, typename T>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[V]) {
  if constexpr (V == 1) {
    *p = from_float<T>(f[0]);
  } else {
    constexpr int kBytes = V * int(sizeof(T));
    static_assert(kBytes == 8 || kBytes == 16, "packed access must be 8 or 16 bytes");
    uint32_t w[kBytes / 4];
    if constexpr (sizeof(T) == 4) {
#pragma unroll
      for (int k = 0; k < V; ++k) w[k] = __float_as_uint(f[k]);
    } else {
#pragma unroll
      for (int k = 0; k < V / 2; ++k) w[k] = float_to_bf16_bits(f[2 * k]) | (float_to_bf16_bits(f[2 * k + 1]) << 16);
    }
    if constexpr (kBytes == 16) {
      *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
    } else {
      *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
    }
  }
}

// Two floats → two bf16 in one word (lo in the low half) with the hardware's cvt.rn.bf16x2.f32:
// one instruction for two elements where float_to_bf16_bits takes ~5 per element, which matters
// in kernels whose arithmetic is as cheap as their memory traffic. Same rounding (to nearest even)
// for every number; a NaN comes out as the canonical 0x7fff instead of keeping its payload.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));  // a → upper half, b → lower
  return r;
}

// store_vec with the hardware conversion: equal to store_vec for every number; NaNs become the
// canonical NaN. Kernels whose output must match the CPU bit for bit on NaN too (cast) use store_vec.
template <int V, typename T>
__device__ __forceinline__ void store_vec_fast(T* p, const float (&f)[V]) {
  if constexpr (V == 1 || sizeof(T) == 4) {
    store_vec<V>(p, f);
  } else {
    static_assert(V == 8, "bf16 goes in 16-byte packs (kVec) or one at a time");
    *reinterpret_cast<uint4*>(p) = make_uint4(pack_bf16x2(f[0], f[1]), pack_bf16x2(f[2], f[3]),
                                              pack_bf16x2(f[4], f[5]), pack_bf16x2(f[6], f[7]));
  }
}

// Rounds V floats to T's precision in place as store_vec_fast would (bf16: to nearest even through
// the same cvt; float: unchanged), for kernels that store values and go on using them.
template <int V, typename T>
__device__ __forceinline__ void round_vec_fast(float (&f)[V]) {
  if constexpr (sizeof(T) == 2) {
    static_assert(V % 2 == 0, "bf16 rounds in pairs");
#pragma unroll
    for (int k = 0; k < V; k += 2) {
      const uint32_t w = pack_bf16x2(f[k], f[k + 1]);
      f[k] = __uint_as_float(w << 16);
      f[k + 1] = __uint_as_float(w & 0xffff0000u);
    }
  }
}

// 2^x on the special-function unit (ex2.approx.ftz: relative error ~2^-22, subnormal results
// flushed to 0; 2^-inf = 0, which masked attention scores rely on). exp2f would add range
// fix-ups these kernels do not need. With the log2(e) factor folded into one FMA by the caller, e^x in two
// instructions where expf takes about eight.
__device__ __forceinline__ float fast_exp2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
constexpr float kLog2e = 1.4426950408889634f;

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Blocks for a grid-stride loop over `items` work items: enough to fill the GPU several times
// over (132 SMs on an H200), capped so huge tensors loop instead of launching millions of blocks.
inline unsigned grid_for(int64_t items, int threads, int64_t max_blocks = 132 * 32) {
  int64_t blocks = (items + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return unsigned(blocks);
}

// A launcher's broken precondition is a bug in the calling op: say which launcher and why.
inline void require(bool ok, const char* launcher, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("tg::cuda::") + launcher + ": " + what);
}

}  // namespace tg::cuda

namespace tg::cuda {

// Butterfly sums: lane i adds lane i^m's value, so both lanes form a+b with the same operands
// (addition commutes exactly): every lane ends with the bitwise same, run-to-run fixed result.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// out (cols) = Σ_r x (rows, cols). Block (32, 32) owns 32 columns: thread (tx, ty) sums rows
// ty, ty+32, … of column tx in order, then ty = 0 adds the 32 partials in order. The order depends
// only on (rows, cols), so the result is bitwise reproducible without atomics or scratch.
// column_sum_block is one such block's work on its 32 columns (col_block); kernels that sum
// several matrices in one launch call it with their own choice of matrix.
template <typename TI, typename TO>
__device__ __forceinline__ void column_sum_block(const TI* __restrict__ x, TO* __restrict__ out, int64_t rows,
                                                 int64_t cols, int64_t col_block) {
  __shared__ float partial[32][32];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t c = col_block * 32 + tx;
  float acc = 0.0f;
  if (c < cols) {
    const TI* p = x + c;
#pragma unroll 4
    for (int64_t r = ty; r < rows; r += 32) acc += to_float(p[r * cols]);
  }
  partial[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < cols) {
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 32; ++k) s += partial[k][tx];
    out[c] = from_float<TO>(s);
  }
}

template <typename TI, typename TO>
__global__ void column_sum_kernel(const TI* __restrict__ x, TO* __restrict__ out, int64_t rows, int64_t cols) {
  column_sum_block(x, out, rows, cols, blockIdx.x);
}

}  // namespace tg::cuda
