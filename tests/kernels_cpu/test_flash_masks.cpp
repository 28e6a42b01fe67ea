// The CPU FlashAttention kernels with structured masks (sliding window, document starts) against
// the materialised masked attention in double (tests/flash_reference.h), plus the properties the
// masks must keep: every output written, bitwise reproducible, and no mask ≡ the causal kernel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "tests/flash_reference.h"

namespace {

using tg::cpu::AttentionShape;
namespace ref = tg::testing::flash;

std::vector<double> uniform(size_t n, double amplitude, uint64_t seed) {
  ref::Rng rng{seed};
  std::vector<double> x(n);
  for (double& e : x) e = amplitude * rng.next();
  return x;
}

// Document starts of B rows of length T from the lengths of their documents, repeated cyclically.
std::vector<int32_t> starts_from_lengths(int64_t B, int64_t T, const std::vector<int64_t>& lengths) {
  std::vector<int32_t> starts(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int64_t start = 0, next = 0;
    size_t doc = size_t(b);  // rows differ: each begins at another entry of the length list
    for (int64_t t = 0; t < T; ++t) {
      if (t == next) start = t, next = t + lengths[doc++ % lengths.size()];
      starts[size_t(b * T + t)] = int32_t(start);
    }
  }
  return starts;
}

struct Out {
  std::vector<double> o, lse, dq, dk, dv;
};

// Runs forward and backward in precision T on outputs filled with NaN, so an element the kernels
// do not write stays NaN.
template <typename T>
Out run(const AttentionShape& s, const std::vector<double>& q, const std::vector<double>& k,
        const std::vector<double>& v, const std::vector<double>& dout) {
  auto cast = [](const std::vector<double>& x) { return std::vector<T>(x.begin(), x.end()); };
  const auto qt = cast(q), kt = cast(k), vt = cast(v), dt = cast(dout);
  const T nan = std::numeric_limits<T>::quiet_NaN();
  std::vector<T> o(q.size(), nan), lse(size_t(s.B * s.H * s.T), nan), dq(q.size(), nan), dk(q.size(), nan),
      dv(q.size(), nan);
  tg::cpu::flash_attention_forward<T>(qt.data(), kt.data(), vt.data(), o.data(), lse.data(), s);
  tg::cpu::flash_attention_backward<T>(qt.data(), kt.data(), vt.data(), o.data(), lse.data(), dt.data(), dq.data(),
                                       dk.data(), dv.data(), s);
  auto up = [](const std::vector<T>& x) { return std::vector<double>(x.begin(), x.end()); };
  return {up(o), up(lse), up(dq), up(dk), up(dv)};
}

struct MaskCase {
  std::string name;
  int64_t T;
  int64_t window;                // 0: none
  std::vector<int64_t> lengths;  // document lengths, cyclic; empty: no document mask
};

void check_against_reference(const MaskCase& c) {
  SCOPED_TRACE(c.name + " T=" + std::to_string(c.T));
  const int64_t B = 2, H = 2, D = 16, T = c.T;
  const size_t n = size_t(B * T * H * D);
  const auto q = uniform(n, 2.0, 11 + uint64_t(T)), k = uniform(n, 2.0, 12 + uint64_t(T));
  const auto v = uniform(n, 1.0, 13), dout = uniform(n, 1.0, 14);
  const std::vector<int32_t> starts = c.lengths.empty() ? std::vector<int32_t>{} : starts_from_lengths(B, T, c.lengths);
  AttentionShape s{B, T, H, D, true, 1.0 / std::sqrt(double(D))};
  s.window = c.window;
  s.doc_start = starts.empty() ? nullptr : starts.data();

  const ref::Case rc{B, T, H, D, true, 0.0};
  const ref::Reference r = ref::reference(rc, s.scale, q, k, v, dout, s.doc_start, c.window);
  const Out got = run<double>(s, q, k, v, dout);
  for (const auto* x : {&got.o, &got.lse, &got.dq, &got.dk, &got.dv}) EXPECT_EQ(ref::count_nonfinite(*x), 0u);
  EXPECT_LE(ref::rel_error(got.o, r.o), 1e-12) << "o";
  EXPECT_LE(ref::rel_error(got.lse, r.lse), 1e-12) << "lse";
  EXPECT_LE(ref::rel_error(got.dq, r.dq), 1e-12) << "dq";
  EXPECT_LE(ref::rel_error(got.dk, r.dk), 1e-12) << "dk";
  EXPECT_LE(ref::rel_error(got.dv, r.dv), 1e-12) << "dv";

  // The mask must matter: the unmasked causal attention differs (except where nothing is masked).
  if (T > 1 && (c.window > 0 && c.window < T)) {
    const ref::Reference causal = ref::reference(rc, s.scale, q, k, v, dout);
    EXPECT_GT(ref::max_abs_diff(r.o, causal.o), 1e-6);
  }

  // Two runs of the backward give the same bits.
  const Out again = run<double>(s, q, k, v, dout);
  for (auto [a, b] : {std::pair{&got.dq, &again.dq}, {&got.dk, &again.dk}, {&got.dv, &again.dv}, {&got.o, &again.o}})
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(double)), 0);
}

// Tiles are 32×32: windows below, at and above a tile; documents of length 1, within a tile and
// across several tiles; both masks at once.
std::vector<MaskCase> cases(int64_t T) {
  return {
      {"window1", T, 1, {}},
      {"window5", T, 5, {}},
      {"window32", T, 32, {}},
      {"window45", T, 45, {}},
      {"window100", T, 100, {}},
      {"docs_len1", T, 0, {1}},
      {"docs_mixed", T, 0, {1, 7, 40, 1, 3, 90, 33}},
      {"docs_long", T, 0, {300, 5, 700}},
      {"docs_and_window", T, 20, {1, 50, 9, 130, 64}},
  };
}

TEST(FlashMasks, AgainstMaterialisedReference) {
  for (int64_t T : {1, 17, 129, 1000})
    for (const MaskCase& c : cases(T)) check_against_reference(c);
}

TEST(FlashMasks, LongSequence) {
  check_against_reference({"docs_and_window", 4096, 300, {1, 500, 33, 1200, 64, 2000}});
}

// A whole row as one document, or a window at least T long, masks nothing: the same bits as
// the plain causal kernel, in float as in double.
template <typename T>
void expect_bitwise_causal(int64_t Tn) {
  const int64_t B = 2, H = 3, D = 24;
  const size_t n = size_t(B * Tn * H * D);
  const auto q = uniform(n, 2.0, 21), k = uniform(n, 2.0, 22), v = uniform(n, 1.0, 23), dout = uniform(n, 1.0, 24);
  const AttentionShape plain{B, Tn, H, D, true, 1.0 / std::sqrt(double(D))};
  const Out base = run<T>(plain, q, k, v, dout);
  const std::vector<int32_t> one_doc(size_t(B * Tn), 0);
  AttentionShape doc = plain, win = plain, both = plain;
  doc.doc_start = one_doc.data();
  win.window = Tn;
  both.doc_start = one_doc.data(), both.window = Tn + 5;
  for (const AttentionShape* s : {&doc, &win, &both}) {
    const Out got = run<T>(*s, q, k, v, dout);
    for (auto [a, b] : {std::pair{&got.o, &base.o}, {&got.lse, &base.lse}, {&got.dq, &base.dq}, {&got.dk, &base.dk},
                        {&got.dv, &base.dv}})
      EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(double)), 0) << "T=" << Tn;
  }
}

// The longest document of the starts: a row that begins mid-document, documents of one token,
// the longest in the second row, a last document reaching T.
TEST(FlashMasks, LongestDocument) {
  const std::vector<int32_t> starts = {0, 0, 0, 3, 3, 5,   // 3, 2, 1 tokens
                                       0, 1, 1, 1, 1, 1};  // 1, 5 tokens
  EXPECT_EQ(tg::cpu::longest_document(starts.data(), 2, 6), 5);
  EXPECT_EQ(tg::cpu::longest_document(starts.data(), 1, 6), 3);
  const std::vector<int32_t> one(7, 0);  // one document over the whole row
  EXPECT_EQ(tg::cpu::longest_document(one.data(), 1, 7), 7);
}

TEST(FlashMasks, NoEffectiveMaskIsCausalBitwise) {
  for (int64_t T : {1, 17, 129, 300}) {
    expect_bitwise_causal<double>(T);
    expect_bitwise_causal<float>(T);
  }
}

}  // namespace
