#include "data/augment.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "core/rng.h"

namespace tessel::data {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Keeps augmentation streams apart from other users of the same seed (e.g. the shuffle).
constexpr uint64_t kAugmentPurpose = 0x6175676d656e74ull;  // "augment"

// One value per channel from a list of one (for all) or `channels` values.
float per_channel(const std::vector<float>& values, int64_t channel) {
  return values.size() == 1 ? values[0] : values[static_cast<size_t>(channel)];
}

std::string join(const std::vector<float>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

}  // namespace

KeyedRandom::KeyedRandom(std::initializer_list<uint64_t> key_parts) : key_(0) {
  for (uint64_t part : key_parts) key_ = splitmix64(key_ ^ part);
}

uint32_t KeyedRandom::next_u32() {
  if (used_ == 4) {
    block_ = philox4x32(key_, counter_++);
    used_ = 0;
  }
  return block_[used_++];
}

double KeyedRandom::uniform() {
  const uint64_t high = next_u32(), low = next_u32();
  return static_cast<double>((high << 21) ^ (low >> 11)) * 0x1.0p-53;
}

int64_t KeyedRandom::below(int64_t n) {
  const uint64_t high = next_u32(), low = next_u32();
  return static_cast<int64_t>(((high << 32) | low) % static_cast<uint64_t>(n));
}

double KeyedRandom::normal() {
  if (has_spare_normal_) {
    has_spare_normal_ = false;
    return spare_normal_;
  }
  // 1 - uniform() is in (0, 1], so the log is finite.
  const double radius = std::sqrt(-2.0 * std::log(1.0 - uniform()));
  const double angle = 6.283185307179586 * uniform();  // 2 pi
  spare_normal_ = radius * std::sin(angle);
  has_spare_normal_ = true;
  return radius * std::cos(angle);
}

void Transform::check(int64_t, int64_t, int64_t) const {}

RandomCrop::RandomCrop(int64_t padding, std::vector<float> fill)
    : padding_(padding), fill_(std::move(fill)) {
  TESSEL_CHECK(padding_ >= 0, "RandomCrop: padding must be >= 0, got ", padding_);
}

void RandomCrop::check(int64_t channels, int64_t, int64_t) const {
  TESSEL_CHECK(fill_.empty() || fill_.size() == 1 || static_cast<int64_t>(fill_.size()) == channels,
               "RandomCrop: fill has ", fill_.size(), " values ", join(fill_),
               " but the images have ", channels, " channels (give 1 value or one per channel)");
}

void RandomCrop::apply(ImageRef image, KeyedRandom& random) const {
  const int64_t span = 2 * padding_ + 1;
  // Offsets of the window in the padded image, minus the padding: the source pixel of output
  // (y, x) is (y + shift_y, x + shift_x).
  const int64_t shift_y = random.below(span) - padding_;
  const int64_t shift_x = random.below(span) - padding_;
  if (shift_y == 0 && shift_x == 0) return;
  const int64_t height = image.height, width = image.width;
  const int64_t plane = height * width;
  std::vector<float> source(image.data, image.data + image.channels * plane);
  for (int64_t c = 0; c < image.channels; ++c) {
    const float fill = fill_.empty() ? 0.0f : per_channel(fill_, c);
    const float* in = source.data() + c * plane;
    float* out = image.data + c * plane;
    for (int64_t y = 0; y < height; ++y) {
      const int64_t source_y = y + shift_y;
      float* out_row = out + y * width;
      if (source_y < 0 || source_y >= height) {
        std::fill(out_row, out_row + width, fill);
        continue;
      }
      for (int64_t x = 0; x < width; ++x) {
        const int64_t source_x = x + shift_x;
        out_row[x] = source_x >= 0 && source_x < width ? in[source_y * width + source_x] : fill;
      }
    }
  }
}

std::string RandomCrop::name() const {
  std::ostringstream out;
  out << "RandomCrop(padding=" << padding_;
  if (!fill_.empty()) out << ", fill=" << join(fill_);
  out << ")";
  return out.str();
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p_(p) {
  TESSEL_CHECK(p_ >= 0.0 && p_ <= 1.0, "RandomHorizontalFlip: p must be in [0, 1], got ", p_);
}

void RandomHorizontalFlip::apply(ImageRef image, KeyedRandom& random) const {
  if (!(random.uniform() < p_)) return;
  for (int64_t row = 0; row < image.channels * image.height; ++row) {
    float* values = image.data + row * image.width;
    std::reverse(values, values + image.width);
  }
}

std::string RandomHorizontalFlip::name() const {
  std::ostringstream out;
  out << "RandomHorizontalFlip(p=" << p_ << ")";
  return out.str();
}

Normalize::Normalize(std::vector<float> mean, std::vector<float> stddev)
    : mean_(std::move(mean)), stddev_(std::move(stddev)) {
  TESSEL_CHECK(!mean_.empty() && !stddev_.empty(), "Normalize: mean and std must not be empty");
  TESSEL_CHECK(mean_.size() == stddev_.size() || mean_.size() == 1 || stddev_.size() == 1,
               "Normalize: mean ", join(mean_), " and std ", join(stddev_),
               " have different lengths");
  for (float value : stddev_)
    TESSEL_CHECK(value > 0, "Normalize: every std must be positive, got ", join(stddev_));
}

void Normalize::check(int64_t channels, int64_t, int64_t) const {
  for (const auto* values : {&mean_, &stddev_})
    TESSEL_CHECK(values->size() == 1 || static_cast<int64_t>(values->size()) == channels,
                 "Normalize: mean ", join(mean_), " and std ", join(stddev_),
                 " do not fit images of ", channels, " channels (give 1 value or one per channel)");
}

void Normalize::apply(ImageRef image, KeyedRandom&) const {
  const int64_t plane = image.height * image.width;
  for (int64_t c = 0; c < image.channels; ++c) {
    const float scale = 1.0f / per_channel(stddev_, c);
    const float shift = per_channel(mean_, c);
    float* values = image.data + c * plane;
    for (int64_t i = 0; i < plane; ++i) values[i] = (values[i] - shift) * scale;
  }
}

std::string Normalize::name() const {
  return "Normalize(mean=" + join(mean_) + ", std=" + join(stddev_) + ")";
}

TransformList& TransformList::add(std::shared_ptr<const Transform> transform) {
  TESSEL_CHECK(transform != nullptr, "TransformList::add: transform is null");
  transforms_.push_back(std::move(transform));
  return *this;
}

Tensor TransformList::apply(const Tensor& images, const std::vector<int64_t>& indices,
                            uint64_t seed, int64_t epoch) const {
  TESSEL_CHECK(images.defined() && images.dim() == 4 && images.dtype() == DType::kFloat32 &&
                   images.device().is_cpu(),
               "TransformList: images must be a (N,C,H,W) f32 CPU tensor, got ",
               images.defined() ? images.str() : "undefined");
  const int64_t count = images.size(0), channels = images.size(1);
  const int64_t height = images.size(2), width = images.size(3);
  TESSEL_CHECK(static_cast<int64_t>(indices.size()) == count, "TransformList: ", count,
               " images but ", indices.size(), " indices");
  for (const auto& transform : transforms_) transform->check(channels, height, width);

  Tensor output = tessel::empty(images.sizes(), DType::kFloat32);
  if (count == 0) return output;
  StorageAccess output_access(*output.storage());
  float* values = output.data_ptr<float>();
  if (images.is_contiguous()) {
    StorageAccess images_access(*images.storage());
    std::memcpy(values, images.data_ptr<float>(), output.nbytes());
  } else {
    const std::vector<float> gathered = images.to_vector<float>();
    std::memcpy(values, gathered.data(), output.nbytes());
  }
  const int64_t example_size = channels * height * width;
  for (int64_t i = 0; i < count; ++i) {
    const ImageRef image{values + i * example_size, channels, height, width};
    for (size_t position = 0; position < transforms_.size(); ++position) {
      KeyedRandom random{seed, kAugmentPurpose, static_cast<uint64_t>(epoch),
                         static_cast<uint64_t>(indices[i]), position};
      transforms_[position]->apply(image, random);
    }
  }
  return output;
}

BatchTransform TransformList::batch_transform() const {
  return [list = *this](Batch& batch, const BatchInfo& info) {
    batch.inputs = list.apply(batch.inputs, info.indices, info.seed, info.epoch);
  };
}

std::string TransformList::str() const {
  if (transforms_.empty()) return "(no transforms)";
  std::string text;
  for (size_t i = 0; i < transforms_.size(); ++i)
    text += (i ? " -> " : "") + transforms_[i]->name();
  return text;
}

TransformList standard_image_augmentation(int64_t padding) {
  TransformList list;
  list.add(std::make_shared<RandomCrop>(padding)).add(std::make_shared<RandomHorizontalFlip>(0.5));
  return list;
}

}  // namespace tessel::data
