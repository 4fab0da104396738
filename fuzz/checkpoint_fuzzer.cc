// A checkpoint's training state (train_state.safetensors: optimizer tensors, and in __metadata__
// the step, RNG states, optimizer and scheduler scalars) next to a valid model.safetensors of the
// same save: load_checkpoint must restore it into a small model with Adam and StepLR or throw
// tessel::Error, and on an error leave the optimizer and scheduler state as they were.
#include <filesystem>
#include <string>

#include "core/safetensors.h"
#include "fuzz/harness.h"
#include "fuzz/small_net.h"
#include "optim/lr_scheduler.h"
#include "optim/optim.h"
#include "train/state/checkpoint.h"

namespace tessel::fuzz {
namespace {

// The save_id both files carry; the corpus's training states use it too.
constexpr const char* kSaveId = "fuzz";

// A checkpoint folder whose model.safetensors is SmallNet's initial state, written once.
const std::string& checkpoint_folder() {
  static const std::string folder = [] {
    const std::string path = scratch_dir() + "/step_7";
    std::filesystem::create_directories(path);
    SmallNet net;
    save_safetensors(path + "/model.safetensors", net.state_dict(),
                     {{"format", "tessel-checkpoint-1"}, {"save_id", kSaveId}, {"step", "7"}});
    return path;
  }();
  return folder;
}

}  // namespace
}  // namespace tessel::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessel;
  const std::string& folder = fuzz::checkpoint_folder();
  fuzz::write_scratch_file("step_7/train_state.safetensors", fuzz::as_string(data, size));

  fuzz::SmallNet net;
  optim::Adam adam(net.named_parameters(), optim::AdamOptions(0.01));
  optim::StepLR schedule(adam, 2, 0.5);
  const optim::NamedScalars adam_before = adam.state_scalars();
  const optim::NamedScalars schedule_before = schedule.state_scalars();
  // Odd sizes load as rank 1 of two ranks, to read the per-rank RNG states too.
  train::CheckpointRank rank;
  if (size % 2 == 1) {
    rank.rank = 1;
    rank.ranks = 2;
    rank.layout = "dp=2,tp=1";
  }
  optim::NamedScalars extra;
  const bool loaded = fuzz::expect_only_tessel_errors(
      [&] { train::load_checkpoint(folder, net, adam, &schedule, &extra, nullptr, &rank); });
  if (!loaded) {
    TESSEL_FUZZ_CHECK(adam.state_scalars() == adam_before, "a failed load changed Adam's state");
    TESSEL_FUZZ_CHECK(schedule.state_scalars() == schedule_before,
                      "a failed load changed the schedule's state");
  }
  return 0;
}
