// CIFAR-10, binary version: records of 1 label byte and 3072 pixel bytes (the R, G, B planes of
// a 32x32 image), 10,000 per file: data_batch_1.bin .. data_batch_5.bin and test_batch.bin.
//   auto train = load_cifar10("/data/cifar-10-batches-bin", Split::kTrain);  // (50000,3,32,32)
//   auto one = load_cifar10("/data/cifar-10-batches-bin/data_batch_1.bin", Split::kTrain);
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace tessel::data {

constexpr int64_t kCifar10Classes = 10;
constexpr int64_t kCifar10Channels = 3;
constexpr int64_t kCifar10Size = 32;  // height and width
constexpr int64_t kCifar10PixelBytes = kCifar10Channels * kCifar10Size * kCifar10Size;  // 3072
constexpr int64_t kCifar10RecordBytes = 1 + kCifar10PixelBytes;                         // 3073
constexpr int64_t kCifar10RecordsPerFile = 10000;
// Per-channel (R, G, B) statistics of the training set, pixels in [0, 1].
inline const std::vector<float>& cifar10_mean() {
  static const std::vector<float> mean = {0.4914f, 0.4822f, 0.4465f};
  return mean;
}
inline const std::vector<float>& cifar10_std() {
  static const std::vector<float> stddev = {0.2470f, 0.2435f, 0.2616f};
  return stddev;
}
// What the archive cifar-10-binary.tar.gz extracts to.
constexpr const char* kCifar10FolderName = "cifar-10-batches-bin";

// The raw records of one or more files, in file order.
struct Cifar10Records {
  std::vector<uint8_t> labels;  // (N) in [0, 10)
  std::vector<uint8_t> pixels;  // (N, 3, 32, 32)
  int64_t size() const { return static_cast<int64_t>(labels.size()); }
};

// Reads one file of any number of records. Throws tessel::Error naming the file when it cannot
// be opened, is empty, its size is not a multiple of 3073 bytes (truncated, or not the binary
// version), reading stops early, or a label is above 9.
Cifar10Records read_cifar10_file(const std::string& path);

// The files of `split` under `path`: a directory holding data_batch_1..5.bin (train) or
// test_batch.bin (test), or its parent holding cifar-10-batches-bin/; or a single file, taken
// whatever the split. Throws tessel::Error listing the expected and the missing files.
std::vector<std::string> cifar10_files(const std::string& path, Split split);

// The images and labels of `files`, concatenated: (N,3,32,32) f32 scaled to [0, 1], then
// normalised per channel with cifar10_mean() / cifar10_std() unless `normalize` is false.
std::shared_ptr<ImageDataset> load_cifar10_files(const std::vector<std::string>& files,
                                                 bool normalize = true);
// load_cifar10_files(cifar10_files(path, split), normalize).
std::shared_ptr<ImageDataset> load_cifar10(const std::string& path, Split split,
                                           bool normalize = true);

}  // namespace tessel::data
