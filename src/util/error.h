// Two kinds of errors (docs/architecture.md, "Conventions"): a user's mistake throws tg::Error with a
// message that says what, where and what to do; an internal library call that fails goes
// through a checking macro that names the call, file and line.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace tg {

// A user-facing error: bad shape, bad config, missing file, unsupported option.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Memory ran out: which device, how much was asked for, what tilegrad held and what to change.
// A tg::Error (the run stops with the message); `tilegrad bench memory` catches it to end a series.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace tg

// Throws tg::Error built from the streamed arguments when `cond` is false.
#define TG_CHECK(cond, ...)                                        \
  do {                                                             \
    if (!(cond)) throw ::tg::Error(::tg::detail::concat(__VA_ARGS__)); \
  } while (0)

// An internal invariant (a bug in tilegrad if it fails): names file and line.
#define TG_ASSERT(cond)                                                                      \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw std::logic_error(::tg::detail::concat("internal error: ", #cond, " failed at ", \
                                                  __FILE__, ":", __LINE__));                 \
  } while (0)
