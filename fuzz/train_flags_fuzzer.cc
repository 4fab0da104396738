// The train command line: the input's lines are the arguments after the program name (so
// "--lr=1e-3", "--memory_budget", "1.5GiB" ...). parse_train_flags must fill a TrainConfig
// whose values pass the flags' checks, or print a message and return an exit code; it must not
// throw, whatever the values.
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/harness.h"
#include "train/cli.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessel;
  std::vector<std::string> args = fuzz::split(fuzz::as_string(data, size), '\n');
  // The arguments as argv, each NUL-terminated where the input held a NUL byte as well.
  std::vector<const char*> argv = {"train"};
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  train::TrainConfig config;
  std::ostringstream out, err;
  int code = -1;
  fuzz::expect_only_tessel_errors([&] {
    code = train::parse_train_flags(static_cast<int>(argv.size()), argv.data(), &config, out, err);
  });
  if (code != -1) return 0;
  TESSEL_FUZZ_CHECK(config.steps >= 0 && config.threads >= 0 && config.dp >= 0 && config.tp >= 0 &&
                        config.eval_every >= 0 && config.log_every > 0 &&
                        config.checkpoint_every >= 0,
                    "a negative count passed the checks");
  TESSEL_FUZZ_CHECK(!config.batch_size || *config.batch_size > 0, "batch size ",
                    *config.batch_size);
  TESSEL_FUZZ_CHECK(!config.epochs || *config.epochs > 0, "epochs ", *config.epochs);
  TESSEL_FUZZ_CHECK(!config.lr || *config.lr > 0, "learning rate ", *config.lr);
  TESSEL_FUZZ_CHECK(config.precision == "f32" || config.precision == "bf16", "precision '",
                    config.precision, "'");
  return 0;
}
