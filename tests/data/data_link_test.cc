// //data links on its own: this test depends on it (and GoogleTest) alone, yet makes
// tensors with from_vector and reads them back with to_vector, which call Tensor::to(Device).
#include <memory>
#include <vector>

#include "data/data_loader.h"
#include "data/dataset.h"
#include "gtest/gtest.h"

namespace tessel::data {
namespace {

TEST(DataLibrary, LinksAndLoadsBatchesWithoutOtherDependencies) {
  const std::vector<float> pixels{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  auto dataset = std::make_shared<ImageDataset>(from_vector<float>(pixels, {3, 1, 2, 2}),
                                                from_vector<int64_t>({2, 0, 1}, {3}), 3);
  DataLoader loader(dataset, DataLoaderOptions().batch_size(2).shuffle(false));
  std::vector<std::vector<float>> inputs;
  std::vector<std::vector<int64_t>> targets;
  for (Batch& batch : loader) {
    inputs.push_back(batch.inputs.to_vector<float>());
    targets.push_back(batch.targets.to_vector<int64_t>());
  }
  EXPECT_EQ(targets, (std::vector<std::vector<int64_t>>{{2, 0}, {1}}));
  EXPECT_EQ(inputs, (std::vector<std::vector<float>>{{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11}}));
}

}  // namespace
}  // namespace tessel::data
