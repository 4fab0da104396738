// Checkpoints: the files they write and their exact contents, atomic replacement (leftovers of a
// crashed save are ignored), keep-last-K, and clear errors for missing, truncated, corrupt or
// mismatched checkpoints that leave the training state unchanged.
#include "train/state/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "core/rng.h"
#include "core/safetensors.h"
#include "nn/nn.h"
#include "ops/ops.h"
#include "optim/optim.h"
#include "tests/testing.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;
using testing::bitwise_equal;
using testing::throws_error;

// A fresh, empty folder for one test.
std::string fresh_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(::testing::TempDir()) / "checkpoint_test" /
                 (std::string(info->test_suite_name()) + "." + info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Linear + BatchNorm: parameters and buffers (an i64 one too).
class SmallNet : public nn::Module {
 public:
  explicit SmallNet(int64_t hidden = 4) : Module("SmallNet") {
    fc = register_module("fc", std::make_shared<nn::Linear>(3, hidden));
    bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(hidden));
  }
  Tensor forward(const Tensor& x) override {
    const int64_t n = x.size(0);
    const int64_t hidden = fc->options.out_features();
    return (*bn)((*fc)(x).reshape({n, hidden, 1, 1})).reshape({n, hidden});
  }
  std::shared_ptr<nn::Linear> fc;
  std::shared_ptr<nn::BatchNorm2d> bn;
};

// One SGD-momentum step on random data, so the optimizer has state.
void train_step(nn::Module& net, optim::Optimizer& optimizer) {
  optimizer.zero_grad();
  Tensor loss = pow(net(randn({5, 3})), 2.0).mean();
  loss.backward();
  optimizer.step();
}

struct TrainingRun {
  explicit TrainingRun(int64_t hidden = 4)
      : net(std::make_shared<SmallNet>(hidden)),
        sgd(net->named_parameters(), optim::SGDOptions(0.1).momentum(0.9)),
        schedule(sgd, 2, 0.5) {}
  std::shared_ptr<SmallNet> net;
  optim::SGD sgd;
  optim::StepLR schedule;
};

// Everything a checkpoint restores, as copies.
struct Snapshot {
  explicit Snapshot(const TrainingRun& run) {
    for (const auto& [name, tensor] : run.net->state_dict())
      model.emplace_back(name, clone(tensor));
    for (const auto& [name, tensor] : run.sgd.state_tensors())
      optimizer.emplace_back(name, clone(tensor));
    optimizer_scalars = run.sgd.state_scalars();
    schedule = run.schedule.state_scalars();
  }
  nn::NamedTensors model;
  nn::NamedTensors optimizer;
  NamedScalars optimizer_scalars;
  NamedScalars schedule;
};

void expect_same_state(const TrainingRun& run, const Snapshot& expected) {
  Snapshot actual(run);
  ASSERT_EQ(actual.model.size(), expected.model.size());
  for (size_t i = 0; i < actual.model.size(); ++i) {
    EXPECT_EQ(actual.model[i].first, expected.model[i].first);
    EXPECT_TRUE(bitwise_equal(actual.model[i].second, expected.model[i].second))
        << actual.model[i].first;
  }
  ASSERT_EQ(actual.optimizer.size(), expected.optimizer.size());
  for (size_t i = 0; i < actual.optimizer.size(); ++i) {
    EXPECT_EQ(actual.optimizer[i].first, expected.optimizer[i].first);
    EXPECT_TRUE(bitwise_equal(actual.optimizer[i].second, expected.optimizer[i].second))
        << actual.optimizer[i].first;
  }
  EXPECT_EQ(actual.optimizer_scalars, expected.optimizer_scalars);
  EXPECT_EQ(actual.schedule, expected.schedule);
}

TEST(Checkpoint, WritesModelTrainStateAndLatest) {
  const std::string dir = fresh_dir();
  manual_seed(7);
  TrainingRun run;
  for (int i = 0; i < 3; ++i) {
    train_step(*run.net, run.sgd);
    run.schedule.step();
  }
  const std::string folder = save_checkpoint(dir, 3, *run.net, run.sgd, &run.schedule);
  EXPECT_EQ(folder, (fs::path(dir) / "step_3").string());
  EXPECT_EQ(read_file(fs::path(dir) / "latest"), "step_3\n");
  EXPECT_EQ(latest_checkpoint(dir), folder);
  // Only the final files: no temporaries left behind.
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"model.safetensors", "train_state.safetensors"}));

  // The model file is the state_dict, buffers included.
  auto model = load_safetensors(folder + "/model.safetensors");
  for (const auto& [name, tensor] : run.net->state_dict()) {
    ASSERT_TRUE(model.count(name)) << name;
    EXPECT_TRUE(bitwise_equal(model.at(name), tensor)) << name;
  }
  EXPECT_EQ(model.size(), run.net->state_dict().size());
  EXPECT_EQ(model.at("bn.num_batches_tracked").item<int64_t>(), 3);
}

TEST(Checkpoint, TrainStateHoldsExactScalars) {
  const std::string dir = fresh_dir();
  manual_seed(0xFFFFFFFFFFFFFFF1ull);  // above 2^53: must survive as text exactly
  TrainingRun run;
  train_step(*run.net, run.sgd);
  run.sgd.set_lr(0.1 / 3);
  const RngState rng = get_rng_state();
  save_checkpoint(dir, 1, *run.net, run.sgd, nullptr, {{"epoch", 2}, {"best", 1.0 / 3}});
  SafetensorsMetadata metadata;
  auto state = load_safetensors(dir + "/step_1/train_state.safetensors", &metadata);
  EXPECT_EQ(metadata.at("step"), "1");
  EXPECT_EQ(metadata.at("optimizer"), "SGD");
  EXPECT_EQ(metadata.at("optimizer.lr"), "0.033333333333333333");
  EXPECT_EQ(metadata.at("optimizer.fc.weight.step"), "1");
  EXPECT_EQ(metadata.at("rng.seed"), "18446744073709551601");
  EXPECT_EQ(metadata.at("rng.offset"), std::to_string(rng.offset));
  EXPECT_EQ(metadata.at("extra.best"), "0.33333333333333331");
  EXPECT_EQ(metadata.count("scheduler"), 0u);
  EXPECT_TRUE(state.count("optimizer.fc.weight.momentum_buffer"));
  EXPECT_TRUE(state.count("optimizer.bn.bias.momentum_buffer"));

  TrainingRun restored;
  NamedScalars extra;
  manual_seed(1);
  EXPECT_EQ(load_checkpoint(dir + "/step_1", *restored.net, restored.sgd, nullptr, &extra), 1);
  EXPECT_EQ(extra, (NamedScalars{{"best", 1.0 / 3}, {"epoch", 2}}));
  EXPECT_EQ(restored.sgd.lr(), 0.1 / 3);
  EXPECT_EQ(get_rng_state(), rng);
}

TEST(Checkpoint, LoadRestoresModelOptimizerScheduleAndRng) {
  const std::string dir = fresh_dir();
  manual_seed(3);
  TrainingRun run;
  for (int i = 0; i < 5; ++i) {
    train_step(*run.net, run.sgd);
    run.schedule.step();
  }
  save_checkpoint(dir, 5, *run.net, run.sgd, &run.schedule);
  const RngState rng = get_rng_state();
  const Snapshot saved(run);

  manual_seed(99);
  TrainingRun restored;
  EXPECT_EQ(load_latest_checkpoint(dir, *restored.net, restored.sgd, &restored.schedule), 5);
  expect_same_state(restored, saved);
  EXPECT_EQ(restored.schedule.step_count(), 5);
  EXPECT_EQ(restored.sgd.lr(), 0.1 * 0.25);
  EXPECT_EQ(get_rng_state(), rng);
}

TEST(Checkpoint, EachRankGetsItsOwnRngBackInTheSameLayoutOnly) {
  const std::string dir = fresh_dir();
  manual_seed(5);
  TrainingRun run;
  train_step(*run.net, run.sgd);
  CheckpointContents contents = capture_checkpoint(1, *run.net, run.sgd);
  const RngState rank0 = contents.rng;
  const RngState rank1{5, rank0.offset + 17};
  contents.rank_rngs = {rank0, rank1};
  contents.rank_layout = "dp=2,tp=1";
  write_checkpoint(dir, contents);
  SafetensorsMetadata metadata;
  load_safetensors(dir + "/step_1/train_state.safetensors", &metadata);
  EXPECT_EQ(metadata.at("rng.ranks"), "2");
  EXPECT_EQ(metadata.at("rng.layout"), "dp=2,tp=1");
  EXPECT_EQ(metadata.at("rng.rank.1.offset"), std::to_string(rank1.offset));

  // {rank, ranks, layout} -> the state restored and whether it is the rank's own.
  struct Case {
    int rank, ranks;
    std::string layout;
    RngState expected;
    bool own;
  };
  for (const Case& c : {Case{0, 2, "dp=2,tp=1", rank0, true}, Case{1, 2, "dp=2,tp=1", rank1, true},
                        Case{1, 2, "dp=1,tp=2", rank0, false},
                        Case{3, 4, "dp=4,tp=1", rank0, false}, Case{0, 1, "", rank0, false}}) {
    TrainingRun restored;
    manual_seed(99);
    CheckpointRank rank;
    rank.rank = c.rank;
    rank.ranks = c.ranks;
    rank.layout = c.layout;
    load_checkpoint(dir + "/step_1", *restored.net, restored.sgd, nullptr, nullptr, nullptr, &rank);
    EXPECT_EQ(get_rng_state(), c.expected) << c.rank << " of " << c.ranks << " " << c.layout;
    EXPECT_EQ(rank.own_rng, c.own) << c.rank << " of " << c.ranks << " " << c.layout;
    EXPECT_EQ(rank.saved_ranks, 2);
    EXPECT_EQ(rank.saved_layout, "dp=2,tp=1");
  }

  // A one-process checkpoint (no per-rank states): every rank of a larger run takes its state.
  const std::string single = dir + "/single";
  save_checkpoint(single, 1, *run.net, run.sgd);
  const RngState saved = get_rng_state();
  TrainingRun restored;
  manual_seed(99);
  CheckpointRank rank;
  rank.rank = 1;
  rank.ranks = 2;
  rank.layout = "dp=2,tp=1";
  load_checkpoint(single + "/step_1", *restored.net, restored.sgd, nullptr, nullptr, nullptr,
                  &rank);
  EXPECT_EQ(get_rng_state(), saved);
  EXPECT_FALSE(rank.own_rng);
  EXPECT_EQ(rank.saved_ranks, 1);

  // A mismatched rank_rngs[0] is refused.
  contents.rank_rngs[0].offset += 1;
  EXPECT_TRUE(throws_error([&] { write_checkpoint(dir, contents); }, "rank_rngs[0]"));
}

TEST(Checkpoint, KeepsTheLastThreeByDefault) {
  const std::string dir = fresh_dir();
  TrainingRun run;
  for (int step = 1; step <= 5; ++step) save_checkpoint(dir, step * 10, *run.net, run.sgd);
  EXPECT_FALSE(fs::exists(dir + "/step_10"));
  EXPECT_FALSE(fs::exists(dir + "/step_20"));
  EXPECT_TRUE(fs::exists(dir + "/step_30"));
  EXPECT_TRUE(fs::exists(dir + "/step_40"));
  EXPECT_TRUE(fs::exists(dir + "/step_50/train_state.safetensors"));
  EXPECT_EQ(read_file(dir + "/latest"), "step_50\n");
}

TEST(Checkpoint, KeepLastDeletesTheOldestOnlyAfterTheNewOneIsComplete) {
  const std::string dir = fresh_dir();
  TrainingRun run;
  CheckpointOptions keep_two;
  keep_two.keep_last = 2;
  save_checkpoint(dir, 1, *run.net, run.sgd, nullptr, {}, keep_two);
  save_checkpoint(dir, 2, *run.net, run.sgd, nullptr, {}, keep_two);
  EXPECT_TRUE(fs::exists(dir + "/step_1"));

  // A failing save (a bad argument found before writing) deletes nothing.
  EXPECT_TRUE(throws_error(
      [&] {
        save_checkpoint(dir, 3, *run.net, run.sgd, nullptr, {{"a", 1}, {"a", 2}}, keep_two);
      },
      "extra scalar 'a' is given twice"));
  EXPECT_TRUE(fs::exists(dir + "/step_1"));
  EXPECT_EQ(read_file(dir + "/latest"), "step_2\n");

  save_checkpoint(dir, 3, *run.net, run.sgd, nullptr, {}, keep_two);
  EXPECT_FALSE(fs::exists(dir + "/step_1"));
  EXPECT_TRUE(fs::exists(dir + "/step_2"));
  EXPECT_TRUE(fs::exists(dir + "/step_3"));

  CheckpointOptions keep_all;
  keep_all.keep_last = 0;
  save_checkpoint(dir, 4, *run.net, run.sgd, nullptr, {}, keep_all);
  EXPECT_TRUE(fs::exists(dir + "/step_2"));
}

TEST(Checkpoint, LeftoversOfACrashedSaveAreIgnored) {
  const std::string dir = fresh_dir();
  manual_seed(5);
  TrainingRun run;
  train_step(*run.net, run.sgd);
  save_checkpoint(dir, 10, *run.net, run.sgd, &run.schedule);
  const Snapshot saved(run);
  const std::string good_model = read_file(dir + "/step_10/model.safetensors");

  // A save of step 20 that died: a half-written temporary, a model file without its train state;
  // and one of step 10's own files half rewritten in its temporary.
  train_step(*run.net, run.sgd);
  fs::create_directories(dir + "/step_20");
  write_file(dir + "/step_20/model.safetensors", good_model);
  write_file(dir + "/step_20/train_state.safetensors.tmp.4242", good_model.substr(0, 100));
  write_file(dir + "/step_10/model.safetensors.tmp.4242", good_model.substr(0, 50));
  write_file(dir + "/latest.tmp.4242", "step_2");

  TrainingRun restored;
  EXPECT_EQ(load_latest_checkpoint(dir, *restored.net, restored.sgd, &restored.schedule), 10);
  expect_same_state(restored, saved);

  // The next save of step 20 completes it and clears the temporaries.
  save_checkpoint(dir, 20, *run.net, run.sgd, &run.schedule);
  EXPECT_FALSE(fs::exists(dir + "/step_20/train_state.safetensors.tmp.4242"));
  EXPECT_FALSE(fs::exists(dir + "/latest.tmp.4242"));
  EXPECT_EQ(read_file(dir + "/latest"), "step_20\n");
  TrainingRun latest;
  EXPECT_EQ(load_latest_checkpoint(dir, *latest.net, latest.sgd, &latest.schedule), 20);
  expect_same_state(latest, Snapshot(run));
}

TEST(Checkpoint, FilesFromDifferentSavesAreRefused) {
  const std::string dir = fresh_dir();
  TrainingRun run;
  save_checkpoint(dir, 1, *run.net, run.sgd);
  const std::string first_model = read_file(dir + "/step_1/model.safetensors");
  save_checkpoint(dir, 1, *run.net, run.sgd);  // rewriting a step replaces it
  write_file(dir + "/step_1/model.safetensors", first_model);
  TrainingRun restored;
  EXPECT_TRUE(throws_error([&] { load_checkpoint(dir + "/step_1", *restored.net, restored.sgd); },
                           "come from different saves"));
}

TEST(Checkpoint, RewritingTheLatestStepPointsLatestElsewhereMeanwhile) {
  const std::string dir = fresh_dir();
  TrainingRun run;
  save_checkpoint(dir, 1, *run.net, run.sgd);
  save_checkpoint(dir, 2, *run.net, run.sgd);
  save_checkpoint(dir, 2, *run.net, run.sgd);
  EXPECT_EQ(read_file(dir + "/latest"), "step_2\n");
  EXPECT_TRUE(fs::exists(dir + "/step_1"));
  TrainingRun restored;
  EXPECT_EQ(load_latest_checkpoint(dir, *restored.net, restored.sgd), 2);
}

TEST(CheckpointErrors, MissingDirectoryFolderOrFile) {
  const std::string dir = fresh_dir();
  TrainingRun run;
  EXPECT_TRUE(throws_error([&] { load_latest_checkpoint(dir + "/nowhere", *run.net, run.sgd); },
                           "the checkpoint directory '" + dir + "/nowhere' does not exist"));
  EXPECT_TRUE(throws_error([&] { load_latest_checkpoint(dir, *run.net, run.sgd); },
                           "has no 'latest' file: no complete checkpoint was saved there"));
  EXPECT_EQ(latest_checkpoint(dir), "");
  EXPECT_EQ(latest_checkpoint(dir + "/nowhere"), "");
  EXPECT_TRUE(throws_error([&] { load_checkpoint(dir + "/step_4", *run.net, run.sgd); },
                           "'" + dir + "/step_4' does not exist"));

  save_checkpoint(dir, 4, *run.net, run.sgd);
  EXPECT_TRUE(throws_error([&] { load_checkpoint(dir + "/latest", *run.net, run.sgd); },
                           "is not a checkpoint folder"));
  fs::remove(dir + "/step_4/train_state.safetensors");
  EXPECT_TRUE(throws_error([&] { load_latest_checkpoint(dir, *run.net, run.sgd); },
                           "train_state.safetensors' is missing"));
  write_file(dir + "/latest", "garbage\n");
  EXPECT_TRUE(throws_error([&] { load_latest_checkpoint(dir, *run.net, run.sgd); },
                           "latest' is corrupt: expected a folder name like step_100"));
}

TEST(CheckpointErrors, TruncatedOrCorruptFilesLeaveTheStateUnchanged) {
  const std::string dir = fresh_dir();
  manual_seed(11);
  TrainingRun run;
  train_step(*run.net, run.sgd);
  save_checkpoint(dir, 1, *run.net, run.sgd, &run.schedule);
  const std::string model_path = dir + "/step_1/model.safetensors";
  const std::string train_path = dir + "/step_1/train_state.safetensors";
  const std::string model_bytes = read_file(model_path);
  const std::string train_bytes = read_file(train_path);

  manual_seed(12);
  TrainingRun other;
  train_step(*other.net, other.sgd);
  const Snapshot before(other);
  const RngState rng = get_rng_state();
  auto load = [&] { load_latest_checkpoint(dir, *other.net, other.sgd, &other.schedule); };

  write_file(model_path, model_bytes.substr(0, model_bytes.size() - 4));
  EXPECT_TRUE(throws_error(load, "load_checkpoint: cannot read '" + model_path + "'"));
  EXPECT_TRUE(throws_error(load, "out of range"));
  write_file(model_path, model_bytes.substr(0, 6));
  EXPECT_TRUE(throws_error(load, "truncated file?"));
  write_file(model_path, model_bytes);

  write_file(train_path, train_bytes.substr(0, train_bytes.size() / 2));
  EXPECT_TRUE(throws_error(load, "cannot read '" + train_path + "'"));
  write_file(train_path, std::string(train_bytes.size(), '\0'));
  EXPECT_TRUE(throws_error(load, "cannot read '" + train_path + "'"));

  // Valid safetensors that are not Tessel checkpoints.
  save_safetensors(train_path, {{"optimizer.fc.weight.momentum_buffer", zeros({4, 3})}},
                   {{"format", "tessel-checkpoint-1"}});
  EXPECT_TRUE(throws_error(load, "has no 'save_id' in its metadata"));
  expect_same_state(other, before);
  EXPECT_EQ(get_rng_state(), rng);
}

TEST(CheckpointErrors, ADifferentModelNamesTheKeysAndChangesNothing) {
  const std::string dir = fresh_dir();
  manual_seed(21);
  TrainingRun run;
  train_step(*run.net, run.sgd);
  run.schedule.step();
  save_checkpoint(dir, 1, *run.net, run.sgd, &run.schedule);

  // Wider layers: same names, other shapes. Its optimizer state does not fit either.
  TrainingRun wider(/*hidden=*/5);
  train_step(*wider.net, wider.sgd);
  const Snapshot before(wider);
  EXPECT_TRUE(
      throws_error([&] { load_latest_checkpoint(dir, *wider.net, wider.sgd, &wider.schedule); },
                   "size mismatch for 'fc.weight.momentum_buffer'"));
  expect_same_state(wider, before);

  // Same optimizer parameters, but the model lacks the batch norm buffers' owner.
  auto linear_only = std::make_shared<nn::Sequential>(
      std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>>{
          {"fc", std::make_shared<nn::Linear>(3, 4)}});
  optim::SGD sgd({{"fc.weight", linear_only->named_parameters()[0].second},
                  {"fc.bias", linear_only->named_parameters()[1].second},
                  {"bn.weight", zeros({4}).set_requires_grad(true)},
                  {"bn.bias", zeros({4}).set_requires_grad(true)}},
                 optim::SGDOptions(0.1).momentum(0.9));
  optim::StepLR schedule(sgd, 2, 0.5);
  const Tensor weight_before = clone(linear_only->named_parameters()[0].second);
  const double lr_before = sgd.lr();
  auto load = [&] { load_latest_checkpoint(dir, *linear_only, sgd, &schedule); };
  EXPECT_TRUE(throws_error(load, "model.safetensors' does not match this model"));
  EXPECT_TRUE(throws_error(load, "bn.running_mean"));
  EXPECT_TRUE(bitwise_equal(linear_only->named_parameters()[0].second, weight_before));
  EXPECT_TRUE(sgd.state_tensors().empty());
  EXPECT_EQ(sgd.lr(), lr_before);
  EXPECT_EQ(schedule.step_count(), 0);
}

TEST(CheckpointErrors, AnotherOptimizerOrSchedulerIsRefused) {
  const std::string dir = fresh_dir();
  TrainingRun run;
  train_step(*run.net, run.sgd);
  save_checkpoint(dir, 1, *run.net, run.sgd);

  auto net = std::make_shared<SmallNet>();
  optim::AdamW adamw(net->named_parameters(), optim::AdamWOptions(1e-3));
  EXPECT_TRUE(throws_error([&] { load_latest_checkpoint(dir, *net, adamw); },
                           "holds the state of a SGD optimizer, not of AdamW"));

  TrainingRun restored;
  EXPECT_TRUE(throws_error(
      [&] { load_latest_checkpoint(dir, *restored.net, restored.sgd, &restored.schedule); },
      "was saved without a learning-rate scheduler, but a StepLR was given"));
  save_checkpoint(dir, 2, *run.net, run.sgd, &run.schedule);
  optim::CosineWithWarmup cosine(restored.sgd, 1, 10);
  EXPECT_TRUE(
      throws_error([&] { load_latest_checkpoint(dir, *restored.net, restored.sgd, &cosine); },
                   "holds the state of a StepLR scheduler, not of CosineWithWarmup"));
  // Without a scheduler to restore, the saved one is left aside.
  EXPECT_EQ(load_latest_checkpoint(dir, *restored.net, restored.sgd), 2);
  // A scheduler must drive the optimizer it is saved or loaded with.
  EXPECT_TRUE(
      throws_error([&] { load_latest_checkpoint(dir, *restored.net, restored.sgd, &run.schedule); },
                   "drives another optimizer"));
}

TEST(CheckpointErrors, BadSaveArguments) {
  const std::string dir = fresh_dir();
  TrainingRun run;
  EXPECT_TRUE(throws_error([&] { save_checkpoint(dir, -1, *run.net, run.sgd); },
                           "save_checkpoint: step must be >= 0, got -1"));
  EXPECT_TRUE(throws_error([&] { save_checkpoint("", 1, *run.net, run.sgd); },
                           "the checkpoint directory is empty"));
  EXPECT_TRUE(throws_error(
      [&] {
        save_checkpoint(dir, 1, *run.net, run.sgd, nullptr, {{"", 1}});
      },
      "an extra scalar has an empty name"));
  CheckpointOptions negative;
  negative.keep_last = -1;
  EXPECT_TRUE(
      throws_error([&] { save_checkpoint(dir, 1, *run.net, run.sgd, nullptr, {}, negative); },
                   "keep_last must be >= 0"));
  TrainingRun other;
  EXPECT_TRUE(throws_error([&] { save_checkpoint(dir, 1, *run.net, run.sgd, &other.schedule); },
                           "drives another optimizer"));
  write_file(dir + "/a_file", "not a folder");
  EXPECT_TRUE(throws_error([&] { save_checkpoint(dir + "/a_file/run", 1, *run.net, run.sgd); },
                           "save_checkpoint: cannot create '" + dir + "/a_file/run/step_1'"));
  EXPECT_FALSE(fs::exists(dir + "/latest"));
}

}  // namespace
}  // namespace tessel::train
