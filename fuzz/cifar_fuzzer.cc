// CIFAR-10 binary files: read_cifar10_file and load_cifar10_files must return whole records with
// labels in [0, 10) (as an (N, 3, 32, 32) data set) or throw tessel::Error.
#include <string>

#include "data/cifar.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessel;
  const std::string path =
      fuzz::write_scratch_file("data_batch_1.bin", fuzz::as_string(data, size));
  data::Cifar10Records records;
  if (!fuzz::expect_only_tessel_errors([&] { records = data::read_cifar10_file(path); })) return 0;
  TESSEL_FUZZ_CHECK(records.size() * data::kCifar10RecordBytes == static_cast<int64_t>(size),
                    records.size(), " records from ", size, " bytes");
  TESSEL_FUZZ_CHECK(records.pixels.size() ==
                        records.labels.size() * static_cast<size_t>(data::kCifar10PixelBytes),
                    records.pixels.size(), " pixels for ", records.labels.size(), " labels");
  for (uint8_t label : records.labels)
    TESSEL_FUZZ_CHECK(label < data::kCifar10Classes, "label ", int{label});
  for (bool normalize : {false, true}) {
    fuzz::expect_only_tessel_errors([&] {
      const auto dataset = data::load_cifar10_files({path}, normalize);
      TESSEL_FUZZ_CHECK(dataset->size() == records.size(), "the data set holds ", dataset->size(),
                        " images of ", records.size());
    });
  }
  return 0;
}
