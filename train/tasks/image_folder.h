// Image folders in the formats the vision recipes read: CIFAR-10 binary (data_batch_1..5.bin /
// test_batch.bin, or a parent of cifar-10-batches-bin/) or IDX files
// ({train,t10k}-{images-idx3,labels-idx1}-ubyte, optionally .gz; any image size).
//   auto train_set = load_image_folder("/data/cifar-10-batches-bin", data::Split::kTrain);
#pragma once

#include <memory>
#include <string>

#include "data/dataset.h"

namespace tessel::train {

// The `split` of the image folder at `path`. IDX images are normalised with the training
// images' mean and standard deviation, and the classes come from the training labels, so both
// splits agree. Throws tessel::Error naming the folder when it holds neither format.
std::shared_ptr<data::ImageDataset> load_image_folder(const std::string& path, data::Split split);

}  // namespace tessel::train
