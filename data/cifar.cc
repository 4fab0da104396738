#include "data/cifar.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace tessel::data {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> expected_names(Split split) {
  if (split == Split::kTest) return {"test_batch.bin"};
  std::vector<std::string> names;
  for (int i = 1; i <= 5; ++i) names.push_back("data_batch_" + std::to_string(i) + ".bin");
  return names;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i ? ", " : "") + names[i];
  return text;
}

bool is_file(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

bool holds_any(const fs::path& directory, const std::vector<std::string>& names) {
  for (const auto& name : names)
    if (is_file(directory / name)) return true;
  return false;
}

}  // namespace

Cifar10Records read_cifar10_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSEL_CHECK(in.good(), "CIFAR-10 file '", path, "': cannot open: ", std::strerror(errno));
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  in.seekg(0, std::ios::beg);
  TESSEL_CHECK(size >= 0 && in.good(), "CIFAR-10 file '", path, "': cannot read its size");
  TESSEL_CHECK(size > 0, "CIFAR-10 file '", path, "': empty, expected records of ",
               kCifar10RecordBytes, " bytes");
  TESSEL_CHECK(size % kCifar10RecordBytes == 0, "CIFAR-10 file '", path, "': truncated or not ",
               "the binary version: its ", size, " bytes are not a multiple of the ",
               kCifar10RecordBytes, "-byte record (1 label byte + ", kCifar10PixelBytes,
               " pixel bytes): ", size / kCifar10RecordBytes, " whole records and ",
               size % kCifar10RecordBytes, " bytes more");

  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  TESSEL_CHECK(in.gcount() == size, "CIFAR-10 file '", path, "': truncated while reading: got ",
               in.gcount(), " of ", size, " bytes");

  const int64_t count = size / kCifar10RecordBytes;
  Cifar10Records records;
  records.labels.resize(static_cast<size_t>(count));
  records.pixels.resize(static_cast<size_t>(count * kCifar10PixelBytes));
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* record = bytes.data() + i * kCifar10RecordBytes;
    TESSEL_CHECK(record[0] < kCifar10Classes, "CIFAR-10 file '", path, "': record ", i,
                 " has label ", static_cast<int>(record[0]), ", above ", kCifar10Classes - 1,
                 " (a CIFAR-100 file, or not CIFAR-10 at all?)");
    records.labels[i] = record[0];
    std::memcpy(records.pixels.data() + i * kCifar10PixelBytes, record + 1, kCifar10PixelBytes);
  }
  return records;
}

std::vector<std::string> cifar10_files(const std::string& path, Split split) {
  const fs::path given(path);
  if (is_file(given)) return {path};
  const std::vector<std::string> names = expected_names(split);
  const std::vector<std::string> all_names = {"data_batch_1.bin .. data_batch_5.bin",
                                              "test_batch.bin"};
  std::error_code error;
  TESSEL_CHECK(fs::is_directory(given, error), "CIFAR-10: '", path,
               "' is neither a file nor a directory (expected a directory holding ",
               join_names(all_names), ", the binary version, or one such file)");

  // Accept the folder the archive was extracted into, too.
  fs::path directory = given;
  if (!holds_any(directory, expected_names(Split::kTrain)) &&
      !holds_any(directory, expected_names(Split::kTest)) &&
      fs::is_directory(directory / kCifar10FolderName, error))
    directory /= kCifar10FolderName;

  std::vector<std::string> files, missing;
  for (const auto& name : names) {
    if (is_file(directory / name))
      files.push_back((directory / name).string());
    else
      missing.push_back(name);
  }
  TESSEL_CHECK(missing.empty(), "CIFAR-10 in '", directory.string(), "': missing ",
               join_names(missing), " (the ", split == Split::kTrain ? "training" : "test",
               " split reads ", join_names(names), "; the binary version, cifar-10-binary.tar.gz)");
  return files;
}

std::shared_ptr<ImageDataset> load_cifar10_files(const std::vector<std::string>& files,
                                                 bool normalize) {
  TESSEL_CHECK(!files.empty(), "load_cifar10_files: no files given");
  std::vector<Cifar10Records> parts;
  int64_t count = 0;
  for (const auto& file : files) {
    parts.push_back(read_cifar10_file(file));
    count += parts.back().size();
  }

  Tensor images = empty({count, kCifar10Channels, kCifar10Size, kCifar10Size}, DType::kFloat32);
  Tensor labels = empty({count}, DType::kInt64);
  {
    StorageAccess images_access(*images.storage());
    StorageAccess labels_access(*labels.storage());
    float* image_values = images.data_ptr<float>();
    int64_t* label_values = labels.data_ptr<int64_t>();
    // value = pixel * scale[c] + shift[c]: pixel / 255, then (x - mean) / std when normalising.
    float scale[kCifar10Channels], shift[kCifar10Channels];
    for (int64_t c = 0; c < kCifar10Channels; ++c) {
      const float mean = normalize ? cifar10_mean()[c] : 0.0f;
      const float stddev = normalize ? cifar10_std()[c] : 1.0f;
      scale[c] = 1.0f / (255.0f * stddev);
      shift[c] = -mean / stddev;
    }
    constexpr int64_t plane = kCifar10Size * kCifar10Size;
    int64_t example = 0;
    for (const auto& part : parts) {
      for (int64_t i = 0; i < part.size(); ++i, ++example) {
        label_values[example] = part.labels[i];
        const uint8_t* pixels = part.pixels.data() + i * kCifar10PixelBytes;
        float* out = image_values + example * kCifar10PixelBytes;
        for (int64_t j = 0; j < kCifar10PixelBytes; ++j)
          out[j] = static_cast<float>(pixels[j]) * scale[j / plane] + shift[j / plane];
      }
    }
  }
  return std::make_shared<ImageDataset>(std::move(images), std::move(labels), kCifar10Classes);
}

std::shared_ptr<ImageDataset> load_cifar10(const std::string& path, Split split, bool normalize) {
  return load_cifar10_files(cifar10_files(path, split), normalize);
}

}  // namespace tessel::data
