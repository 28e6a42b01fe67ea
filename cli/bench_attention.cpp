// `tilegrad bench attention`: the FlashAttention kernels' forward and backward TFLOP/s on the
// shapes and FLOP conventions of bench/reference/torch_attention.py (and, with --window/--docs,
// torch_flex_attention.py).
#include "cli/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#ifdef TILEGRAD_HAVE_CUDA
#include "kernels/cuda/check.cuh"
#endif
#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/flash_attention/flash.h"
#include "src/tensor/dispatch.h"

namespace tg {

namespace {
#ifdef TILEGRAD_HAVE_CUDA
// A bf16 tensor of uniform values in [−1, 1) from a xorshift stream (fast enough for 100 M elements).
Tensor random_bf16(const Shape& shape, uint64_t seed, Device device) {
  Tensor host = Tensor::empty(shape, DType::bf16);
  bf16* p = host.data<bf16>();
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (int64_t i = 0; i < host.numel(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = float_to_bf16(float(x >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
  return host.to(device);
}

// The reference attention benchmark's timing (PyTorch's torch_attention.py): `warm` untimed calls, then per timed call CUDA
// events recorded around it on the stream and a synchronisation, the median of `runs`.
template <typename F>
double median_event_seconds(int64_t runs, int64_t warm, F&& f) {
  for (int64_t i = 0; i < warm; ++i) f();
  TG_CUDA_CHECK(cudaStreamSynchronize(detail::cuda_stream()));
  cudaEvent_t start, stop;
  TG_CUDA_CHECK(cudaEventCreate(&start));
  TG_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> t;
  for (int64_t i = 0; i < runs; ++i) {
    TG_CUDA_CHECK(cudaEventRecord(start, detail::cuda_stream()));
    f();
    TG_CUDA_CHECK(cudaEventRecord(stop, detail::cuda_stream()));
    TG_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    TG_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    t.push_back(ms * 1e-3);
  }
  TG_CUDA_CHECK(cudaEventDestroy(start));
  TG_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
#endif

template <typename F>
double median_seconds(int64_t runs, Device device, F&& f) {
  std::vector<double> t;
  for (int64_t i = 0; i < runs; ++i) {
    device_synchronize(device);
    auto t0 = std::chrono::steady_clock::now();
    f();
    device_synchronize(device);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int bench_attention(const cli::Args& a) {
  // The options first, so that a bad one is named whatever the machine.
  const int64_t runs = a.get_int("steps", 20), max_t = a.get_int("max-t", 32768);
  // --protocol sustained (default): warm-up forward + backward pairs, then `runs` forwards,
  // `runs` deterministic and `runs` atomic backwards back to back, each call timed on the host
  // between synchronisations. reference: torch_attention.py's — per mode the forward timed alone
  // (5 warm-up calls, `runs` timed), then forward + backward (3 warm-up calls, runs / 2 timed),
  // the backward the difference of the medians, CUDA events around each call. The sustained
  // one keeps the board at its power cap through a shape's three modes, which the reference's
  // shorter passes might not; measured side by side in one call the two agree (geometric means
  // 0.987–1.005 per column, docs/kernels.md §3), and the sustained one
  // times the backward directly, without the difference's noise, so it stays the default.
  const std::string protocol = a.get("protocol", "sustained");
  const bool sustained = protocol == "sustained";
  const int64_t warm_fwd = a.get_int("warmup", sustained ? 3 : 5), warm_fb = a.get_int("warmup", 3);
  const int64_t min_t = a.get_int("min-t", 1024);  // e.g. --min-t 8192 --max-t 8192: one T (for ncu)
  const int64_t only_d = a.get_int("head-dim", 0);  // 0: 64 and 128
  const int64_t masks = a.get_int("causal", 2);     // 1: causal only, 0: non-causal only, 2: both
  // --variant NAME: a shape of the wgmma kernels' development registry (cuda::flash_attention_variants,
  // docs/kernels.md §4.4) instead of the one the launchers select, wherever it applies; the others
  // run the launchers' shapes. tools/attention_ab.sh compares variants so, from one binary.
  const std::string variant = a.get("variant", "");
  // --window W, --docs N: the structured masks (causal only): a sliding window of W keys, and N
  // equal documents per row (doc_start built accordingly). Each masked shape is timed beside the
  // same shape's full causal attention; its TF/s count the visible (query, key) pairs exactly.
  const int64_t window = a.get_int("window", 0), docs = a.get_int("docs", 0);
  const bool masked = window > 0 || docs > 0;
  const char* fn = "tilegrad bench attention";
  TG_CHECK(window >= 0 && docs >= 0, fn, ": --window and --docs must be ≥ 0");
  TG_CHECK(!masked || masks != 0, fn, ": --window and --docs are causal masks; --causal 0 times nothing");
  TG_CHECK(runs >= 1, fn, ": --steps ", runs, " times nothing; give at least 1");
  TG_CHECK(only_d == 0 || only_d == 32 || only_d == 64 || only_d == 96 || only_d == 128, fn, ": --head-dim ", only_d,
           " has no kernel; give 32, 64, 96, 128 or 0 (64 and 128)");
  TG_CHECK(max_t >= 1024, fn, ": --max-t ", max_t, " is below the shortest shape (T = 1024)");
  TG_CHECK(min_t <= max_t, fn, ": --min-t ", min_t, " exceeds --max-t ", max_t, "; no shape would run");
  TG_CHECK(sustained || protocol == "reference", fn, ": --protocol ", protocol, " is unknown; give reference or sustained");
  TG_CHECK(warm_fwd >= 0 && warm_fb >= 0, fn, ": --warmup is negative");
  TG_CHECK(masks >= 0 && masks <= 2, fn, ": --causal takes 1 (causal only), 0 (non-causal only) or 2 (both), got ",
           masks);
#ifdef TILEGRAD_HAVE_CUDA
  const int variant_id = variant.empty() ? 0 : cuda::flash_attention_variant(variant);
  if (!variant.empty() && variant_id == 0) {
    std::string names;
    for (const cuda::FlashVariant& v : cuda::flash_attention_variants()) names += " " + v.name;
    TG_CHECK(false, fn, ": --variant ", variant, " is not in the registry; give one of:", names);
  }
  TG_CHECK(cuda_device_count() > 0, fn, ": needs a CUDA GPU");
  const Device dev = Device::cuda(0);
  // bwd: the default, deterministic backward (dQ in a pass of its own); atomic: the opt-in
  // backward that adds dQ with unordered atomics (FlashDq::kAtomic, train.deterministic: false;
  // --atomic 2: FlashDq::kAtomicKernel, its kernel also where kAtomic takes the deterministic one).
  // The kernels flash attention takes on this GPU (FlashKernels::kAuto: wgmma on an H100/H200);
  // --compare 1 also times the portable mma.sync kernels (fwd/bwd mma.sync TF/s) on the same inputs.
  const bool compare = a.get_int("compare", 0) != 0;
  const bool backward = a.get_int("backward", 1) != 0;  // 0: the forward alone (backward columns 0)
  const int64_t atomic_arg = a.get_int("atomic", 1);
  TG_CHECK(atomic_arg >= 0 && atomic_arg <= 2, fn, ": --atomic takes 0, 1 or 2, got ", atomic_arg);
  const bool atomic = backward && atomic_arg != 0;  // 0: not the opt-in atomic backward (column 0)
  const cuda::FlashDq atomic_mode = atomic_arg == 2 ? cuda::FlashDq::kAtomicKernel : cuda::FlashDq::kAtomic;
  std::printf("%-4s %-6s %-7s %-9s %-9s %-9s %-9s %-10s%s%s\n", "d", "T", "causal", "fwd ms", "bwd ms", "fwd TF/s",
              "bwd TF/s", "atomic TF/s", compare ? " mma.sync fwd / bwd TF/s" : "",
              masked ? " | full causal: fwd ms, bwd ms, fwd TF/s, bwd TF/s" : "");
  // Head dims 32 and 96 only when asked for: the reference benchmark's shapes (torch_attention.py) are
  // 64 and 128 (hidden 2048: 2048 / 96 is not whole, so d 96 runs 21 heads, hidden 2016).
  for (int64_t D : {32, 64, 96, 128}) {
    if (only_d == 0 ? D == 32 || D == 96 : D != only_d) continue;
    const int64_t H = 2048 / D;
    for (int64_t T = 1024; T <= max_t; T *= 2) {
      if (T < min_t) continue;
      const int64_t B = std::max<int64_t>(1, 16384 / T);
      Tensor q = random_bf16({B, T, H, D}, 1, dev), k = random_bf16({B, T, H, D}, 2, dev),
             v = random_bf16({B, T, H, D}, 3, dev), dout = random_bf16({B, T, H, D}, 4, dev);
      Tensor o = Tensor::empty(q.shape(), DType::bf16, dev), lse = Tensor::empty({B, H, T}, DType::f32, dev);
      Tensor dq = Tensor::empty(q.shape(), DType::bf16, dev), dk = Tensor::empty(q.shape(), DType::bf16, dev),
             dv = Tensor::empty(q.shape(), DType::bf16, dev);
      // Sized for the atomic mode, which also serves the default.
      const size_t ws_bytes = cuda::flash_attention_backward_workspace_bytes(B, T, H, D, cuda::FlashDq::kAtomic);
      Tensor ws = Tensor::empty({int64_t(ws_bytes / 4 + 4)}, DType::f32, dev);
      // --docs N: N equal documents per row (the last one shorter when N does not divide T).
      Tensor doc_start;
      std::vector<int32_t> starts;
      if (docs > 0) {
        const int64_t len = (T + docs - 1) / docs;
        starts.resize(size_t(B * T));
        for (int64_t b = 0; b < B; ++b)
          for (int64_t t = 0; t < T; ++t) starts[size_t(b * T + t)] = int32_t(t / len * len);
        doc_start = Tensor::from_ints(starts, {B, T}).to(dev);
      }
      // The visible (query, key) pairs of the mask, counted exactly from lo(i): Σ (i − lo(i) + 1).
      double visible = 0;
      if (masked)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < T; ++i) {
            int64_t lo = docs > 0 ? starts[size_t(b * T + i)] : 0;
            if (window > 0) lo = std::max<int64_t>(lo, i - window + 1);
            visible += double(i - lo + 1);
          }
      for (bool causal : {true, false}) {
        if (masks != 2 && causal != (masks == 1)) continue;
        if (masked && !causal) continue;
        cuda::FlashAttentionParams p{};
        p.q = q.data<bf16>(), p.k = k.data<bf16>(), p.v = v.data<bf16>(), p.o = o.data<bf16>();
        p.lse = lse.data<float>(), p.dout = dout.data<bf16>(), p.dq = dq.data<bf16>(), p.dk = dk.data<bf16>();
        p.dv = dv.data<bf16>(), p.workspace = ws.raw();
        p.B = B, p.T = T, p.H = H, p.D = D, p.scale = float(1.0 / std::sqrt(double(D))), p.causal = causal;
        p.variant = uint8_t(variant_id);
        auto fwd = [&] { cuda::flash_attention_forward(p, detail::cuda_stream()); };
        auto bwd = [&] { cuda::flash_attention_backward(p, detail::cuda_stream()); };
        // Seconds of one forward, and of one backward given the forward's (the reference
        // protocol subtracts it), with the current p.kernels and p.dq_mode.
        auto time_fwd = [&] {
          if (sustained) {
            for (int64_t i = 0; i < warm_fwd; ++i) {
              fwd();
              if (backward) bwd();
            }
            return median_seconds(runs, dev, fwd);
          }
          return median_event_seconds(runs, warm_fwd, fwd);
        };
        auto time_bwd = [&](double tf) {
          if (sustained) return median_seconds(runs, dev, bwd);
          const double tfb = median_event_seconds(std::max<int64_t>(1, runs / 2), warm_fb, [&] { fwd(), bwd(); });
          return std::max(tfb - tf, 1e-9);
        };
        // Masked: the same shape's full causal attention first, then the mask.
        double tf_full = 0, tb_full = 0;
        if (masked) {
          tf_full = time_fwd(), tb_full = backward ? time_bwd(tf_full) : 0.0;
          p.window = window;
          p.doc_start = docs > 0 ? doc_start.data<int32_t>() : nullptr;
          p.longest_document = docs > 0 ? cpu::longest_document(starts.data(), B, T) : 0;
        }
        const double tf = time_fwd();
        const double tb = backward ? time_bwd(tf) : 0.0;  // 0: not timed
        p.dq_mode = atomic_mode;
        const double tb_atomic = atomic ? time_bwd(tf) : 0.0;
        p.dq_mode = cuda::FlashDq::kRecompute;
        double tf_mma = 0, tb_mma = 0;
        if (compare) {
          p.kernels = cuda::FlashKernels::kMmaSync;
          tf_mma = time_fwd(), tb_mma = time_bwd(tf_mma);
          p.kernels = cuda::FlashKernels::kAuto;
        }
        // FlashAttention papers' convention: 4·B·H·T²·d forward, halved when causal; backward 2.5×.
        // Masked: 4·H·d per visible (query, key) pair, counted exactly (the full causal beside it
        // keeps the convention).
        const double full_flops = 4.0 * double(B * H) * double(T) * double(T) * double(D) / (causal ? 2.0 : 1.0);
        const double flops = masked ? 4.0 * double(H) * double(D) * visible : full_flops;
        const double bf = 2.5 * flops / 1e12;
        auto rate = [](double tflop, double seconds) { return seconds > 0 ? tflop / seconds : 0.0; };
        std::printf("%-4lld %-6lld %-7s %-9.3f %-9.3f %-9.1f %-9.1f %-10.1f", (long long)D, (long long)T,
                    masked ? "masked" : causal ? "yes" : "no", tf * 1e3, tb * 1e3, flops / tf / 1e12, rate(bf, tb),
                    rate(bf, tb_atomic));
        if (compare) std::printf(" %-7.1f %-7.1f", flops / tf_mma / 1e12, bf / tb_mma);
        if (masked)
          std::printf(" | %-9.3f %-9.3f %-9.1f %-9.1f", tf_full * 1e3, tb_full * 1e3, full_flops / tf_full / 1e12,
                      rate(2.5 * full_flops / 1e12, tb_full));
        std::printf("\n");
        std::printf("{\"bench\":\"attention\",\"impl\":\"tilegrad\",\"variant\":\"%s\",\"d\":%lld,\"T\":%lld,"
                    "\"B\":%lld,\"H\":%lld,\"protocol\":\"%s\",\"causal\":%s,\"fwd_ms\":%.4f,\"bwd_ms\":%.4f,\"fwd_tflops\":%.1f,\"bwd_tflops\":%.1f,"
                    "\"bwd_atomic_tflops\":%.1f",
                    variant.empty() ? "default" : variant.c_str(), (long long)D, (long long)T, (long long)B, (long long)H,
                    protocol.c_str(), causal ? "true" : "false", tf * 1e3,
                    tb * 1e3, flops / tf / 1e12, rate(bf, tb), rate(bf, tb_atomic));
        if (compare)
          std::printf(",\"fwd_mma_sync_tflops\":%.1f,\"bwd_mma_sync_tflops\":%.1f", flops / tf_mma / 1e12, bf / tb_mma);
        if (masked)
          std::printf(",\"window\":%lld,\"docs\":%lld,\"visible_fraction\":%.4f,\"causal_fwd_ms\":%.4f,"
                      "\"causal_bwd_ms\":%.4f,\"causal_fwd_tflops\":%.1f,\"causal_bwd_tflops\":%.1f",
                      (long long)window, (long long)docs, visible / (double(B) * double(T) * double(T + 1) / 2.0),
                      tf_full * 1e3, tb_full * 1e3, full_flops / tf_full / 1e12, rate(2.5 * full_flops / 1e12, tb_full));
        std::printf("}\n");
        std::fflush(stdout);
      }
    }
  }
  return 0;
#else
  TG_CHECK(false, fn, ": this tilegrad was built without CUDA");
  return 1;
#endif
}

}  // namespace tg
