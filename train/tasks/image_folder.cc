#include "train/tasks/image_folder.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "data/cifar.h"
#include "data/idx.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;

bool exists_with_optional_gz(const fs::path& path) {
  return fs::exists(path) || fs::exists(path.string() + ".gz");
}

std::string existing_idx(const fs::path& directory, const std::string& name) {
  const fs::path gz = directory / (name + ".gz");
  return fs::exists(gz) ? gz.string() : (directory / name).string();
}

}  // namespace

std::shared_ptr<data::ImageDataset> load_image_folder(const std::string& path, data::Split split) {
  const fs::path folder(path);
  TESSEL_CHECK(fs::exists(folder), "image folder '", path, "' does not exist");
  if (fs::is_regular_file(folder) || fs::exists(folder / "data_batch_1.bin") ||
      fs::exists(folder / "test_batch.bin") || fs::exists(folder / data::kCifar10FolderName))
    return data::load_cifar10(path, split);
  TESSEL_CHECK(exists_with_optional_gz(folder / "train-images-idx3-ubyte"), "image folder '", path,
               "' holds neither CIFAR-10 binary files (data_batch_1.bin .. data_batch_5.bin, "
               "test_batch.bin) nor IDX files (train-images-idx3-ubyte[.gz], "
               "train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], "
               "t10k-labels-idx1-ubyte[.gz])");
  // Statistics and classes come from the training split, so both splits agree.
  const data::IdxArray train_images =
      data::read_idx_images(existing_idx(folder, "train-images-idx3-ubyte"));
  double sum = 0, sum_sq = 0;
  for (uint8_t v : train_images.values) sum += v / 255.0, sum_sq += (v / 255.0) * (v / 255.0);
  const double n = std::max<double>(1.0, static_cast<double>(train_images.values.size()));
  const double mean = sum / n;
  const double stddev = std::max(1e-6, std::sqrt(std::max(0.0, sum_sq / n - mean * mean)));
  const data::IdxArray train_labels =
      data::read_idx_labels(existing_idx(folder, "train-labels-idx1-ubyte"));
  int64_t classes = 1;
  for (uint8_t label : train_labels.values) classes = std::max<int64_t>(classes, label + 1);
  const std::string prefix = split == data::Split::kTrain ? "train" : "t10k";
  return data::load_idx_dataset(existing_idx(folder, prefix + "-images-idx3-ubyte"),
                                existing_idx(folder, prefix + "-labels-idx1-ubyte"), classes,
                                static_cast<float>(mean), static_cast<float>(stddev));
}

}  // namespace tessel::train
