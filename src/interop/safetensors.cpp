// safetensors reader and writer (format: https://github.com/huggingface/safetensors).
#include "src/interop/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/util/error.h"

namespace fs = std::filesystem;

namespace tg {

namespace {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

constexpr uint64_t kMaxHeader = uint64_t(100) << 20;  // the reference implementation's limit

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      uint32_t m = mant;
      do { ++e; m <<= 1; } while ((m & 0x400) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (m & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  return std::bit_cast<float>(bits);
}

size_t dtype_size(const std::string& d) {
  if (d == "F32") return 4;
  if (d == "F16" || d == "BF16") return 2;
  if (d == "F64") return 8;
  return 0;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<CheckpointArray>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const CheckpointArray& t : tensors) {
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    TG_CHECK(numel == int64_t(t.data.size()), "safetensors ", path, ": tensor '", t.name, "' has ", t.data.size(),
             " values for its shape's ", numel);
    TG_CHECK(!header.contains(t.name) && t.name != "__metadata__", "safetensors ", path, ": tensor name '", t.name,
             "' given twice or reserved");
    const uint64_t bytes = uint64_t(numel) * 4;
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const fs::path final_path(path);
  const fs::path tmp = final_path.parent_path() / ("." + final_path.filename().string() + ".tmp");
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TG_CHECK(out.good(), "safetensors ", path, ": cannot create ", tmp.string());
    const uint64_t n = text.size();
    out.write(reinterpret_cast<const char*>(&n), 8);
    out.write(text.data(), std::streamsize(text.size()));
    for (const CheckpointArray& t : tensors)
      out.write(reinterpret_cast<const char*>(t.data.data()), std::streamsize(t.data.size() * sizeof(float)));
    out.flush();
    if (!out.good()) {
      out.close();
      std::error_code rm;
      fs::remove(tmp, rm);  // no partial file left behind
      TG_CHECK(false, "safetensors ", path, ": writing it failed (is the disk full?); nothing was written");
    }
  }
  std::error_code ec;
  fs::rename(tmp, final_path, ec);
  TG_CHECK(!ec, "safetensors ", path, ": cannot rename ", tmp.string(), " into place: ", ec.message());
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  TG_CHECK(in.good(), "safetensors ", path, ": cannot open the file");
  const uint64_t file_size = uint64_t(in.tellg());
  in.seekg(0);
  TG_CHECK(file_size >= 8, "safetensors ", path, ": ", file_size, " bytes, too short for the 8-byte header length");
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  TG_CHECK(n <= kMaxHeader && 8 + n <= file_size, "safetensors ", path, ": header length ", n,
           " does not fit the file of ", file_size, " bytes (not a safetensors file, or truncated)");
  std::string text(n, '\0');
  in.read(text.data(), std::streamsize(n));
  TG_CHECK(in.good(), "safetensors ", path, ": cannot read the header");
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TG_CHECK(false, "safetensors ", path, ": the header is not valid JSON (", e.what(), ")");
  }
  TG_CHECK(header.is_object(), "safetensors ", path, ": the header is not a JSON object");
  const uint64_t data_size = file_size - 8 - n;
  SafetensorsFile f;
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      TG_CHECK(it->is_object(), "safetensors ", path, ": __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m)
        if (m->is_string()) f.metadata[m.key()] = m->get<std::string>();
      continue;
    }
    const std::string& name = it.key();
    const nlohmann::json& e = *it;
    auto bad = [&](const std::string& why) {
      TG_CHECK(false, "safetensors ", path, ": tensor '", name, "': ", why);
    };
    if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
      bad("needs dtype, shape and data_offsets");
    Entry en{name, e["dtype"].is_string() ? e["dtype"].get<std::string>() : "", {}, 0, 0};
    if (dtype_size(en.dtype) == 0)
      bad("dtype " + e["dtype"].dump() + " is not supported (F32, F16, BF16, F64 are)");
    if (!e["shape"].is_array()) bad("shape is not a list");
    // The element count is checked against the data's size as it grows, so no product of
    // dimensions can wrap around to a size that fits.
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) bad("shape " + e["shape"].dump() + " has a non-natural dimension");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > uint64_t(INT64_MAX) || (dim != 0 && numel > data_size / dim))
        bad("shape " + e["shape"].dump() + " holds more values than the file's " + std::to_string(data_size) +
            " bytes of data");
      en.shape.push_back(int64_t(dim));
      numel *= dim;
    }
    const auto& off = e["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("data_offsets is not [begin, end]");
    en.begin = off[0].get<uint64_t>(), en.end = off[1].get<uint64_t>();
    if (en.begin > en.end || en.end > data_size)
      bad("data_offsets [" + std::to_string(en.begin) + ", " + std::to_string(en.end) + "] fall outside the " +
          std::to_string(data_size) + " bytes of data (truncated file?)");
    if (en.end - en.begin != numel * dtype_size(en.dtype))
      bad("data_offsets span " + std::to_string(en.end - en.begin) + " bytes but shape " + e["shape"].dump() +
          " of " + en.dtype + " needs " + std::to_string(numel * dtype_size(en.dtype)));
    entries.push_back(std::move(en));
  }
  // File order (by offset), and no two tensors share bytes.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < entries.size(); ++i)
    TG_CHECK(entries[i].begin >= entries[i - 1].end || entries[i].begin == entries[i].end, "safetensors ", path,
             ": tensors '", entries[i - 1].name, "' and '", entries[i].name, "' overlap");
  std::vector<char> bytes;
  for (const Entry& e : entries) {
    const size_t count = (e.end - e.begin) / dtype_size(e.dtype);
    bytes.resize(e.end - e.begin);
    in.seekg(std::streamoff(8 + n + e.begin));
    in.read(bytes.data(), std::streamsize(bytes.size()));
    TG_CHECK(in.good(), "safetensors ", path, ": cannot read tensor '", e.name, "'");
    CheckpointArray a{e.name, e.shape, std::vector<float>(count)};
    if (e.dtype == "F32") {
      if (count > 0) std::memcpy(a.data.data(), bytes.data(), bytes.size());  // an empty vector's data() may be null
    } else if (e.dtype == "F64") {
      for (size_t i = 0; i < count; ++i) {
        double v;
        std::memcpy(&v, bytes.data() + 8 * i, 8);
        a.data[i] = float(v);
      }
    } else {
      for (size_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        a.data[i] = e.dtype == "BF16" ? std::bit_cast<float>(uint32_t(h) << 16) : half_to_float(h);
      }
    }
    f.tensors.push_back(std::move(a));
    f.dtypes.push_back(e.dtype);
  }
  return f;
}

}  // namespace tg
