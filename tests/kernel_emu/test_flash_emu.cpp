// The FlashAttention CUDA kernels' own source, run on the CPU by tools/kernel_emu/emu.h, against
// the double-precision reference of the GPU tests: forward O and lse, backward dQ, dK, dV with
// both dQ strategies, over head dims, sequence tails, the causal rule and the structured masks
// (sliding window, documents), outputs poisoned first.
// This checks the kernels' logic (tiles, indices, masks, fragment layouts, cp.async ordering) on
// machines without a GPU, CI included; speed and the GPU's mma rounding are the GPU tests' job.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

// The emulator first: it defines what the kernel sources expect from CUDA.
#include "emu.h"
// Then the kernels, as generated from kernels/cuda/flash_attention/ at build time.
#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/flash_attention/kernel_traits.cuh"
#include "kernels/cuda/flash_attention/mask.cuh"
#include "tile_emu.cuh"
#include "sm90_emu.cuh"
#include "flash_fwd_emu.h"
#include "flash_bwd_emu.h"
#include "flash_fwd_sm90a_emu.h"
#include "flash_bwd_sm90a_emu.h"
#include "tests/flash_reference.h"

namespace {

using namespace tg::cuda;
using namespace tg::testing::flash;

// f(std::integral_constant<int, D>{}) for the head dim D among Ds (the last of them when D is
// none of the others): the kernels take the head dim as a template argument.
template <int First, int... Rest, class F>
decltype(auto) with_head_dim(int64_t D, F&& f) {
  if constexpr (sizeof...(Rest) == 0)
    return f(std::integral_constant<int, First>{});
  else
    return D == First ? f(std::integral_constant<int, First>{}) : with_head_dim<Rest...>(D, std::forward<F>(f));
}

// The GPU tests' bounds (tests/cuda/test_flash_attention.cpp): every output written (no NaN
// left from the poison), O and dQ, dK, dV within the relative errors, lse within 1e-3.
void expect_matches_reference(const std::vector<tg::bf16>& o, const std::vector<float>& lse,
                              const std::vector<tg::bf16>& dq, const std::vector<tg::bf16>& dk,
                              const std::vector<tg::bf16>& dv, const Reference& ref) {
  const std::vector<double> O = to_double(o), L = to_double(lse);
  ASSERT_EQ(count_nonfinite(O), 0u) << "O has NaN/inf (unwritten elements?)";
  ASSERT_EQ(count_nonfinite(L), 0u) << "lse has NaN/inf";
  EXPECT_LE(rel_error(O, ref.o), 2e-2) << "O";
  EXPECT_LE(max_abs_diff(L, ref.lse), 1e-3) << "lse";
  const char* names[3] = {"dQ", "dK", "dV"};
  const std::vector<tg::bf16>* got[3] = {&dq, &dk, &dv};
  const std::vector<double>* want[3] = {&ref.dq, &ref.dk, &ref.dv};
  for (int t = 0; t < 3; ++t) {
    const std::vector<double> g = to_double(*got[t]);
    ASSERT_EQ(count_nonfinite(g), 0u) << names[t] << " has NaN/inf (unwritten elements?)";
    EXPECT_LE(rel_error(g, *want[t]), 5e-2) << names[t];
  }
}

// The launch sequences of flash_fwd.cu / flash_bwd.cu (launch_fwd, launch_bwd), block for block.

// Grid (head, batch, tiles of `tile_rows`), as the attention launchers build it (the sm_90a
// forward's is 1-D: forward_sm90a).
EmuDim3 tile_grid(const FlashAttentionParams& p, int tile_rows) {
  return {unsigned(p.H), unsigned(p.B), unsigned((p.T + tile_rows - 1) / tile_rows)};
}

// The row-wise passes around the tile kernels: delta before, the atomic mode's dQ convert after.
template <int D>
void delta_pass(const FlashAttentionParams& p, const flash::BwdWorkspace<D>& ws) {
  const int64_t rows = p.B * p.T * p.H;
  emu_launch({unsigned((rows * flash::kDeltaLanes<D> + 255) / 256), 1, 1}, 256, 0, [&] {
    flash::flash_bwd_delta_kernel<D>(p.o, p.o_row_stride, p.dout, p.do_row_stride, ws.delta, rows, int(p.T), int(p.H));
  });
}
template <int D>
void dq_convert_pass(const FlashAttentionParams& p, const flash::BwdWorkspace<D>& ws) {
  const int64_t rows = p.B * p.T * p.H;
  emu_launch({unsigned((rows * (D / 8) + 255) / 256), 1, 1}, 256, 0, [&] {
    flash::flash_bwd_dq_convert_kernel<D>(ws.dq_accum, flash::BwdWorkspace<D>::accum_rows(p.T), p.dq,
                                          p.dq_row_stride, rows, int(p.T), int(p.H), p.scale);
  });
}

template <int D>
void forward(const FlashAttentionParams& p_in) {
  const FlashAttentionParams p = flash::with_resolved_row_strides(p_in);
  using Tr = flash::FwdConfig<D>;
  flash::with_mask(p, [&](auto masked) {
    emu_launch(tile_grid(p, Tr::kBr), Tr::kThreads, Tr::kSmemBytes,
               [&] { flash::flash_fwd_kernel<Tr, decltype(masked)::value>(p); });
  });
}

template <int D>
void backward(const FlashAttentionParams& p_in) {
  const FlashAttentionParams p = flash::with_resolved_row_strides(p_in);
  using Ws = flash::BwdWorkspace<D>;
  const Ws ws(p);
  delta_pass<D>(p, ws);
  using Dkdv = flash::DkdvConfig<D>;
  const int accum_rows = int(Ws::accum_rows(p.T));
  flash::with_mask(p, [&](auto masked) {
    constexpr bool kMasked = decltype(masked)::value;
    if (!Ws::has_accum(p.dq_mode)) {  // as launch_bwd: the pair serves kAtomic where no atomic kernel is built
      emu_launch(tile_grid(p, Dkdv::kOwn), Dkdv::kThreads, Dkdv::kSmemBytes, [&] {
        flash::flash_bwd_dkdv_kernel<Dkdv, FlashDq::kRecompute, kMasked>(p, ws.delta, ws.dq_accum, accum_rows);
      });
      using Dq = flash::DqConfig<D>;
      emu_launch(tile_grid(p, Dq::kOwn), Dq::kThreads, Dq::kSmemBytes,
                 [&] { flash::flash_bwd_dq_kernel<Dq, kMasked>(p, ws.delta); });
      return;
    }
    if constexpr (flash::kMmaSyncAtomicDq<D>) {
      std::memset(ws.dq_accum, 0, Ws::accum_bytes(p.B, p.T, p.H));
      emu_launch(tile_grid(p, Dkdv::kOwn), Dkdv::kThreads, Dkdv::kSmemDkdvBytes, [&] {
        flash::flash_bwd_dkdv_kernel<Dkdv, FlashDq::kAtomic, kMasked>(p, ws.delta, ws.dq_accum, accum_rows);
      });
      dq_convert_pass<D>(p, ws);
    }
  });
}

struct EmuCase {
  Case shape;
  FlashDq dq_mode;
};

void PrintTo(const EmuCase& e, std::ostream* os) {
  *os << "B" << e.shape.B << " T" << e.shape.T << " H" << e.shape.H << " D" << e.shape.D
      << (e.shape.causal ? " causal" : " full") << (e.dq_mode == FlashDq::kAtomic ? " atomic dQ" : "");
}

class FlashEmulated : public ::testing::TestWithParam<EmuCase> {};

TEST_P(FlashEmulated, MatchesDoubleReference) {
  const Case c = GetParam().shape;
  const Problem pr = make_problem(c);
  const size_t n = pr.n, n_lse = pr.n_lse;
  const double scale = pr.scale;
  const Input &q = pr.q, &k = pr.k, &v = pr.v, &dout = pr.dout;
  const Reference& ref = pr.ref;

  const tg::bf16 nan_bf16{0xFFFF};  // poison: every output element must be written
  std::vector<tg::bf16> o(n, nan_bf16), dq(n, nan_bf16), dk(n, nan_bf16), dv(n, nan_bf16);
  std::vector<float> lse(n_lse, NAN);
  const FlashDq mode = GetParam().dq_mode;
  const size_t ws_bytes = with_head_dim<32, 64, 96, 128>(
      c.D, [&](auto d) { return flash::BwdWorkspace<d()>::bytes(c.B, c.T, c.H, mode); });
  std::vector<float> workspace(ws_bytes / sizeof(float) + 4, NAN);

  FlashAttentionParams p{};
  p.q = q.bits.data(), p.k = k.bits.data(), p.v = v.bits.data(), p.o = o.data(), p.lse = lse.data();
  p.dout = dout.bits.data(), p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data(), p.workspace = workspace.data();
  p.B = c.B, p.T = c.T, p.H = c.H, p.D = c.D, p.scale = float(scale), p.causal = c.causal;
  p.dq_mode = GetParam().dq_mode;
  with_head_dim<32, 64, 96, 128>(c.D, [&](auto d) {
    forward<d()>(p);
    backward<d()>(p);
  });

  expect_matches_reference(o, lse, dq, dk, dv, ref);
}

// One batch, two heads (the emulator runs a block of 128 threads as 128 std::threads): T = 1,
// a tail inside the first tile, and one past a tile boundary of every kernel (64/128 rows).
std::vector<EmuCase> cases() {
  std::vector<EmuCase> out;
  for (int64_t D : {32, 64, 96, 128})
    for (bool causal : {false, true})
      for (int64_t T : {1, 17, 129}) out.push_back({{1, T, 2, D, causal, 0.0}, FlashDq::kRecompute});
  for (int64_t D : {32, 64, 128})  // the head dims with an atomic-dQ kernel (kMmaSyncAtomicDq)
    for (bool causal : {false, true}) out.push_back({{1, 129, 2, D, causal, 0.0}, FlashDq::kAtomic});
  out.push_back({{1, 129, 2, 64, true, -0.125}, FlashDq::kRecompute});  // scale < 0: what the wgmma forward leaves to this one
  return out;
}

std::string case_name(const ::testing::TestParamInfo<EmuCase>& info) {
  const Case& c = info.param.shape;
  return "T" + std::to_string(c.T) + "_D" + std::to_string(c.D) + (c.causal ? "_causal" : "_full") +
         (info.param.dq_mode == FlashDq::kAtomic ? "_atomic_dq" : "") + (c.scale < 0 ? "_negative_scale" : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashEmulated, ::testing::ValuesIn(cases()), case_name);

// The persistent kernels' 1-D grid over work items of tile_rows rows: one item per block below
// T = 256; from there on 3 blocks taking several items each (the persistent grid's way), so the
// streams, the own tiles' hand-over and the turns run on across items. Blocks run one at a time
// here, so the first one claims every item past the grid's first ones from the item counter
// (ItemCounter), which must be zero again afterwards.
EmuDim3 item_grid(const FlashAttentionParams& p, int tile_rows) {
  const int n_items = int(p.H * p.B * ((p.T + tile_rows - 1) / tile_rows));
  return {unsigned(p.T >= 256 ? std::min(n_items, 3) : n_items), 1, 1};
}
struct ItemCounter {
  unsigned words[2] = {0, 0};
  ~ItemCounter() { EXPECT_EQ(words[0] + words[1], 0u) << "the item counter was not reset"; }
};

// The sm_90a kernels (flash_fwd_sm90a.cu, flash_bwd_sm90a.cu: wgmma, swizzled tiles, two
// warpgroups) against the same reference and bounds, with wgmma emulated as
// tests/cuda/test_wgmma.cpp found it on the H200; the launch sequences of their launchers.
// The forward: a producer thread on TMA and mbarriers, consumers taking turns.
template <class Tr>
void forward_sm90a_traits(const FlashAttentionParams& p) {
  const flash::FwdTmaMaps maps = flash::fwd_tma_maps<Tr>(p);
  ItemCounter counter;
  flash::with_mask(p, [&](auto masked) {
    emu_launch(item_grid(p, Tr::kBr), Tr::kThreads, Tr::kSmemBytes,
               [&] { flash::flash_fwd_sm90a_kernel<Tr, decltype(masked)::value>(p, maps, counter.words); });
  });
}
// A shape of sm90_shapes.h, its last tile's products as narrow as the launcher makes them
// (fwd_last_tile_keys).
template <class Shape>
void forward_sm90a_with(const FlashAttentionParams& p) {
  flash::with_last_tile_traits<Shape>(p.T, [&](auto tr) { forward_sm90a_traits<typename decltype(tr)::type>(p); });
}
// The shape the forward's table selects (flash::fwd_shape) for a T scaled so that the emulated
// lengths reach its thresholds: the table's short causal shape, up to kFwdShortCausalMaxT there,
// runs here below T = 256, so that the causal cases at 256, 300 and 600 run the long-T shape.
int64_t table_t(int64_t T) { return T >= 256 ? flash::kBwdSm90aLongT : T; }
template <class List, class F>
void with_table_shape(List list, const char* name, F&& f) {
  ASSERT_TRUE(name != nullptr) << "no shape in the table";
  ASSERT_TRUE(flash::with_named_shape(list, name, f)) << name;
}
void forward_sm90a(const FlashAttentionParams& p_in) {
  const FlashAttentionParams p = flash::with_resolved_row_strides(p_in);
  with_table_shape(flash::join(flash::FwdTable{}, flash::FwdVariants{}), flash::fwd_shape(p.D, p.causal, table_t(p.T), flash::variant_name(p.variant)),
                   [&](auto tag) { forward_sm90a_with<typename decltype(tag)::type>(p); });
}

template <class Shape>
void dkdv_sm90a_with(const FlashAttentionParams& p, const float* delta) {
  using Tr = flash::DkdvWsSm90aTraits<Shape>;
  const flash::BwdTmaMaps maps = flash::bwd_tma_maps<Tr>(p);
  ItemCounter counter;
  flash::with_mask(p, [&](auto masked) {
    emu_launch(item_grid(p, Tr::kBc), Tr::kThreads, Tr::kSmemBytes, [&] {
      flash::flash_bwd_dkdv_sm90a_ws_kernel<Tr, decltype(masked)::value>(p, delta, nullptr, 0, maps, counter.words);
    });
  });
}
template <int D>
void backward_sm90a(const FlashAttentionParams& p_in) {
  const FlashAttentionParams p = flash::with_resolved_row_strides(p_in);
  using Ws = flash::BwdWorkspace<D>;
  const Ws ws(p);
  delta_pass<D>(p, ws);
  if constexpr (flash::kSm90aAtomicDq<D>) {
    if (p.dq_mode == FlashDq::kAtomic) {
      using Atomic = flash::DkdvWsSm90aTraits<std::conditional_t<D == 64, flash::DkdvAtomicD64, flash::DkdvAtomicD128>>;
      const int accum_rows = int(Ws::accum_rows(p.T));
      std::memset(ws.dq_accum, 0, Ws::accum_bytes(p.B, p.T, p.H));
      const flash::BwdTmaMaps maps = flash::bwd_tma_maps<Atomic>(p);
      ItemCounter counter;
      flash::with_mask(p, [&](auto masked) {
        emu_launch(item_grid(p, Atomic::kBc), Atomic::kThreads, Atomic::kSmemBytes, [&] {
          flash::flash_bwd_dkdv_sm90a_ws_kernel<Atomic, decltype(masked)::value>(p, ws.delta, ws.dq_accum, accum_rows,
                                                                                maps, counter.words);
        });
      });
      dq_convert_pass<D>(p, ws);
      return;
    }
  }
  // The tables take the long shapes from T = kBwdSm90aLongT; here from T = 256 (table_t), so that
  // their stages, turns and ragged tails run too (at 256, 300 and 600).
  with_table_shape(flash::join(flash::DkdvTable{}, flash::DkdvVariants{}), flash::dkdv_shape(p.D, p.causal, table_t(p.T), flash::variant_name(p.variant)),
                   [&](auto tag) { dkdv_sm90a_with<typename decltype(tag)::type>(p, ws.delta); });
  auto run_dq = [&](auto tag) {
    using Dq = flash::DqSm90aTraits<typename decltype(tag)::type>;
    const flash::BwdTmaMaps maps = flash::bwd_tma_maps<Dq>(p);
    ItemCounter dq_counter;
    flash::with_mask(p, [&](auto masked) {
      emu_launch(item_grid(p, Dq::kBr), Dq::kThreads, Dq::kSmemBytes, [&] {
        flash::flash_bwd_dq_sm90a_kernel<Dq, decltype(masked)::value>(p, ws.delta, maps, dq_counter.words);
      });
    });
  };
  // As the dK/dV kernel above: the long shape from T = 256 here, but at d 64's T 300 the short one
  // (two Q/dO buffers, kQBuffers), so that its buffers alternate over the several items each of
  // the 3 blocks takes (the cases B 2 × H 3 non-causal and B 2 × H 8 causal).
  const bool short_dq_at_300 = D == 64 && p.T == 300;
  with_table_shape(flash::join(flash::DqTable{}, flash::DqVariants{}),
                   flash::dq_shape(p.D, p.causal, short_dq_at_300 ? p.T : table_t(p.T), flash::variant_name(p.variant)), run_dq);
}

struct Sm90aCase {
  Case shape;
  bool packed;  // q, k, v read from one (B, T, 3·H·D) qkv buffer, as the model passes them
  FlashDq dq_mode = FlashDq::kRecompute;
  const char* variant = nullptr;  // a variant of the development registry (FlashAttentionParams::variant)
};
void PrintTo(const Sm90aCase& e, std::ostream* os) {
  *os << "B" << e.shape.B << " T" << e.shape.T << " H" << e.shape.H << " D" << e.shape.D
      << (e.shape.causal ? " causal" : " full") << (e.packed ? " packed qkv" : "")
      << (e.dq_mode == FlashDq::kAtomic ? " atomic dQ" : "") << (e.variant ? " variant " : "")
      << (e.variant ? e.variant : "");
}

class FlashSm90aEmulated : public ::testing::TestWithParam<Sm90aCase> {};

TEST_P(FlashSm90aEmulated, MatchesDoubleReference) {
  const Case c = GetParam().shape;
  const Problem pr = make_problem(c);
  const size_t n = pr.n, n_lse = pr.n_lse;
  const double scale = pr.scale;
  const Input &q = pr.q, &k = pr.k, &v = pr.v, &dout = pr.dout;
  const Reference& ref = pr.ref;
  const tg::bf16 nan_bf16{0xFFFF};  // poison: every output element must be written
  std::vector<tg::bf16> o(n, nan_bf16);
  std::vector<float> lse(n_lse, NAN);
  const FlashDq dq_mode = GetParam().dq_mode;
  const size_t ws_bytes = with_head_dim<64, 96, 128>(
      c.D, [&](auto d) { return flash::BwdWorkspace<d()>::bytes(c.B, c.T, c.H, dq_mode); });
  std::vector<float> workspace(ws_bytes / sizeof(float) + 4, NAN);
  FlashAttentionParams p{};
  p.q = q.bits.data(), p.k = k.bits.data(), p.v = v.bits.data(), p.o = o.data(), p.lse = lse.data();
  p.dout = dout.bits.data(), p.workspace = workspace.data();
  p.B = c.B, p.T = c.T, p.H = c.H, p.D = c.D, p.scale = float(scale), p.causal = c.causal;
  p.dq_mode = dq_mode;
  p.variant = uint8_t(flash::variant_id(GetParam().variant));
  ASSERT_TRUE(!GetParam().variant || p.variant != 0) << GetParam().variant;
  const size_t hd = size_t(c.H * c.D), rows = size_t(c.B * c.T), w = 3 * hd;
  // Contiguous dq, dk, dv, or (packed) one (B, T, 3·H·D) d(qkv) buffer beside a packed qkv input.
  std::vector<tg::bf16> dq(n, nan_bf16), dk(n, nan_bf16), dv(n, nan_bf16);
  std::vector<tg::bf16> qkv(rows * w), dqkv(rows * w, nan_bf16);
  p.dq = dq.data(), p.dk = dk.data(), p.dv = dv.data();
  if (GetParam().packed) {
    for (size_t r = 0; r < rows; ++r)
      for (size_t e = 0; e < hd; ++e) {
        qkv[r * w + e] = q.bits[r * hd + e];
        qkv[r * w + hd + e] = k.bits[r * hd + e];
        qkv[r * w + 2 * hd + e] = v.bits[r * hd + e];
      }
    p.q = qkv.data(), p.k = qkv.data() + hd, p.v = qkv.data() + 2 * hd;
    p.dq = dqkv.data(), p.dk = dqkv.data() + hd, p.dv = dqkv.data() + 2 * hd;
    p.q_row_stride = p.k_row_stride = p.v_row_stride = int64_t(w);
    p.dq_row_stride = p.dk_row_stride = p.dv_row_stride = int64_t(w);
  }
  // As flash_attention_forward dispatches: a scale ≤ 0 takes the mma.sync forward (the wgmma one
  // keeps the row max of raw scores), the backward stays wgmma.
  // Head dim 96 runs the d 128 tiles, zero-padded past column 96 (flash_fwd_sm90a).
  const bool mma_sync_forward = !(p.scale > 0.0f);
  with_head_dim<64, 96, 128>(c.D, [&](auto d) {
    mma_sync_forward ? forward<d()>(p) : forward_sm90a(p);
    backward_sm90a<d()>(p);
  });
  if (GetParam().packed)
    for (size_t r = 0; r < rows; ++r)
      for (size_t e = 0; e < hd; ++e) {
        dq[r * hd + e] = dqkv[r * w + e];
        dk[r * hd + e] = dqkv[r * w + hd + e];
        dv[r * hd + e] = dqkv[r * w + 2 * hd + e];
      }

  expect_matches_reference(o, lse, dq, dk, dv, ref);
}

// T = 1; a tail inside the first 64-key tile; one past a 128-row query block with a 64-key tail;
// two whole query blocks (the causal diagonal of both warpgroups, the prefetch of every stage);
// T = 600 (the warp-specialised forward's stages each filled, released and refilled, the
// consumers' turns over 5 tiles, a tail);
// q, k, v packed; a negative scale (the mma.sync forward, then the wgmma backward); the atomic dQ
// at d 128 and d 64 — there the consumers form whole dQ tiles by turns, and items of odd tile
// counts (T 129 causal: 3 and 1) hand an item's first one to either consumer — (its tail tile,
// several key blocks adding into one query tile, packed d(qkv), a long sequence).
std::vector<Sm90aCase> sm90a_cases() {
  std::vector<Sm90aCase> out;
  for (int64_t D : {64, 128})
    for (bool causal : {false, true})
      for (int64_t T : {1, 17, 129, 256}) out.push_back({{1, T, 2, D, causal, 0.0}, false});
  for (int64_t D : {64, 128}) out.push_back({{2, 129, 3, D, true, 0.0}, true});
  // 5 tiles of 128 keys (4 of 176 at d 128 not causal, the last ragged): every K/V stage of the
  // forward reused.
  for (int64_t D : {64, 128})
    for (bool causal : {false, true}) out.push_back({{1, 600, 1, D, causal, 0.0}, false});
  // d 128 not causal, the last of 3 tiles of 176 keys holding 48: its products over 64 keys
  // (fwd_last_tile_keys; at T 256, 300 and 600 over 128).
  out.push_back({{1, 400, 1, 128, false, 0.0}, false});
  for (int64_t D : {64, 128}) {
    for (bool causal : {false, true})
      for (int64_t T : {129, 256}) out.push_back({{1, T, 2, D, causal, 0.0}, false, FlashDq::kAtomic});
    out.push_back({{2, 129, 3, D, true, 0.0}, true, FlashDq::kAtomic});
    // 10 query tiles: every Q/dO stage, dSᵀ buffer and the dQ staging reused several times.
    for (bool causal : {false, true}) out.push_back({{1, 600, 1, D, causal, 0.0}, false, FlashDq::kAtomic});
  }
  for (int64_t D : {64, 128}) out.push_back({{1, 129, 2, D, true, -0.125}, false});
  // Several batches and heads over 3 blocks, non-causal: the head-major item order
  // (sm90::item_tile) decoded alike by every role of every kernel, batch index included.
  for (int64_t D : {64, 128}) out.push_back({{2, 300, 3, D, false, 0.0}, false});
  for (int64_t D : {64, 128}) out.push_back({{2, 300, 3, D, false, 0.0}, false, FlashDq::kAtomic});
  // Causal with 16 heads over 3 blocks: the causal order's groups of heads (sm90::item_tile: 8
  // waves of the grid, 24 items here; 3 tiles of 128 rows per head, so 2 groups of 8 heads in the
  // dK/dV and dQ passes, the d 64 atomic dK/dV kernel and the d 128 forward, 12 and 4 in the d 64
  // forward's 192-row tiles; the d 128 atomic dK/dV kernel keeps one group) decoded alike by every
  // role.
  out.push_back({{2, 300, 8, 64, true, 0.0}, false});
  for (int64_t D : {64, 128}) out.push_back({{2, 300, 8, D, true, 0.0}, false, FlashDq::kAtomic});
  // Head dim 96 on the d 128 kernels: each tile's second panel zero-filled past the head's last
  // column, and stores that stop there — with several heads, whose columns follow one another
  // (contiguous and packed), so a load or store past column 96 would meet the next head's; the
  // atomic mode takes the deterministic pair.
  for (bool causal : {false, true})
    for (int64_t T : {17, 129}) out.push_back({{1, T, 2, 96, causal, 0.0}, false});
  out.push_back({{2, 129, 3, 96, true, 0.0}, true});
  out.push_back({{2, 300, 3, 96, false, 0.0}, false, FlashDq::kAtomic});
  return out;
}

// Each variant of the development registry (sm90_shapes.h), at each mask it takes and a T whose
// table_t lies in its range (129 or 260: several items per block, ragged tails); the launchers'
// selection runs it there (fwd_shape, dkdv_shape, dq_shape with the variant's name), the other
// kernel of the pass the table's shape.
std::vector<Sm90aCase> variant_cases() {
  std::vector<Sm90aCase> out;
  auto add = [&](auto tag) {
    using S = typename decltype(tag)::type;
    for (bool causal : {false, true})
      for (int64_t T : {260, 129})
        if (flash::applies<S>(S::head_dim, causal, table_t(T))) {
          out.push_back({{2, T, 3, S::head_dim, causal, 0.0}, false, FlashDq::kRecompute, S::name});
          break;
        }
  };
  flash::for_each_shape(flash::FwdVariants{}, add);
  flash::for_each_shape(flash::DkdvVariants{}, add);
  flash::for_each_shape(flash::DqVariants{}, add);
  return out;
}

std::string sm90a_case_name(const ::testing::TestParamInfo<Sm90aCase>& info) {
  const Case& c = info.param.shape;
  return "B" + std::to_string(c.B) + "_T" + std::to_string(c.T) + "_H" + std::to_string(c.H) + "_D" +
         std::to_string(c.D) + (c.causal ? "_causal" : "_full") + (info.param.packed ? "_packed" : "") +
         (c.scale < 0 ? "_negative_scale" : "") + (info.param.dq_mode == FlashDq::kAtomic ? "_atomic_dq" : "") +
         (info.param.variant ? std::string("_") + info.param.variant : "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, FlashSm90aEmulated, ::testing::ValuesIn(sm90a_cases()), sm90a_case_name);
INSTANTIATE_TEST_SUITE_P(Variants, FlashSm90aEmulated, ::testing::ValuesIn(variant_cases()), sm90a_case_name);

// Every variant applies somewhere (its case above exists), and is selected there only when named.
TEST(ShapeTables, VariantsRunOnlyWhereNamedAndApplicable) {
  const std::vector<Sm90aCase> vc = variant_cases();
  int n = 0;
  auto check = [&](auto tag, auto select) {
    using S = typename decltype(tag)::type;
    ++n;
    const auto it = std::find_if(vc.begin(), vc.end(), [](const Sm90aCase& e) { return std::string(e.variant) == S::name; });
    ASSERT_NE(it, vc.end()) << S::name << " applies at no case";
    const Case& c = it->shape;
    EXPECT_EQ(std::string(select(c.D, c.causal, table_t(c.T), S::name)), S::name);
    EXPECT_NE(std::string(select(c.D, c.causal, table_t(c.T), nullptr)), S::name) << "a variant is not in a table";
    const int64_t other_d = S::head_dim == 64 ? 128 : 64;
    EXPECT_NE(std::string(select(other_d, c.causal, table_t(c.T), S::name)), S::name) << "only at its head dim";
    EXPECT_TRUE(flash::is_sm90a_variant(S::name));
  };
  flash::for_each_shape(flash::FwdVariants{}, [&](auto tag) { check(tag, flash::fwd_shape); });
  flash::for_each_shape(flash::DkdvVariants{}, [&](auto tag) { check(tag, flash::dkdv_shape); });
  flash::for_each_shape(flash::DqVariants{}, [&](auto tag) { check(tag, flash::dq_shape); });
  EXPECT_EQ(n, 9);
  EXPECT_FALSE(flash::is_sm90a_variant("fwd_d64")) << "table shapes are not variants";
  EXPECT_FALSE(flash::is_sm90a_variant("no_such_variant"));
  // Numbered from 1 in the order of the lists (FlashAttentionParams::variant), 0 for none.
  for (int id = 1; id <= n; ++id) EXPECT_EQ(flash::variant_id(flash::variant_name(id)), id);
  EXPECT_EQ(flash::variant_name(0), nullptr);
  EXPECT_EQ(flash::variant_name(n + 1), nullptr);
  EXPECT_EQ(flash::variant_id("fwd_d64"), 0);
  // The pointers, the two modes, B, T, H, D, scale with causal and the variant, the eight row
  // strides, the window, doc_start and longest_document.
  static_assert(sizeof(FlashAttentionParams) == 10 * 8 + 2 * 4 + 4 * 8 + 8 + 8 * 8 + 3 * 8,
                "variant in the padding after causal");
}

// The emulator's own check on wgmma operands: a product whose shared-memory operand tile, register
// A fragments or accumulator are written between its issue and its wait (the hardware may read
// them at any time until then) is reported; the same product with the write after the wait is
// not, and gives A · B.
TEST(EmulatedWgmma, OperandWrittenBeforeTheWaitIsReported) {
  enum Write { kSmemA, kRegisterA, kAccumulator };
  for (Write what : {kSmemA, kRegisterA, kAccumulator})
    for (bool write_before_wait : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "operand " << int(what) << (write_before_wait ? ", before" : ", after")
                                        << " the wait");
      flash::sm90::emu_abort_on_hazard = false;
      flash::sm90::emu_hazards = 0;
      std::vector<float> d00(2);
      // A (64 × 16) all 1 and B (64 × 16), row n all n / 64: K-major, 128-byte swizzled rows of
      // 16 bf16 (32 of the 128 bytes used), at shared offsets 0 and 8192.
      emu_launch({1, 1, 1}, 128, 16384, [&] {
        const int t = int(threadIdx.x);
        const uint16_t one = tg::float_to_bf16(1.0f).bits, bn = tg::float_to_bf16(float(t % 64) / 64.0f).bits;
        for (int k = 0; k < 16 && t < 64; ++k) {
          const uint32_t a_at = uint32_t(t) * 128 + 2u * uint32_t(k), b_at = 8192 + a_at;
          std::memcpy(emu_smem + (a_at ^ (((a_at >> 7) & 7u) << 4)), &one, 2);
          std::memcpy(emu_smem + (b_at ^ (((b_at >> 7) & 7u) << 4)), &bn, 2);
        }
        __syncthreads();
        // 128-byte swizzle, 1024 bytes per 8 rows.
        auto desc = [](uint32_t start) { return (uint64_t(1) << 62) | (uint64_t(1024 >> 4) << 32) | (start >> 4); };
        float acc[32] = {};
        uint32_t a_frag[4];  // A as register fragments: every element 1 (two bf16 ones per word)
        for (uint32_t& w : a_frag) w = uint32_t(one) | (uint32_t(one) << 16);
        flash::sm90::wgmma_fence();
        if (what == kRegisterA)
          flash::sm90::wgmma_m64n64k16_rs<0>(acc, a_frag, desc(8192), false);
        else
          flash::sm90::wgmma_m64n64k16_ss<0>(acc, desc(0), desc(8192), false);
        flash::sm90::wgmma_commit();
        auto write = [&] {
          __syncthreads();
          if (what == kSmemA && t == 0) std::memset(emu_smem, 0, 64 * 128);
          if (what == kRegisterA) a_frag[0] = 0;
          if (what == kAccumulator) acc[5] = 7.0f;
          __syncthreads();
        };
        if (write_before_wait) write();
        flash::sm90::wgmma_wait<0>();
        if (t == 0) d00 = {acc[0], acc[1]};
        if (!write_before_wait) write();
      });
      flash::sm90::emu_abort_on_hazard = true;
      EXPECT_EQ(flash::sm90::emu_hazards.load(), write_before_wait ? 128 : 0);
      // Thread 0's first two elements: row 0, columns 0 and 1: Σ_k 1 · n / 64 = 0 and 16 / 64.
      EXPECT_EQ(d00[0], 0.0f);
      EXPECT_EQ(d00[1], 16.0f / 64.0f);
    }
}

// The emulator's check on mbarrier waits: a thread that waits twice in a row for the same parity
// (a phase skipped, which a parity wait cannot tell from the one two phases later) is reported;
// waits that alternate are not.
TEST(EmulatedMbarrier, PhaseSkippedIsReported) {
  for (bool skip : {false, true}) {
    SCOPED_TRACE(skip ? "a phase skipped" : "every phase waited for");
    flash::sm90::emu_abort_on_hazard = false;
    flash::sm90::emu_hazards = 0;
    emu_launch({1, 1, 1}, 32, 64, [&] {
      uint64_t* bar = reinterpret_cast<uint64_t*>(emu_smem);
      if (threadIdx.x == 0) flash::sm90::mbarrier_init(bar, 1);
      __syncthreads();
      for (int phase = 0; phase < 4; ++phase) {
        if (threadIdx.x == 1) flash::sm90::mbarrier_arrive(bar);  // completes the phase
        if (threadIdx.x == 0 && (!skip || phase % 2 == 0)) flash::sm90::mbarrier_wait(bar, uint32_t(phase) & 1);
        __syncthreads();
      }
    });
    flash::sm90::emu_abort_on_hazard = true;
    EXPECT_EQ(flash::sm90::emu_hazards.load(), skip ? 1 : 0);
  }
}

// The persistent kernels' causal item order (sm90::causal_item_tile): every (head, batch, tile)
// exactly once; groups of the fewest heads that hold group_items items, consecutive in b·H + h,
// each group's items heaviest first (tile index rising, or falling with heaviest_last), the head
// fastest; with no group size, every head in one group (the order before groups).
TEST(CausalItemOrder, GroupsOfHeadsHeaviestFirst) {
  struct Shape {
    int H, B, n_tiles, group_items;
  };
  for (const Shape s : {Shape{3, 2, 5, 0}, Shape{3, 2, 5, 12}, Shape{16, 2, 3, 24}, Shape{16, 1, 5, 24},
                        Shape{7, 3, 4, 1}, Shape{32, 4, 32, 1056}, Shape{16, 1, 128, 1056}, Shape{5, 1, 2000, 1056}})
    for (bool heaviest_last : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "H " << s.H << " B " << s.B << " tiles " << s.n_tiles << " group "
                                        << s.group_items << " heaviest_last " << heaviest_last);
      const int HB = s.H * s.B, n = HB * s.n_tiles;
      const int G = s.group_items > 0 ? std::min(HB, std::max(1, (s.group_items + s.n_tiles - 1) / s.n_tiles)) : HB;
      std::vector<int> seen(size_t(n), 0);
      for (int w = 0; w < n; ++w) {
        const flash::sm90::ItemTile t = flash::sm90::causal_item_tile(w, s.H, s.B, s.n_tiles, 10, heaviest_last,
                                                                      s.group_items);
        ASSERT_TRUE(t.h >= 0 && t.h < s.H && t.b >= 0 && t.b < s.B && t.row0 % 10 == 0);
        const int hb = t.b * s.H + t.h, tile = t.row0 / 10;
        ASSERT_TRUE(tile >= 0 && tile < s.n_tiles);
        ++seen[size_t(hb * s.n_tiles + tile)];
        const int group = w / (G * s.n_tiles), heads = std::min(G, HB - group * G);
        const int r = w - group * G * s.n_tiles;
        EXPECT_EQ(hb, group * G + r % heads) << w;  // the group's heads, the head fastest
        EXPECT_EQ(heaviest_last ? s.n_tiles - 1 - tile : tile, r / heads) << w;  // heaviest first
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n) << "every item exactly once";
      if (s.group_items <= 0)
        for (int w = 0; w < n; ++w) {  // one group: head w % H, batch (w / H) % B, tile w / (H · B)
          const flash::sm90::ItemTile t = flash::sm90::causal_item_tile(w, s.H, s.B, s.n_tiles, 1, false, 0);
          EXPECT_TRUE(t.h == w % s.H && t.b == (w / s.H) % s.B && t.row0 == w / HB) << w;
        }
    }
}

// The shape tables (sm90_shapes.h): each (head dim, mask, T) the wgmma kernels take has a shape,
// and the thresholds fall where docs/kernels.md §4.2 puts them.
TEST(ShapeTables, EveryCaseHasTheDocumentedShape) {
  auto str = [](const char* s) { return std::string(s ? s : "(none)"); };
  for (int64_t D : {64, 96, 128})
    for (bool causal : {false, true})
      for (int64_t T : {1, 17, 1023, 1024, 1025, 2047, 2048, 4096, 32768}) {
        EXPECT_NE(flash::fwd_shape(D, causal, T), nullptr) << D << " " << causal << " " << T;
        EXPECT_NE(flash::dkdv_shape(D, causal, T), nullptr) << D << " " << causal << " " << T;
        EXPECT_NE(flash::dq_shape(D, causal, T), nullptr) << D << " " << causal << " " << T;
        EXPECT_EQ(flash::dkdv_atomic_shape(D, causal, T) != nullptr, D != 96) << D << " " << causal << " " << T;
      }
  EXPECT_EQ(str(flash::fwd_shape(64, true, 1024)), "fwd_d64_short_causal");
  EXPECT_EQ(str(flash::fwd_shape(64, true, 1025)), "fwd_d64");
  EXPECT_EQ(str(flash::fwd_shape(64, false, 17)), "fwd_d64");
  EXPECT_EQ(str(flash::fwd_shape(128, true, 17)), "fwd_d128_causal");
  EXPECT_EQ(str(flash::fwd_shape(128, false, 8192)), "fwd_d128_noncausal");
  EXPECT_EQ(str(flash::fwd_shape(96, true, 8192)), "fwd_d96_causal");
  EXPECT_EQ(str(flash::fwd_shape(96, false, 8192)), "fwd_d96_noncausal");
  EXPECT_EQ(str(flash::dkdv_shape(64, true, 2047)), "dkdv_d64");
  EXPECT_EQ(str(flash::dkdv_shape(64, true, 2048)), "dkdv_d64_long_causal");
  EXPECT_EQ(str(flash::dkdv_shape(64, false, 2048)), "dkdv_d64_long_noncausal");
  EXPECT_EQ(str(flash::dkdv_shape(128, true, 2048)), "dkdv_d128");
  EXPECT_EQ(str(flash::dkdv_shape(96, false, 17)), "dkdv_d96");
  EXPECT_EQ(str(flash::dq_shape(64, false, 2047)), "dq_d64");
  EXPECT_EQ(str(flash::dq_shape(64, true, 2048)), "dq_d64_long");
  EXPECT_EQ(str(flash::dq_shape(128, true, 1)), "dq_d128");
  EXPECT_EQ(str(flash::dq_shape(96, true, 1)), "dq_d96");
  EXPECT_EQ(flash::fwd_shape(32, true, 1024), nullptr) << "head dim 32 has no wgmma shape";
}

// The mma.sync tables (mma_shapes.h): one shape per head dim and kernel, with the tiles
// docs/kernels.md §4.1 documents, as the traits derive them.
TEST(MmaShapeTables, EveryHeadDimHasTheDocumentedShape) {
  auto fwd = [](auto tr, const char* name, int threads, int br, int bc, bool q_regs, int min_blocks) {
    using Tr = decltype(tr);
    EXPECT_EQ(std::string(Tr::shape::name), name);
    EXPECT_EQ(Tr::kThreads, threads) << name;
    EXPECT_EQ(Tr::kBr, br) << name;
    EXPECT_EQ(Tr::kBc, bc) << name;
    EXPECT_EQ(Tr::kQInRegs, q_regs) << name;
    EXPECT_EQ(Tr::kMinBlocks, min_blocks) << name;
  };
  fwd(flash::FwdConfig<32>{}, "mma_fwd_d32", 128, 128, 64, true, 3);
  fwd(flash::FwdConfig<64>{}, "mma_fwd_d64", 128, 128, 64, true, 2);
  fwd(flash::FwdConfig<96>{}, "mma_fwd_d96", 128, 128, 64, false, 2);
  fwd(flash::FwdConfig<128>{}, "mma_fwd_d128", 128, 128, 32, false, 2);
  auto bwd = [](auto tr, const char* name, int threads, int own, int row_blocks, int stream) {
    using Tr = decltype(tr);
    EXPECT_EQ(std::string(Tr::shape::name), name);
    EXPECT_EQ(Tr::kThreads, threads) << name;
    EXPECT_EQ(Tr::kOwn, own) << name;
    EXPECT_EQ(Tr::kRowBlocks, row_blocks) << name;
    EXPECT_EQ(Tr::kStream, stream) << name;
  };
  bwd(flash::DkdvConfig<32>{}, "mma_dkdv_d32", 128, 128, 2, 32);
  bwd(flash::DkdvConfig<64>{}, "mma_dkdv_d64", 128, 128, 2, 32);
  bwd(flash::DkdvConfig<96>{}, "mma_dkdv_d96", 192, 96, 1, 32);
  bwd(flash::DkdvConfig<128>{}, "mma_dkdv_d128", 128, 64, 1, 32);
  bwd(flash::DqConfig<32>{}, "mma_dq_d32", 128, 128, 2, 32);
  bwd(flash::DqConfig<64>{}, "mma_dq_d64", 128, 128, 2, 32);
  bwd(flash::DqConfig<96>{}, "mma_dq_d96", 128, 128, 2, 32);
  bwd(flash::DqConfig<128>{}, "mma_dq_d128", 128, 128, 2, 32);
  EXPECT_TRUE(flash::kMmaSyncAtomicDq<32> && flash::kMmaSyncAtomicDq<64> && flash::kMmaSyncAtomicDq<128>);
  EXPECT_FALSE(flash::kMmaSyncAtomicDq<96>);
  // A head dim no table holds selects nothing (the launchers are instantiated only for these four).
  EXPECT_TRUE((std::is_void_v<flash::mma_fwd_shape<80>>));
  EXPECT_TRUE((std::is_void_v<flash::mma_dkdv_shape<80>>));
  EXPECT_TRUE((std::is_void_v<flash::mma_dq_shape<80>>));
}

// The non-causal forward's products over T's last K/V tile (flash::fwd_last_tile_keys): on
// 176-key tiles the narrowest of 64, 128 and 176 keys that holds the T − (n_kb − 1)·176 keys of
// T's last tile, and the whole tile where it is the item's only one; whole tiles on 128-key ones.
// Checked against that definition over every T to 2000, and at the benchmark's lengths.
TEST(ForwardLastTile, NarrowestWidthThatHoldsTsLastTile) {
  using Wide = flash::FwdSm90aTraits<flash::FwdD128NonCausal>;  // 176-key tiles
  using Narrow = flash::FwdSm90aTraits<flash::FwdD64>;           // 128-key tiles
  static_assert(Wide::kBc == 176 && Narrow::kBc == 128, "the shapes this test is about");
  for (int64_t T = 1; T <= 2000; ++T) {
    const int64_t n_kb = (T + 175) / 176, last = T - (n_kb - 1) * 176;  // keys in T's last tile
    const int keys = flash::fwd_last_tile_keys<Wide>(T);
    EXPECT_TRUE(keys == 64 || keys == 128 || keys == 176) << T;
    EXPECT_GE(keys, last) << "T " << T << ": the products must reach every key";
    if (n_kb == 1) EXPECT_EQ(keys, 176) << T;
    else if (keys > 64) EXPECT_GT(last, keys == 176 ? 128 : 64) << "T " << T << ": a narrower width would hold it";
    EXPECT_EQ(flash::fwd_last_tile_keys<Narrow>(T), 128) << T;
  }
  // 1k: 144 keys in the last tile; 2k: 112; 4k: 48; 8k: 96; 16k: 16; 32k: 32.
  const std::pair<int64_t, int> expected[] = {{1024, 176}, {2048, 128}, {4096, 64}, {8192, 128}, {16384, 64}, {32768, 64}};
  for (const auto& [T, keys] : expected) EXPECT_EQ(flash::fwd_last_tile_keys<Wide>(T), keys) << T;
}

}  // namespace

namespace {

// ── Structured masks (mask.cuh): both kernel families, forward and both backward modes ──

// A mask: a sliding window (0: none) and documents whose lengths cycle through doc_lengths (none
// if empty), the pattern rotated by the batch row so that the rows differ.
struct MaskSpec {
  const char* name;
  int64_t window;
  std::vector<int> doc_lengths;
};
std::vector<int32_t> doc_starts(const MaskSpec& m, int64_t B, int64_t T) {
  std::vector<int32_t> out;
  if (m.doc_lengths.empty()) return out;
  out.resize(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    size_t next = size_t(b) % m.doc_lengths.size();
    int64_t start = 0, end = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (t == end) {
        start = t;
        end = t + m.doc_lengths[next];
        next = (next + 1) % m.doc_lengths.size();
      }
      out[size_t(b * T + t)] = int32_t(start);
    }
  }
  return out;
}

enum class Family { kMmaSync, kWgmma };
struct MaskedCase {
  Family family;
  int64_t B, T, H, D;
  MaskSpec mask;
  FlashDq dq_mode;
};
void PrintTo(const MaskedCase& e, std::ostream* os) {
  *os << (e.family == Family::kWgmma ? "wgmma" : "mma.sync") << " B" << e.B << " T" << e.T << " H" << e.H << " D"
      << e.D << " " << e.mask.name << (e.dq_mode == FlashDq::kAtomic ? " atomic dQ" : "");
}

struct Outputs {
  std::vector<tg::bf16> o, dq, dk, dv;
  std::vector<float> lse;
};
// Forward and backward of one family, every output poisoned first.
Outputs run_masked(const MaskedCase& mc, const Problem& pr, const int32_t* doc, int64_t window) {
  const tg::bf16 nan_bf16{0xFFFF};
  Outputs out{std::vector<tg::bf16>(pr.n, nan_bf16), std::vector<tg::bf16>(pr.n, nan_bf16),
              std::vector<tg::bf16>(pr.n, nan_bf16), std::vector<tg::bf16>(pr.n, nan_bf16),
              std::vector<float>(pr.n_lse, NAN)};
  const size_t ws_bytes = with_head_dim<32, 64, 96, 128>(
      mc.D, [&](auto d) { return flash::BwdWorkspace<d()>::bytes(mc.B, mc.T, mc.H, mc.dq_mode); });
  std::vector<float> workspace(ws_bytes / sizeof(float) + 4, NAN);
  FlashAttentionParams p{};
  p.q = pr.q.bits.data(), p.k = pr.k.bits.data(), p.v = pr.v.bits.data(), p.o = out.o.data(), p.lse = out.lse.data();
  p.dout = pr.dout.bits.data(), p.dq = out.dq.data(), p.dk = out.dk.data(), p.dv = out.dv.data();
  p.workspace = workspace.data();
  p.B = mc.B, p.T = mc.T, p.H = mc.H, p.D = mc.D, p.scale = float(pr.scale), p.causal = true;
  p.dq_mode = mc.dq_mode;
  p.window = window, p.doc_start = doc;
  if (mc.family == Family::kMmaSync) {
    with_head_dim<32, 64, 96, 128>(mc.D, [&](auto d) {
      forward<d()>(p);
      backward<d()>(p);
    });
  } else {
    with_head_dim<64, 96, 128>(mc.D, [&](auto d) {
      forward_sm90a(p);
      backward_sm90a<d()>(p);
    });
  }
  return out;
}

class FlashMaskedEmulated : public ::testing::TestWithParam<MaskedCase> {};

TEST_P(FlashMaskedEmulated, MatchesDoubleReference) {
  const MaskedCase& mc = GetParam();
  const Case c{mc.B, mc.T, mc.H, mc.D, true, 0.0};
  const Problem pr = make_problem(c);
  const std::vector<int32_t> doc = doc_starts(mc.mask, mc.B, mc.T);
  const int32_t* d = doc.empty() ? nullptr : doc.data();
  const Reference ref = reference(c, pr.scale, pr.q.val, pr.k.val, pr.v.val, pr.dout.val, d, mc.mask.window);
  const Outputs got = run_masked(mc, pr, d, mc.mask.window);
  expect_matches_reference(got.o, got.lse, got.dq, got.dk, got.dv, ref);
}

// One document over the whole sequence (doc_start all 0, or a window ≥ T) excludes nothing: the
// masked kernels must give the unmasked causal outputs bit for bit (no tile takes the mask).
class FlashMaskedBitwiseEmulated : public ::testing::TestWithParam<MaskedCase> {};
TEST_P(FlashMaskedBitwiseEmulated, WholeSequenceDocumentIsCausalBitForBit) {
  const MaskedCase& mc = GetParam();
  const Case c{mc.B, mc.T, mc.H, mc.D, true, 0.0};
  const Problem pr = make_problem(c);
  const std::vector<int32_t> whole(size_t(mc.B * mc.T), 0);
  const Outputs causal = run_masked(mc, pr, nullptr, 0);
  const Outputs doc = run_masked(mc, pr, whole.data(), 0);
  const Outputs wide = run_masked(mc, pr, nullptr, mc.T);
  auto bits = [](const std::vector<tg::bf16>& x) {
    std::vector<uint16_t> u(x.size());
    for (size_t i = 0; i < x.size(); ++i) u[i] = x[i].bits;
    return u;
  };
  for (const Outputs* m : {&doc, &wide}) {
    EXPECT_EQ(bits(m->o), bits(causal.o)) << "O";
    EXPECT_EQ(std::memcmp(m->lse.data(), causal.lse.data(), causal.lse.size() * sizeof(float)), 0) << "lse";
    EXPECT_EQ(bits(m->dq), bits(causal.dq)) << "dQ";
    EXPECT_EQ(bits(m->dk), bits(causal.dk)) << "dK";
    EXPECT_EQ(bits(m->dv), bits(causal.dv)) << "dV";
  }
}

// Windows inside a 16-row fragment, between the 64- and 128-row tiles and past them; documents of
// length 1 beside ones spanning several tiles; both masks at once; two batch rows whose documents
// differ. The wgmma kernels at T = 300 (their long shapes, several items per block, ragged tails),
// the mma.sync ones (slower to emulate) at T = 200 (2 tiles of 128 rows, 4 of 64, a ragged tail);
// both at T = 129 with two heads.
const std::vector<MaskSpec>& emu_masks() {
  static const std::vector<MaskSpec> masks = {
      {"window5", 5, {}},
      {"window100", 100, {}},
      {"window150", 150, {}},
      {"docs", 0, {1, 1, 3, 70, 1, 150, 2, 40, 1}},
      {"docs_window50", 50, {90, 1, 7, 200, 1, 1, 33}},
  };
  return masks;
}
std::vector<MaskedCase> masked_cases() {
  const std::vector<MaskSpec>& m = emu_masks();
  std::vector<MaskedCase> out;
  for (Family f : {Family::kMmaSync, Family::kWgmma}) {
    const int64_t T = f == Family::kWgmma ? 300 : 200;
    for (const MaskSpec& mask : m) out.push_back({f, 2, T, 1, 64, mask, FlashDq::kRecompute});
    for (int i : {0, 4}) out.push_back({f, 2, T, 1, 64, m[size_t(i)], FlashDq::kAtomic});
    for (int i : {1, 3}) out.push_back({f, 2, T, 1, 128, m[size_t(i)], FlashDq::kRecompute});
    out.push_back({f, 2, T, 1, 128, m[3], FlashDq::kAtomic});
    out.push_back({f, 1, 129, 2, 64, m[0], FlashDq::kRecompute});
  }
  // The mma.sync kernels' other head dims take the mask alike (96 has no atomic-dQ kernel).
  for (int64_t D : {32, 96}) out.push_back({Family::kMmaSync, 2, 200, 1, D, m[3], FlashDq::kRecompute});
  return out;
}
std::vector<MaskedCase> bitwise_cases() {
  std::vector<MaskedCase> out;
  const MaskSpec none{"whole_document", 0, {}};
  for (Family f : {Family::kMmaSync, Family::kWgmma})
    for (int64_t D : {64, 128}) out.push_back({f, 2, f == Family::kWgmma ? 300 : 200, 1, D, none, FlashDq::kRecompute});
  out.push_back({Family::kWgmma, 2, 300, 1, 64, none, FlashDq::kAtomic});
  return out;
}
std::string masked_case_name(const ::testing::TestParamInfo<MaskedCase>& info) {
  const MaskedCase& e = info.param;
  return std::string(e.family == Family::kWgmma ? "wgmma" : "mma_sync") + "_B" + std::to_string(e.B) + "_T" +
         std::to_string(e.T) + "_H" + std::to_string(e.H) + "_D" + std::to_string(e.D) + "_" + e.mask.name +
         (e.dq_mode == FlashDq::kAtomic ? "_atomic_dq" : "");
}
INSTANTIATE_TEST_SUITE_P(Masks, FlashMaskedEmulated, ::testing::ValuesIn(masked_cases()), masked_case_name);
INSTANTIATE_TEST_SUITE_P(Masks, FlashMaskedBitwiseEmulated, ::testing::ValuesIn(bitwise_cases()), masked_case_name);

// The block ranges against a brute-force count over a sequence of documents and windows.
TEST(SeqMaskRanges, MatchBruteForce) {
  const int T = 300;
  for (const MaskSpec& m : {MaskSpec{"w7", 7, {}}, MaskSpec{"docs", 0, {1, 1, 3, 70, 1, 150, 2, 40, 1}},
                            MaskSpec{"both", 50, {90, 1, 7, 200, 1}}}) {
    SCOPED_TRACE(m.name);
    const std::vector<int32_t> doc = doc_starts(m, 1, T);
    FlashAttentionParams p{};
    p.T = T, p.B = 1, p.window = m.window, p.doc_start = doc.empty() ? nullptr : doc.data();
    const flash::SeqMask sm = flash::seq_mask(p, 0);
    auto visible = [&](int q, int k) {
      int lo = doc.empty() ? 0 : doc[size_t(q)];
      if (m.window > 0) lo = std::max(lo, q - int(m.window) + 1);
      return lo <= k && k <= q;
    };
    for (int k = 0; k < T; ++k) {
      int end = k + 1;
      for (int q = k; q < T; ++q)
        if (visible(q, k)) end = q + 1;
      EXPECT_EQ(sm.query_end(k), end) << k;
    }
    for (int tile : {16, 64, 128})
      for (int t0 = 0; t0 < T; t0 += tile) {
        const flash::SeqMask::Range keys = sm.key_tiles(t0, tile, tile), queries = sm.query_tiles(t0, tile, tile);
        for (int other = 0; other * tile < T; ++other) {
          bool any_k = false, any_q = false;
          for (int q = t0; q < std::min(t0 + tile, T); ++q)
            for (int k = other * tile; k < std::min((other + 1) * tile, T); ++k) any_k |= visible(q, k);
          for (int k = t0; k < std::min(t0 + tile, T); ++k)
            for (int q = other * tile; q < std::min((other + 1) * tile, T); ++q) any_q |= visible(q, k);
          // Every visible tile is in range; the range's first tile and last are visible ones.
          if (any_k) EXPECT_TRUE(other >= keys.first && other < keys.end) << t0 << " keys " << other;
          if (any_q) EXPECT_TRUE(other >= queries.first && other < queries.end) << t0 << " queries " << other;
          if (other == keys.first || other == keys.end - 1) EXPECT_TRUE(any_k) << t0 << " keys " << other;
          if (other == queries.first || other == queries.end - 1) EXPECT_TRUE(any_q) << t0 << " queries " << other;
        }
      }
  }
}

}  // namespace
