#include "core/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

namespace tessel {
namespace {

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100000000;
constexpr const char* kMetadataKey = "__metadata__";

struct DTypeCode {
  DType dtype;
  const char* code;
};
constexpr DTypeCode kDTypeCodes[] = {
    {DType::kFloat32, "F32"}, {DType::kFloat64, "F64"}, {DType::kBFloat16, "BF16"},
    {DType::kFloat16, "F16"}, {DType::kInt32, "I32"},   {DType::kInt64, "I64"},
    {DType::kUInt8, "U8"},    {DType::kBool, "BOOL"},
};

const char* dtype_code(DType dtype) {
  for (const auto& entry : kDTypeCodes)
    if (entry.dtype == dtype) return entry.code;
  TESSEL_FAIL("safetensors: dtype ", dtype_name(dtype), " has no safetensors code");
}

bool dtype_from_code(const std::string& code, DType* dtype) {
  for (const auto& entry : kDTypeCodes) {
    if (code == entry.code) {
      *dtype = entry.dtype;
      return true;
    }
  }
  return false;
}

std::string known_codes() {
  std::string out;
  for (const auto& entry : kDTypeCodes) out += std::string(out.empty() ? "" : ", ") + entry.code;
  return out;
}

// Appends the elements of `tensor` (any strides, CPU) to `out` in row-major order.
void append_row_major_bytes(const Tensor& tensor, std::string* out) {
  const size_t item = tensor.element_size();
  const size_t start = out->size();
  out->resize(start + tensor.nbytes());
  if (tensor.numel() == 0) return;
  char* destination = &(*out)[start];
  StorageAccess access(*tensor.storage());
  const char* base = static_cast<const char*>(tensor.raw_data());
  if (tensor.is_contiguous()) {
    std::memcpy(destination, base, tensor.nbytes());
    return;
  }
  const int64_t dims = tensor.dim();
  const Shape& sizes = tensor.sizes();
  const Shape& strides = tensor.strides();
  Shape index(dims, 0);
  for (int64_t linear = 0; linear < tensor.numel(); ++linear) {
    int64_t offset = 0;
    for (int64_t d = 0; d < dims; ++d) offset += index[d] * strides[d];
    std::memcpy(destination + linear * item, base + offset * static_cast<int64_t>(item), item);
    for (int64_t d = dims - 1; d >= 0; --d) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

// One tensor entry of a parsed header.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

// Reads a non-negative integer from a JSON value; false when it is not one.
bool read_unsigned(const nlohmann::json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(value.get<int64_t>());
    return true;
  }
  return false;
}

Entry parse_entry(const std::string& name, const nlohmann::json& value, uint64_t data_bytes,
                  const std::string& source) {
  auto fail_prefix = [&]() { return "safetensors '" + source + "': tensor '" + name + "' "; };
  TESSEL_CHECK(value.is_object(), fail_prefix(), "is not a JSON object: ", value.dump());
  for (const char* key : {"dtype", "shape", "data_offsets"})
    TESSEL_CHECK(value.contains(key), fail_prefix(), "is missing '", key, "'");

  Entry entry;
  entry.name = name;
  const auto& dtype_value = value["dtype"];
  TESSEL_CHECK(dtype_value.is_string(), fail_prefix(), "has a non-string dtype ",
               dtype_value.dump());
  TESSEL_CHECK(dtype_from_code(dtype_value.get<std::string>(), &entry.dtype), fail_prefix(),
               "has unknown dtype '", dtype_value.get<std::string>(),
               "' (supported: ", known_codes(), ")");

  const auto& shape_value = value["shape"];
  TESSEL_CHECK(shape_value.is_array(), fail_prefix(),
               "has a shape that is not an array: ", shape_value.dump());
  // numel in 128 bits so a huge shape cannot overflow into a plausible size. The product of the
  // non-zero dimensions (what contiguous strides multiply) must fit in int64 too: a shape like
  // [2^62, 2^62, 0] holds no bytes, yet its strides would overflow.
  unsigned __int128 numel = 1;
  unsigned __int128 stride_extent = 1;
  const auto int64_max = static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max());
  for (const auto& dim_value : shape_value) {
    uint64_t dim = 0;
    TESSEL_CHECK(read_unsigned(dim_value, &dim) &&
                     dim <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 fail_prefix(), "has an invalid shape ", shape_value.dump(),
                 " (dimensions must be non-negative integers)");
    entry.shape.push_back(static_cast<int64_t>(dim));
    // Saturate at 2^64 (no real tensor is that big; keeps the product from wrapping).
    numel = std::min(numel * dim, static_cast<unsigned __int128>(1) << 64);
    stride_extent = std::min(stride_extent * std::max<uint64_t>(dim, 1), int64_max + 1);
  }
  TESSEL_CHECK(stride_extent <= int64_max, fail_prefix(), "has shape ", shape_value.dump(),
               " whose non-zero dimensions multiply past 2^63 - 1");

  const auto& offsets_value = value["data_offsets"];
  TESSEL_CHECK(offsets_value.is_array() && offsets_value.size() == 2 &&
                   read_unsigned(offsets_value[0], &entry.begin) &&
                   read_unsigned(offsets_value[1], &entry.end),
               fail_prefix(), "has invalid data_offsets ", offsets_value.dump(),
               " (expected [begin, end] with non-negative integers)");
  TESSEL_CHECK(entry.begin <= entry.end, fail_prefix(), "has data_offsets [", entry.begin, ", ",
               entry.end, "] with begin after end");
  TESSEL_CHECK(entry.end <= data_bytes, fail_prefix(), "has data_offsets [", entry.begin, ", ",
               entry.end, "] out of range: the data section holds ", data_bytes, " bytes");
  const unsigned __int128 expected_bytes = numel * element_size(entry.dtype);
  TESSEL_CHECK(expected_bytes == entry.end - entry.begin, fail_prefix(), "has shape ",
               shape_value.dump(), " of ", dtype_value.get<std::string>(), " (",
               static_cast<uint64_t>(std::min<unsigned __int128>(
                   expected_bytes, std::numeric_limits<uint64_t>::max())),
               " bytes) but data_offsets [", entry.begin, ", ", entry.end, "] span ",
               entry.end - entry.begin, " bytes");
  return entry;
}

}  // namespace

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const SafetensorsMetadata& metadata) {
  std::set<std::string> names;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = std::move(meta);
  }

  std::string data;
  for (const auto& [name, tensor] : tensors) {
    TESSEL_CHECK(name != kMetadataKey, "save_safetensors '", path, "': the tensor name '",
                 kMetadataKey, "' is reserved for metadata");
    TESSEL_CHECK(names.insert(name).second, "save_safetensors '", path,
                 "': duplicate tensor name '", name, "'");
    TESSEL_CHECK(tensor.defined(), "save_safetensors '", path, "': tensor '", name,
                 "' is undefined");
    TESSEL_CHECK(!tensor.device().is_meta(), "save_safetensors '", path, "': tensor '", name,
                 "' is on the meta device and has no values");
    const Tensor cpu = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
    const uint64_t begin = data.size();
    append_row_major_bytes(cpu, &data);
    header[name] = {{"dtype", dtype_code(cpu.dtype())},
                    {"shape", cpu.sizes()},
                    {"data_offsets", {begin, static_cast<uint64_t>(data.size())}}};
  }

  std::string header_text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_length = header_text.size();
  char length_bytes[8];
  for (int i = 0; i < 8; ++i)
    length_bytes[i] = static_cast<char>((header_length >> (8 * i)) & 0xff);

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TESSEL_CHECK(out.is_open(), "save_safetensors: cannot open '", path,
               "' for writing: ", std::strerror(errno));
  out.write(length_bytes, 8);
  out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  out.flush();
  TESSEL_CHECK(out.good(), "save_safetensors: writing '", path, "' failed (",
               8 + header_text.size() + data.size(), " bytes): ", std::strerror(errno));
  out.close();
  TESSEL_CHECK(!out.fail(), "save_safetensors: closing '", path,
               "' failed: ", std::strerror(errno));
}

std::map<std::string, Tensor> load_safetensors(const std::string& path,
                                               SafetensorsMetadata* metadata) {
  std::ifstream in(path, std::ios::binary);
  TESSEL_CHECK(in.is_open(), "load_safetensors: cannot open '", path, "': ", std::strerror(errno));
  std::ostringstream contents;
  contents << in.rdbuf();
  TESSEL_CHECK(!in.bad(), "load_safetensors: reading '", path, "' failed: ", std::strerror(errno));
  return parse_safetensors(contents.str(), path, metadata);
}

std::map<std::string, Tensor> parse_safetensors(const std::string& bytes, const std::string& source,
                                                SafetensorsMetadata* metadata) {
  const std::string where = "safetensors '" + source + "': ";
  TESSEL_CHECK(bytes.size() >= 8, where, "file is ", bytes.size(),
               " bytes, shorter than the 8-byte header length (truncated file?)");
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i)
    header_length = (header_length << 8) | static_cast<unsigned char>(bytes[i]);
  TESSEL_CHECK(header_length <= kMaxHeaderBytes, where, "header length ", header_length,
               " exceeds the limit of ", kMaxHeaderBytes, " bytes (corrupt file?)");
  TESSEL_CHECK(header_length <= bytes.size() - 8, where, "header length ", header_length,
               " runs past the end of the file (", bytes.size(), " bytes; truncated file?)");

  // Parse, noting duplicate top-level keys (a JSON object keeps only the last of them).
  std::set<std::string> seen_keys;
  std::string duplicate_key;
  auto note_duplicates = [&](int depth, nlohmann::json::parse_event_t event,
                             nlohmann::json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key) {
      const std::string key = parsed.get<std::string>();
      if (!seen_keys.insert(key).second && duplicate_key.empty()) duplicate_key = key;
    }
    return true;
  };
  nlohmann::json header;
  const char* header_begin = bytes.data() + 8;
  try {
    header = nlohmann::json::parse(header_begin, header_begin + header_length, note_duplicates);
  } catch (const nlohmann::json::exception& error) {
    TESSEL_FAIL(where, "bad JSON header: ", error.what());
  }
  TESSEL_CHECK(header.is_object(), where, "the JSON header is not an object but ",
               header.type_name());
  TESSEL_CHECK(duplicate_key.empty(), where, "duplicate tensor name '", duplicate_key,
               "' in the header");

  const uint64_t data_bytes = bytes.size() - 8 - header_length;
  SafetensorsMetadata parsed_metadata;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      TESSEL_CHECK(value.is_object(), where, "'", kMetadataKey,
                   "' is not an object of strings: ", value.dump());
      for (const auto& [key, text] : value.items()) {
        TESSEL_CHECK(text.is_string(), where, "metadata '", key,
                     "' is not a string: ", text.dump());
        parsed_metadata[key] = text.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(name, value, data_bytes, source));
  }

  // The entries must tile the data section exactly: no overlap, no hole, nothing left over.
  std::vector<const Entry*> by_offset;
  for (const auto& entry : entries) by_offset.push_back(&entry);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry* entry : by_offset) {
    TESSEL_CHECK(entry->begin >= covered, where, "tensor '", entry->name, "' data_offsets [",
                 entry->begin, ", ", entry->end, "] overlap tensor '",
                 previous ? previous->name : "", "' (which ends at ", covered, ")");
    TESSEL_CHECK(entry->begin == covered, where, "hole in the data: bytes [", covered, ", ",
                 entry->begin, ") belong to no tensor (next tensor '", entry->name, "')");
    covered = entry->end;
    previous = entry;
  }
  TESSEL_CHECK(covered == data_bytes, where, "hole in the data: bytes [", covered, ", ", data_bytes,
               ") at the end of the file belong to no tensor");

  const char* data = header_begin + header_length;
  std::map<std::string, Tensor> tensors;
  for (const auto& entry : entries) {
    Tensor tensor = empty(entry.shape, TensorOptions(entry.dtype));
    const size_t nbytes = entry.end - entry.begin;
    if (nbytes > 0) {
      const char* source_bytes = data + entry.begin;
      if (entry.dtype == DType::kBool) {
        for (size_t i = 0; i < nbytes; ++i) {
          const auto byte = static_cast<unsigned char>(source_bytes[i]);
          TESSEL_CHECK(byte <= 1, where, "BOOL tensor '", entry.name, "' holds byte value ",
                       static_cast<int>(byte), " at element ", i, " (expected 0 or 1)");
        }
      }
      StorageAccess access(*tensor.storage());
      std::memcpy(tensor.raw_data(), source_bytes, nbytes);
    }
    tensors.emplace(entry.name, std::move(tensor));
  }
  if (metadata) *metadata = std::move(parsed_metadata);
  return tensors;
}

}  // namespace tessel
