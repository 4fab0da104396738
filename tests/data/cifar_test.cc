#include "data/cifar.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/data_loader.h"
#include "gtest/gtest.h"
#include "tests/testing.h"

namespace tessel::data {
namespace {

using testing::throws_error;
namespace fs = std::filesystem;

// A fresh, empty folder under the test's temporary directory.
std::string fresh_directory(const std::string& name) {
  const fs::path directory = fs::path(::testing::TempDir()) / name;
  fs::remove_all(directory);
  fs::create_directories(directory);
  return directory.string();
}

// Record r of a test file: label `label`, pixel j of the (3,32,32) planes = (seed + j) % 256.
std::string record(uint8_t label, int seed) {
  std::string bytes(1, static_cast<char>(label));
  for (int64_t j = 0; j < kCifar10PixelBytes; ++j)
    bytes.push_back(static_cast<char>((seed + j) % 256));
  return bytes;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// Writes data_batch_1..5.bin (file k holding k records, labels k-1) and test_batch.bin (one
// record of label 9) into `directory`.
void write_all_files(const std::string& directory) {
  for (int file = 1; file <= 5; ++file) {
    std::string bytes;
    for (int r = 0; r < file; ++r) bytes += record(static_cast<uint8_t>(file - 1), 10 * file + r);
    write_file(directory + "/data_batch_" + std::to_string(file) + ".bin", bytes);
  }
  write_file(directory + "/test_batch.bin", record(9, 200));
}

TEST(Cifar10, ReadsLabelAndRgbPlanesOfEachRecord) {
  const std::string path = fresh_directory("cifar_records") + "/two.bin";
  write_file(path, record(3, 0) + record(7, 100));
  Cifar10Records records = read_cifar10_file(path);
  ASSERT_EQ(records.size(), 2);
  EXPECT_EQ(records.labels, (std::vector<uint8_t>{3, 7}));
  ASSERT_EQ(records.pixels.size(), 2u * 3072u);
  EXPECT_EQ(records.pixels[0], 0);
  EXPECT_EQ(records.pixels[1024], 1024 % 256);  // first green pixel
  EXPECT_EQ(records.pixels[3072], 100);         // second record
  EXPECT_EQ(records.pixels[3072 + 3071], (100 + 3071) % 256);
}

TEST(Cifar10, DatasetIsNormalisedPerChannelWithTheUsualStatistics) {
  const std::string path = fresh_directory("cifar_normalised") + "/one.bin";
  write_file(path, record(4, 7));
  auto dataset = load_cifar10_files({path});
  EXPECT_EQ(dataset->size(), 1);
  EXPECT_EQ(dataset->images().sizes(), (Shape{1, 3, 32, 32}));
  EXPECT_EQ(dataset->images().dtype(), DType::kFloat32);
  EXPECT_EQ(dataset->labels().dtype(), DType::kInt64);
  EXPECT_EQ(dataset->labels().to_vector<int64_t>(), (std::vector<int64_t>{4}));
  EXPECT_EQ(dataset->num_classes(), 10);
  const std::vector<float> mean = {0.4914f, 0.4822f, 0.4465f};
  const std::vector<float> stddev = {0.2470f, 0.2435f, 0.2616f};
  EXPECT_EQ(cifar10_mean(), mean);
  EXPECT_EQ(cifar10_std(), stddev);
  auto values = dataset->images().to_vector<float>();
  for (int64_t j = 0; j < 3072; ++j) {
    const int channel = static_cast<int>(j / 1024);
    const float expected = ((7 + j) % 256 / 255.0f - mean[channel]) / stddev[channel];
    ASSERT_NEAR(values[j], expected, 1e-5f) << j;
  }
}

TEST(Cifar10, UnnormalisedPixelsAreScaledToTheUnitInterval) {
  const std::string path = fresh_directory("cifar_unit") + "/one.bin";
  write_file(path, record(0, 250));
  auto values = load_cifar10_files({path}, /*normalize=*/false)->images().to_vector<float>();
  EXPECT_FLOAT_EQ(values[0], 250 / 255.0f);
  EXPECT_FLOAT_EQ(values[5], 255 / 255.0f);
  EXPECT_FLOAT_EQ(values[6], 0.0f);
}

TEST(Cifar10, DirectoryGivesFiveTrainingFilesInOrderAndTheTestFile) {
  const std::string directory = fresh_directory("cifar_directory");
  write_all_files(directory);
  auto train = load_cifar10(directory, Split::kTrain);
  EXPECT_EQ(train->size(), 1 + 2 + 3 + 4 + 5);
  EXPECT_EQ(train->labels().to_vector<int64_t>(),
            (std::vector<int64_t>{0, 1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4}));
  auto test = load_cifar10(directory, Split::kTest);
  EXPECT_EQ(test->size(), 1);
  EXPECT_EQ(test->labels().to_vector<int64_t>(), (std::vector<int64_t>{9}));
  EXPECT_EQ(cifar10_files(directory, Split::kTest),
            (std::vector<std::string>{directory + "/test_batch.bin"}));
}

TEST(Cifar10, FindsTheFolderTheArchiveExtractsTo) {
  const std::string parent = fresh_directory("cifar_parent");
  fs::create_directories(parent + "/cifar-10-batches-bin");
  write_all_files(parent + "/cifar-10-batches-bin");
  EXPECT_EQ(load_cifar10(parent, Split::kTrain)->size(), 15);
  EXPECT_EQ(cifar10_files(parent, Split::kTest),
            (std::vector<std::string>{parent + "/cifar-10-batches-bin/test_batch.bin"}));
}

TEST(Cifar10, ASingleFileIsReadWhateverTheSplit) {
  const std::string directory = fresh_directory("cifar_single");
  write_all_files(directory);
  const std::string file = directory + "/data_batch_3.bin";
  EXPECT_EQ(cifar10_files(file, Split::kTest), (std::vector<std::string>{file}));
  EXPECT_EQ(load_cifar10(file, Split::kTrain)->size(), 3);
}

TEST(Cifar10, MissingFilesAreListedWithWhatWasExpected) {
  const std::string directory = fresh_directory("cifar_missing");
  write_all_files(directory);
  fs::remove(directory + "/data_batch_3.bin");
  fs::remove(directory + "/data_batch_5.bin");
  EXPECT_TRUE(throws_error([&] { load_cifar10(directory, Split::kTrain); },
                           "CIFAR-10 in '" + directory +
                               "': missing data_batch_3.bin, data_batch_5.bin (the training "
                               "split reads data_batch_1.bin, data_batch_2.bin, "
                               "data_batch_3.bin, data_batch_4.bin, data_batch_5.bin"));
  EXPECT_NO_THROW(load_cifar10(directory, Split::kTest));
  fs::remove(directory + "/test_batch.bin");
  EXPECT_TRUE(throws_error([&] { load_cifar10(directory, Split::kTest); },
                           "missing test_batch.bin (the test split reads test_batch.bin"));
  const std::string empty_directory = fresh_directory("cifar_empty_directory");
  EXPECT_TRUE(
      throws_error([&] { load_cifar10(empty_directory, Split::kTest); }, "missing test_batch.bin"));
  EXPECT_TRUE(throws_error([&] { load_cifar10(directory + "/nothing_here", Split::kTrain); },
                           "nothing_here' is neither a file nor a directory (expected a "
                           "directory holding data_batch_1.bin .. data_batch_5.bin, "
                           "test_batch.bin"));
}

TEST(Cifar10, SizeThatIsNotAWholeNumberOfRecordsNamesTheFile) {
  const std::string path = fresh_directory("cifar_truncated") + "/data_batch_1.bin";
  write_file(path, record(1, 0) + record(2, 0).substr(0, 100));
  EXPECT_TRUE(throws_error([&] { read_cifar10_file(path); },
                           "CIFAR-10 file '" + path +
                               "': truncated or not the binary version: its 3173 bytes are not "
                               "a multiple of the 3073-byte record (1 label byte + 3072 pixel "
                               "bytes): 1 whole records and 100 bytes more"));
  write_file(path, "");
  EXPECT_TRUE(throws_error([&] { read_cifar10_file(path); }, "'" + path + "': empty"));
  EXPECT_TRUE(throws_error([&] { read_cifar10_file(path + ".absent"); },
                           "'" + path + ".absent': cannot open"));
}

TEST(Cifar10, LabelAboveNineNamesTheFileAndRecord) {
  const std::string path = fresh_directory("cifar_label") + "/test_batch.bin";
  write_file(path, record(9, 0) + record(10, 0));
  EXPECT_TRUE(throws_error([&] { load_cifar10(path, Split::kTest); },
                           "CIFAR-10 file '" + path + "': record 1 has label 10, above 9"));
}

TEST(Cifar10, LoaderYieldsImageBatchesAndLabels) {
  const std::string directory = fresh_directory("cifar_loader");
  write_all_files(directory);
  DataLoader loader(load_cifar10(directory, Split::kTrain),
                    DataLoaderOptions().batch_size(4).shuffle(false));
  loader.start_epoch(0);
  auto batch = loader.next();
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->inputs.sizes(), (Shape{4, 3, 32, 32}));
  EXPECT_EQ(batch->inputs.dtype(), DType::kFloat32);
  EXPECT_EQ(batch->targets.dtype(), DType::kInt64);
  EXPECT_EQ(batch->targets.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 1, 2}));
}

}  // namespace
}  // namespace tessel::data
