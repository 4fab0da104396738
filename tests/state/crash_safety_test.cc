// No checkpoint is ever lost. A training process that saves after every step is killed
// (SIGKILL) at every point of the save path - each write, fsync, rename and deletion, through
// the rotation that keeps the newest three - and at random moments; afterwards the newest
// complete checkpoint loads and resuming from it ends bitwise where an uninterrupted run ends.
// A full disk (ENOSPC) or a failing one (EIO) at any write or fsync of a save, and a real
// kernel write failure (RLIMIT_FSIZE), give a clear tessel::Error, keep the previous checkpoint,
// and leave the training itself intact.
//
// The killed runs are child processes: this binary started again with --child=... (its own
// main below), so the parent's state never depends on a fork.
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/threading.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/lr_scheduler.h"
#include "optim/optim.h"
#include "tests/state/fault_injection.h"
#include "tests/testing.h"
#include "train/state/checkpoint.h"

extern char** environ;

namespace tessel::train {
namespace {

namespace fs = std::filesystem;
using testing::bitwise_equal;
namespace fault = testing::fault;

constexpr uint64_t kSeed = 7;
constexpr int kKeepLast = 3;

// Linear -> ReLU -> Dropout -> Linear: dropout draws from the RNG, so resume must restore it.
struct Training {
  std::shared_ptr<nn::Sequential> net;
  std::unique_ptr<optim::SGD> optimizer;
  std::unique_ptr<optim::StepLR> schedule;
};

Training fresh_training() {
  manual_seed(kSeed);
  Training training;
  training.net = std::make_shared<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      std::make_shared<nn::Linear>(6, 12), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Dropout>(0.25), std::make_shared<nn::Linear>(12, 3)});
  training.optimizer = std::make_unique<optim::SGD>(training.net->named_parameters(),
                                                    optim::SGDOptions(0.1).momentum(0.9));
  training.schedule = std::make_unique<optim::StepLR>(*training.optimizer, 3, 0.5);
  return training;
}

void train_one_step(Training& training) {
  Tensor inputs = randn({8, 6});
  Tensor labels = randint(0, 3, {8});
  training.optimizer->zero_grad();
  cross_entropy((*training.net)(inputs), labels).backward();
  training.optimizer->step();
  training.schedule->step();
}

void save(const Training& training, const std::string& dir, int64_t step) {
  CheckpointOptions options;
  options.keep_last = kKeepLast;
  save_checkpoint(dir, step, *training.net, *training.optimizer, training.schedule.get(), {},
                  options);
}

// Steps (from, to], each followed by a save.
void train_and_save(Training& training, const std::string& dir, int64_t from, int64_t to) {
  for (int64_t step = from + 1; step <= to; ++step) {
    train_one_step(training);
    save(training, dir, step);
  }
}

// Resumes from the newest complete checkpoint under `dir` (or starts afresh without one) and
// trains to `steps`; returns the training at its end.
Training resume_and_finish(const std::string& dir, int64_t steps, int64_t* resumed_at) {
  Training training = fresh_training();
  int64_t step = 0;
  if (!latest_checkpoint(dir).empty())
    step = load_latest_checkpoint(dir, *training.net, *training.optimizer, training.schedule.get());
  if (resumed_at) *resumed_at = step;
  train_and_save(training, dir, step, steps);
  return training;
}

::testing::AssertionResult same_state(const Training& actual, const Training& expected) {
  const auto actual_state = actual.net->state_dict();
  const auto expected_state = expected.net->state_dict();
  if (actual_state.size() != expected_state.size())
    return ::testing::AssertionFailure() << "state_dict sizes differ";
  for (size_t i = 0; i < actual_state.size(); ++i) {
    auto equal = bitwise_equal(actual_state[i].second, expected_state[i].second);
    if (!equal) return equal << " (" << actual_state[i].first << ")";
  }
  const auto actual_optimizer = actual.optimizer->state_tensors();
  const auto expected_optimizer = expected.optimizer->state_tensors();
  if (actual_optimizer.size() != expected_optimizer.size())
    return ::testing::AssertionFailure() << "optimizer state sizes differ";
  for (size_t i = 0; i < actual_optimizer.size(); ++i) {
    auto equal = bitwise_equal(actual_optimizer[i].second, expected_optimizer[i].second);
    if (!equal) return equal << " (optimizer " << actual_optimizer[i].first << ")";
  }
  if (actual.schedule->last_lr() != expected.schedule->last_lr())
    return ::testing::AssertionFailure() << "learning rates differ";
  return ::testing::AssertionSuccess();
}

// Files a crashed or failed save may leave behind under `dir`: temporaries are allowed (the
// next save of that step removes them) but never count as a checkpoint.
std::vector<std::string> temporaries_under(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.path().filename().string().find(".tmp.") != std::string::npos)
      found.push_back(entry.path().string());
  return found;
}

class CrashSafety : public ::testing::Test {
 protected:
  void SetUp() override {
    set_num_threads(1);  // the children run on one thread too: the same sums in the same order
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = fs::path(tmp ? tmp : "/tmp") / ("crash_safety_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override {
    fault::disarm();
    std::error_code ignored;
    fs::remove_all(root_, ignored);
  }
  std::string fresh_dir(const std::string& name) {
    const fs::path dir = root_ / name;
    fs::remove_all(dir);
    return dir.string();
  }
  Training reference(int64_t steps) {
    Training training = fresh_training();
    train_and_save(training, fresh_dir("reference"), 0, steps);
    return training;
  }
  fs::path root_;
};

std::string self_path() { return fs::read_symlink("/proc/self/exe").string(); }

pid_t spawn_child(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  std::string self = self_path();
  argv.push_back(self.data());
  std::vector<std::string> copies = args;
  for (auto& arg : copies) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int result = posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv.data(), environ);
  if (result != 0) TESSEL_FAIL("posix_spawn failed: ", std::strerror(result));
  return pid;
}

int wait_child(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

TEST_F(CrashSafety, KilledAtEveryPointOfTheSavePathResumesBitwise) {
  constexpr int64_t kSteps = 5;  // rotation (keep 3) deletes from step 4 on
  const Training expected = reference(kSteps);

  // How many fault points a whole run has.
  const std::string counted = fresh_dir("counted");
  fault::arm({fs::absolute(counted).string(), fault::Action::kCount});
  Training counting = fresh_training();
  train_and_save(counting, counted, 0, kSteps);
  const int64_t points = fault::points_seen();
  fault::disarm();
  ASSERT_GT(points, 10 * kSteps) << "the save path made fewer calls than expected";

  for (int64_t point = 1; point <= points; ++point) {
    const std::string dir = fresh_dir("kill_" + std::to_string(point));
    const int status =
        wait_child(spawn_child({"--child=kill", "--dir=" + dir, "--at=" + std::to_string(point),
                                "--steps=" + std::to_string(kSteps)}));
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << "point " << point << ": the child was not killed (status " << status << ")";
    int64_t resumed_at = -1;
    const Training resumed = resume_and_finish(dir, kSteps, &resumed_at);
    EXPECT_TRUE(same_state(resumed, expected))
        << "killed at point " << point << " of " << points << ", resumed at step " << resumed_at;
    fs::remove_all(dir);
  }
  std::printf("killed at each of %lld points of %lld saves; every run resumed bitwise\n",
              static_cast<long long>(points), static_cast<long long>(kSteps));
}

TEST_F(CrashSafety, KilledAtRandomMomentsResumesBitwise) {
  constexpr int64_t kSteps = 30;
  constexpr int kTrials = 12;
  const Training expected = reference(kSteps);

  // Uninterrupted child runs give the time span to aim into: the shorter of two, and kills in its
  // first 60%, so that most land mid-run even when the machine's load makes runs vary in length.
  double span_us = 0;
  for (int run = 0; run < 2; ++run) {
    const std::string timed = fresh_dir("timed_" + std::to_string(run));
    const auto start = std::chrono::steady_clock::now();
    const int timed_status = wait_child(
        spawn_child({"--child=run", "--dir=" + timed, "--steps=" + std::to_string(kSteps)}));
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    ASSERT_TRUE(WIFEXITED(timed_status) && WEXITSTATUS(timed_status) == 0);
    span_us = run == 0 ? us : std::min(span_us, us);
  }

  std::mt19937_64 random(12345);
  std::uniform_real_distribution<double> moment(0.0, 0.6 * span_us);
  int killed_mid_run = 0;
  for (int trial = 0; trial < kTrials; ++trial) {
    const std::string dir = fresh_dir("random_" + std::to_string(trial));
    const pid_t pid =
        spawn_child({"--child=run", "--dir=" + dir, "--steps=" + std::to_string(kSteps)});
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(moment(random))));
    kill(pid, SIGKILL);
    const int status = wait_child(pid);
    if (WIFSIGNALED(status)) ++killed_mid_run;
    int64_t resumed_at = -1;
    const Training resumed = resume_and_finish(dir, kSteps, &resumed_at);
    EXPECT_TRUE(same_state(resumed, expected))
        << "trial " << trial << ", resumed at step " << resumed_at;
    fs::remove_all(dir);
  }
  EXPECT_GT(killed_mid_run, kTrials / 2) << "most kills should land before the run ends";
}

// A failing write or fsync anywhere in one save: a tessel::Error naming the failure, the
// previous checkpoint still `latest` and loadable, no temporary left, and training that goes on
// (and later saves) exactly as if the failure had not happened.
void expect_failed_save_is_harmless(const std::string& dir, int error, const Training& expected,
                                    int64_t steps) {
  constexpr int64_t kFailingStep = 3;
  // The data calls of one save (the one at kFailingStep).
  int64_t calls_per_save = 0;
  {
    const std::string counted = dir + "_count";
    Training training = fresh_training();
    train_and_save(training, counted, 0, kFailingStep - 1);
    train_one_step(training);
    fault::arm({fs::absolute(counted).string(), fault::Action::kFail, /*at=*/-1, error});
    save(training, counted, kFailingStep);
    calls_per_save = fault::points_seen();
    fault::disarm();
  }
  ASSERT_GT(calls_per_save, 4);
  for (int64_t call = 1; call <= calls_per_save; ++call) {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
    Training training = fresh_training();
    train_and_save(training, dir, 0, kFailingStep - 1);
    train_one_step(training);
    fault::arm({fs::absolute(dir).string(), fault::Action::kFail, call, error});
    EXPECT_TRUE(
        testing::throws_error([&] { save(training, dir, kFailingStep); }, std::strerror(error)))
        << "data call " << call << " of " << calls_per_save;
    fault::disarm();
    EXPECT_TRUE(temporaries_under(dir).empty()) << "data call " << call;
    {
      // Loading moves the global RNG, which the training in memory goes on drawing from.
      const RngState training_rng = get_rng_state();
      // The previous checkpoint is intact. `latest` names it, or, when only the final sync of
      // the folder failed, the new one, which is complete then.
      Training previous = fresh_training();
      EXPECT_EQ(load_checkpoint((fs::path(dir) / "step_2").string(), *previous.net,
                                *previous.optimizer, previous.schedule.get()),
                kFailingStep - 1);
      const std::string latest = fs::path(latest_checkpoint(dir)).filename().string();
      EXPECT_TRUE(latest == "step_2" || latest == "step_3") << "data call " << call;
      Training newest = fresh_training();
      EXPECT_EQ(load_latest_checkpoint(dir, *newest.net, *newest.optimizer, newest.schedule.get()),
                std::stoll(latest.substr(5)));
      set_rng_state(training_rng);
    }
    // The training in memory is untouched: it goes on and later saves succeed.
    train_and_save(training, dir, kFailingStep, steps);
    EXPECT_TRUE(same_state(training, expected)) << "data call " << call;
    int64_t resumed_at = -1;
    EXPECT_TRUE(same_state(resume_and_finish(dir, steps, &resumed_at), expected));
    EXPECT_EQ(resumed_at, steps);
  }
}

TEST_F(CrashSafety, FullDiskAtAnyWriteOrFsyncKeepsThePreviousCheckpoint) {
  constexpr int64_t kSteps = 5;
  const Training expected = reference(kSteps);
  expect_failed_save_is_harmless(fresh_dir("enospc"), ENOSPC, expected, kSteps);
}

TEST_F(CrashSafety, IoErrorAtAnyWriteOrFsyncKeepsThePreviousCheckpoint) {
  constexpr int64_t kSteps = 5;
  const Training expected = reference(kSteps);
  expect_failed_save_is_harmless(fresh_dir("eio"), EIO, expected, kSteps);
}

// A real failure from the kernel: a file size limit makes write() fail with EFBIG mid-file.
TEST_F(CrashSafety, KernelWriteFailureKeepsThePreviousCheckpoint) {
  constexpr int64_t kSteps = 5;
  const Training expected = reference(kSteps);
  const std::string dir = fresh_dir("fsize");
  const int status = wait_child(
      spawn_child({"--child=fsize", "--dir=" + dir, "--steps=" + std::to_string(kSteps)}));
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child reported a problem (see its stderr above)";
  int64_t resumed_at = -1;
  EXPECT_TRUE(same_state(resume_and_finish(dir, kSteps, &resumed_at), expected));
  EXPECT_EQ(resumed_at, kSteps);
}

// ---- the child processes ----

std::string flag_value(int argc, char** argv, const std::string& name) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  return "";
}

int child_main(int argc, char** argv) {
  set_num_threads(1);
  const std::string mode = flag_value(argc, argv, "child");
  const std::string dir = flag_value(argc, argv, "dir");
  const int64_t steps = std::stoll(flag_value(argc, argv, "steps"));
  Training training = fresh_training();
  if (mode == "run") {
    train_and_save(training, dir, 0, steps);
    return 0;
  }
  if (mode == "kill") {
    fs::create_directories(dir);
    fault::arm({fs::absolute(dir).string(), fault::Action::kKill,
                std::stoll(flag_value(argc, argv, "at"))});
    train_and_save(training, dir, 0, steps);
    std::fprintf(stderr, "child: finished without reaching its kill point\n");
    return 3;
  }
  if (mode == "fsize") {
    train_and_save(training, dir, 0, 2);
    train_one_step(training);
    signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead of killing the process
    rlimit limit{};
    getrlimit(RLIMIT_FSIZE, &limit);
    const rlimit saved = limit;
    limit.rlim_cur = 64;  // smaller than any checkpoint file
    setrlimit(RLIMIT_FSIZE, &limit);
    bool failed_clearly = false;
    try {
      save(training, dir, 3);
    } catch (const Error& error) {
      failed_clearly = std::strstr(error.what(), std::strerror(EFBIG)) != nullptr;
      if (!failed_clearly) std::fprintf(stderr, "child: unexpected message: %s\n", error.what());
    }
    setrlimit(RLIMIT_FSIZE, &saved);
    if (!failed_clearly) {
      std::fprintf(stderr, "child: the save under a 64-byte file limit did not fail clearly\n");
      return 1;
    }
    if (fs::path(latest_checkpoint(dir)).filename() != "step_2" ||
        !temporaries_under(dir).empty()) {
      std::fprintf(stderr, "child: after the failed save, latest is '%s' or temporaries remain\n",
                   latest_checkpoint(dir).c_str());
      return 1;
    }
    save(training, dir, 3);
    train_and_save(training, dir, 3, steps);
    return 0;
  }
  std::fprintf(stderr, "child: unknown mode '%s'\n", mode.c_str());
  return 2;
}

}  // namespace
}  // namespace tessel::train

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--child=", 8) == 0) {
      try {
        return tessel::train::child_main(argc, argv);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "child: %s\n", error.what());
        return 1;
      }
    }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
