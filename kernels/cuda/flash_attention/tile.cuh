// Warp-level tile helpers for the FlashAttention kernels: cp.async tile loads, ldmatrix fragment
// loads, m16n8k16 bf16 mma, and the softmax steps on accumulator fragments. Destination first.
// fast_exp2, pack_bf16x2 and kLog2e come from kernels/cuda/common.cuh.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "src/tensor/dtype.h"

namespace tg::cuda::flash {

constexpr float kLn2 = 0.6931471805599453f;

// ── Fragment layout (PTX ISA, mma.m16n8k16 with .bf16): lane = 4·g + t, g = lane/4, t = lane%4.
//   A (16×16, row-major), 4 regs of bf16x2: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
//                                           a3 = (g+8, 2t+8..).
//   B (16×8, "col": k×n), 2 regs:           b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g).
//   C (16×8) fp32, 4 regs:                  c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1).
// A warp's 16×N accumulator is float acc[N/8][4]: acc[nt][e] sits at row frag_row(e), column
// frag_col(nt, e). In a bf16x2 register the lower column is the low half.

__device__ __forceinline__ int frag_row(int lane, int e) { return (lane >> 2) + (e >> 1) * 8; }
__device__ __forceinline__ int frag_col(int lane, int nt, int e) { return nt * 8 + (lane & 3) * 2 + (e & 1); }

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ── cp.async: global → shared without a register round trip ──

// 16 bytes; when !valid nothing is read and the destination is zero-filled (src-size 0).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// 4 bytes, zero-filled when !valid.
__device__ __forceinline__ void cp_async_4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight. Other threads'
// copies become visible only after a __syncthreads() that follows.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Rows [t0, t0 + ROWS) of one head, whose row t starts at src + t·ld with D contiguous bf16, into
// shared memory: the 16-byte chunk at column col (a multiple of 8) of tile row r goes to
// dst_of(r, col) (the layout is the caller's). ld is the token row stride in elements, ≤ 2^24 so that ROWS·ld fits 32 bits (the
// tile's base t0·ld is formed once in 64 bits, each chunk's offset in 32). Rows ≥ T are
// zero-filled: later mmas multiply them (by P = 0 or into rows never stored), and zeros, unlike
// stale smem, can never make a NaN.
template <int ROWS, int D, int THREADS, typename DstOf>
__device__ __forceinline__ void load_rows_async(DstOf dst_of, const tg::bf16* src, int ld, int t0, int T, int tid) {
  constexpr int kChunksPerRow = D / 8;  // 16-byte chunks
  constexpr int kIters = ROWS * kChunksPerRow / THREADS;
  static_assert(ROWS * kChunksPerRow % THREADS == 0, "tile must split evenly over the threads");
  static_assert(ROWS <= 128, "ROWS · ld must fit 32 bits for ld ≤ 2^24");
  // Every caller has t0 < T, so row t0 exists: an invalid row (≥ T) reads it instead, which keeps
  // the (ignored) source address well-formed.
  const tg::bf16* tile = src + int64_t(t0) * ld;
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int c = it * THREADS + tid;
    const int r = c / kChunksPerRow, col = (c % kChunksPerRow) * 8;
    const bool valid = t0 + r < T;
    cp_async_16(dst_of(r, col), tile + ((valid ? r * ld : 0) + col), valid);
  }
}

// The plain layout: dst (ROWS, LDS), row r at dst + r·LDS.
template <int ROWS, int D, int LDS, int THREADS>
__device__ __forceinline__ void load_tile(tg::bf16* dst, const tg::bf16* src, int ld, int t0, int T, int tid) {
  load_rows_async<ROWS, D, THREADS>([=](int r, int col) { return dst + r * LDS + col; }, src, ld, t0, T, tid);
}

// dst (ROWS) smem ← src[t0, t0 + ROWS), zeros past T (fp32 per-row statistics: lse, delta).
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_row_stats(float* dst, const float* src, int t0, int T, int tid) {
  for (int r = tid; r < ROWS; r += THREADS) {
    const bool valid = t0 + r < T;
    cp_async_4(dst + r, src + (valid ? t0 + r : 0), valid);
  }
}

// ── ldmatrix and mma ──

// Four 8×8 b16 matrices; lane l supplies the row address of matrix l/8, row l%8, and receives in
// r[i] the pair (row l/4, cols 2(l%4)..+1) of matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// Same, transposed: r[i] receives (rows 2(l%4)..+1, col l/4) of matrix i.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// Two matrices, transposed: lanes 0-15 supply the row addresses (matrix l/8, row l%8; the other
// lanes' are ignored), r[i] as in ldmatrix_x4_trans.
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}

// c (16×8 fp32) += a (16×16 bf16) · b (16×8 bf16).
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ── Fragment loads ──

// a (16×K) A fragments ← the 16×K row-major smem tile at `tile` (row stride lda). For each
// 16-column k-step, the x4 matrices are (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
// (rows 8-15, k 8-15) = a0..a3, so lane l addresses row l%16, column 8·(l/16).
template <int K>
__device__ __forceinline__ void load_a_frags(uint32_t (&a)[K / 16][4], const tg::bf16* tile, int lda, int lane) {
  const tg::bf16* p = tile + (lane & 15) * lda + (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) ldmatrix_x4(a[kk], p + kk * 16);
}

// ── Warp GEMMs: acc (16×N, fp32) += A (16×K) · B ──
// Two ways B is stored in smem, both row-major with stride ldb:
//   mma_abt: B is an (N, K) tile and the product is A·Bᵀ (S = Q Kᵀ, dP = dO Vᵀ, Sᵀ = K Qᵀ,
//            dPᵀ = V dOᵀ): a row of the tile is a column n of the mma's B, ldmatrix without .trans.
//   mma_ab:  B is a (K, N) tile and the product is A·B (O += P V, dV += Pᵀ dO, dK += dSᵀ Q,
//            dQ += dS K): ldmatrix.trans turns its rows (k) into the B fragment's k pairs.

// acc += A · Bᵀ, A in registers, B an (N, K) smem tile. Per k-step, one x4 covers n-tiles n0 and
// n0+8: matrices (n0+0..7, k0+0..7), (n0+0..7, k0+8..15), (n0+8..15, k0), (n0+8..15, k0+8) are
// b0, b1 of n-tile n0 then of n0+8; lane l addresses row n0 + l%8 + 8·(l/16), column k0 + 8·((l/8)%2).
template <int N, int K>
__device__ __forceinline__ void mma_abt(float (&acc)[N / 8][4], const uint32_t (&a)[K / 16][4], const tg::bf16* b,
                                        int ldb, int lane) {
  static_assert(N % 16 == 0 && K % 16 == 0, "whole x4 loads only");
  const tg::bf16* p = b + ((lane & 7) + (lane >> 4) * 8) * ldb + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      uint32_t f[4];
      ldmatrix_x4(f, p + nn * 16 * ldb + kk * 16);
      mma_16x8x16(acc[2 * nn], a[kk], f[0], f[1]);
      mma_16x8x16(acc[2 * nn + 1], a[kk], f[2], f[3]);
    }
  }
}

// acc += A · B, A in registers, B a (K, N) smem tile. Per k-step, one x4.trans covers n-tiles n0
// and n0+8: matrices (k0+0..7, n0), (k0+8..15, n0), (k0+0..7, n0+8), (k0+8..15, n0+8), transposed,
// are b0, b1 of n-tile n0 then of n0+8; lane l addresses row k0 + l%16, column n0 + 8·(l/16).
template <int N, int K>
__device__ __forceinline__ void mma_ab(float (&acc)[N / 8][4], const uint32_t (&a)[K / 16][4], const tg::bf16* b,
                                       int ldb, int lane) {
  static_assert(N % 16 == 0 && K % 16 == 0, "whole x4 loads only");
  const tg::bf16* p = b + (lane & 15) * ldb + (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      uint32_t f[4];
      ldmatrix_x4_trans(f, p + kk * 16 * ldb + nn * 16);
      mma_16x8x16(acc[2 * nn], a[kk], f[0], f[1]);
      mma_16x8x16(acc[2 * nn + 1], a[kk], f[2], f[3]);
    }
  }
}

// ── Warp GEMMs over R row blocks: acc[r] (16×N) += A[r] (16×K) · B for r < R ──
// Same B layouts as above; every B fragment is loaded once and feeds R mmas (one per row block),
// so the ldmatrix bytes per mma drop by R and the R accumulators are independent mma chains.

// acc[r] += A[r] · Bᵀ, A in registers.
template <int R, int N, int K>
__device__ __forceinline__ void mma_abt_rows(float (&acc)[R][N / 8][4], const uint32_t (&a)[R][K / 16][4],
                                             const tg::bf16* b, int ldb, int lane) {
  static_assert(N % 16 == 0 && K % 16 == 0, "whole x4 loads only");
  const tg::bf16* p = b + ((lane & 7) + (lane >> 4) * 8) * ldb + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      uint32_t f[4];
      ldmatrix_x4(f, p + nn * 16 * ldb + kk * 16);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        mma_16x8x16(acc[r][2 * nn], a[r][kk], f[0], f[1]);
        mma_16x8x16(acc[r][2 * nn + 1], a[r][kk], f[2], f[3]);
      }
    }
  }
}

// acc[r] += A[r] · Bᵀ with A[r] the 16 rows at a + 16·r·lda of smem, read one k-step at a time.
template <int R, int N, int K>
__device__ __forceinline__ void mma_abt_smem_a_rows(float (&acc)[R][N / 8][4], const tg::bf16* a, int lda,
                                                    const tg::bf16* b, int ldb, int lane) {
  static_assert(N % 16 == 0 && K % 16 == 0, "whole x4 loads only");
  const tg::bf16* pa = a + (lane & 15) * lda + (lane >> 4) * 8;
  const tg::bf16* pb = b + ((lane & 7) + (lane >> 4) * 8) * ldb + ((lane >> 3) & 1) * 8;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) ldmatrix_x4(af[r], pa + r * 16 * lda + kk * 16);
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      uint32_t f[4];
      ldmatrix_x4(f, pb + nn * 16 * ldb + kk * 16);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        mma_16x8x16(acc[r][2 * nn], af[r], f[0], f[1]);
        mma_16x8x16(acc[r][2 * nn + 1], af[r], f[2], f[3]);
      }
    }
  }
}

// acc[r] += A[r] · B, A in registers, B a (K, N) smem tile.
template <int R, int N, int K>
__device__ __forceinline__ void mma_ab_rows(float (&acc)[R][N / 8][4], const uint32_t (&a)[R][K / 16][4],
                                            const tg::bf16* b, int ldb, int lane) {
  static_assert(N % 16 == 0 && K % 16 == 0, "whole x4 loads only");
  const tg::bf16* p = b + (lane & 15) * ldb + (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      uint32_t f[4];
      ldmatrix_x4_trans(f, p + kk * 16 * ldb + nn * 16);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        mma_16x8x16(acc[r][2 * nn], a[r][kk], f[0], f[1]);
        mma_16x8x16(acc[r][2 * nn + 1], a[r][kk], f[2], f[3]);
      }
    }
  }
}

// acc[r] += A[r] · B where A is stored transposed in smem: element (m, k) of A at a[k·lda + m]
// (K-major, e.g. dSᵀ written as keys × queries), A[r] its rows m ∈ [16r, 16r + 16), read one
// k-step at a time with ldmatrix.trans; B a (K, N) smem tile as in mma_ab. For a k-step the x4
// matrices are the stored 8×8 blocks (k 0-7, m 0-7), (k 0-7, m 8-15), (k 8-15, m 0-7),
// (k 8-15, m 8-15), whose transposes are a0..a3: lane l addresses stored row k0 + 8·(l/16) +
// l%8, column 16r + 8·((l/8)%2).
template <int R, int N, int K>
__device__ __forceinline__ void mma_ab_smem_at_rows(float (&acc)[R][N / 8][4], const tg::bf16* a, int lda,
                                                   const tg::bf16* b, int ldb, int lane) {
  static_assert(N % 8 == 0 && K % 16 == 0, "whole n-tiles and k-steps only");
  const tg::bf16* pa = a + ((lane >> 4) * 8 + (lane & 7)) * lda + ((lane >> 3) & 1) * 8;
  const tg::bf16* pb = b + (lane & 15) * ldb + (lane >> 4) * 8;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    uint32_t af[R][4];
#pragma unroll
    for (int r = 0; r < R; ++r) ldmatrix_x4_trans(af[r], pa + kk * 16 * lda + r * 16);
#pragma unroll
    for (int nn = 0; nn < N / 16; ++nn) {
      uint32_t f[4];
      ldmatrix_x4_trans(f, pb + kk * 16 * ldb + nn * 16);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        mma_16x8x16(acc[r][2 * nn], af[r], f[0], f[1]);
        mma_16x8x16(acc[r][2 * nn + 1], af[r], f[2], f[3]);
      }
    }
    if constexpr (N % 16 == 8) {  // a last 8-column n-tile: its two k halves (lanes 0-15's rows)
      uint32_t f[2];
      ldmatrix_x2_trans(f, pb + kk * 16 * ldb + (N - 8));
#pragma unroll
      for (int r = 0; r < R; ++r) mma_16x8x16(acc[r][N / 8 - 1], af[r], f[0], f[1]);
    }
  }
}

// The 16×K tile held as A fragments (bf16) → row-major smem at tile (row stride ld), each lane
// storing its four bf16x2 pairs per k-step (rows g, g+8; columns 2t, 2t+8 of the k-step).
template <int K>
__device__ __forceinline__ void store_a_frags(tg::bf16* tile, int ld, const uint32_t (&a)[K / 16][4], int lane) {
  uint32_t* lo = reinterpret_cast<uint32_t*>(tile + (lane >> 2) * ld + (lane & 3) * 2);
  uint32_t* hi = reinterpret_cast<uint32_t*>(tile + ((lane >> 2) + 8) * ld + (lane & 3) * 2);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    lo[kk * 8] = a[kk][0];
    hi[kk * 8] = a[kk][1];
    lo[kk * 8 + 4] = a[kk][2];
    hi[kk * 8 + 4] = a[kk][3];
  }
}

// a (16×N as A fragments, bf16) ← c (16×N accumulator, fp32). The C layout of n-tiles 2k and
// 2k+1 is exactly the A layout of k-step k (a0 = c[2k] rows g, a1 = c[2k] rows g+8, a2 = c[2k+1]
// rows g, a3 = c[2k+1] rows g+8), so P and dS go from one mma to the next without leaving registers.
template <int N>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[N / 16][4], const float (&c)[N / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk) {
    a[kk][0] = pack_bf16x2(c[2 * kk][0], c[2 * kk][1]);
    a[kk][1] = pack_bf16x2(c[2 * kk][2], c[2 * kk][3]);
    a[kk][2] = pack_bf16x2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[kk][3] = pack_bf16x2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
  }
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
}

// ── Elementwise steps on a 16×N score tile ──

template <int N>
__device__ __forceinline__ void scale_tile(float (&s)[N / 8][4], float f) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] *= f;
}

// s = −inf where excluded(row0 + row, col0 + col): the causal rule and the tail past T. Only
// tiles that straddle the diagonal or the end of the sequence call this.
// (The backward masks P after the exponential instead, with value = 0.)
template <int N, typename Excluded>
__device__ __forceinline__ void mask_tile(float (&s)[N / 8][4], int row0, int col0, int lane, Excluded excluded,
                                          float value = -INFINITY) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (excluded(row0 + frag_row(lane, e), col0 + frag_col(lane, nt, e))) s[nt][e] = value;
}

// The 4 lanes 4g..4g+3 hold one row between them: butterfly over lane bits 0 and 1.
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// m[i] = max(m[i], max of row i of s) for this thread's rows i = 0 (g) and 1 (g + 8).
template <int N>
__device__ __forceinline__ void row_max(float (&m)[2], const float (&s)[N / 8][4]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float v = m[i];
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt) v = fmaxf(v, fmaxf(s[nt][2 * i], s[nt][2 * i + 1]));
    m[i] = quad_max(v);
  }
}

// A row whose max is still −inf has seen only masked scores; exponentiating against 0 instead
// keeps exp2(−inf − (−inf)) = NaN out (the CPU reference guards the same case).
__device__ __forceinline__ float safe_max(float m) { return m == -INFINITY ? 0.0f : m; }

// Online-softmax rescale: everything accumulated against m_old is re-based on m_new by
// exp2(m_old − m_new) (scores are in log2 units). m_old = −inf (nothing yet) gives 0. A row
// whose max did not move needs no rescale (factor 1; or, while the row has seen only masked
// scores, an accumulator that is still 0), and along a long row the max soon stops moving, so
// when none of the warp's 8 rows (g = 0..7, or 8..15) moved, the D/4 multiplies per row are
// skipped by a warp-uniform branch; rows that did not move in a warp that rescales get factor 1.
template <int D>
__device__ __forceinline__ void rescale(float (&o)[D / 8][4], float (&l)[2], const float (&m_old)[2],
                                        const float (&m_new)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool moved = m_old[i] != m_new[i];
    if (!__any_sync(0xffffffffu, moved)) continue;
    const float alpha = moved ? fast_exp2(m_old[i] - safe_max(m_new[i])) : 1.0f;
    l[i] *= alpha;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      o[nt][2 * i] *= alpha;
      o[nt][2 * i + 1] *= alpha;
    }
  }
}

// s = exp2(s − m) in place and l += this thread's part of each row sum (the 4 lanes of a row are
// summed once, at the end: their partial sums are all rescaled by the same alpha).
template <int N>
__device__ __forceinline__ void exp2_row_sum(float (&s)[N / 8][4], const float (&m)[2], float (&l)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float base = safe_max(m[i]);
    float sum = 0.0f;
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt) {
      s[nt][2 * i] = fast_exp2(s[nt][2 * i] - base);
      s[nt][2 * i + 1] = fast_exp2(s[nt][2 * i + 1] - base);
      sum += s[nt][2 * i] + s[nt][2 * i + 1];
    }
    l[i] += sum;
  }
}

// ── Online softmax on raw scores (the sm_90a forward) ──
// S = Q Kᵀ stays unscaled and the scale₂ = scale·log₂e multiply is folded into the exponent's
// FFMA: for scale > 0 the row max of raw scores is the max of scaled ones, so the running max m
// stays in raw units and exp2((s − m)·scale₂) = exp2(fma(s, scale₂, −m·scale₂)) — one
// instruction per score fewer than scaling the tile first.

// m ← max(m, row max of s) for this thread's rows g, g+8; alpha[i] = exp2((m_old − m_new)·scale₂),
// the factor that re-bases what was accumulated against m_old (1 when the max did not move;
// 0 when nothing was accumulated yet).
template <int N>
__device__ __forceinline__ void update_row_max_raw(float (&m)[2], float (&alpha)[2], const float (&s)[N / 8][4],
                                                   float scale2) {
  float m_new[2] = {m[0], m[1]};
  row_max<N>(m_new, s);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    alpha[i] = m_new[i] == m[i] ? 1.0f : fast_exp2((m[i] - m_new[i]) * scale2);
    m[i] = m_new[i];
  }
}

// s ← exp2((s − m)·scale₂) in place (P relative to the running max); sum[i] = this thread's part
// of row i's sum (the 4 lanes of a row are summed once, at the end).
template <int N>
__device__ __forceinline__ void exp2_rows_raw(float (&s)[N / 8][4], const float (&m)[2], float (&sum)[2],
                                              float scale2) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float base = safe_max(m[i]) * scale2;
    float acc = 0.0f;
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt) {
      s[nt][2 * i] = fast_exp2(fmaf(s[nt][2 * i], scale2, -base));
      s[nt][2 * i + 1] = fast_exp2(fmaf(s[nt][2 * i + 1], scale2, -base));
      acc += s[nt][2 * i] + s[nt][2 * i + 1];
    }
    sum[i] = acc;
  }
}

// o rows ×= alpha and l = l·alpha + sum; the multiplies over o are skipped by a warp-uniform
// branch when no row of the warp moved its max (as in rescale).
template <int D>
__device__ __forceinline__ void rescale_accumulate(float (&o)[D / 8][4], float (&l)[2], const float (&alpha)[2],
                                                   const float (&sum)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] = l[i] * alpha[i] + sum[i];
    if (!__any_sync(0xffffffffu, alpha[i] != 1.0f)) continue;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt) {
      o[nt][2 * i] *= alpha[i];
      o[nt][2 * i + 1] *= alpha[i];
    }
  }
}

// P = exp2(s·scale₂ − lse₂) with lse₂ per row (log2 units; rows g and g+8 of this thread): the
// scale folded into one FFMA per score. Masked entries are zeroed afterwards (mask_tile, value 0).
template <int N>
__device__ __forceinline__ void exp2_scaled_minus_row(float (&s)[N / 8][4], float scale_log2, const float (&lse2)[2]) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = fast_exp2(fmaf(s[nt][e], scale_log2, -lse2[e >> 1]));
}

// P = exp2(s·scale₂ − lse·log2e) with lse per column, read from smem (natural log units, as stored).
template <int N>
__device__ __forceinline__ void exp2_scaled_minus_col(float (&s)[N / 8][4], float scale_log2, const float* lse,
                                                      int lane) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) {
    const float2 L = *reinterpret_cast<const float2*>(lse + frag_col(lane, nt, 0));  // cols 2t, 2t+1
    const float l0 = -L.x * kLog2e, l1 = -L.y * kLog2e;
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = fast_exp2(fmaf(s[nt][e], scale_log2, (e & 1) ? l1 : l0));
  }
}

// dS = P ∘ (dP − delta) in place over dP, delta per row (this thread's rows g, g+8).
template <int N>
__device__ __forceinline__ void softmax_grad_row(float (&dp)[N / 8][4], const float (&p)[N / 8][4],
                                                 const float (&delta)[2]) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[nt][e] = p[nt][e] * (dp[nt][e] - delta[e >> 1]);
}

// dSᵀ = Pᵀ ∘ (dPᵀ − delta) in place over dPᵀ, with Pᵀ read back from its bf16 A fragments (the
// acc_to_a image of the accumulator, the same rounded values dV was built from), so the fp32 Pᵀ
// need not stay live across the dPᵀ mma: 16·N/64 fewer registers in the dK/dV kernel.
template <int N>
__device__ __forceinline__ void softmax_grad_col_bf16p(float (&dp)[N / 8][4], const uint32_t (&pf)[N / 16][4],
                                                       const float* delta, int lane) {
#pragma unroll
  for (int nt = 0; nt < N / 8; ++nt) {
    const float2 Dl = *reinterpret_cast<const float2*>(delta + frag_col(lane, nt, 0));
    const uint32_t lo_rows = pf[nt / 2][(nt & 1) * 2], hi_rows = pf[nt / 2][(nt & 1) * 2 + 1];  // rows g, g+8
    dp[nt][0] = __uint_as_float(lo_rows << 16) * (dp[nt][0] - Dl.x);
    dp[nt][1] = __uint_as_float(lo_rows & 0xffff0000u) * (dp[nt][1] - Dl.y);
    dp[nt][2] = __uint_as_float(hi_rows << 16) * (dp[nt][2] - Dl.x);
    dp[nt][3] = __uint_as_float(hi_rows & 0xffff0000u) * (dp[nt][3] - Dl.y);
  }
}

// ── Global fp32 accumulation (the backward's opt-in atomic dQ) ──

// p[0], p[1] += a, b: one vector reduction performed at L2, no value returned (vector reductions
// exist from sm_90; before it, two scalar ones).
__device__ __forceinline__ void red_add_f32x2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// The fp32 dQ accumulator's layout: rows of ld floats whose 8-float (32-byte) chunks are permuted
// per row, chunk c stored at c ^ (row % 8). A warp's accumulator fragment covers 8 rows × 4
// column pairs per n-tile; unpermuted, those 8 rows (ld a multiple of 32 floats) share 8 banks
// when staged in shared memory (8-way conflicts), permuted they spread over all 32. A row of 32
// floats (head dim 32) has 4 chunks only, permuted by row % 4, and so has each group of 4 of a
// 96-float row's 12 (the XOR must map the row's chunks onto themselves: it takes row % m for the
// largest m ≤ 8 dividing the chunk count). Offset of the column pair (col, col + 1), col even, of
// `row`. (row % 8 is the same in any tile frame whose origin is a multiple of 8 rows.)
__host__ __device__ constexpr int dq_accum_chunk_xor(int row, int ld) {
  return row & ((ld / 8) % 8 == 0 ? 7 : (ld / 8) % 4 == 0 ? 3 : (ld / 8) % 2 == 0 ? 1 : 0);
}
__device__ __forceinline__ int dq_accum_offset(int row, int col, int ld) {
  return row * ld + ((((col >> 3) ^ dq_accum_chunk_xor(row, ld)) << 3) | (col & 7));
}

// Rows [row0, row0 + 16) of the dQ accumulator at dst (fp32, dq_accum_offset's layout, row stride
// ld), columns [col0, col0 + N), += acc (16 rows × N) of a warp, as vector reductions. The caller
// guarantees the rows exist (the dQ buffer is padded to whole tiles).
template <int N>
__device__ __forceinline__ void accumulate_rows_f32(float* dst, int ld, const float (&acc)[N / 8][4], int row0,
                                                    int col0, int lane) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + (lane >> 2) + 8 * i;
#pragma unroll
    for (int nt = 0; nt < N / 8; ++nt)
      red_add_f32x2(dst + dq_accum_offset(row, col0 + frag_col(lane, nt, 0), ld), acc[nt][2 * i], acc[nt][2 * i + 1]);
  }
}

// Rows [row0, row0 + 16) of one head (row t at dst + t·ld) ← acc · f[row], bf16; rows ≥ T are
// never written. Each lane stores its column pairs as 4-byte bf16x2.
template <int D>
__device__ __forceinline__ void store_rows(tg::bf16* dst, int ld, const float (&acc)[D / 8][4], const float (&f)[2],
                                           int row0, int T, int lane) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = row0 + (lane >> 2) + 8 * i;
    if (row >= T) continue;
    tg::bf16* out = dst + int64_t(row) * ld;
#pragma unroll
    for (int nt = 0; nt < D / 8; ++nt)
      *reinterpret_cast<uint32_t*>(out + frag_col(lane, nt, 0)) =
          pack_bf16x2(acc[nt][2 * i] * f[i], acc[nt][2 * i + 1] * f[i]);
  }
}

}  // namespace tg::cuda::flash
