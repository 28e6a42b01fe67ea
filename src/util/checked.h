// Overflow-checked integer arithmetic for sizes: a product of shape dimensions or a byte count
// that does not fit in 64 bits is an error naming what was being computed, never a wrapped value.
#pragma once
#include <cstdint>
#include <string>

#include "src/util/error.h"

namespace tg {

// a · b, or tg::Error "<what>: <a> × <b> overflows 64 bits".
inline int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  TG_CHECK(!__builtin_mul_overflow(a, b, &r), what, ": ", a, " × ", b, " overflows 64 bits");
  return r;
}

// a + b, or tg::Error "<what>: <a> + <b> overflows 64 bits".
inline int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  TG_CHECK(!__builtin_add_overflow(a, b, &r), what, ": ", a, " + ", b, " overflows 64 bits");
  return r;
}

}  // namespace tg
