// safetensors bytes: parse_safetensors must accept them or throw tessel::Error. What it accepts
// is saved and parsed again (the same tensors must come back) and loaded into a small model,
// strictly and not.
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/safetensors.h"
#include "fuzz/harness.h"
#include "fuzz/small_net.h"

namespace tessel::fuzz {
namespace {

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  if (a.nbytes() == 0) return true;
  StorageAccess access_a(*a.storage()), access_b(*b.storage());
  return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void check_round_trip(const std::map<std::string, Tensor>& tensors,
                      const SafetensorsMetadata& metadata) {
  std::vector<std::pair<std::string, Tensor>> ordered(tensors.begin(), tensors.end());
  const std::string path = scratch_dir() + "/round_trip.safetensors";
  save_safetensors(path, ordered, metadata);
  SafetensorsMetadata reread_metadata;
  const std::map<std::string, Tensor> reread = load_safetensors(path, &reread_metadata);
  TESSEL_FUZZ_CHECK(reread.size() == tensors.size(), reread.size(), " tensors came back of ",
                    tensors.size());
  TESSEL_FUZZ_CHECK(reread_metadata == metadata, "the metadata changed");
  for (const auto& [name, tensor] : tensors) {
    auto found = reread.find(name);
    TESSEL_FUZZ_CHECK(found != reread.end(), "tensor '", name, "' is gone");
    TESSEL_FUZZ_CHECK(same_bytes(tensor, found->second), "tensor '", name, "' changed");
  }
}

}  // namespace
}  // namespace tessel::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessel;
  std::map<std::string, Tensor> tensors;
  SafetensorsMetadata metadata;
  const bool parsed = fuzz::expect_only_tessel_errors(
      [&] { tensors = parse_safetensors(fuzz::as_string(data, size), "fuzz input", &metadata); });
  if (!parsed) return 0;
  // Saving what was read must work: every name and dtype came from a valid file.
  fuzz::check_round_trip(tensors, metadata);
  for (bool strict : {true, false}) {
    fuzz::SmallNet net;
    fuzz::expect_only_tessel_errors([&] { net.load_state_dict(tensors, strict); });
  }
  return 0;
}
