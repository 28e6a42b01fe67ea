// CPU FlashAttention forward/backward: tiled online softmax, recompute-in-backward, no T×T buffer.
#include "kernels/cpu/flash_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/vector_math.h"

namespace tg::cpu {
namespace {

// Tile sizes. With D ≤ 128 in double, one Br×D or Bc×D tile is ≤ 32 KiB, so a thread's working
// set (forward: Q, K, V, acc tiles + the Br×Bc score tile ≈ 136 KiB; backward: six D-wide tiles +
// two score tiles ≈ 208 KiB) fits a per-core L2 while each loaded K/V (or Q/dO) tile is reused
// across 32 rows.
// Br == Bc makes at most one key block straddle the diagonal for each query block.
constexpr int64_t kBr = 32;  // query rows per tile
constexpr int64_t kBc = 32;  // key columns per tile

// Where a key block stands relative to a query block under the causal rule and the structured
// masks. Blocks wholly masked are never visited (the loop bounds exclude them), so only these two
// kinds reach the tile code.
enum class BlockKind {
  kUnmasked,  // every key visible to every query (or not causal): no mask logic at all
  kBoundary,  // straddles the diagonal, a document start or the window's edge: masked per element
};

// First key query i of row b may see: lo(b, i) of the header. 0 without structured masks.
int64_t first_visible(const AttentionShape& s, int64_t b, int64_t i) {
  int64_t lo = s.doc_start ? int64_t(s.doc_start[b * s.T + i]) : 0;
  if (s.window > 0) lo = std::max(lo, i - s.window + 1);
  return lo;
}

// Keys [k0, k1) vs queries [q0, q1), where lo_last = lo(q1 − 1) is the largest first visible key
// of the block (lo never decreases): every key is visible to every query iff all keys are in the
// past of the first query (k1 − 1 ≤ q0) and none lies before the last query's first visible key.
BlockKind classify(int64_t q0, int64_t k0, int64_t k1, int64_t lo_last, bool causal) {
  if (!causal) return BlockKind::kUnmasked;
  return (k1 - 1 <= q0 && k0 >= lo_last) ? BlockKind::kUnmasked : BlockKind::kBoundary;
}

// One (b, h) slice of a (B, T, H, D) tensor: row t starts at base + t·stride, D contiguous values.
template <typename P>
struct HeadRows {
  P* base;
  int64_t stride;  // H·D: consecutive tokens of one head are H·D apart
  P* row(int64_t t) const { return base + t * stride; }
};

template <typename P>
HeadRows<P> head_rows(P* x, const AttentionShape& s, int64_t b, int64_t h) {
  return {x + (b * s.T * s.H + h) * s.D, s.H * s.D};
}

// Copies rows [t0, t0 + n) of a head into a contiguous n×D tile, so the inner loops stream.
template <typename T>
void load_tile(T* dst, HeadRows<const T> src, int64_t t0, int64_t n, int64_t D) {
  for (int64_t r = 0; r < n; ++r) std::copy_n(src.row(t0 + r), D, dst + r * D);
}

// Writes a contiguous n×D tile back to rows [t0, t0 + n) of a head.
template <typename T>
void store_tile(HeadRows<T> dst, const T* src, int64_t t0, int64_t n, int64_t D) {
  for (int64_t r = 0; r < n; ++r) std::copy_n(src + r * D, D, dst.row(t0 + r));
}

// The summation order is fixed at compile time, so results are bitwise reproducible.
template <typename T>
T dot(const T* a, const T* b, int64_t D) {
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t d = 0; d < D; ++d) sum += a[d] * b[d];
  return sum;
}

// S = scale · A Bᵀ for an nr×D tile A and an nc×D tile B; S is nr×kBc (row stride kBc).
// Used for both S = scale·Q Kᵀ and (with scale 1) dP = dO Vᵀ. The tile products are BLAS calls
// (single-threaded: they run inside the kernels' own parallel loops): the CPU training step took
// 88 ms against 104 with loops of our own (docs/performance.md, "CPU").
template <typename T>
void scores(T* S, const T* A, const T* B, int64_t nr, int64_t nc, int64_t D, T scale) {
  gemm(false, true, nr, nc, D, scale, A, D, B, D, T(0), S, kBc);
}

// Excludes key k0 + c from query q0 + r when it lies in its future, or (structured masks) before
// the query's first visible key. Only boundary tiles call this.
template <typename T>
void mask_tile(T* S, const AttentionShape& s, int64_t b, int64_t q0, int64_t k0, int64_t nr, int64_t nc) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t before = s.masked() ? std::min(first_visible(s, b, q0 + r) - k0, nc) : 0;
    for (int64_t c = 0; c < before; ++c) S[r * kBc + c] = kNegInf;
    for (int64_t c = std::max<int64_t>(q0 + r - k0 + 1, 0); c < nc; ++c) S[r * kBc + c] = kNegInf;
  }
}

template <typename T>
T row_max(const T* S_row, int64_t nc) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t c = 0; c < nc; ++c) m = std::max(m, S_row[c]);
  return m;
}

// When the running max moves from m_old to m_new, everything summed so far was exponentiated
// against m_old; multiplying by exp(m_old − m_new) re-bases it on m_new.
template <typename T>
void rescale(T& l, T* acc_row, T m_old, T m_new, int64_t D) {
  const T alpha = std::exp(m_old - m_new);  // m_old = −inf (first tile): alpha = 0, acc is 0
  l *= alpha;
#pragma omp simd
  for (int64_t d = 0; d < D; ++d) acc_row[d] *= alpha;
}

// P = exp(S − m) in place; returns rowsum(P), summed in order. Masked entries (−inf) become
// exactly 0.
template <typename T>
T exp_row_sum(T* S_row, T m, int64_t nc) {
#pragma omp simd
  for (int64_t c = 0; c < nc; ++c) S_row[c] = exp_vectorizable(S_row[c] - m);
  T sum = 0;
  for (int64_t c = 0; c < nc; ++c) sum += S_row[c];
  return sum;
}

// C += A B. A: nr×nc (row stride kBc), B: nc×D, C: nr×D with row stride ldc (so C may be the
// output rows of a head directly).
template <typename T>
void add_ab(T* C, int64_t ldc, const T* A, const T* B, int64_t nr, int64_t nc, int64_t D) {
  gemm(false, false, nr, D, nc, T(1), A, kBc, B, D, T(1), C, ldc);
}

// C += Aᵀ B. A: nr×nc (row stride kBc), B: nr×D, C: nc×D.
template <typename T>
void add_atb(T* C, const T* A, const T* B, int64_t nr, int64_t nc, int64_t D) {
  gemm(true, false, nc, D, nr, T(1), A, kBc, B, D, T(1), C, D);
}

// Online-softmax step for one tile: fold the scores S (nr×nc) into the running max m, running
// sum l and accumulator acc (nr×D) of each row, leaving P = exp(S − m_new) in S for the P V that
// follows.
template <typename T>
void online_softmax(T* S, T* m, T* l, T* acc, int64_t nr, int64_t nc, int64_t D) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t r = 0; r < nr; ++r) {
    T* S_row = S + r * kBc;
    const T m_new = std::max(m[r], row_max(S_row, nc));
    if (m_new == kNegInf) {
      // Row fully masked so far: a boundary tile before the row's first visible key (structured
      // masks); guarded so it cannot turn into exp(−inf + inf) = NaN. Every row sees its own key
      // on the diagonal, so no row ends fully masked.
      std::fill_n(S_row, nc, T(0));
      continue;
    }
    rescale(l[r], acc + r * D, m[r], m_new, D);
    l[r] += exp_row_sum(S_row, m_new, nc);
    m[r] = m_new;
  }
}

// P = exp(S − lse) in place: the forward's final softmax, rebuilt without any running max.
template <typename T>
void softmax_from_lse(T* S, const T* lse, int64_t nr, int64_t nc) {
  for (int64_t r = 0; r < nr; ++r) {
    const T l = lse[r];
#pragma omp simd
    for (int64_t c = 0; c < nc; ++c) S[r * kBc + c] = exp_vectorizable(S[r * kBc + c] - l);
  }
}

// dS = scale · P ∘ (dP − Delta) in place over dP. Folding the softmax scale in here once means
// dQ += dS K and dK += dSᵀ Q below need no further scaling.
template <typename T>
void softmax_backward(T* dP, const T* P, const T* Delta, T scale, int64_t nr, int64_t nc) {
  for (int64_t r = 0; r < nr; ++r) {
    const T delta = Delta[r];
#pragma omp simd
    for (int64_t c = 0; c < nc; ++c) dP[r * kBc + c] = scale * P[r * kBc + c] * (dP[r * kBc + c] - delta);
  }
}

// Number of key blocks a query block [q0, q1) must visit: under the causal rule the blocks
// starting after q1 − 1 are wholly in the future and are never touched.
int64_t key_block_end(int64_t q1, int64_t T, bool causal) {
  const int64_t last_key = causal ? q1 - 1 : T - 1;
  return last_key / kBc + 1;
}

// First query block a key block starting at k0 must visit: blocks ending before k0 see only
// future keys from it.
int64_t query_block_begin(int64_t k0, bool causal) { return causal ? k0 / kBr : 0; }

int64_t num_blocks(int64_t T, int64_t block) { return (T + block - 1) / block; }

}  // namespace

template <typename T>
void flash_attention_forward(const T* q, const T* k, const T* v, T* o, T* lse,
                             const AttentionShape& s) {
  const int64_t B = s.B, H = s.H, D = s.D, Tn = s.T;
  const T scale = static_cast<T>(s.scale);
  const int64_t n_qblocks = num_blocks(Tn, kBr);

#pragma omp parallel
  {
    // Per-thread scratch, O(Br·D + Bc·D + Br·Bc).
    std::vector<T> Qi(kBr * D), Kj(kBc * D), Vj(kBc * D), acc(kBr * D), S(kBr * kBc);
    std::vector<T> m(kBr), l(kBr);

    // Causal query blocks differ in cost (later ones see more keys), hence dynamic scheduling.
    // Each (b, h, i) is computed by one thread in a fixed order, so results do not depend on it.
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < n_qblocks; ++i) {
          const auto Q = head_rows(q, s, b, h), K = head_rows(k, s, b, h), V = head_rows(v, s, b, h);
          const auto O = head_rows(o, s, b, h);
          T* L = lse + (b * H + h) * Tn;  // (T,) row of lse for this head

          const int64_t q0 = i * kBr, q1 = std::min(q0 + kBr, Tn), nr = q1 - q0;
          load_tile(Qi.data(), Q, q0, nr, D);
          std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
          std::fill(l.begin(), l.end(), T(0));
          std::fill(acc.begin(), acc.end(), T(0));

          // Key blocks before the one holding the first query's first visible key are wholly masked.
          const int64_t j_begin = s.causal ? first_visible(s, b, q0) / kBc : 0;
          const int64_t lo_last = s.causal ? first_visible(s, b, q1 - 1) : 0;
          for (int64_t j = j_begin; j < key_block_end(q1, Tn, s.causal); ++j) {
            const int64_t k0 = j * kBc, k1 = std::min(k0 + kBc, Tn), nc = k1 - k0;
            load_tile(Kj.data(), K, k0, nc, D);
            load_tile(Vj.data(), V, k0, nc, D);
            scores(S.data(), Qi.data(), Kj.data(), nr, nc, D, scale);
            if (classify(q0, k0, k1, lo_last, s.causal) == BlockKind::kBoundary)
              mask_tile(S.data(), s, b, q0, k0, nr, nc);

            online_softmax(S.data(), m.data(), l.data(), acc.data(), nr, nc, D);
            add_ab(acc.data(), D, S.data(), Vj.data(), nr, nc, D);  // acc += P V_j
          }

          // O = acc / l; lse = m + log l is all the backward needs to rebuild P = exp(S − lse).
          for (int64_t r = 0; r < nr; ++r) {
            const T inv_l = T(1) / l[r];
            T* o_row = O.row(q0 + r);
            const T* acc_row = acc.data() + r * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) o_row[d] = acc_row[d] * inv_l;
            L[q0 + r] = m[r] + std::log(l[r]);
          }
        }
  }
}

template <typename T>
void flash_attention_backward(const T* q, const T* k, const T* v, const T* o, const T* lse,
                              const T* dout, T* dq, T* dk, T* dv, const AttentionShape& s) {
  const int64_t B = s.B, H = s.H, D = s.D, Tn = s.T;
  const T scale = static_cast<T>(s.scale);
  const int64_t n_kblocks = num_blocks(Tn, kBc), n_qblocks = num_blocks(Tn, kBr);

  // Delta = rowsum(dO ∘ O) equals rowsum(P ∘ dP) (since O = P V), so dS = P ∘ (dP − Delta)
  // needs no full row of P. (B, H, T).
  std::vector<T> delta(B * H * Tn);
#pragma omp parallel for collapse(2)
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const auto O = head_rows(o, s, b, h), dO = head_rows(dout, s, b, h);
      for (int64_t t = 0; t < Tn; ++t) delta[(b * H + h) * Tn + t] = dot(dO.row(t), O.row(t), D);
    }

#pragma omp parallel
  {
    // Per-thread scratch, O(Br·D + Bc·D + Br·Bc).
    std::vector<T> Kj(kBc * D), Vj(kBc * D), dKj(kBc * D), dVj(kBc * D);
    std::vector<T> Qi(kBr * D), dOi(kBr * D), P(kBr * kBc), dS(kBr * kBc);

    // One thread owns a whole (b, h): dQ rows receive contributions from every key block, and
    // keeping them on one thread makes that accumulation race-free and its order fixed.
#pragma omp for collapse(2) schedule(dynamic)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h) {
        const auto Q = head_rows(q, s, b, h), K = head_rows(k, s, b, h), V = head_rows(v, s, b, h);
        const auto dO = head_rows(dout, s, b, h);
        const auto dQ = head_rows(dq, s, b, h), dK = head_rows(dk, s, b, h), dV = head_rows(dv, s, b, h);
        const T* L = lse + (b * H + h) * Tn;          // (T,)
        const T* Delta = delta.data() + (b * H + h) * Tn;  // (T,)

        for (int64_t t = 0; t < Tn; ++t) std::fill_n(dQ.row(t), D, T(0));  // overwrite, not +=

        for (int64_t j = 0; j < n_kblocks; ++j) {
          const int64_t k0 = j * kBc, k1 = std::min(k0 + kBc, Tn), nc = k1 - k0;
          load_tile(Kj.data(), K, k0, nc, D);
          load_tile(Vj.data(), V, k0, nc, D);
          std::fill(dKj.begin(), dKj.end(), T(0));
          std::fill(dVj.begin(), dVj.end(), T(0));

          for (int64_t i = query_block_begin(k0, s.causal); i < n_qblocks; ++i) {
            const int64_t q0 = i * kBr, q1 = std::min(q0 + kBr, Tn), nr = q1 - q0;
            // lo never decreases: once a query block's first query cannot see this key block,
            // no later query block can.
            if (s.causal && first_visible(s, b, q0) > k1 - 1) break;
            const int64_t lo_last = s.causal ? first_visible(s, b, q1 - 1) : 0;
            load_tile(Qi.data(), Q, q0, nr, D);
            load_tile(dOi.data(), dO, q0, nr, D);

            // P = exp(scale·Q_i K_jᵀ − L_i): the forward's softmax, rebuilt tile by tile.
            scores(P.data(), Qi.data(), Kj.data(), nr, nc, D, scale);
            if (classify(q0, k0, k1, lo_last, s.causal) == BlockKind::kBoundary)
              mask_tile(P.data(), s, b, q0, k0, nr, nc);
            softmax_from_lse(P.data(), L + q0, nr, nc);

            add_atb(dVj.data(), P.data(), dOi.data(), nr, nc, D);  // dV_j += Pᵀ dO_i

            scores(dS.data(), dOi.data(), Vj.data(), nr, nc, D, T(1));  // dP = dO_i V_jᵀ
            softmax_backward(dS.data(), P.data(), Delta + q0, scale, nr, nc);

            add_ab(dQ.row(q0), dQ.stride, dS.data(), Kj.data(), nr, nc, D);  // dQ_i += scale·dS K_j
            add_atb(dKj.data(), dS.data(), Qi.data(), nr, nc, D);            // dK_j += scale·dSᵀ Q_i
          }

          store_tile(dK, dKj.data(), k0, nc, D);
          store_tile(dV, dVj.data(), k0, nc, D);
        }
      }
  }
}

template void flash_attention_forward<float>(const float*, const float*, const float*, float*,
                                             float*, const AttentionShape&);
template void flash_attention_forward<double>(const double*, const double*, const double*, double*,
                                              double*, const AttentionShape&);
template void flash_attention_backward<float>(const float*, const float*, const float*,
                                              const float*, const float*, const float*, float*,
                                              float*, float*, const AttentionShape&);
template void flash_attention_backward<double>(const double*, const double*, const double*,
                                               const double*, const double*, const double*,
                                               double*, double*, double*, const AttentionShape&);

}  // namespace tg::cpu
