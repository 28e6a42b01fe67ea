// Attention on (B, T, H, D): the materialised reference, the fused FlashAttention op (CPU
// kernel, or the CUDA tensor-core kernel for bf16 at head dims 32, 64, 96 and 128), and self-attention
// straight from the fused qkv projection.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <iostream>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/flash_attention.h"
#include "kernels/cuda/flash_attention/flash.h"
#include "kernels/cuda/layout.h"
#include "src/ops/ops.h"
#include "src/tensor/dispatch.h"

namespace tg::ops {

using detail::check_defined;
using detail::check_same;
using detail::cuda_stream;
using detail::dispatch;
using detail::empty_like;

namespace {
std::atomic<bool> g_deterministic{true};
}  // namespace
void set_deterministic(bool on) { g_deterministic = on; }
bool deterministic() { return g_deterministic; }

namespace {
#ifdef TILEGRAD_HAVE_CUDA
// The GPU backward's dQ strategy under the process-wide determinism setting.
cuda::FlashDq flash_dq_mode() { return deterministic() ? cuda::FlashDq::kRecompute : cuda::FlashDq::kAtomic; }
#endif

void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_defined(op, q, "q");
  check_defined(op, k, "k");
  check_defined(op, v, "v");
  check_same(op, q, k);
  check_same(op, q, v);
  TG_CHECK(q.dim() == 4, op, ": q must be (B, T, H, D), got ", q.desc());
  TG_CHECK(k.shape() == q.shape() && v.shape() == q.shape(), op, ": q, k, v shapes differ: ",
           shape_str(q.shape()), ", ", shape_str(k.shape()), ", ", shape_str(v.shape()));
}

// The fused kernel covers every CPU tensor, and on the GPU bf16 at the head dims it was built
// for. Anything else takes the materialised path, and says so once per shape: an unusual head
// dimension must never leave the fast path silently.
// `heads` is the (B, T, H, D) shape of q.
bool fused_kernel_covers(const Tensor& like, const Shape& heads) {
  if (like.device().is_cpu()) return true;
#ifdef TILEGRAD_HAVE_CUDA
  if (like.dtype() == DType::bf16 && cuda::flash_attention_supported(heads[3])) return true;
#endif
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard<std::mutex> lock(mu);
  const std::string what = std::string(dtype_name(like.dtype())) + shape_str(heads) + " on " + like.device().str();
  if (warned.insert(what).second)
    std::cerr << "tilegrad: warning: no fused GPU attention kernel for q " << what
              << " (it covers bf16 with head dim 32, 64, 96 or 128); using the materialised attention (T×T scores)"
              << std::endl;
  return false;
}

// Validates a structured mask against q (B, T, H, D): causal only, document starts (B, T) i32 on
// the CPU with 0 ≤ start ≤ t that never decrease along a row (and, when given, their device copy
// of the same shape on q's device). Every device takes masks: the CPU and the fused GPU kernels
// as block ranges, the materialised attention as an additive bias.
void check_mask(const char* op, const Device& device, int64_t B, int64_t T, bool causal, const AttentionMask& mask) {
  TG_CHECK(mask.window >= 0, op, ": attention window ", mask.window, " is negative");
  if (!mask.any()) return;
  TG_CHECK(causal, op, ": structured attention masks (window, documents) combine with causal attention only");
  if (!mask.doc_start.defined()) return;
  if (mask.doc_start_device.defined()) {
    const Tensor& g = mask.doc_start_device;
    TG_CHECK(g.device() == device && g.dtype() == DType::i32 && g.dim() == 2 && g.size(0) == B && g.size(1) == T, op,
             ": the device copy of the document starts must be i32 (", B, ", ", T, ") on ", device.str(), ", got ",
             g.desc());
  }
  const Tensor& d = mask.doc_start;
  TG_CHECK(d.device().is_cpu() && d.dtype() == DType::i32 && d.dim() == 2 && d.size(0) == B && d.size(1) == T, op,
           ": document starts must be i32 (", B, ", ", T, ") on the CPU, got ", d.desc());
  const int32_t* p = d.data<int32_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int32_t s = p[b * T + t];
      TG_CHECK(s >= 0 && s <= t && (t == 0 || s >= p[b * T + t - 1]), op, ": document start ", s, " at row ", b,
               " position ", t, " must lie in [0, t] and never decrease along the row");
    }
}

cpu::AttentionShape shape_of(const Tensor& q, bool causal, const AttentionMask& mask = {}) {
  cpu::AttentionShape s{q.size(0), q.size(1), q.size(2), q.size(3), causal, 1.0 / std::sqrt(double(q.size(3)))};
  s.window = mask.window;
  s.doc_start = mask.doc_start.defined() ? mask.doc_start.data<int32_t>() : nullptr;
  return s;
}

// The materialised mask as an additive (B, H, T, T) bias in `like`'s dtype and on its device: 0
// where key j is visible to query i, −inf elsewhere (including the future).
Tensor mask_bias(const Tensor& like, const Shape& heads, const AttentionMask& mask) {
  const int64_t B = heads[0], T = heads[1], H = heads[2];
  const int32_t* d = mask.doc_start.defined() ? mask.doc_start.data<int32_t>() : nullptr;
  std::vector<double> bias(size_t(B * H * T * T), -INFINITY);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      int64_t lo = d ? d[b * T + i] : 0;
      if (mask.window > 0) lo = std::max<int64_t>(lo, i - mask.window + 1);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t j = lo; j <= i; ++j) bias[size_t(((b * H + h) * T + i) * T + j)] = 0.0;
    }
  Tensor out = Tensor::from_vector(bias, {B, H, T, T}, like.dtype());
  return like.device().is_cpu() ? out : out.to(like.device());
}

}  // namespace

// Copied here once per forward unless the caller (the GPT, once per step) already did; the
// backward keeps this copy.
AttentionMask on_device(const AttentionMask& mask, const Device& device) {
  if (device.is_cpu() || !mask.doc_start.defined() || mask.doc_start_device.defined()) return mask;
  AttentionMask m = mask;
  m.doc_start_device = mask.doc_start.to(device);
  m.longest_document = cpu::longest_document(mask.doc_start.data<int32_t>(), mask.doc_start.size(0), mask.doc_start.size(1));
  return m;
}

namespace {

#ifdef TILEGRAD_HAVE_CUDA
// The mask's fields of the kernels' parameters (the document starts from their device copy).
void set_gpu_mask(cuda::FlashAttentionParams& p, const AttentionMask& mask) {
  p.window = mask.window;
  p.doc_start = mask.doc_start_device.defined() ? mask.doc_start_device.data<int32_t>() : nullptr;
  p.longest_document = p.doc_start ? mask.longest_document : 0;
}

cuda::FlashAttentionParams gpu_params(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                      const AttentionMask& mask) {
  cuda::FlashAttentionParams p{};
  p.q = q.data<bf16>();
  p.k = k.data<bf16>();
  p.v = v.data<bf16>();
  p.B = q.size(0), p.T = q.size(1), p.H = q.size(2), p.D = q.size(3);
  p.scale = float(1.0 / std::sqrt(double(p.D)));
  p.causal = causal;
  set_gpu_mask(p, mask);
  return p;
}
#endif

// O (B, T, H, D) and the per-row log-sum-exp L (B, H, T): all the backward needs. On the GPU the
// mask's document starts are read from doc_start_device (on_device).
std::pair<Tensor, Tensor> flash_forward(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                        const AttentionMask& mask = {}) {
  Tensor o = empty_like(q);
  const cpu::AttentionShape s = shape_of(q, causal, mask);
  const DType stat = q.device().is_cpu() ? q.dtype() : DType::f32;  // fp32 statistics on the GPU
  Tensor lse = Tensor::empty({s.B, s.H, s.T}, stat, q.device());
  if (q.device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
    cuda::FlashAttentionParams p = gpu_params(q, k, v, causal, mask);
    p.o = o.data<bf16>();
    p.lse = lse.data<float>();
    cuda::flash_attention_forward(p, cuda_stream());
#endif
    return {o, lse};
  }
  dispatch("attention_flash", q,
           [&]<typename T>() {
             cpu::flash_attention_forward(q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(), lse.data<T>(), s);
           },
           [&]<typename T>() {});
  return {o, lse};
}

// dQ, dK, dV from (Q, K, V, O, L, dO): recomputes the scores block by block.
std::tuple<Tensor, Tensor, Tensor> flash_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                                                  const Tensor& lse, const Tensor& dout, bool causal,
                                                  const AttentionMask& mask = {}) {
  Tensor dq = empty_like(q), dk = empty_like(k), dv = empty_like(v);
  if (q.device().is_cuda()) {
#ifdef TILEGRAD_HAVE_CUDA
    cuda::FlashAttentionParams p = gpu_params(q, k, v, causal, mask);
    p.dq_mode = flash_dq_mode();
    Tensor workspace;
    {
      MemoryCategoryScope ws(MemCategory::workspace);
      const size_t bytes = cuda::flash_attention_backward_workspace_bytes(p.B, p.T, p.H, p.D, p.dq_mode);
      workspace = Tensor::empty({int64_t((bytes + 15) / 16) * 4}, DType::f32, q.device());
    }
    p.o = const_cast<bf16*>(o.data<bf16>());
    p.lse = const_cast<float*>(lse.data<float>());
    p.dout = dout.data<bf16>();
    p.dq = dq.data<bf16>();
    p.dk = dk.data<bf16>();
    p.dv = dv.data<bf16>();
    p.workspace = workspace.raw();
    cuda::flash_attention_backward(p, cuda_stream());
#endif
    return {dq, dk, dv};
  }
  const cpu::AttentionShape s = shape_of(q, causal, mask);
  dispatch("attention_flash backward", q,
           [&]<typename T>() {
             cpu::flash_attention_backward(q.data<T>(), k.data<T>(), v.data<T>(), o.data<T>(), lse.data<T>(),
                                           dout.data<T>(), dq.data<T>(), dk.data<T>(), dv.data<T>(), s);
           },
           [&]<typename T>() {});
  return {dq, dk, dv};
}
}  // namespace

Tensor document_starts(const Tensor& ids, int32_t eot_token) {
  TG_CHECK(ids.defined() && ids.dim() == 2 && ids.dtype() == DType::i32 && ids.device().is_cpu(),
           "document_starts: ids must be i32 (B, T) on the CPU, got ", ids.defined() ? ids.desc() : "undefined");
  const int64_t B = ids.size(0), T = ids.size(1);
  const int32_t* x = ids.data<int32_t>();
  std::vector<int32_t> starts(size_t(B * T));
  for (int64_t b = 0; b < B; ++b) {
    int32_t start = 0;  // a row begins mid-document: its first document starts at position 0
    for (int64_t t = 0; t < T; ++t) {
      starts[size_t(b * T + t)] = start;
      if (x[b * T + t] == eot_token) start = int32_t(t + 1);  // the eot closes its document
    }
  }
  return Tensor::from_ints(starts, {B, T});
}

Tensor attention_naive(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const AttentionMask& mask) {
  check_qkv("attention_naive", q, k, v);
  check_mask("attention_naive", q.device(), q.size(0), q.size(1), causal, mask);
  const double scale_factor = 1.0 / std::sqrt(double(q.size(3)));
  Tensor qh = transpose12(q), kh = transpose12(k), vh = transpose12(v);  // (B, H, T, D)
  Tensor s = matmul(qh, kh, false, true);                               // (B, H, T, T)
  Tensor p = mask.any() ? softmax(add(scale(s, scale_factor), mask_bias(s, q.shape(), mask)))
                        : attention_softmax(s, scale_factor, causal);  // scale, mask, softmax: only P is kept
  return transpose12(matmul(p, vh));                                    // (B, T, H, D)
}

Tensor attention_flash(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, const AttentionMask& mask_in) {
  check_qkv("attention_flash", q, k, v);
  check_mask("attention_flash", q.device(), q.size(0), q.size(1), causal, mask_in);
  if (!fused_kernel_covers(q, q.shape())) return attention_naive(q, k, v, causal, mask_in);
  const AttentionMask mask = on_device(mask_in, q.device());
  auto [o, lse] = flash_forward(q, k, v, causal, mask);
  // Saved for the backward: the inputs, O and the log-sum-exp (and the mask); never the (T, T) scores.
  record(o, "attention_flash", {q, k, v},
         [q = q.detach(), k = k.detach(), v = v.detach(), o_saved = o.detach(), lse, causal, mask](const Tensor& g) {
           auto [dq, dk, dv] = flash_backward(q, k, v, o_saved, lse, g, causal, mask);
           return std::vector<Tensor>{dq, dk, dv};
         });
  return o;
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, AttentionKind kind,
                 const AttentionMask& mask) {
  return kind == AttentionKind::flash ? attention_flash(q, k, v, causal, mask) : attention_naive(q, k, v, causal, mask);
}

namespace {
// The GPU's fused self-attention reads q, k, v straight out of qkv (token stride 3C) and writes
// d(qkv) in place: no slice copies either way. With RoPE, q and k are rotated into their own
// buffers first (and their gradients rotated back and placed into d(qkv) afterwards).
Tensor self_attention_gpu(const Tensor& qkv, int64_t n_head, double rope_base, const AttentionMask& mask) {
#ifdef TILEGRAD_HAVE_CUDA
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = n_head, D = C / H;
  const Shape heads = {B, T, H, D};
  const bool rotate = rope_base > 0;
  Tensor packed = qkv.detach(), q_rot, k_rot;  // q_rot, k_rot: (B, T, H, D) when rotating
  if (rotate) {
    NoGradGuard no_grad;
    q_rot = rope(reshape(slice_last(packed, 0, C), heads), rope_base);
    k_rot = rope(reshape(slice_last(packed, C, C), heads), rope_base);
  }
  auto params = [=](const Tensor& packed, const Tensor& q_rot, const Tensor& k_rot) {
    cuda::FlashAttentionParams p{};
    const bf16* base = packed.data<bf16>();
    p.q = rotate ? q_rot.data<bf16>() : base;
    p.k = rotate ? k_rot.data<bf16>() : base + C;
    p.v = base + 2 * C;
    p.q_row_stride = rotate ? 0 : 3 * C;
    p.k_row_stride = rotate ? 0 : 3 * C;
    p.v_row_stride = 3 * C;
    p.B = B, p.T = T, p.H = H, p.D = D;
    p.scale = float(1.0 / std::sqrt(double(D)));
    p.causal = true;
    set_gpu_mask(p, mask);  // (mask is captured with its device copy: the backward reads it too)
    return p;
  };
  Tensor o = Tensor::empty(heads, DType::bf16, qkv.device());
  Tensor lse = Tensor::empty({B, H, T}, DType::f32, qkv.device());
  cuda::FlashAttentionParams p = params(packed, q_rot, k_rot);
  p.o = o.data<bf16>();
  p.lse = lse.data<float>();
  cuda::flash_attention_forward(p, cuda_stream());
  Tensor out = o.view({B, T, C});
  record(out, "self_attention", {qkv}, [=](const Tensor& g) {
    Tensor dqkv = Tensor::empty({B, T, 3 * C}, DType::bf16, g.device()), dq, dk, workspace;
    const cuda::FlashDq dq_mode = flash_dq_mode();
    {
      MemoryCategoryScope ws(MemCategory::workspace);
      workspace = Tensor::empty(
          {int64_t(cuda::flash_attention_backward_workspace_bytes(B, T, H, D, dq_mode) / 4 + 4)}, DType::f32,
          g.device());
    }
    cuda::FlashAttentionParams b = params(packed, q_rot, k_rot);
    b.o = const_cast<bf16*>(o.data<bf16>());
    b.lse = const_cast<float*>(lse.data<float>());
    b.dout = g.data<bf16>();
    b.workspace = workspace.raw();
    bf16* d = dqkv.data<bf16>();
    if (rotate) {  // dq, dk in their own buffers first: they still have to be rotated back
      dq = Tensor::empty(heads, DType::bf16, g.device());
      dk = Tensor::empty(heads, DType::bf16, g.device());
    }
    b.dq = rotate ? dq.data<bf16>() : d;
    b.dk = rotate ? dk.data<bf16>() : d + C;
    b.dv = d + 2 * C;
    b.dq_row_stride = rotate ? 0 : 3 * C;
    b.dk_row_stride = rotate ? 0 : 3 * C;
    b.dv_row_stride = 3 * C;
    b.dq_mode = dq_mode;
    cuda::flash_attention_backward(b, cuda_stream());
    if (rotate) {
      Tensor dq_back = rope(dq, rope_base, 0, /*inverse=*/true), dk_back = rope(dk, rope_base, 0, /*inverse=*/true);
      cuda::unslice_last(dq_back.data<bf16>(), d, B * T, 3 * C, 0, C, cuda_stream());
      cuda::unslice_last(dk_back.data<bf16>(), d, B * T, 3 * C, C, C, cuda_stream());
    }
    return std::vector<Tensor>{dqkv};
  });
  return out;
#else
  (void)qkv, (void)n_head, (void)rope_base, (void)mask;
  TG_ASSERT(false);
  return Tensor();
#endif
}
}  // namespace

Tensor self_attention(const Tensor& qkv, int64_t n_head, AttentionKind kind, double rope_base,
                      const AttentionMask& mask) {
  check_defined("self_attention", qkv, "qkv");
  TG_CHECK(qkv.dim() == 3 && qkv.size(2) % 3 == 0 && n_head > 0 && (qkv.size(2) / 3) % n_head == 0,
           "self_attention: qkv must be (B, T, 3C) with C divisible by n_head ", n_head, ", got ", qkv.desc());
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, H = n_head, D = C / H;
  const Shape heads = {B, T, H, D};
  check_mask("self_attention", qkv.device(), B, T, true, mask);
  auto split = [&](const Tensor& x) {
    std::vector<Tensor> parts = split_last(x, 3);
    Tensor q = reshape(parts[0], heads), k = reshape(parts[1], heads), v = reshape(parts[2], heads);
    if (rope_base > 0) {
      q = rope(q, rope_base);
      k = rope(k, rope_base);
    }
    return std::make_tuple(q, k, v);
  };
  const bool fused = kind == AttentionKind::flash && fused_kernel_covers(qkv, heads);
  if (!fused) {  // the composite: every step its own node
    auto [q, k, v] = split(qkv);
    return reshape(attention_naive(q, k, v, /*causal=*/true, mask), {B, T, C});
  }
  if (qkv.device().is_cuda()) return self_attention_gpu(qkv, n_head, rope_base, on_device(mask, qkv.device()));
  Tensor q, k, v;
  {
    NoGradGuard no_grad;  // one node for the whole op: the pieces below record nothing
    std::tie(q, k, v) = split(qkv.detach());
  }
  auto [o, lse] = flash_forward(q, k, v, /*causal=*/true, mask);
  Tensor out = o.view({B, T, C});
  record(out, "self_attention", {qkv}, [q, k, v, o, lse, rope_base, B, T, C, mask](const Tensor& g) {
    auto [dq, dk, dv] = flash_backward(q, k, v, o, lse, g.view(o.shape()), /*causal=*/true, mask);
    if (rope_base > 0) {  // back through the rotation
      dq = rope(dq, rope_base, 0, /*inverse=*/true);
      dk = rope(dk, rope_base, 0, /*inverse=*/true);
    }
    // d(qkv) in one piece: each third written once, nothing zero-filled or accumulated.
    return std::vector<Tensor>{concat_last({dq.view({B, T, C}), dk.view({B, T, C}), dv.view({B, T, C})})};
  });
  return out;
}

}  // namespace tg::ops
