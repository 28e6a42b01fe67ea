// CPU rotary position embedding (RoPE) on (B, T, H, D), rotate-half pairing (i, i + D/2).
#pragma once
#include <cmath>
#include <cstdint>

namespace tg::cpu {

// Rotates each (x_i, x_{i+D/2}) pair of token t by angle (t + pos_offset) · base^(−2i/D).
// direction = +1 forward, −1 for the backward (the inverse rotation). Angles are computed in
// double so float and double agree to rounding.
template <typename T>
void rope_apply(const T* x, T* out, int64_t B, int64_t Tn, int64_t H, int64_t D, double base,
                int64_t pos_offset, int direction) {
  const int64_t half = D / 2;
#pragma omp parallel for collapse(2) if (B * Tn * H * D > (1 << 15))
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < Tn; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        double freq = std::pow(base, -2.0 * double(i) / double(D));
        double angle = double(t + pos_offset) * freq;
        T c = T(std::cos(angle)), s = T(direction * std::sin(angle));
        for (int64_t h = 0; h < H; ++h) {
          int64_t row = ((b * Tn + t) * H + h) * D;
          T x1 = x[row + i], x2 = x[row + i + half];
          out[row + i] = x1 * c - x2 * s;
          out[row + i + half] = x1 * s + x2 * c;
        }
      }
    }
}

}  // namespace tg::cpu
