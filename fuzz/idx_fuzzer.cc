// IDX files, plain or gzip-compressed (the corpus holds both): read_idx with the images magic and
// with the labels magic must return dimensions that account for every value, or throw
// tessel::Error.
#include <string>

#include "data/idx.h"
#include "fuzz/harness.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessel;
  const std::string path = fuzz::write_scratch_file("input.idx", fuzz::as_string(data, size));
  for (uint32_t magic : {data::kIdxImagesMagic, data::kIdxLabelsMagic}) {
    data::IdxArray array;
    if (!fuzz::expect_only_tessel_errors([&] { array = data::read_idx(path, magic); })) continue;
    TESSEL_FUZZ_CHECK(array.dims.size() == (magic & 0xff), "got ", array.dims.size(),
                      " dimensions");
    int64_t count = 1;
    for (int64_t dim : array.dims) count *= dim;
    TESSEL_FUZZ_CHECK(static_cast<size_t>(count) == array.values.size(), "dimensions ", array.dims,
                      " for ", array.values.size(), " values");
  }
  return 0;
}
