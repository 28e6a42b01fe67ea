// Table-driven config: one table of fields drives YAML parsing, --set, range checks, to_yaml and docs.
#include "src/io/config.h"

#include <glob.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>
#include <variant>

#include "src/util/error.h"
#include "src/util/files.h"

namespace tg {
namespace {

// ---------------------------------------------------------------------------------------------------------
// The field table. Defaults are not repeated here: they come from a default-constructed Config, so the
// struct initialisers in config.h are the single source of truth for them.

using Ref = std::variant<int*, std::int64_t*, double*, bool*, std::string*>;
using Getter = Ref (*)(Config&);

template <auto Section, auto Member>
Ref member_ref(Config& c) {
  return &((c.*Section).*Member);
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// An interval of allowed numeric values; open ends say "> lo" / "< hi" instead of ">=" / "<=".
struct Range {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  bool contains(double v) const { return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi); }
  bool unbounded() const { return lo == -kInf && hi == kInf; }
};

std::string fmt_double(double v);

std::string fmt_bound(double v) {
  // Integral bounds read better without the ".0" the YAML writer adds.
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string((long long)v);
  return fmt_double(v);
}

std::string range_text(const Range& r) {
  if (r.unbounded()) return "";
  if (r.hi == kInf) return (r.lo_open ? "> " : ">= ") + fmt_bound(r.lo);
  if (r.lo == -kInf) return (r.hi_open ? "< " : "<= ") + fmt_bound(r.hi);
  return std::string("in ") + (r.lo_open ? "(" : "[") + fmt_bound(r.lo) + ", " + fmt_bound(r.hi) +
         (r.hi_open ? ")" : "]");
}

struct Field {
  std::string section, name;
  Getter ref;
  std::string doc;
  Range range;
  std::vector<std::string> allowed;  // non-empty: an enum-like string field
  bool glob = false;                 // a data glob: checked against the file system when asked
  bool non_empty = false;            // a string that must be set

  std::string key() const { return section + "." + name; }

  // Chainable modifiers keep each table row on one or two lines.
  Field& min(double v) {
    range.lo = v;
    return *this;
  }
  Field& max(double v) {
    range.hi = v;
    return *this;
  }
  Field& positive() {
    range.lo = 0;
    range.lo_open = true;
    return *this;
  }
  Field& unit_open() {
    range = {0, 1, false, true};
    return *this;
  }  // [0, 1)
  Field& one_of(std::vector<std::string> v) {
    allowed = std::move(v);
    return *this;
  }
  Field& is_glob() {
    glob = true;
    return *this;
  }
  Field& required() {
    non_empty = true;
    return *this;
  }
};

Field make_field(std::string section, std::string name, Getter ref, std::string doc) {
  Field f;
  f.section = std::move(section);
  f.name = std::move(name);
  f.ref = ref;
  f.doc = std::move(doc);
  return f;
}

// Stringising the member name is what keeps YAML keys equal to field names.
#define TG_FIELD(sec, member, doc) \
  make_field(#sec, #member, &member_ref<&Config::sec, &decltype(Config::sec)::member>, doc)

const std::vector<Field>& fields() {
  static const std::vector<Field> table = [] {
    std::vector<Field> t;
    // model
    t.push_back(TG_FIELD(model, n_layer, "Number of transformer blocks.").min(1));
    t.push_back(TG_FIELD(model, n_head, "Attention heads per block; must divide d_model.").min(1));
    t.push_back(TG_FIELD(model, d_model, "Width of the residual stream.").min(1));
    t.push_back(TG_FIELD(model, vocab_size, "Vocabulary size; shards store uint16 token ids, hence the cap.")
                    .min(1)
                    .max(65536));
    t.push_back(TG_FIELD(model, max_seq_len, "Longest context; rows of the learned position table.").min(1));
    t.push_back(TG_FIELD(model, pos_embedding, "Position encoding: learned table (GPT-2) or rotary.")
                    .one_of({"learned", "rope"}));
    t.push_back(TG_FIELD(model, attention, "Attention implementation: fused flash kernel or composite ops.")
                    .one_of({"flash", "naive"}));
    t.push_back(TG_FIELD(model, bias, "Biases in Linear and LayerNorm layers."));
    t.push_back(TG_FIELD(model, dropout, "Dropout probability; 0 disables it.").unit_open());
    t.push_back(
        TG_FIELD(model, rope_base, "RoPE frequency base (used only with pos_embedding: rope).").positive());
    t.push_back(TG_FIELD(model, attention_window,
                         "Sliding-window attention: query i sees keys i-W < j <= i; 0 = full causal. Part of the "
                         "model: sampling uses the window it was trained with.")
                    .min(0));
    // data
    t.push_back(TG_FIELD(data, train, "Glob of training token shards (relative to the working directory); required.")
                    .is_glob());
    t.push_back(TG_FIELD(data, val,
                         "Glob of validation token shards (relative to the working directory); required unless "
                         "run.eval_every is 0.")
                    .is_glob());
    t.push_back(TG_FIELD(data, document_mask,
                         "Tokens attend only within their document: a document ends with (and includes) each "
                         "data.eot_token."));
    t.push_back(TG_FIELD(data, eot_token,
                         "End-of-text id separating documents: 256, the default, for byte-level data (what "
                         "`tilegrad prepare` writes between files); GPT-2's BPE: 50256. Must be < model.vocab_size, "
                         "and set explicitly when model.vocab_size > 257, if data.document_mask is on.")
                    .min(0));
    // train
    t.push_back(TG_FIELD(train, batch_size, "Sequences per micro-batch per rank.").min(1));
    t.push_back(
        TG_FIELD(train, seq_len, "Tokens per sequence; <= model.max_seq_len with learned positions.").min(1));
    t.push_back(TG_FIELD(train, grad_accum, "Micro-batches accumulated per optimizer step.").min(1));
    t.push_back(TG_FIELD(train, max_steps, "Optimizer steps to train for.").min(1));
    t.push_back(TG_FIELD(train, lr, "Peak learning rate, reached at the end of warmup.").positive());
    t.push_back(TG_FIELD(train, min_lr, "Final learning rate of the cosine and wsd schedules; <= lr.").min(0));
    t.push_back(TG_FIELD(train, warmup_steps, "Steps of linear warmup from 0 to lr; <= max_steps.").min(0));
    t.push_back(TG_FIELD(train, lr_schedule,
                         "After warmup: cosine decay to min_lr; constant lr; or wsd (warmup, stable, decay): lr, "
                         "then a linear decay to min_lr over the last train.decay_steps, so that a run resumed with "
                         "a larger max_steps keeps its learning rates up to the new decay.")
                    .one_of({"cosine", "constant", "wsd"}));
    t.push_back(TG_FIELD(train, decay_steps,
                         "With lr_schedule wsd: steps of the final linear decay to min_lr; 0 = the last fifth of "
                         "max_steps; <= max_steps - warmup_steps.")
                    .min(0));
    t.push_back(TG_FIELD(train, weight_decay, "AdamW decoupled weight decay (matrices only).").min(0));
    t.push_back(TG_FIELD(train, beta1, "AdamW first-moment decay.").unit_open());
    t.push_back(TG_FIELD(train, beta2, "AdamW second-moment decay.").unit_open());
    t.push_back(TG_FIELD(train, eps, "AdamW denominator epsilon.").positive());
    t.push_back(
        TG_FIELD(train, grad_clip, "Clip the global gradient norm to this; 0 disables clipping.").min(0));
    t.push_back(TG_FIELD(train, seed, "Seed for initialisation, data order and sampling.").min(0));
    t.push_back(
        TG_FIELD(train, max_bad_steps, "Consecutive non-finite-loss steps skipped before aborting.").min(0));
    t.push_back(TG_FIELD(train, precision, "Compute precision; bf16 keeps fp32 master weights (CUDA only).")
                    .one_of({"fp32", "bf16"}));
    t.push_back(TG_FIELD(train, deterministic,
                         "Bitwise reproducible GPU kernels; false lets the attention backward add dQ with "
                         "unordered atomics (faster; the last bits vary from run to run)."));
    t.push_back(TG_FIELD(train, lm_head_chunk,
                         "Rows of logits the LM head and loss make at a time, so the (batch_size*seq_len, "
                         "vocab_size) logits never exist whole (long context); 0 makes them all at once.")
                    .min(0));
    t.push_back(TG_FIELD(train, recompute,
                         "Keep only each transformer block's input and run the block again in the backward: "
                         "activations of one block instead of all (long context), for about a third more "
                         "compute; the same values and gradients."));
    t.push_back(TG_FIELD(train, recompute_rows,
                         "Positions at a time for the token-wise parts of each block (LayerNorms, projections, "
                         "RoPE, the MLP), each piece run again in the backward: a block keeps 6 activations of "
                         "(seq_len, d_model) instead of 16 or more, for one more forward of those parts "
                         "(long context, with train.recompute; needs model.dropout 0); 0 runs them whole.")
                    .min(0));
    t.push_back(TG_FIELD(train, offload_activations,
                         "With train.recompute on a GPU: each block's input waits in page-locked host memory "
                         "from its forward to its backward instead of on the GPU (one copy out, one back, "
                         "queued with the kernels)."));
    t.push_back(TG_FIELD(train, cuda_graph,
                         "On one GPU: record each micro-batch's forward and backward once as a CUDA graph and "
                         "replay it, one launch instead of hundreds of kernels. Where a graph cannot replay "
                         "the step (several ranks, the CPU, model.dropout > 0, data.document_mask, "
                         "train.recompute or train.recompute_rows) train.log says why and the kernels are "
                         "launched one by one."));
    t.push_back(TG_FIELD(train, zero,
                         "Data parallelism: 0 keeps AdamW's moments whole on every rank; 1 shards them (ZeRO-1): "
                         "each rank updates 1/W of the parameters and all-gathers them.")
                    .min(0)
                    .max(1));
    t.push_back(TG_FIELD(train, bucket_mb,
                         "Data parallelism: MiB of fp32 gradients per bucket, each reduced as soon as its gradients "
                         "are final, overlapped with the rest of the backward; 0 reduces them all after it.")
                    .min(0)
                    .max(1 << 20));
    t.push_back(TG_FIELD(train, init_from,
                         "A new run's initial parameters instead of random ones: a tilegrad checkpoint (a ckpt-*.h5 "
                         "file or a run directory; its weights only: step 0, fresh AdamW) or a Hugging Face GPT-2 "
                         "folder with model.safetensors (and config.json); every shape must fit model.*. Empty: "
                         "random initialisation. Ignored by --resume."));
    // run
    t.push_back(
        TG_FIELD(run, out_dir, "Run directory: log, metrics.jsonl, checkpoints, samples.").required());
    t.push_back(TG_FIELD(run, device, "Where to train; auto picks cuda when a GPU is present.")
                    .one_of({"auto", "cpu", "cuda"}));
    t.push_back(TG_FIELD(run, log_every, "Steps between log lines.").min(1));
    t.push_back(TG_FIELD(run, eval_every, "Steps between validation evals; 0 = never.").min(0));
    t.push_back(TG_FIELD(run, eval_steps, "Validation batches per eval (per rank in a data-parallel run).").min(1));
    t.push_back(TG_FIELD(run, sample_every, "Steps between generated samples; 0 = never.").min(0));
    t.push_back(TG_FIELD(run, sample_tokens, "Tokens per generated sample.").min(1));
    t.push_back(TG_FIELD(run, ckpt_every, "Steps between checkpoints; 0 = never.").min(0));
    t.push_back(TG_FIELD(run, keep_last, "Checkpoints kept on disk; 0 keeps all.").min(0));
    t.push_back(TG_FIELD(run, keep_best,
                         "After each evaluation whose val loss is the lowest so far, keep that step's checkpoint "
                         "(written then if the step has none) and name it in RUN_DIR/best, which keep_last never "
                         "prunes; `tilegrad sample RUN_DIR/best` reads it. Needs run.eval_every > 0."));
    t.push_back(TG_FIELD(run, comm_timeout_s,
                         "Data parallelism: seconds a collective may wait for the other ranks before this rank "
                         "gives up, naming the collective and the step, and exits non-zero.")
                    .positive());
    return t;
  }();
  return table;
}
#undef TG_FIELD

const std::vector<std::string>& sections() {
  static const std::vector<std::string> s = {"model", "data", "train", "run"};
  return s;
}

const Field* find_field(const std::string& section, const std::string& name) {
  for (const Field& f : fields())
    if (f.section == section && f.name == name) return &f;
  return nullptr;
}

bool is_section(const std::string& s) {
  return std::find(sections().begin(), sections().end(), s) != sections().end();
}

// ---------------------------------------------------------------------------------------------------------
// "Did you mean": plain Levenshtein distance with a threshold that grows with the word, plus a prefix rule so
// that "warmup" finds "warmup_steps".

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string lower(std::string s) {
  for (char& ch : s) ch = (char)std::tolower((unsigned char)ch);
  return s;
}

// The closest candidate to `word`, or "" when none is close enough to be a plausible typo.
std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  const std::string w = lower(word);
  const size_t limit = w.size() <= 3 ? 1 : w.size() <= 7 ? 2 : 3;
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const std::string& c : candidates) {
    const std::string lc = lower(c);
    size_t d = edit_distance(w, lc);
    const bool prefix = w.size() >= 4 && (lc.rfind(w, 0) == 0 || w.rfind(lc, 0) == 0);
    if (d > limit && !prefix) continue;
    if (prefix) d = std::min(d, limit);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

std::string did_you_mean(const std::string& s) { return s.empty() ? "" : " (did you mean '" + s + "'?)"; }

// Suggestion for an unknown `name` under a known `section`: the same name under another section first (the
// usual mistake is the wrong section), then a typo within the section, then a typo anywhere.
std::string suggest_key(const std::string& section, const std::string& name) {
  for (const Field& f : fields())
    if (f.name == name && f.section != section) return f.key();
  std::vector<std::string> here, all;
  for (const Field& f : fields()) {
    if (f.section == section) here.push_back(f.name);
    all.push_back(f.key());
  }
  if (std::string s = closest(name, here); !s.empty()) return section + "." + s;
  std::vector<std::string> names;
  for (const Field& f : fields()) names.push_back(f.name);
  if (std::string s = closest(name, names); !s.empty())
    for (const Field& f : fields())
      if (f.name == s) return f.key();
  return "";
}

// Suggestion for an unknown top-level `name`: a key written without its section, or a misspelt section.
std::string suggest_section(const std::string& name) {
  for (const Field& f : fields())
    if (f.name == name) return f.key();
  return closest(name, sections());
}

std::string quote_list(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", '" : "'") + v[i] + "'";
  return s;
}

// ---------------------------------------------------------------------------------------------------------
// Scalars: text in, typed value out, and typed value back to text.

std::string fmt_double(double v) {
  // Shortest text that reads back bit-exactly; the ".0" keeps it a float for YAML 1.1 readers (PyYAML).
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, end);
  if (!std::isfinite(v) || s.find('.') != std::string::npos) return s;
  const size_t e = s.find('e');
  if (e == std::string::npos) return s + ".0";
  return s.insert(e, ".0");
}

std::string yaml_quote(const std::string& s) {
  // Always double-quoted: globs start with '*' or contain ':' often enough that plain style is a trap.
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += (char)ch;
    } else if (ch < 0x20 || ch == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      out += buf;
    } else {
      out += (char)ch;
    }
  }
  return out + "\"";
}

std::string value_text(const Ref& r, bool for_yaml) {
  return std::visit(
      [&](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, double>)
          return fmt_double(*p);
        else if constexpr (std::is_same_v<T, bool>)
          return *p ? "true" : "false";
        else if constexpr (std::is_same_v<T, std::string>)
          return for_yaml ? yaml_quote(*p) : "'" + *p + "'";
        else
          return std::to_string(*p);
      },
      r);
}

std::string type_name(const Field& f) {
  Config probe;
  return std::visit(
      [&](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, double>)
          return "float";
        else if constexpr (std::is_same_v<T, bool>)
          return "bool";
        else if constexpr (std::is_same_v<T, std::string>)
          return f.glob ? "glob" : "string";
        else
          return "int";
      },
      f.ref(probe));
}

// What a value of this field looks like, for "expected ..." messages.
std::string expected_text(const Field& f) {
  if (!f.allowed.empty()) return "one of " + quote_list(f.allowed);
  const std::string t = type_name(f);
  if (t == "int") return "an integer";
  if (t == "float") return "a number";
  if (t == "bool") return "true or false";
  return "a string";
}

// A parse failure carries only the reason; the caller knows the location.
struct BadValue {
  std::string why;
};

std::string strip_plus(const std::string& s) { return (!s.empty() && s[0] == '+') ? s.substr(1) : s; }

void set_from_text(const Field& f, Config& c, const std::string& text) {
  const std::string got = "got '" + text + "'";
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, double>) {
          const std::string s = strip_plus(text);
          double v = 0;
          auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
          if (s.empty() || ec != std::errc() || end != s.data() + s.size())
            throw BadValue{"expected a number, " + got};
          if (!std::isfinite(v)) throw BadValue{"expected a finite number, " + got};
          *p = v;
        } else if constexpr (std::is_same_v<T, bool>) {
          const std::string s = lower(text);
          if (s == "true" || s == "yes" || s == "on")
            *p = true;
          else if (s == "false" || s == "no" || s == "off")
            *p = false;
          else
            throw BadValue{"expected true or false, " + got};
        } else if constexpr (std::is_same_v<T, std::string>) {
          *p = text;
        } else {
          const std::string s = strip_plus(text);
          std::int64_t v = 0;
          auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
          if (ec == std::errc::result_out_of_range) throw BadValue{"integer out of range, " + got};
          if (s.empty() || ec != std::errc() || end != s.data() + s.size())
            throw BadValue{"expected an integer, " + got};
          if (v < (std::int64_t)std::numeric_limits<T>::min() ||
              v > (std::int64_t)std::numeric_limits<T>::max())
            throw BadValue{"integer out of range (must fit in " + std::to_string(8 * sizeof(T)) + " bits), " +
                           got};
          *p = (T)v;
        }
      },
      f.ref(c));
}

double as_double(const Ref& r) {
  return std::visit(
      [](auto* p) -> double {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_arithmetic_v<T>)
          return (double)*p;
        else
          return 0.0;
      },
      r);
}

bool is_numeric(const Ref& r) {
  return std::holds_alternative<int*>(r) || std::holds_alternative<std::int64_t*>(r) ||
         std::holds_alternative<double*>(r);
}

// ---------------------------------------------------------------------------------------------------------
// Where each key got its value, so validation errors can point at the line that set it.

struct Locations {
  std::string source;                        // file name or "<config>"
  std::map<std::string, std::string> where;  // key -> "file:line" or "--set key=value"
  std::map<std::string, std::string> brief;  // key -> "line N" or "--set key=value"

  std::string of(const std::string& key) const {
    auto it = where.find(key);
    return it != where.end() ? it->second : source;
  }
  // For the second key a cross-field message mentions.
  std::string note(const std::string& key) const {
    auto it = brief.find(key);
    return it != brief.end() ? it->second : "default";
  }
  // Marks a value the user did not set, so "64 exceeds ..." at another key's line is not a puzzle.
  std::string if_default(const std::string& key) const { return where.count(key) ? "" : " (default)"; }
  // A cross-field error points at whichever of the two keys the user actually set.
  std::string of_either(const std::string& a, const std::string& b) const {
    return where.count(a) || !where.count(b) ? of(a) : of(b);
  }
};

[[noreturn]] void fail(const std::string& loc, const std::string& key, const std::string& msg) {
  throw Error(loc + ": " + key + ": " + msg);
}

std::string mark_loc(const std::string& source, const YAML::Mark& m) {
  return source + ":" + std::to_string(m.line + 1);
}

std::string node_kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "nothing (null)";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "'" + n.Scalar() + "'";
  }
}

void validate(const Config& c, const Locations& loc) {
  Config& mc = const_cast<Config&>(c);  // the getters take Config&; nothing below writes through them
  for (const Field& f : fields()) {
    const Ref r = f.ref(mc);
    const std::string key = f.key();
    if (is_numeric(r) && !f.range.contains(as_double(r)))
      fail(loc.of(key), key, "must be " + range_text(f.range) + ", got " + value_text(r, false));
    if (auto* s = std::get_if<std::string*>(&r)) {
      if (!f.allowed.empty() && std::find(f.allowed.begin(), f.allowed.end(), **s) == f.allowed.end())
        fail(loc.of(key), key,
             "expected one of " + quote_list(f.allowed) + ", got '" + **s + "'" +
                 did_you_mean(closest(**s, f.allowed)));
      if (f.non_empty && (*s)->empty()) fail(loc.of(key), key, "must not be empty");
    }
  }

  const ModelConfig& m = c.model;
  const TrainConfig& t = c.train;
  if (m.d_model % m.n_head != 0) {
    const int lo = m.d_model - m.d_model % m.n_head;
    fail(loc.of_either("model.d_model", "model.n_head"), "model.d_model",
         std::to_string(m.d_model) + loc.if_default("model.d_model") + " is not divisible by model.n_head (" +
             std::to_string(m.n_head) + ", " + loc.note("model.n_head") +
             "); every head needs the same width: use d_model " +
             (lo > 0 ? std::to_string(lo) + " or " : "") + std::to_string(lo + m.n_head) +
             ", or change n_head");
  }
  if (m.pos_embedding == "rope" && (m.d_model / m.n_head) % 2 != 0)
    fail(loc.of_either("model.pos_embedding", "model.d_model"), "model.pos_embedding",
         "rope rotates pairs of dimensions, so the head size d_model / n_head must be even, got " +
             std::to_string(m.d_model / m.n_head));
  if (m.pos_embedding == "learned" && t.seq_len > m.max_seq_len)
    fail(loc.of_either("train.seq_len", "model.max_seq_len"), "train.seq_len",
         std::to_string(t.seq_len) + loc.if_default("train.seq_len") + " exceeds model.max_seq_len (" +
             std::to_string(m.max_seq_len) + ", " + loc.note("model.max_seq_len") +
             "); the learned position table has max_seq_len rows: lower train.seq_len or raise "
             "model.max_seq_len");
  if (c.run.keep_best && c.run.eval_every == 0)
    fail(loc.of_either("run.keep_best", "run.eval_every"), "run.keep_best",
         "true needs evaluations to choose the best checkpoint by, but run.eval_every is 0 (" +
             loc.note("run.eval_every") + "); set run.eval_every, or run.keep_best: false");
  if (c.data.document_mask && c.data.eot_token >= m.vocab_size)
    fail(loc.of_either("data.eot_token", "model.vocab_size"), "data.eot_token",
         std::to_string(c.data.eot_token) + loc.if_default("data.eot_token") +
             " is outside the vocabulary (model.vocab_size " + std::to_string(m.vocab_size) + ", " +
             loc.note("model.vocab_size") + "); data.document_mask needs the end-of-text id the shards use: "
             "byte-level data with several files has vocab_size 257 and eot_token 256");
  // 256 is byte-level data's end-of-text id; in a larger vocabulary it is an ordinary token
  // (GPT-2's "Ġt"), and documents would silently end at the wrong places.
  if (c.data.document_mask && !loc.where.count("data.eot_token") && m.vocab_size > 257)
    fail(loc.of_either("data.document_mask", "model.vocab_size"), "data.document_mask",
         "needs the shards' end-of-text id, and data.eot_token is not set: its default, 256, is byte-level "
         "data's, but model.vocab_size is " + std::to_string(m.vocab_size) + " (" + loc.note("model.vocab_size") +
             "); set data.eot_token to your tokenizer's end-of-text id (GPT-2's BPE: 50256; a "
             "`tilegrad tokenizer train` vocabulary: its last id)");
  if (t.min_lr > t.lr)
    fail(loc.of_either("train.min_lr", "train.lr"), "train.min_lr",
         fmt_double(t.min_lr) + loc.if_default("train.min_lr") + " must be <= train.lr (" + fmt_double(t.lr) +
             ", " + loc.note("train.lr") + ")");
  if (t.warmup_steps > t.max_steps)
    fail(loc.of_either("train.warmup_steps", "train.max_steps"), "train.warmup_steps",
         std::to_string(t.warmup_steps) + loc.if_default("train.warmup_steps") +
             " must be <= train.max_steps (" + std::to_string(t.max_steps) + ", " +
             loc.note("train.max_steps") + "); for a short run lower it too, e.g. --set train.warmup_steps=" +
             std::to_string(t.max_steps / 10));
  if (t.decay_steps > t.max_steps - t.warmup_steps)
    fail(loc.of_either("train.decay_steps", "train.max_steps"), "train.decay_steps",
         std::to_string(t.decay_steps) + " exceeds train.max_steps - train.warmup_steps (" +
             std::to_string(t.max_steps - t.warmup_steps) + "); the decay follows the warmup");
  if (t.offload_activations && !t.recompute)
    fail(loc.of_either("train.offload_activations", "train.recompute"), "train.offload_activations",
         "parks the inputs of recomputed blocks, but train.recompute is false (" + loc.note("train.recompute") +
             "); set train.recompute: true as well");
  if (t.recompute_rows > 0 && m.dropout > 0)
    fail(loc.of_either("train.recompute_rows", "model.dropout"), "train.recompute_rows",
         std::to_string(t.recompute_rows) + " runs blocks in pieces, which model.dropout " + fmt_double(m.dropout) +
             " (" + loc.note("model.dropout") + ") does not support: set train.recompute_rows: 0 or model.dropout: 0");
  if (t.precision == "bf16" && c.run.device == "cpu")
    fail(loc.of_either("train.precision", "run.device"), "train.precision",
         "bf16" + loc.if_default("train.precision") + " needs a CUDA device but run.device is 'cpu' (" +
             loc.note("run.device") + "); use precision fp32 on the CPU");
}

void check_data_globs(const Config& c, const Locations& loc) {
  Config& mc = const_cast<Config&>(c);
  for (const Field& f : fields()) {
    if (!f.glob) continue;
    const std::string& pattern = *std::get<std::string*>(f.ref(mc));
    const std::string key = f.key();
    if (pattern.empty() && key == "data.val" && c.run.eval_every == 0) continue;  // a run that never evaluates
    if (pattern.empty())
      fail(loc.of(key), key, "not set; give a glob of token shards, e.g. \"data/kjv/" + f.name + "*.bin\"");
    glob_t g{};
    const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
    const size_t n = rc == 0 ? g.gl_pathc : 0;
    globfree(&g);
    if (n == 0) {
      std::error_code ec;
      const std::string cwd = std::filesystem::current_path(ec).string();
      fail(loc.of(key), key,
           "no file matches '" + pattern + "'" +
               (pattern.starts_with("/") ? "" : " (relative to " + cwd + ")") +
               "; create the token shards with `tilegrad prepare` or fix the glob");
    }
  }
}

// Iterates a YAML mapping, rejecting duplicate and non-scalar keys (yaml-cpp keeps duplicates silently).
template <typename Fn>
void for_each_entry(const YAML::Node& map, const std::string& source, const std::string& prefix, Fn&& fn) {
  std::map<std::string, int> seen;  // name -> 1-based line
  for (const auto& kv : map) {
    const YAML::Node k = kv.first;  // a copy: yaml-cpp's iterator hands out temporaries
    if (!k.IsScalar())
      throw Error(mark_loc(source, k.Mark()) + ": " + (prefix.empty() ? "" : prefix + ": ") +
                  "expected a key name, got " + node_kind(k));
    const std::string name = k.Scalar();
    const int line = k.Mark().line + 1;
    if (auto [pos, fresh] = seen.emplace(name, line); !fresh)
      fail(mark_loc(source, k.Mark()), prefix.empty() ? name : prefix + "." + name,
           "duplicate key (first set at line " + std::to_string(pos->second) + ", again at line " +
               std::to_string(line) + "); keep one");
    fn(name, k, YAML::Node(kv.second));
  }
}

void apply_override(Config& c, const std::string& ov, Locations& loc) {
  const std::string where = "--set " + ov;
  const size_t eq = ov.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(where + ": expected key=value with a dotted key, e.g. --set train.lr=3e-4");
  const std::string key = ov.substr(0, eq), value = ov.substr(eq + 1);
  const size_t dot = key.find('.');
  const std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
  const std::string name = dot == std::string::npos ? key : key.substr(dot + 1);
  const Field* f = find_field(section, name);
  if (!f) {
    std::string hint;
    if (is_section(section))
      hint = suggest_key(section, name);
    else if (std::string s = closest(section, sections()); !section.empty() && !s.empty())
      hint = find_field(s, name) ? s + "." + name : suggest_key(s, name);
    else
      hint = suggest_section(name);
    if (hint.find('.') == std::string::npos) hint.clear();  // only whole keys are useful here
    fail(where, key, "unknown key" + did_you_mean(hint));
  }
  try {
    set_from_text(*f, c, value);
  } catch (const BadValue& b) {
    fail(where, key, b.why);
  }
  loc.where[key] = where;
  loc.brief[key] = where;
}

}  // namespace

// -------------------------------------------------------------------------------------------------------------

Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides, bool check_data_files) {
  Config c;
  c.source_path = source_name;
  Locations loc;
  loc.source = source_name.empty() ? "<config>" : source_name;
  const std::string& src = loc.source;

  YAML::Node root;
  try {
    // One document: keys in a second one (after '---') would be silently ignored otherwise.
    const std::vector<YAML::Node> docs = YAML::LoadAll(yaml_text);
    for (size_t i = 1; i < docs.size(); ++i)
      if (!docs[i].IsNull())
        throw Error(mark_loc(src, docs[i].Mark()) + ": a second YAML document (after '---'); a config is one "
                    "document: merge it into the first");
    if (!docs.empty()) root = docs[0];
  } catch (const YAML::Exception& e) {
    std::string hint;
    if (e.msg.find("anchor") != std::string::npos)
      hint = " (a value starting with '*' is a YAML alias: quote it, e.g. \"*.bin\")";
    throw Error(src + ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) +
                ": YAML syntax error: " + e.msg + hint);
  }
  if (!root.IsNull() && !root.IsMap())
    throw Error(mark_loc(src, root.Mark()) + ": expected a mapping with sections " + quote_list(sections()) +
                ", got " + node_kind(root));

  if (root.IsMap()) {
    for_each_entry(
        root, src, "", [&](const std::string& section, const YAML::Node& k, const YAML::Node& body) {
          if (!is_section(section))
            fail(mark_loc(src, k.Mark()), section,
                 "unknown section; expected one of " + quote_list(sections()) +
                     did_you_mean(suggest_section(section)));
          if (body.IsNull()) return;  // "train:" with nothing under it keeps the defaults
          if (!body.IsMap())
            fail(mark_loc(src, body.Mark()), section, "expected a mapping of keys, got " + node_kind(body));
          for_each_entry(body, src, section,
                         [&](const std::string& name, const YAML::Node& kn, const YAML::Node& v) {
                           const Field* f = find_field(section, name);
                           const std::string key = section + "." + name;
                           if (!f)
                             fail(mark_loc(src, kn.Mark()), key,
                                  "unknown key" + did_you_mean(suggest_key(section, name)));
                           if (!v.IsScalar())
                             fail(mark_loc(src, v.Mark()), key,
                                  "expected " + expected_text(*f) + ", got " + node_kind(v));
                           try {
                             set_from_text(*f, c, v.Scalar());
                           } catch (const BadValue& b) {
                             fail(mark_loc(src, v.Mark()), key, b.why);
                           }
                           loc.where[key] = mark_loc(src, v.Mark());
                           loc.brief[key] = "line " + std::to_string(v.Mark().line + 1);
                         });
        });
  }

  for (const std::string& ov : overrides) apply_override(c, ov, loc);
  validate(c, loc);
  if (check_data_files) check_data_globs(c, loc);
  return c;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   bool check_data_files) {
  const std::string problem = regular_file_problem(path);
  if (!problem.empty())
    throw Error("cannot read config file '" + path + "': it " + problem + "; pass a .yaml file, e.g. configs/kjv-tiny.yaml");
  // A config is text of a few kilobytes; 16 MiB is far beyond any.
  const std::string text = read_regular_file(path, "cannot read config file '" + path + "'", uint64_t{16} << 20);
  return parse_config(text, path, overrides, check_data_files);
}

std::string config_to_yaml(const Config& c) {
  Config& mc = const_cast<Config&>(c);
  std::string out = "# tilegrad resolved config";
  if (!c.source_path.empty()) out += " (from " + c.source_path + ")";
  out += "\n";
  std::string section;
  for (const Field& f : fields()) {
    if (f.section != section) {
      section = f.section;
      out += section + ":\n";
    }
    out += "  " + f.name + ": " + value_text(f.ref(mc), true) + "\n";
  }
  return out;
}

void validate_config(const Config& c) {
  Locations loc;
  loc.source = c.source_path.empty() ? "<config>" : c.source_path;
  validate(c, loc);
}

std::vector<ConfigKeyDoc> config_reference() {
  Config defaults;
  std::vector<ConfigKeyDoc> out;
  for (const Field& f : fields()) {
    ConfigKeyDoc d;
    d.key = f.key();
    if (!f.allowed.empty()) {
      for (size_t i = 0; i < f.allowed.size(); ++i) d.type += (i ? " | " : "") + f.allowed[i];
    } else {
      d.type = type_name(f);
      if (std::string r = range_text(f.range); !r.empty()) d.type += " " + r;
    }
    d.default_value = value_text(f.ref(defaults), true);
    d.description = f.doc;
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace tg
