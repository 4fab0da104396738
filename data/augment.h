// Per-sample image augmentation: a TransformList of RandomCrop, RandomHorizontalFlip, Normalize
// (or your own Transform) applied to each (C,H,W) image of a batch, on the DataLoader's thread.
//   TransformList augment;
//   augment.add(std::make_shared<RandomCrop>(4)).add(std::make_shared<RandomHorizontalFlip>());
//   DataLoader loader(train, DataLoaderOptions().seed(1).transform(augment.batch_transform()));
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/data_loader.h"

namespace tessel::data {

// One example's image: (C,H,W) f32, row-major, owned by the batch being transformed.
struct ImageRef {
  float* data;
  int64_t channels;
  int64_t height;
  int64_t width;
};

// A stream of Philox 4x32-10 numbers (core/rng.h) under a key hashed from a few integers. A
// transform gets the stream of (seed, epoch, example index, its position in the list), so an
// example's augmentation depends on nothing else (not batch size, order or thread timing).
class KeyedRandom {
 public:
  KeyedRandom(std::initializer_list<uint64_t> key_parts);
  uint32_t next_u32();
  // Uniform in [0, 1) with 53 random bits.
  double uniform();
  // Uniform in [0, n) for n > 0 (64 random bits, so the modulo bias is negligible).
  int64_t below(int64_t n);
  // Standard normal (Box-Muller; the second value of each pair is kept for the next call).
  double normal();

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
  std::array<uint32_t, 4> block_{};
  int used_ = 4;
  double spare_normal_ = 0;
  bool has_spare_normal_ = false;
};

// A per-sample transform. apply() runs on a loader's background thread and is const: one list
// may serve several loaders at once.
class Transform {
 public:
  virtual ~Transform() = default;
  // Throws tessel::Error when the transform cannot take images of this geometry (called once
  // per batch, before any example is touched).
  virtual void check(int64_t channels, int64_t height, int64_t width) const;
  // Rewrites `image` in place; every random choice comes from `random`.
  virtual void apply(ImageRef image, KeyedRandom& random) const = 0;
  virtual std::string name() const = 0;
};

// torchvision's RandomCrop(size=(H,W), padding): pads each side by `padding` pixels of `fill`,
// then cuts out an HxW window at a uniformly drawn offset in [0, 2*padding] on each axis. So the
// image moves by up to `padding` pixels with the vacated border filled. `fill`: empty for zeros,
// one value for every channel, or one per channel. (On images already normalised, a fill of
// -mean/std per channel pads with black, as cropping before normalising does.)
class RandomCrop : public Transform {
 public:
  explicit RandomCrop(int64_t padding, std::vector<float> fill = {});
  void check(int64_t channels, int64_t height, int64_t width) const override;
  void apply(ImageRef image, KeyedRandom& random) const override;
  std::string name() const override;
  int64_t padding() const { return padding_; }

 private:
  int64_t padding_;
  std::vector<float> fill_;
};

// Mirrors the image left-right with probability p.
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5);
  void apply(ImageRef image, KeyedRandom& random) const override;
  std::string name() const override;

 private:
  double p_;
};

// (x - mean[c]) / std[c] per channel; one value each applies to every channel.
class Normalize : public Transform {
 public:
  Normalize(std::vector<float> mean, std::vector<float> stddev);
  void check(int64_t channels, int64_t height, int64_t width) const override;
  void apply(ImageRef image, KeyedRandom& random) const override;
  std::string name() const override;

 private:
  std::vector<float> mean_;
  std::vector<float> stddev_;
};

// Transforms applied in order to every example of a batch.
class TransformList {
 public:
  TransformList() = default;
  TransformList& add(std::shared_ptr<const Transform> transform);
  const std::vector<std::shared_ptr<const Transform>>& transforms() const { return transforms_; }
  bool empty() const { return transforms_.empty(); }

  // A new (N,C,H,W) f32 tensor: example i of `images` (any strides) transformed with the random
  // numbers of (seed, epoch, indices[i]). Throws tessel::Error on other shapes or dtypes, or a
  // count of indices other than N.
  Tensor apply(const Tensor& images, const std::vector<int64_t>& indices, uint64_t seed,
               int64_t epoch) const;
  // For DataLoaderOptions::transform: replaces batch.inputs by apply(inputs, indices, seed,
  // epoch). The function holds its own copy of the list.
  BatchTransform batch_transform() const;
  // "RandomCrop(padding=4) -> RandomHorizontalFlip(p=0.5)"
  std::string str() const;

 private:
  std::vector<std::shared_ptr<const Transform>> transforms_;
};

// The usual training augmentation for images already normalised (e.g. by load_cifar10):
// RandomCrop(padding) then RandomHorizontalFlip(0.5). The crop pads with zeros, which after
// normalisation is the data set's mean colour.
TransformList standard_image_augmentation(int64_t padding);

}  // namespace tessel::data
