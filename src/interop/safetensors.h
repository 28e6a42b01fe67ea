// The safetensors format (Hugging Face): an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {string: string}},
// then the tensors' bytes, little-endian, row-major, at those offsets from the end of the header.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "src/io/checkpoint.h"

namespace tg {

// Writes float32 tensors ("F32") in the given order, header padded with spaces to a multiple of
// 8 bytes so every tensor is 8-byte aligned. The file appears atomically (a temporary file in
// the same folder, renamed). Throws tg::Error naming the file when it cannot be written.
void write_safetensors(const std::string& path, const std::vector<CheckpointArray>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

struct SafetensorsFile {
  std::vector<CheckpointArray> tensors;  // in file order, converted to float32
  std::vector<std::string> dtypes;       // each tensor's dtype in the file ("F32", "BF16", ...)
  std::map<std::string, std::string> metadata;
};

// Reads F32, F16, BF16 and F64 tensors (converted to float32). Checks the header (valid JSON,
// every entry's dtype, shape and offsets; offsets inside the file, sized as the shape says, not
// overlapping); errors name the file and the tensor.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace tg
