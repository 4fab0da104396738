// safetensors files: 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__":
// {...}}), then the raw row-major little-endian data. Every dtype Tensor has is supported.
//   save_safetensors("model.safetensors", {{"fc.weight", w}}, {{"step", "10"}});
//   auto tensors = load_safetensors("model.safetensors");
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace tessel {

using SafetensorsMetadata = std::map<std::string, std::string>;

// Writes tensors (any device, strides and dtype) in the order given; names must be unique.
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const SafetensorsMetadata& metadata = {});
// Reads every tensor to the CPU. Throws tessel::Error naming the file and the problem on a
// truncated file, a header length past the end, bad JSON, unknown dtype, shape/size mismatch,
// overlapping or out-of-range offsets, or holes.
std::map<std::string, Tensor> load_safetensors(const std::string& path,
                                               SafetensorsMetadata* metadata = nullptr);
// The same, from bytes in memory (`source` names them in errors).
std::map<std::string, Tensor> parse_safetensors(const std::string& bytes, const std::string& source,
                                                SafetensorsMetadata* metadata = nullptr);

}  // namespace tessel
