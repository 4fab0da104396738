#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <thread>

#include "core/threading.h"
#include "data/data_loader.h"
#include "data/dataset.h"
#include "data/idx.h"
#include "gtest/gtest.h"
#include "tests/testing.h"

namespace tessel::data {
namespace {

using testing::throws_error;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + name; }

// The bytes of an IDX file: big-endian magic and dimensions, then the values.
std::string idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims,
                      const std::vector<uint8_t>& values) {
  std::string bytes;
  auto put_u32 = [&](uint32_t value) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>(value >> shift));
  };
  put_u32(magic);
  for (uint32_t dim : dims) put_u32(dim);
  bytes.append(values.begin(), values.end());
  return bytes;
}

void write_plain(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void write_gzip(const std::string& path, const std::string& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
            static_cast<int>(bytes.size()));
  ASSERT_EQ(gzclose(file), Z_OK);
}

// Three 2x2 images with pixel values 0..11, and their labels.
const std::vector<uint8_t> kPixels = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 255};
const std::vector<uint8_t> kLabels = {2, 0, 9};

std::string images_file() { return idx_bytes(kIdxImagesMagic, {3, 2, 2}, kPixels); }
std::string labels_file() { return idx_bytes(kIdxLabelsMagic, {3}, kLabels); }

TEST(Idx, ReadsPlainAndGzipFilesAlike) {
  for (bool gzip : {false, true}) {
    const std::string images_path = temp_path(gzip ? "images.idx.gz" : "images.idx");
    const std::string labels_path = temp_path(gzip ? "labels.idx.gz" : "labels.idx");
    if (gzip) {
      write_gzip(images_path, images_file());
      write_gzip(labels_path, labels_file());
    } else {
      write_plain(images_path, images_file());
      write_plain(labels_path, labels_file());
    }
    IdxArray images = read_idx_images(images_path);
    EXPECT_EQ(images.dims, (std::vector<int64_t>{3, 2, 2})) << gzip;
    EXPECT_EQ(images.values, kPixels) << gzip;
    IdxArray labels = read_idx_labels(labels_path);
    EXPECT_EQ(labels.dims, (std::vector<int64_t>{3})) << gzip;
    EXPECT_EQ(labels.values, kLabels) << gzip;
  }
}

TEST(Idx, WrongMagicNamesTheFile) {
  const std::string path = temp_path("labels_as_images.idx");
  write_plain(path, labels_file());
  EXPECT_TRUE(throws_error([&] { read_idx_images(path); },
                           "IDX file '" + path + "': wrong magic number 0x801 (expected 0x803"));
  write_plain(path, "not an idx file at all");
  EXPECT_TRUE(throws_error([&] { read_idx_labels(path); }, "wrong magic number"));
}

TEST(Idx, TruncatedFiles) {
  const std::string path = temp_path("truncated.idx");
  std::string bytes = images_file();
  write_plain(path, bytes.substr(0, bytes.size() - 2));
  EXPECT_TRUE(throws_error([&] { read_idx_images(path); },
                           "truncated data: dimensions [3, 2, 2] need 12 values but the file "
                           "holds 10"));
  write_plain(path, bytes.substr(0, 9));
  EXPECT_TRUE(throws_error([&] { read_idx_images(path); }, "truncated header: dimension 1 of 3"));
  write_plain(path, bytes.substr(0, 2));
  EXPECT_TRUE(throws_error([&] { read_idx_images(path); }, "shorter than the 4-byte magic"));
  const std::string gz_path = temp_path("truncated.idx.gz");
  write_gzip(gz_path, bytes.substr(0, bytes.size() - 5));
  EXPECT_TRUE(throws_error([&] { read_idx_images(gz_path); }, "'" + gz_path + "': truncated"));
}

// A corrupt header must be answered with an error, not an allocation of what it claims.
TEST(Idx, HugeClaimedSizesAreErrorsNotAllocations) {
  const std::string path = temp_path("huge.idx");
  // About 2^40 values claimed, 3 present: reading stops at the data, not at 1 TB of zeros.
  write_plain(path, idx_bytes(kIdxImagesMagic, {0xFFFFFFFFu, 255, 1}, {1, 2, 3}));
  EXPECT_TRUE(throws_error([&] { read_idx_images(path); },
                           "need 1095216660225 values but the file holds 3"));
  // Dimensions whose product overflows 64 bits are refused before multiplying.
  write_plain(path, idx_bytes(kIdxImagesMagic, {0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu}, {}));
  EXPECT_TRUE(throws_error([&] { read_idx_images(path); }, "describe more than 2^40 values"));
}

TEST(Idx, CutGzipStreamIsAnErrorNamingTheFile) {
  const std::string full = temp_path("whole.idx.gz");
  // Enough values that the compressed stream spans many bytes.
  std::vector<uint8_t> pixels(64 * 28 * 28);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7919 % 251);
  write_gzip(full, idx_bytes(kIdxImagesMagic, {64, 28, 28}, pixels));
  std::ifstream in(full, std::ios::binary);
  std::string compressed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string cut = temp_path("cut.idx.gz");
  write_plain(cut, compressed.substr(0, compressed.size() / 2));
  EXPECT_TRUE(throws_error([&] { read_idx_images(cut); }, "IDX file '" + cut + "'"));
}

TEST(Idx, TrailingBytesAreAnError) {
  const std::string path = temp_path("trailing.idx");
  write_plain(path, labels_file() + "x");
  EXPECT_TRUE(throws_error([&] { read_idx_labels(path); }, "unexpected data after the 3 values"));
}

TEST(Idx, MissingFile) {
  EXPECT_TRUE(throws_error([] { read_idx_images(temp_path("no_such_file.gz")); },
                           "no_such_file.gz': cannot open"));
}

TEST(ImageDataset, LoadsNormalisedImagesAndLabels) {
  const std::string images_path = temp_path("ds_images.idx.gz");
  const std::string labels_path = temp_path("ds_labels.idx");
  write_gzip(images_path, images_file());
  write_plain(labels_path, labels_file());
  auto dataset = load_idx_dataset(images_path, labels_path, 10, 0.5f, 0.25f);
  EXPECT_EQ(dataset->size(), 3);
  EXPECT_EQ(dataset->images().sizes(), (Shape{3, 1, 2, 2}));
  EXPECT_EQ(dataset->images().dtype(), DType::kFloat32);
  EXPECT_EQ(dataset->labels().dtype(), DType::kInt64);
  EXPECT_EQ(dataset->labels().to_vector<int64_t>(), (std::vector<int64_t>{2, 0, 9}));
  auto values = dataset->images().to_vector<float>();
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_NEAR(values[i], (kPixels[i] / 255.0f - 0.5f) / 0.25f, 1e-6f) << i;
  EXPECT_NEAR(values.back(), 2.0f, 1e-6f);  // 255 -> (1 - 0.5) / 0.25
}

TEST(ImageDataset, GetBatchGathersExamplesInTheGivenOrder) {
  const std::string images_path = temp_path("gb_images.idx");
  const std::string labels_path = temp_path("gb_labels.idx");
  write_plain(images_path, images_file());
  write_plain(labels_path, labels_file());
  auto dataset = load_idx_dataset(images_path, labels_path, 10, 0.0f, 1.0f);
  Batch batch = dataset->get_batch({2, 0, 2});
  EXPECT_EQ(batch.inputs.sizes(), (Shape{3, 1, 2, 2}));
  EXPECT_EQ(batch.targets.to_vector<int64_t>(), (std::vector<int64_t>{9, 2, 9}));
  auto inputs = batch.inputs.to_vector<float>();
  EXPECT_FLOAT_EQ(inputs[0], 8 / 255.0f);
  EXPECT_FLOAT_EQ(inputs[4], 0.0f);
  EXPECT_FLOAT_EQ(inputs[11], 1.0f);
  EXPECT_TRUE(throws_error([&] { dataset->get_batch({0, 3}); }, "index 3 out of range"));
}

TEST(ImageDataset, LabelCountMustMatchImageCount) {
  const std::string images_path = temp_path("count_images.idx");
  const std::string labels_path = temp_path("count_labels.idx");
  write_plain(images_path, images_file());
  write_plain(labels_path, idx_bytes(kIdxLabelsMagic, {2}, {1, 2}));
  EXPECT_TRUE(throws_error([&] { load_idx_dataset(images_path, labels_path, 10, 0.0f, 1.0f); },
                           "'" + labels_path + "': 3 images but 2 labels"));
}

TEST(ImageDataset, LabelsMustBeBelowTheClassCount) {
  const std::string images_path = temp_path("range_images.idx");
  const std::string labels_path = temp_path("range_labels.idx");
  write_plain(images_path, images_file());
  write_plain(labels_path, idx_bytes(kIdxLabelsMagic, {3}, {1, 12, 0}));
  EXPECT_TRUE(
      throws_error([&] { load_idx_dataset(images_path, labels_path, 10, 0.0f, 1.0f); },
                   "IDX file '" + labels_path + "': label 1 is 12, not below the 10 classes"));
}

TEST(ImageDataset, RealFashionMnistTestSetLoads) {
  if (!std::ifstream(std::string(kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz").good())
    GTEST_SKIP() << "Fashion-MNIST is not installed";
  auto test = load_fashion_mnist(kFashionMnistDir, Split::kTest);
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(test->images().sizes(), (Shape{10000, 1, 28, 28}));
  auto labels = test->labels().to_vector<int64_t>();
  std::vector<int> per_class(10, 0);
  for (int64_t label : labels) ++per_class[label];
  for (int count : per_class) EXPECT_EQ(count, 1000);  // the test set is balanced
  // Normalised with the training statistics, the test set is close to mean 0, stddev 1.
  auto pixels = test->images().to_vector<float>();
  double sum = 0, sum_squares = 0;
  for (float value : pixels) {
    sum += value;
    sum_squares += double(value) * value;
  }
  const double mean = sum / pixels.size();
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(sum_squares / pixels.size() - mean * mean), 1.0, 0.02);
}

// A data set whose example i has input i and target i, optionally failing at one index.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(int64_t size, int64_t fail_at = -1) : size_(size), fail_at_(fail_at) {}
  int64_t size() const override { return size_; }
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    for (int64_t index : indices) TESSEL_CHECK(index != fail_at_, "example ", index, " is bad");
    const int64_t count = static_cast<int64_t>(indices.size());
    std::vector<float> inputs(indices.begin(), indices.end());
    return {from_vector<float>(inputs, {count, 1}), from_vector<int64_t>(indices, {count})};
  }

 private:
  int64_t size_;
  int64_t fail_at_;
};

std::vector<std::vector<int64_t>> read_epoch(DataLoader& loader, int64_t epoch) {
  loader.start_epoch(epoch);
  std::vector<std::vector<int64_t>> batches;
  while (auto batch = loader.next()) batches.push_back(batch->targets.to_vector<int64_t>());
  return batches;
}

TEST(DataLoader, WithoutShuffleBatchesAreInOrderAndTheLastIsPartial) {
  DataLoader loader(std::make_shared<CountingDataset>(10),
                    DataLoaderOptions().batch_size(4).shuffle(false));
  EXPECT_EQ(loader.num_batches(), 3);
  auto batches = read_epoch(loader, 0);
  EXPECT_EQ(batches, (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}}));
  EXPECT_FALSE(loader.next().has_value());  // stays finished
}

TEST(DataLoader, DropLastSkipsThePartialBatch) {
  DataLoader loader(std::make_shared<CountingDataset>(10),
                    DataLoaderOptions().batch_size(4).shuffle(false).drop_last(true));
  EXPECT_EQ(loader.num_batches(), 2);
  EXPECT_EQ(read_epoch(loader, 0).size(), 2u);
  DataLoader too_small(std::make_shared<CountingDataset>(3),
                       DataLoaderOptions().batch_size(4).drop_last(true));
  EXPECT_TRUE(read_epoch(too_small, 0).empty());
}

TEST(DataLoader, ShardsReadNearEqualPartsOfEveryBatchInOrder) {
  // 3 data-parallel ranks over batches of 4, 4 and 2 examples of one shuffled order.
  const auto dataset = std::make_shared<CountingDataset>(10);
  DataLoader whole(dataset, DataLoaderOptions().batch_size(4).seed(7));
  const auto expected = read_epoch(whole, 1);
  std::vector<std::vector<std::vector<int64_t>>> parts;
  for (int64_t rank = 0; rank < 3; ++rank) {
    DataLoader shard(dataset, DataLoaderOptions().batch_size(4).seed(7).shard(rank, 3));
    EXPECT_EQ(shard.num_batches(), whole.num_batches());
    parts.push_back(read_epoch(shard, 1));
  }
  for (size_t b = 0; b < expected.size(); ++b) {
    std::vector<int64_t> joined;
    for (const auto& part : parts) joined.insert(joined.end(), part[b].begin(), part[b].end());
    EXPECT_EQ(joined, expected[b]) << "batch " << b;
  }
  EXPECT_EQ(parts[0][0].size(), 2u);  // 4 = 2 + 1 + 1
  EXPECT_EQ(parts[2][2].size(), 0u);  // 2 = 1 + 1 + 0
  EXPECT_TRUE(throws_error([] { DataLoaderOptions().shard(3, 3); }, "shard index must be"));
}

TEST(DataLoader, ShuffleVisitsEveryExampleOncePerEpoch) {
  DataLoader loader(std::make_shared<CountingDataset>(103),
                    DataLoaderOptions().batch_size(10).seed(7));
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> seen;
    for (const auto& batch : read_epoch(loader, epoch))
      seen.insert(seen.end(), batch.begin(), batch.end());
    std::vector<int64_t> sorted = seen;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 103; ++i) ASSERT_EQ(sorted[i], i);
    EXPECT_NE(seen, sorted) << "epoch " << epoch << " was not shuffled";
  }
}

TEST(DataLoader, ShuffleIsReproducibleFromSeedAndEpoch) {
  auto dataset = std::make_shared<CountingDataset>(50);
  DataLoader first(dataset, DataLoaderOptions().batch_size(8).seed(3));
  DataLoader second(dataset, DataLoaderOptions().batch_size(8).seed(3).prefetch(0));
  DataLoader other_seed(dataset, DataLoaderOptions().batch_size(8).seed(4));
  EXPECT_EQ(read_epoch(first, 1), read_epoch(second, 1));
  EXPECT_EQ(read_epoch(first, 0), read_epoch(second, 0));
  EXPECT_NE(read_epoch(first, 0), read_epoch(first, 1));
  EXPECT_NE(read_epoch(first, 0), read_epoch(other_seed, 0));
  EXPECT_EQ(shuffled_indices(50, 3, 1), shuffled_indices(50, 3, 1));
}

TEST(DataLoader, AnEpochMayBeAbandonedMidway) {
  auto loader = std::make_unique<DataLoader>(std::make_shared<CountingDataset>(1000),
                                             DataLoaderOptions().batch_size(1).prefetch(4));
  loader->start_epoch(0);
  ASSERT_TRUE(loader->next().has_value());
  loader->start_epoch(1);  // restarts with the worker still holding batches
  EXPECT_EQ(read_epoch(*loader, 2).size(), 1000u);
  loader->start_epoch(3);
  loader->next();
  loader.reset();  // destroying it mid-epoch stops the worker
}

TEST(DataLoader, ErrorsFromTheWorkerThreadReachNext) {
  DataLoader loader(std::make_shared<CountingDataset>(10, /*fail_at=*/5),
                    DataLoaderOptions().batch_size(2).shuffle(false));
  loader.start_epoch(0);
  EXPECT_TRUE(loader.next().has_value());
  EXPECT_TRUE(loader.next().has_value());
  EXPECT_TRUE(throws_error([&] { loader.next(); }, "example 5 is bad"));
  EXPECT_FALSE(loader.next().has_value());
}

// The background thread's ops run beside the step's, so they get one thread; without prefetch
// the transform runs on the caller's thread with the threads set for it.
TEST(DataLoader, TheBackgroundThreadsOpsRunOnOneThread) {
  const int before = tessel::get_num_threads();
  tessel::set_num_threads(2);
  for (int64_t prefetch : {2, 0}) {
    std::vector<int> seen;
    DataLoader loader(
        std::make_shared<CountingDataset>(6),
        DataLoaderOptions().batch_size(2).shuffle(false).prefetch(prefetch).transform(
            [&](Batch&, const BatchInfo&) { seen.push_back(tessel::get_num_threads()); }));
    loader.start_epoch(0);
    while (loader.next()) {
    }
    EXPECT_EQ(seen, std::vector<int>(3, prefetch > 0 ? 1 : 2)) << "prefetch " << prefetch;
  }
  EXPECT_EQ(tessel::get_num_threads(), 2);
  tessel::set_num_threads(before);
}

TEST(ThreadCap, CapsThisThreadOnlyAndNests) {
  const int before = tessel::get_num_threads();
  tessel::set_num_threads(4);
  {
    tessel::ThreadCap two(2);
    EXPECT_EQ(tessel::get_num_threads(), 2);
    {
      tessel::ThreadCap more(3);  // a cap inside a lower one keeps the lower
      EXPECT_EQ(tessel::get_num_threads(), 2);
    }
    int other = 0;
    std::thread([&] { other = tessel::get_num_threads(); }).join();
    EXPECT_EQ(other, 4);
  }
  EXPECT_EQ(tessel::get_num_threads(), 4);
  EXPECT_TRUE(throws_error([] { tessel::ThreadCap none(0); }, "at least 1 thread"));
  tessel::set_num_threads(before);
}

std::vector<std::vector<int64_t>> targets_of(DataLoader::Epoch epoch) {
  std::vector<std::vector<int64_t>> batches;
  for (Batch& batch : epoch) batches.push_back(batch.targets.to_vector<int64_t>());
  return batches;
}

TEST(DataLoader, RangeForOverAnEpochYieldsTheBatchesOfStartEpochAndNext) {
  auto dataset = std::make_shared<CountingDataset>(23);
  for (int64_t prefetch : {0, 2}) {
    DataLoader by_next(dataset, DataLoaderOptions().batch_size(5).seed(9).prefetch(prefetch));
    DataLoader by_range(dataset, DataLoaderOptions().batch_size(5).seed(9).prefetch(prefetch));
    for (int64_t epoch : {0, 1, 4}) {
      const auto expected = read_epoch(by_next, epoch);
      std::vector<std::vector<int64_t>> inputs_seen;
      std::vector<std::vector<int64_t>> seen;
      for (Batch& batch : by_range.epoch(epoch)) {
        seen.push_back(batch.targets.to_vector<int64_t>());
        inputs_seen.push_back(batch.inputs.to(DType::kInt64).view({-1}).to_vector<int64_t>());
      }
      EXPECT_EQ(seen, expected) << "epoch " << epoch << ", prefetch " << prefetch;
      EXPECT_EQ(inputs_seen, expected);  // inputs and targets stay paired
      EXPECT_EQ(by_range.epoch(), epoch);
    }
  }
}

TEST(DataLoader, RangeForOverTheLoaderRunsTheNextEpochEachTime) {
  auto dataset = std::make_shared<CountingDataset>(17);
  DataLoader loader(dataset, DataLoaderOptions().batch_size(4).seed(2));
  DataLoader reference(dataset, DataLoaderOptions().batch_size(4).seed(2));
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    std::vector<std::vector<int64_t>> seen;
    for (auto& batch : loader) seen.push_back(batch.targets.to_vector<int64_t>());
    EXPECT_EQ(loader.epoch(), epoch);
    EXPECT_EQ(seen, read_epoch(reference, epoch)) << "epoch " << epoch;
  }
  // After an explicit epoch, the plain loop continues from it.
  EXPECT_EQ(targets_of(loader.epoch(7)), read_epoch(reference, 7));
  std::vector<std::vector<int64_t>> seen;
  for (auto& batch : loader) seen.push_back(batch.targets.to_vector<int64_t>());
  EXPECT_EQ(loader.epoch(), 8);
  EXPECT_EQ(seen, read_epoch(reference, 8));
}

TEST(DataLoader, RangeForMayStopEarlyAndStartAgain) {
  DataLoader loader(std::make_shared<CountingDataset>(100),
                    DataLoaderOptions().batch_size(3).shuffle(false).prefetch(4));
  int64_t read = 0;
  for (Batch& batch : loader.epoch(0)) {
    EXPECT_EQ(batch.targets.to_vector<int64_t>()[0], 3 * read);
    if (++read == 2) break;  // the worker still holds prepared batches
  }
  EXPECT_EQ(read, 2);
  EXPECT_EQ(targets_of(loader.epoch(0)).size(), 34u);  // a fresh, complete epoch 0
  // An empty epoch (drop_last with too few examples) ends at once.
  DataLoader empty(std::make_shared<CountingDataset>(2),
                   DataLoaderOptions().batch_size(4).drop_last(true));
  EXPECT_TRUE(targets_of(empty.epoch(0)).empty());
}

TEST(DataLoader, RangeForRethrowsWorkerErrors) {
  DataLoader loader(std::make_shared<CountingDataset>(10, /*fail_at=*/5),
                    DataLoaderOptions().batch_size(2).shuffle(false));
  int64_t read = 0;
  EXPECT_TRUE(throws_error(
      [&] {
        for (Batch& batch : loader) read += batch.targets.numel();
      },
      "example 5 is bad"));
  EXPECT_EQ(read, 4);
}

TEST(DataLoader, NextBeforeStartEpochIsAnError) {
  DataLoader loader(std::make_shared<CountingDataset>(4));
  EXPECT_TRUE(throws_error([&] { loader.next(); }, "call start_epoch"));
  EXPECT_TRUE(
      throws_error([] { DataLoaderOptions().batch_size(0); }, "batch_size must be positive"));
}

}  // namespace
}  // namespace tessel::data
