// CPU layout copies: swap dims 1 and 2 of a 4-D tensor ((B, T, H, D) ↔ (B, H, T, D)),
// and slice/insert a range of the last dimension (the q/k/v split).
#pragma once
#include <cstdint>
#include <cstring>

namespace tg::cpu {

// x (A, M, N, D) → out (A, N, M, D).
template <typename T>
void swap_dims12(const T* x, T* out, int64_t A, int64_t M, int64_t N, int64_t D) {
#pragma omp parallel for collapse(2) if (A * M * N * D > (1 << 15))
  for (int64_t a = 0; a < A; ++a)
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        std::memcpy(out + ((a * N + n) * M + m) * D, x + ((a * M + m) * N + n) * D, size_t(D) * sizeof(T));
}

// out (rows, len) = x (rows, cols)[:, start:start+len].
template <typename T>
void slice_last(const T* x, T* out, int64_t rows, int64_t cols, int64_t start, int64_t len) {
#pragma omp parallel for if (rows * len > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) std::memcpy(out + r * len, x + r * cols + start, size_t(len) * sizeof(T));
}

// dx (rows, cols)[:, start:start+len] = d (rows, len); the rest of dx is left untouched.
template <typename T>
void unslice_last(const T* d, T* dx, int64_t rows, int64_t cols, int64_t start, int64_t len) {
#pragma omp parallel for if (rows * len > (1 << 15))
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dx + r * cols + start, d + r * len, size_t(len) * sizeof(T));
}

// Naive attention's causal mask on scores (batch, T, T): future keys → −inf.
template <typename T>
void causal_mask(const T* s, T* out, int64_t batch, int64_t Tq, int64_t Tk, T fill) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < Tq; ++i)
      for (int64_t j = 0; j < Tk; ++j) {
        int64_t idx = (b * Tq + i) * Tk + j;
        out[idx] = j > i ? fill : s[idx];
      }
}

}  // namespace tg::cpu
