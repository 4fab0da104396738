#include "data/augment.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "data/data_loader.h"
#include "data/dataset.h"
#include "gtest/gtest.h"
#include "tests/testing.h"

namespace tessel::data {
namespace {

using testing::throws_error;

// `count` copies of one (C,H,W) image whose pixel (c, y, x) is 100 c + 10 y + x + 1, so no pixel
// is zero and each value tells where it came from.
Tensor numbered_images(int64_t count, int64_t channels, int64_t height, int64_t width) {
  std::vector<float> values;
  for (int64_t n = 0; n < count; ++n)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t y = 0; y < height; ++y)
        for (int64_t x = 0; x < width; ++x) values.push_back(100.0f * c + 10.0f * y + x + 1.0f);
  return from_vector<float>(values, {count, channels, height, width});
}

std::vector<int64_t> iota(int64_t count, int64_t first = 0) {
  std::vector<int64_t> values(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) values[i] = first + i;
  return values;
}

// Example `n` of a (N,C,H,W) value list.
std::vector<float> example(const std::vector<float>& values, int64_t n, int64_t size) {
  return std::vector<float>(values.begin() + n * size, values.begin() + (n + 1) * size);
}

// The numbered image moved so that output (y, x) shows source (y + dy, x + dx), `fill` outside.
std::vector<float> shifted(int64_t channels, int64_t height, int64_t width, int64_t dy, int64_t dx,
                           const std::vector<float>& fill) {
  std::vector<float> values;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t y = 0; y < height; ++y)
      for (int64_t x = 0; x < width; ++x) {
        const int64_t sy = y + dy, sx = x + dx;
        values.push_back(sy >= 0 && sy < height && sx >= 0 && sx < width
                             ? 100.0f * c + 10.0f * sy + sx + 1.0f
                             : fill[fill.size() == 1 ? 0 : c]);
      }
  return values;
}

TEST(RandomCrop, MovesTheImageByUpToThePaddingAndFillsTheBorder) {
  // 2 channels of 3x4; with padding 1 every one of the 9 shifts must appear, and nothing else.
  const int64_t count = 400;
  TransformList crop;
  crop.add(std::make_shared<RandomCrop>(1, std::vector<float>{-1.0f, -2.0f}));
  auto values = crop.apply(numbered_images(count, 2, 3, 4), iota(count), 5, 0).to_vector<float>();
  std::set<std::pair<int64_t, int64_t>> seen;
  for (int64_t n = 0; n < count; ++n) {
    const auto image = example(values, n, 24);
    bool matched = false;
    for (int64_t dy = -1; dy <= 1 && !matched; ++dy)
      for (int64_t dx = -1; dx <= 1 && !matched; ++dx)
        if (image == shifted(2, 3, 4, dy, dx, {-1.0f, -2.0f})) {
          seen.insert({dy, dx});
          matched = true;
        }
    ASSERT_TRUE(matched) << "example " << n << " is not a shifted copy of the image";
  }
  EXPECT_EQ(seen.size(), 9u);
}

TEST(RandomCrop, ZeroPaddingByDefaultAndPaddingZeroLeavesTheImage) {
  const Tensor images = numbered_images(50, 1, 4, 4);
  TransformList no_padding;
  no_padding.add(std::make_shared<RandomCrop>(0));
  EXPECT_EQ(no_padding.apply(images, iota(50), 1, 0).to_vector<float>(), images.to_vector<float>());

  // Padding 4 on a 4x4 image: a shift of 4 rows or columns leaves only zeros.
  TransformList wide;
  wide.add(std::make_shared<RandomCrop>(4));
  auto values = wide.apply(numbered_images(500, 1, 4, 4), iota(500), 1, 0).to_vector<float>();
  int blank = 0;
  for (int64_t n = 0; n < 500; ++n) {
    const auto image = example(values, n, 16);
    bool matched = false;
    for (int64_t dy = -4; dy <= 4 && !matched; ++dy)
      for (int64_t dx = -4; dx <= 4 && !matched; ++dx)
        matched = image == shifted(1, 4, 4, dy, dx, {0.0f});
    ASSERT_TRUE(matched) << n;
    if (image == std::vector<float>(16, 0.0f)) ++blank;
  }
  EXPECT_GT(blank, 0);
}

TEST(RandomHorizontalFlip, MirrorsEveryRowOfEveryChannel) {
  TransformList flip;
  flip.add(std::make_shared<RandomHorizontalFlip>(1.0));
  auto values = flip.apply(numbered_images(1, 2, 2, 3), {0}, 0, 0).to_vector<float>();
  EXPECT_EQ(values, (std::vector<float>{3, 2, 1, 13, 12, 11, 103, 102, 101, 113, 112, 111}));
  TransformList never;
  never.add(std::make_shared<RandomHorizontalFlip>(0.0));
  EXPECT_EQ(never.apply(numbered_images(20, 2, 2, 3), iota(20), 0, 0).to_vector<float>(),
            numbered_images(20, 2, 2, 3).to_vector<float>());
}

TEST(RandomHorizontalFlip, FlipsAboutHalfOfTheExamples) {
  const int64_t count = 4000;
  TransformList flip;
  flip.add(std::make_shared<RandomHorizontalFlip>());
  auto values = flip.apply(numbered_images(count, 1, 1, 2), iota(count), 11, 3).to_vector<float>();
  int64_t flipped = 0;
  for (int64_t n = 0; n < count; ++n) flipped += values[2 * n] == 2.0f;
  // Binomial(4000, 0.5) has a standard deviation of about 32.
  EXPECT_NEAR(static_cast<double>(flipped) / count, 0.5, 0.04);
}

TEST(Normalize, SubtractsTheMeanAndDividesByTheStdPerChannel) {
  TransformList normalize;
  normalize.add(std::make_shared<Normalize>(std::vector<float>{1.0f, 101.0f},
                                            std::vector<float>{2.0f, 4.0f}));
  auto values = normalize.apply(numbered_images(1, 2, 1, 2), {0}, 0, 0).to_vector<float>();
  EXPECT_EQ(values, (std::vector<float>{0.0f, 0.5f, 0.0f, 0.25f}));
  TransformList one_value;
  one_value.add(std::make_shared<Normalize>(std::vector<float>{1.0f}, std::vector<float>{0.5f}));
  EXPECT_EQ(one_value.apply(numbered_images(1, 2, 1, 1), {0}, 0, 0).to_vector<float>(),
            (std::vector<float>{0.0f, 200.0f}));
}

TEST(TransformList, AppliesTransformsInOrder) {
  // Flip then normalise; each example either flipped or not, and normalised either way.
  TransformList list;
  list.add(std::make_shared<RandomHorizontalFlip>())
      .add(std::make_shared<Normalize>(std::vector<float>{1.0f}, std::vector<float>{10.0f}));
  EXPECT_EQ(list.str(), "RandomHorizontalFlip(p=0.5) -> Normalize(mean=[1], std=[10])");
  auto values = list.apply(numbered_images(40, 1, 1, 2), iota(40), 2, 0).to_vector<float>();
  std::set<std::vector<float>> outcomes;
  for (int64_t n = 0; n < 40; ++n) outcomes.insert(example(values, n, 2));
  EXPECT_EQ(outcomes, (std::set<std::vector<float>>{{0.0f, 0.1f}, {0.1f, 0.0f}}));
  EXPECT_EQ(standard_image_augmentation(4).str(),
            "RandomCrop(padding=4) -> RandomHorizontalFlip(p=0.5)");
}

TEST(TransformList, SameSeedEpochAndIndexGiveTheSameResult) {
  const TransformList list = standard_image_augmentation(2);
  const Tensor images = numbered_images(64, 3, 6, 6);
  const auto first = list.apply(images, iota(64), 7, 1).to_vector<float>();
  EXPECT_EQ(first, list.apply(images, iota(64), 7, 1).to_vector<float>());
  EXPECT_NE(first, list.apply(images, iota(64), 8, 1).to_vector<float>());
  EXPECT_NE(first, list.apply(images, iota(64), 7, 2).to_vector<float>());
  // An example's result depends on its index, not on its position in the batch.
  const auto moved = list.apply(images.slice(0, 0, 1), {37}, 7, 1).to_vector<float>();
  EXPECT_EQ(moved, example(first, 37, 3 * 36));
}

TEST(TransformList, EpochsGiveDifferentAugmentations) {
  const TransformList list = standard_image_augmentation(2);
  const Tensor images = numbered_images(16, 1, 5, 5);
  std::set<std::vector<float>> epochs;
  for (int64_t epoch = 0; epoch < 5; ++epoch)
    epochs.insert(list.apply(images, iota(16), 3, epoch).to_vector<float>());
  EXPECT_EQ(epochs.size(), 5u);
}

TEST(TransformList, ReadsNonContiguousImagesAndLeavesTheInputAlone) {
  const Tensor images = numbered_images(3, 2, 4, 4);
  const Tensor transposed = images.transpose(2, 3);  // (3,2,4,4) with swapped strides
  TransformList flip;
  flip.add(std::make_shared<RandomHorizontalFlip>(1.0));
  const Tensor output = flip.apply(transposed, iota(3), 0, 0);
  EXPECT_TRUE(output.is_contiguous());
  auto expected = transposed.contiguous().to_vector<float>();
  for (size_t row = 0; row < expected.size() / 4; ++row)
    std::reverse(expected.begin() + 4 * row, expected.begin() + 4 * row + 4);
  EXPECT_EQ(output.to_vector<float>(), expected);
  EXPECT_EQ(images.to_vector<float>(), numbered_images(3, 2, 4, 4).to_vector<float>());
}

TEST(TransformList, BadSettingsAndInputsAreClearErrors) {
  EXPECT_TRUE(throws_error([] { RandomCrop(-1); }, "RandomCrop: padding must be >= 0, got -1"));
  EXPECT_TRUE(throws_error([] { RandomHorizontalFlip(1.5); }, "p must be in [0, 1], got 1.5"));
  EXPECT_TRUE(throws_error([] { Normalize({0.5f}, {0.0f}); }, "every std must be positive"));
  EXPECT_TRUE(throws_error(
      [] {
        Normalize({0.1f, 0.2f}, {1.0f, 1.0f, 1.0f});
      },
      "have different lengths"));
  TransformList normalize;
  normalize.add(std::make_shared<Normalize>(std::vector<float>{0.1f, 0.2f, 0.3f},
                                            std::vector<float>{1.0f, 1.0f, 1.0f}));
  EXPECT_TRUE(throws_error([&] { normalize.apply(numbered_images(2, 1, 2, 2), iota(2), 0, 0); },
                           "do not fit images of 1 channels"));
  TransformList crop;
  crop.add(std::make_shared<RandomCrop>(1, std::vector<float>{0.0f, 1.0f}));
  EXPECT_TRUE(throws_error([&] { crop.apply(numbered_images(2, 3, 2, 2), iota(2), 0, 0); },
                           "fill has 2 values [0, 1] but the images have 3 channels"));
  EXPECT_TRUE(throws_error([&] { crop.apply(numbered_images(2, 2, 2, 2), iota(3), 0, 0); },
                           "2 images but 3 indices"));
  EXPECT_TRUE(throws_error(
      [&] {
        crop.apply(tensor({1, 2, 3}, {3}), iota(3), 0, 0);
      },
      "images must be a (N,C,H,W) f32 CPU tensor"));
  EXPECT_TRUE(throws_error([&] { TransformList().add(nullptr); }, "transform is null"));
}

// Example i of a data set whose label is i: the loader's batches say which example is which.
std::shared_ptr<ImageDataset> labelled_by_index(int64_t count) {
  return std::make_shared<ImageDataset>(numbered_images(count, 3, 8, 8),
                                        from_vector<int64_t>(iota(count), {count}), count);
}

// Every example's augmented image in epoch `epoch`, by example index.
std::map<int64_t, std::vector<float>> augmented_epoch(DataLoader& loader, int64_t epoch) {
  std::map<int64_t, std::vector<float>> by_index;
  loader.start_epoch(epoch);
  while (auto batch = loader.next()) {
    const auto images = batch->inputs.to_vector<float>();
    const auto labels = batch->targets.to_vector<int64_t>();
    for (size_t i = 0; i < labels.size(); ++i)
      by_index[labels[i]] = example(images, static_cast<int64_t>(i), 3 * 64);
  }
  return by_index;
}

TEST(TransformList, RunsInTheLoaderIndependentlyOfBatchingAndPrefetch) {
  auto dataset = labelled_by_index(50);
  const TransformList augmentation = standard_image_augmentation(2);
  DataLoader prefetching(dataset, DataLoaderOptions().batch_size(8).seed(4).prefetch(3).transform(
                                      augmentation.batch_transform()));
  DataLoader in_next(dataset, DataLoaderOptions().batch_size(5).seed(4).prefetch(0).transform(
                                  augmentation.batch_transform()));
  DataLoader unshuffled(dataset,
                        DataLoaderOptions().batch_size(50).shuffle(false).seed(4).transform(
                            augmentation.batch_transform()));
  const auto epoch1 = augmented_epoch(prefetching, 1);
  ASSERT_EQ(epoch1.size(), 50u);
  EXPECT_EQ(epoch1, augmented_epoch(in_next, 1));
  EXPECT_EQ(epoch1, augmented_epoch(unshuffled, 1));
  EXPECT_EQ(prefetching.epoch(), 1);
  EXPECT_NE(epoch1, augmented_epoch(prefetching, 2));
  // The same numbers as applying the list directly with the loader's seed.
  const auto direct = augmentation.apply(dataset->images(), iota(50), 4, 1).to_vector<float>();
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(epoch1.at(i), example(direct, i, 3 * 64)) << i;
  // The data set itself is left as it was.
  EXPECT_EQ(dataset->images().to_vector<float>(), numbered_images(50, 3, 8, 8).to_vector<float>());
}

TEST(TransformList, ErrorsInTheLoaderThreadReachNext) {
  TransformList one_channel;
  one_channel.add(
      std::make_shared<Normalize>(std::vector<float>{0.0f, 0.0f}, std::vector<float>{1.0f, 1.0f}));
  DataLoader loader(labelled_by_index(10),
                    DataLoaderOptions().batch_size(4).transform(one_channel.batch_transform()));
  loader.start_epoch(0);
  EXPECT_TRUE(throws_error([&] { loader.next(); }, "do not fit images of 3 channels"));
}

}  // namespace
}  // namespace tessel::data
