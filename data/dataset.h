// Data sets held in memory: a Dataset hands out batches of (inputs, targets) by index;
// ImageDataset holds images (N,C,H,W f32, normalised) and class labels (N, i64).
//   auto train = load_fashion_mnist("/usr/share/datasets/fashion-mnist", Split::kTrain);
//   Batch batch = train->get_batch({0, 1, 2});  // inputs (3,1,28,28), targets (3)
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tessel::data {

struct Batch {
  Tensor inputs;
  Tensor targets;
};

// Read-only after construction: get_batch may be called from a loader thread.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // A new batch holding the examples at `indices`, in that order.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const = 0;
};

class ImageDataset : public Dataset {
 public:
  // images: (N,C,H,W) f32; labels: (N) i64 in [0, num_classes).
  ImageDataset(Tensor images, Tensor labels, int64_t num_classes);
  int64_t size() const override { return images_.size(0); }
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  const Tensor& images() const { return images_; }
  const Tensor& labels() const { return labels_; }
  int64_t num_classes() const { return num_classes_; }
  // The bytes its tensors hold.
  int64_t nbytes() const { return static_cast<int64_t>(images_.nbytes() + labels_.nbytes()); }

 private:
  Tensor images_;
  Tensor labels_;
  int64_t num_classes_;
};

// Reads an IDX image file and label file (gzip or plain) into (N,1,H,W) images scaled to
// [0, 1] then normalised as (x - mean) / stddev. Throws tessel::Error naming the file when the
// counts differ or a label is not below num_classes.
std::shared_ptr<ImageDataset> load_idx_dataset(const std::string& images_path,
                                               const std::string& labels_path, int64_t num_classes,
                                               float mean, float stddev);

// Fashion-MNIST: 60,000 training and 10,000 test images of 28x28, 10 classes. The statistics
// are those of the training set (pixels in [0, 1]).
constexpr float kFashionMnistMean = 0.2860f;
constexpr float kFashionMnistStd = 0.3530f;
constexpr int64_t kFashionMnistClasses = 10;
constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
enum class Split { kTrain, kTest };
// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte.gz from `directory` (falls back to the
// uncompressed names).
std::shared_ptr<ImageDataset> load_fashion_mnist(const std::string& directory, Split split);

}  // namespace tessel::data
