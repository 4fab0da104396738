// IDX files (the MNIST / Fashion-MNIST format): a big-endian header (magic 0x00000803 for
// u8 images, 0x00000801 for u8 labels, then one u32 per dimension) and the raw u8 values.
// Gzip-compressed (.gz) and plain files are both read.
//   IdxArray images = read_idx_images("train-images-idx3-ubyte.gz");  // dims {N, 28, 28}
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessel::data {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // u8, 3 dimensions
constexpr uint32_t kIdxLabelsMagic = 0x00000801;  // u8, 1 dimension

// The values of one IDX file, row-major.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;
};

// Reads an IDX file whose magic must be `expected_magic`; throws tessel::Error naming the file
// on a missing file, a wrong magic, or truncated or trailing data.
IdxArray read_idx(const std::string& path, uint32_t expected_magic);
inline IdxArray read_idx_images(const std::string& path) { return read_idx(path, kIdxImagesMagic); }
inline IdxArray read_idx_labels(const std::string& path) { return read_idx(path, kIdxLabelsMagic); }

}  // namespace tessel::data
