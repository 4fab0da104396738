#include "data/dataset.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "data/idx.h"

namespace tessel::data {

ImageDataset::ImageDataset(Tensor images, Tensor labels, int64_t num_classes)
    : images_(std::move(images)), labels_(std::move(labels)), num_classes_(num_classes) {
  TESSEL_CHECK(images_.defined() && images_.dim() == 4 && images_.dtype() == DType::kFloat32,
               "ImageDataset: images must be a (N,C,H,W) f32 tensor, got ",
               images_.defined() ? images_.str() : "undefined");
  TESSEL_CHECK(labels_.defined() && labels_.dim() == 1 && labels_.dtype() == DType::kInt64,
               "ImageDataset: labels must be a (N) i64 tensor, got ",
               labels_.defined() ? labels_.str() : "undefined");
  TESSEL_CHECK(images_.size(0) == labels_.size(0), "ImageDataset: ", images_.size(0),
               " images but ", labels_.size(0), " labels");
  TESSEL_CHECK(images_.is_contiguous() && labels_.is_contiguous() && images_.device().is_cpu() &&
                   labels_.device().is_cpu(),
               "ImageDataset: images and labels must be contiguous CPU tensors");
  TESSEL_CHECK(num_classes_ > 0, "ImageDataset: num_classes must be positive, got ", num_classes_);
}

Batch ImageDataset::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t count = static_cast<int64_t>(indices.size());
  Shape input_shape = images_.sizes();
  input_shape[0] = count;
  const int64_t example_size = images_.numel() / std::max<int64_t>(size(), 1);
  Batch batch{empty(input_shape, DType::kFloat32), empty({count}, DType::kInt64)};
  if (count == 0) return batch;

  StorageAccess images_access(*images_.storage());
  StorageAccess labels_access(*labels_.storage());
  StorageAccess inputs_access(*batch.inputs.storage());
  StorageAccess targets_access(*batch.targets.storage());
  const float* images = images_.data_ptr<float>();
  const int64_t* labels = labels_.data_ptr<int64_t>();
  float* inputs = batch.inputs.data_ptr<float>();
  int64_t* targets = batch.targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    const int64_t index = indices[i];
    TESSEL_CHECK(index >= 0 && index < size(), "ImageDataset::get_batch: index ", index,
                 " out of range for a data set of ", size(), " examples");
    std::memcpy(inputs + i * example_size, images + index * example_size,
                sizeof(float) * static_cast<size_t>(example_size));
    targets[i] = labels[index];
  }
  return batch;
}

std::shared_ptr<ImageDataset> load_idx_dataset(const std::string& images_path,
                                               const std::string& labels_path, int64_t num_classes,
                                               float mean, float stddev) {
  TESSEL_CHECK(stddev > 0, "load_idx_dataset: stddev must be positive, got ", stddev);
  const IdxArray images = read_idx_images(images_path);
  const IdxArray labels = read_idx_labels(labels_path);
  TESSEL_CHECK(images.dims[0] == labels.dims[0], "IDX files '", images_path, "' and '", labels_path,
               "': ", images.dims[0], " images but ", labels.dims[0], " labels");
  const int64_t count = images.dims[0];
  const int64_t height = images.dims[1];
  const int64_t width = images.dims[2];

  Tensor image_tensor = empty({count, 1, height, width}, DType::kFloat32);
  Tensor label_tensor = empty({count}, DType::kInt64);
  {
    StorageAccess image_access(*image_tensor.storage());
    StorageAccess label_access(*label_tensor.storage());
    float* image_values = image_tensor.data_ptr<float>();
    int64_t* label_values = label_tensor.data_ptr<int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      TESSEL_CHECK(labels.values[i] < num_classes, "IDX file '", labels_path, "': label ", i,
                   " is ", static_cast<int>(labels.values[i]), ", not below the ", num_classes,
                   " classes");
      label_values[i] = labels.values[i];
    }
    // Scale to [0, 1] first, as torchvision's ToTensor does, then normalise.
    const float scale = 1.0f / (255.0f * stddev);
    const float shift = mean / stddev;
    for (size_t i = 0; i < images.values.size(); ++i)
      image_values[i] = static_cast<float>(images.values[i]) * scale - shift;
  }
  return std::make_shared<ImageDataset>(std::move(image_tensor), std::move(label_tensor),
                                        num_classes);
}

namespace {
std::string existing_file(const std::string& directory, const std::string& name) {
  const std::string gz = directory + "/" + name + ".gz";
  if (std::ifstream(gz).good()) return gz;
  const std::string plain = directory + "/" + name;
  if (std::ifstream(plain).good()) return plain;
  TESSEL_FAIL("Fashion-MNIST: neither '", gz, "' nor '", plain,
              "' exists (install Debian's dataset-fashion-mnist, or pass --data=DIR)");
}
}  // namespace

std::shared_ptr<ImageDataset> load_fashion_mnist(const std::string& directory, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::string images_path = existing_file(directory, prefix + "-images-idx3-ubyte");
  const std::string labels_path = existing_file(directory, prefix + "-labels-idx1-ubyte");
  return load_idx_dataset(images_path, labels_path, kFashionMnistClasses, kFashionMnistMean,
                          kFashionMnistStd);
}

}  // namespace tessel::data
