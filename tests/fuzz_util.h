// Seeded mutation fuzzing shared by the parser tests (tests/io/test_fuzz.cpp,
// tests/interop/test_interop_fuzz.cpp): the same mutations in every run, and a child process for
// calls that may crash inside a library.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

namespace tg::testing {

// One to four mutations: flip a bit, replace a byte (by one of the bytes that matter to a YAML,
// JSON or binary parser), insert or delete a run, duplicate a slice, truncate, or insert a run of
// digits (absurd numbers).
inline std::string mutate(std::string s, std::mt19937_64& rng) {
  static const char kInteresting[] = {'\0', '\n', ':', '-', '[', '{', '"', '\'', '#', '&', '*', '!', '|', '>',
                                      '%', '9', ' ', '\t', '\xff', '\x80', '.', 'e'};
  const int n = 1 + int(rng() % 4);
  for (int k = 0; k < n; ++k) {
    const size_t len = s.size();
    const size_t at = len ? size_t(rng() % len) : 0;
    switch (rng() % 7) {
      case 0:
        if (len) s[at] = char(s[at] ^ (1 << (rng() % 8)));
        break;
      case 1:
        if (len) s[at] = kInteresting[rng() % sizeof kInteresting];
        break;
      case 2: s.insert(at, std::string(1 + rng() % 8, kInteresting[rng() % sizeof kInteresting])); break;
      case 3:
        if (len) s.erase(at, 1 + rng() % std::min<size_t>(16, len - at));
        break;
      case 4:
        if (len) s.insert(at, s.substr(rng() % len, 1 + rng() % 32));
        break;
      case 5:
        s.resize(len ? size_t(rng() % len) : 0);
        break;
      case 6:
        s.insert(at, std::string(1 + rng() % 24, char('0' + rng() % 10)));
        break;
    }
  }
  return s;
}

// One to three structural mutations of a JSON document: a value somewhere in it (an object's
// member or a list's element, at any depth) replaced by a value of another type or an absurd one,
// or removed. What a byte mutation rarely reaches: documents that parse but are not what the
// reader expects.
inline nlohmann::json mutate_json(nlohmann::json j, std::mt19937_64& rng) {
  static const nlohmann::json kValues[] = {nullptr, true, -1, 0, 65536, 1e300, -1e300, 9223372036854775807LL,
                                           18446744073709551615ULL, 0.5, "", "x", nlohmann::json::array(),
                                           nlohmann::json::array({1, 2}), nlohmann::json::object(),
                                           nlohmann::json::object({{"a", 1}})};
  const int n = 1 + int(rng() % 3);
  for (int k = 0; k < n; ++k) {
    nlohmann::json* at = &j;
    // Walk down a random number of levels, then replace or remove there.
    for (int depth = 0; depth < 6 && (at->is_object() || at->is_array()) && !at->empty(); ++depth) {
      auto it = at->begin();
      std::advance(it, long(rng() % at->size()));
      if (rng() % 3 == 0 || !(it->is_object() || it->is_array())) {
        if (rng() % 5 == 0) {
          at->erase(it);
        } else {
          *it = kValues[rng() % (sizeof kValues / sizeof kValues[0])];
        }
        break;
      }
      at = &*it;
    }
  }
  return j;
}

// Runs fn in a child process; returns "" if it exited 0, else how it ended.
inline std::string in_child(const std::function<void()>& fn) {
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(120);
    fn();
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "exit status " + std::to_string(WEXITSTATUS(status));
}

}  // namespace tg::testing
