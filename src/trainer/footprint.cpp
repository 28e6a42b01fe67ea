// Memory a run needs, from the config, in checked arithmetic (see footprint.h).
#include "src/trainer/footprint.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "src/util/checked.h"

namespace tg {

#ifdef TILEGRAD_HAVE_CUDA
void cuda_mem_get_info(size_t* free_bytes, size_t* total_bytes);  // kernels/cuda/runtime.cu
#endif

namespace {
const char* kModelKeys = "model.n_layer, model.d_model, model.vocab_size, model.max_seq_len";
}  // namespace

int64_t parameter_count(const ModelConfig& m) {
  const std::string what = std::string("the parameter count from ") + kModelKeys;
  auto mul = [&](int64_t a, int64_t b) { return checked_mul(a, b, what); };
  auto add = [&](int64_t a, int64_t b) { return checked_add(a, b, what); };
  const int64_t C = m.d_model, L = m.n_layer, bias = m.bias ? 1 : 0;
  int64_t n = mul(m.vocab_size, C);                                   // wte
  if (m.pos_embedding == "learned") n = add(n, mul(m.max_seq_len, C));  // wpe
  // One block: ln_1, ln_2 (weight + bias), c_attn (3C × C), c_proj (C × C), c_fc (4C × C),
  // mlp.c_proj (C × 4C), and the biases of the four linears (3C + C + 4C + C).
  const int64_t CC = mul(C, C);
  int64_t block = mul(CC, 12);
  block = add(block, mul(C, 2 * (1 + bias)));
  block = add(block, mul(C, 9 * bias));
  n = add(n, mul(block, L));
  n = add(n, mul(C, 1 + bias));  // ln_f
  return n;
}

Footprint estimate_footprint(const Config& c, bool training, int world_size) {
  const ModelConfig& m = c.model;
  const TrainConfig& t = c.train;
  const std::string what = std::string("the memory estimate from ") + kModelKeys +
                           ", train.batch_size and train.seq_len";
  auto mul = [&](int64_t a, int64_t b) { return checked_mul(a, b, what); };
  auto add = [&](int64_t a, int64_t b) { return checked_add(a, b, what); };
  Footprint f;
  f.params = parameter_count(m);
  const bool bf16 = t.precision == "bf16";
  f.param_bytes = add(mul(f.params, 4), bf16 ? mul(f.params, 2) : 0);
  const int64_t B = training ? t.batch_size : 1, T = t.seq_len, C = m.d_model, L = m.n_layer;
  const int64_t H = m.n_head, V = m.vocab_size;
  const int64_t elem = bf16 ? 2 : 4;
  const int64_t tokens = mul(B, T);
  // A block keeps about 16·C values per token for the backward (the LayerNorms' outputs, q/k/v,
  // the attention output, the MLP's 4C hidden before and after GELU, the residuals);
  // recomputed blocks keep their input only, plus one block's worth while it is recomputed.
  const int64_t per_block = mul(mul(tokens, C), 16 * elem);
  int64_t act = training && t.recompute ? add(mul(mul(mul(tokens, C), elem), L), per_block) : mul(per_block, L);
  if (m.attention == "naive") act = add(act, mul(mul(mul(mul(mul(B, H), T), T), 2 * elem), training ? L : 1));
  // The logits (their gradient is written over them): all rows at once, or lm_head_chunk rows at a time.
  const int64_t rows = t.lm_head_chunk > 0 ? std::min<int64_t>(tokens, t.lm_head_chunk) : tokens;
  act = add(act, mul(mul(rows, V), elem));
  f.activation_bytes = act;
  if (training) {
    f.grad_bytes = mul(f.params, 4);
    f.optimizer_bytes = mul(f.params, 8);
    if (t.zero == 1 && world_size > 1) f.optimizer_bytes /= world_size;
  }
  f.total_bytes = add(add(add(f.param_bytes, f.grad_bytes), f.optimizer_bytes), f.activation_bytes);
  return f;
}

namespace {
// A /proc/meminfo line's value in bytes ("MemTotal:", "MemAvailable:"); -1 if missing.
int64_t meminfo_bytes(const std::string& want) {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  int64_t kb = 0;
  while (in >> key >> kb) {
    std::getline(in, unit);
    if (key == want) return kb * 1024;
  }
  return -1;
}

// A GPU's free or total bytes; -1 without CUDA.
int64_t gpu_memory(bool total) {
#ifdef TILEGRAD_HAVE_CUDA
  size_t free_bytes = 0, total_bytes = 0;
  cuda_mem_get_info(&free_bytes, &total_bytes);
  return int64_t(total ? total_bytes : free_bytes);
#else
  (void)total;
  return -1;
#endif
}
}  // namespace

int64_t available_memory(Device d) { return d.is_cpu() ? meminfo_bytes("MemAvailable:") : gpu_memory(false); }

int64_t total_memory(Device d) { return d.is_cpu() ? meminfo_bytes("MemTotal:") : gpu_memory(true); }

void check_fits(const Config& c, Device d, bool training, int world_size) {
  const Footprint f = estimate_footprint(c, training, world_size);
  const int64_t avail = available_memory(d);
  if (avail < 0 || f.total_bytes <= avail) return;
  std::ostringstream os;
  os << "the run needs at least " << format_bytes(f.total_bytes) << " on " << d.str() << " but "
     << format_bytes(avail) << " is available" << (d.is_cpu() ? " (MemAvailable in /proc/meminfo)" : "") << ": "
     << f.params << " parameters (" << format_bytes(f.param_bytes) << ")";
  if (training)
    os << ", gradients " << format_bytes(f.grad_bytes) << ", AdamW state " << format_bytes(f.optimizer_bytes);
  os << ", activations about " << format_bytes(f.activation_bytes) << " for "
     << (training ? std::to_string(c.train.batch_size) : std::string("1")) << " × " << c.train.seq_len
     << " tokens; lower model.n_layer / model.d_model / model.vocab_size"
     << (training ? " or train.batch_size / train.seq_len (or set train.recompute, train.lm_head_chunk)" : "");
  throw OutOfMemory(os.str());
}

}  // namespace tg
