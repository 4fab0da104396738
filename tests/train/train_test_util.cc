#include "tests/train/train_test_util.h"

#include <zlib.h>

#include <cstdint>
#include <sstream>
#include <utility>

#include "gtest/gtest.h"
#include "train/cli.h"

namespace tessel::train {

CliRun run_train_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "train");
  std::vector<const char*> argv;
  for (const auto& arg : args) argv.push_back(arg.c_str());
  std::ostringstream out, err;
  const int code = run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
  return {code, out.str(), err.str()};
}

void write_idx_split(const std::string& directory, const std::string& prefix, int image_size,
                     const std::string& images, const std::string& labels) {
  const size_t count = labels.size();
  ASSERT_EQ(images.size(), count * image_size * image_size) << prefix;
  // IDX: a big-endian magic number and dimensions, then the bytes.
  auto put_u32 = [](std::string& bytes, uint32_t value) {
    for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<char>(value >> shift));
  };
  std::string images_file, labels_file;
  put_u32(images_file, 0x803);
  put_u32(images_file, static_cast<uint32_t>(count));
  put_u32(images_file, image_size);
  put_u32(images_file, image_size);
  images_file += images;
  put_u32(labels_file, 0x801);
  put_u32(labels_file, static_cast<uint32_t>(count));
  labels_file += labels;
  for (const auto& [name, bytes] :
       {std::pair<std::string, std::string>{prefix + "-images-idx3-ubyte.gz", images_file},
        {prefix + "-labels-idx1-ubyte.gz", labels_file}}) {
    gzFile file = gzopen((directory + "/" + name).c_str(), "wb");
    ASSERT_NE(file, nullptr) << directory << "/" << name;
    gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(file);
  }
}

void write_synthetic_fashion_mnist_split(const std::string& directory, const std::string& prefix,
                                         int count) {
  std::string images, labels;
  for (int i = 0; i < count; ++i) {
    const int label = i % 10;
    labels.push_back(static_cast<char>(label));
    for (int pixel = 0; pixel < 28 * 28; ++pixel) {
      const int row = pixel / 28;
      const bool lit = row >= 2 * label + 4 && row < 2 * label + 6;
      images.push_back(static_cast<char>(lit ? 200 + (pixel * 7 + i) % 50 : (pixel + i) % 30));
    }
  }
  write_idx_split(directory, prefix, 28, images, labels);
}

}  // namespace tessel::train
