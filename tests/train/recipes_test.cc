// Every recipe end to end through the CLI on tiny data written here (IDX, CIFAR-10 binary, fortune
// text), checkpoints and their rotation, and resume matching an uninterrupted run bit for bit.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "tests/train/train_test_util.h"
#include "train/cli.h"
#include "train/recipes/recipe.h"

namespace tessel::train {
namespace {

namespace fs = std::filesystem;

// A fresh folder under the test's temporary directory.
std::string fresh_dir(const std::string& name) {
  const fs::path path = fs::path(::testing::TempDir()) / name;
  fs::remove_all(path);
  fs::create_directories(path);
  return path.string();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// Class k of `classes` lights up band k of the image; a little noise on top.
uint8_t pixel(int example, int label, int classes, int channel, int row, int column, int size) {
  const int band = size / classes;
  const bool lit = row >= band * label && row < band * (label + 1);
  return static_cast<uint8_t>(lit ? 180 + (column * 7 + example + channel) % 60
                                  : (row + column + example) % 40);
}

// {prefix}-images-idx3-ubyte.gz / {prefix}-labels-idx1-ubyte.gz with `count` 28x28 images.
void write_banded_idx_split(const std::string& directory, const std::string& prefix, int count) {
  constexpr int kSize = 28;
  std::string images, labels;
  for (int i = 0; i < count; ++i) {
    const int label = i % 10;
    labels.push_back(static_cast<char>(label));
    for (int row = 0; row < kSize; ++row)
      for (int column = 0; column < kSize; ++column)
        images.push_back(static_cast<char>(pixel(i, label, 10, 0, row, column, kSize)));
  }
  write_idx_split(directory, prefix, kSize, images, labels);
}

std::string idx_folder(const std::string& name, int train = 24, int test = 10) {
  const std::string directory = fresh_dir(name);
  write_banded_idx_split(directory, "train", train);
  write_banded_idx_split(directory, "t10k", test);
  return directory;
}

// CIFAR-10 binary files: data_batch_1..5.bin with `per_file` records each, test_batch.bin.
std::string cifar_folder(const std::string& name, int per_file = 4, int test = 6) {
  const std::string directory = fresh_dir(name);
  auto records = [](int count, int offset) {
    std::string bytes;
    for (int i = 0; i < count; ++i) {
      const int label = (i + offset) % 10;
      bytes.push_back(static_cast<char>(label));
      for (int channel = 0; channel < 3; ++channel)
        for (int row = 0; row < 32; ++row)
          for (int column = 0; column < 32; ++column)
            bytes.push_back(static_cast<char>(pixel(i, label, 10, channel, row, column, 32)));
    }
    return bytes;
  };
  for (int file = 1; file <= 5; ++file)
    write_file(directory + "/data_batch_" + std::to_string(file) + ".bin",
               records(per_file, file * per_file));
  write_file(directory + "/test_batch.bin", records(test, 0));
  return directory;
}

// A fortune file of `count` short entries between "%" lines.
std::string fortunes_file(const std::string& name, int count = 60) {
  const std::string directory = fresh_dir(name);
  const char* subjects[] = {"the cat",       "a dog",       "my friend", "the old man",
                            "every student", "our teacher", "the river", "a small bird"};
  const char* verbs[] = {"sees", "likes", "finds", "follows", "remembers", "watches"};
  const char* objects[] = {"the moon",      "a red apple", "the long road",    "warm bread",
                           "the quiet sea", "a good book", "the morning light"};
  std::ostringstream text;
  for (int i = 0; i < count; ++i) {
    text << subjects[i % 8] << " " << verbs[i % 6] << " " << objects[i % 7] << ".\n"
         << subjects[(i + 3) % 8] << " " << verbs[(i + 1) % 6] << " " << objects[(i + 2) % 7]
         << " again.\n%\n";
  }
  const std::string path = directory + "/fortunes";
  std::ofstream(path) << text.str();
  return path;
}

// Tensors and metadata of one checkpoint file, for bitwise comparison.
struct FileState {
  std::map<std::string, Tensor> tensors;
  SafetensorsMetadata metadata;
};
FileState read_state(const std::string& path) {
  FileState state;
  state.tensors = load_safetensors(path, &state.metadata);
  state.metadata.erase("save_id");  // tells one save from another, by design
  return state;
}

void expect_bitwise_equal(const std::string& expected_path, const std::string& actual_path) {
  const FileState expected = read_state(expected_path);
  const FileState actual = read_state(actual_path);
  EXPECT_EQ(expected.metadata, actual.metadata) << actual_path;
  ASSERT_EQ(expected.tensors.size(), actual.tensors.size()) << actual_path;
  for (const auto& [name, tensor] : expected.tensors) {
    auto found = actual.tensors.find(name);
    ASSERT_NE(found, actual.tensors.end()) << name;
    ASSERT_EQ(tensor.dtype(), found->second.dtype()) << name;
    ASSERT_EQ(tensor.sizes(), found->second.sizes()) << name;
    const Tensor& a = tensor;
    const Tensor& b = found->second;
    if (tensor.dtype() == DType::kFloat32) {
      const auto x = a.to_vector<float>(), y = b.to_vector<float>();
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0)
          << name << " differs in " << actual_path;
    } else {
      EXPECT_EQ(a.to_vector<int64_t>(), b.to_vector<int64_t>()) << name;
    }
  }
}

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

// ---- each recipe, a few steps end to end ----

TEST(Recipes, HelpListsEveryRecipeWithItsDataAndModels) {
  CliRun result = run_train_cli({"--help"});
  ASSERT_EQ(result.code, 0);
  for (const auto& recipe : recipes()) {
    EXPECT_TRUE(contains(result.out, recipe.name)) << recipe.name;
    EXPECT_TRUE(contains(result.out, recipe.data_help)) << recipe.name;
    EXPECT_TRUE(contains(result.out, recipe.defaults.model)) << recipe.name;
  }
  EXPECT_EQ(recipes().front().name, "resnet18_fashion_mnist");  // the default
  EXPECT_TRUE(contains(result.out, "--checkpoint_every"));
  EXPECT_TRUE(contains(result.out, "--work_dir"));
}

TEST(Recipes, DefaultRecipeIsResNet18OnFashionMnist) {
  EXPECT_EQ(TrainConfig().recipe, "resnet18_fashion_mnist");
  const TrainConfig resolved = resolve_config(find_recipe("resnet18_fashion_mnist"), TrainConfig());
  EXPECT_EQ(*resolved.model, "resnet18");
  EXPECT_EQ(*resolved.data, "/usr/share/datasets/fashion-mnist");
}

TEST(ResNet18FashionMnist, TrainsEndToEndOnIdxFiles) {
  const std::string data = idx_folder("resnet_fmnist");
  const std::string metrics = fs::path(data) / "metrics.jsonl";
  CliRun result = run_train_cli({"--data=" + data, "--batch_size=8", "--epochs=3", "--steps=3",
                                 "--log_every=1", "--threads=1", "--metrics=" + metrics});
  ASSERT_EQ(result.code, 0) << result.err << result.out;
  EXPECT_TRUE(contains(result.out, "recipe resnet18_fashion_mnist: model resnet18")) << result.out;
  EXPECT_TRUE(contains(result.out, "RandomCrop(padding=2")) << result.out;
  EXPECT_TRUE(contains(result.out, "train step      3 | epoch 1/3")) << result.out;
  EXPECT_TRUE(contains(result.out, "ms/step | memory ")) << result.out;
  EXPECT_TRUE(contains(result.out, "eval  step      3 | epoch 1 | test loss ")) << result.out;
  EXPECT_TRUE(contains(result.out, "test accuracy: ")) << result.out;
  std::ifstream lines(metrics);
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) ++count;
  EXPECT_EQ(count, 5);  // 3 status lines, 1 evaluation, the final record
}

TEST(ResNet18FashionMnist, TrainsInBf16UnderAutocast) {
  const std::string data = idx_folder("resnet_fmnist_bf16", 8, 4);
  CliRun result = run_train_cli({"--data=" + data, "--batch_size=4", "--steps=2", "--log_every=1",
                                 "--threads=1", "--precision=bf16"});
  ASSERT_EQ(result.code, 0) << result.err << result.out;
  EXPECT_TRUE(contains(result.out, "train step      2 | epoch 1/")) << result.out;
}

TEST(ResNet18FashionMnist, TakesOtherResNets) {
  const std::string data = idx_folder("resnet34_fmnist", 8, 4);
  CliRun result = run_train_cli(
      {"--data=" + data, "--model=resnet34", "--batch_size=4", "--steps=1", "--threads=1"});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "model: resnet34, 21"));  // 21.3M parameters
}

TEST(ShuffleNetV2FashionMnist, TrainsEndToEnd) {
  const std::string data = idx_folder("shufflenet_fmnist");
  CliRun result =
      run_train_cli({"--recipe=shufflenet_v2_fashion_mnist", "--model=shufflenet_v2_x0_5",
                     "--data=" + data, "--batch_size=8", "--steps=2", "--threads=1"});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "train step      2")) << result.out;
  EXPECT_TRUE(contains(result.out, "test accuracy: ")) << result.out;
}

TEST(ResNetCifar10, TrainsOnCifarBinaryFiles) {
  const std::string data = cifar_folder("resnet_cifar");
  CliRun result = run_train_cli(
      {"--recipe=resnet_cifar10", "--data=" + data, "--batch_size=8", "--steps=2", "--threads=1"});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "data: 20 training and 6 test images of 3x32x32, 10 classes"))
      << result.out;
  EXPECT_TRUE(contains(result.out, "test accuracy: ")) << result.out;
}

TEST(ShuffleNetV2Cifar10, TrainsOnCifarBinaryFiles) {
  const std::string data = cifar_folder("shufflenet_cifar");
  CliRun result = run_train_cli({"--recipe=shufflenet_v2_cifar10", "--model=shufflenet_v2_x0_5",
                                 "--data=" + data, "--batch_size=8", "--steps=2", "--threads=1"});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "test accuracy: ")) << result.out;
}

TEST(ResNetImagenetStyle, ReadsCifarOrIdxFolders) {
  const std::string cifar = cifar_folder("imagenet_style_cifar");
  CliRun on_cifar =
      run_train_cli({"--recipe=resnet_imagenet_style", "--model=resnet18", "--data=" + cifar,
                     "--batch_size=8", "--steps=1", "--threads=1"});
  ASSERT_EQ(on_cifar.code, 0) << on_cifar.err;
  EXPECT_TRUE(contains(on_cifar.out, "lr 0.003125")) << on_cifar.out;  // 0.1 * 8 / 256
  EXPECT_TRUE(contains(on_cifar.out, "schedule StepLR")) << on_cifar.out;

  const std::string idx = idx_folder("imagenet_style_idx", 12, 4);
  CliRun on_idx = run_train_cli({"--recipe=resnet_imagenet_style", "--model=resnet18",
                                 "--data=" + idx, "--batch_size=4", "--steps=1", "--threads=1"});
  ASSERT_EQ(on_idx.code, 0) << on_idx.err;
  EXPECT_TRUE(contains(on_idx.out, "data: 12 training and 4 test images of 1x28x28, 10 classes"))
      << on_idx.out;
}

TEST(ResNetImagenetStyle, AFolderOfNeitherFormatIsAClearError) {
  const std::string empty = fresh_dir("imagenet_style_empty");
  CliRun result = run_train_cli({"--recipe=resnet_imagenet_style", "--data=" + empty});
  EXPECT_EQ(result.code, 1);
  EXPECT_TRUE(contains(result.err, "holds neither CIFAR-10 binary files")) << result.err;
}

TEST(Recipes, RecipesWithoutDefaultDataAskForIt) {
  for (const char* recipe : {"resnet_cifar10", "shufflenet_v2_cifar10", "resnet_imagenet_style"}) {
    CliRun result = run_train_cli({std::string("--recipe=") + recipe});
    EXPECT_EQ(result.code, 1) << recipe;
    EXPECT_TRUE(contains(result.err, std::string("recipe ") + recipe +
                                         " has no default data set: pass --data (required: "))
        << result.err;
  }
}

TEST(BertMlmFortunes, TrainsAndComparesWithTheUnigramBaseline) {
  const std::string corpus = fortunes_file("bert_corpus");
  const std::string work = fresh_dir("bert_work");
  const std::vector<std::string> args = {"--recipe=bert_mlm_fortunes",
                                         "--model=bert_tiny",
                                         "--data=" + corpus,
                                         "--work_dir=" + work,
                                         "--batch_size=8",
                                         "--steps=3",
                                         "--threads=1"};
  CliRun first = run_train_cli(args);
  ASSERT_EQ(first.code, 0) << first.err << first.out;
  EXPECT_TRUE(contains(first.out, "vocab: built ")) << first.out;
  EXPECT_TRUE(contains(first.out, "data: 57 training and 3 held-out documents")) << first.out;
  EXPECT_TRUE(contains(first.out, "| mlm loss ")) << first.out;
  EXPECT_TRUE(contains(first.out, "| nsp loss ")) << first.out;
  EXPECT_TRUE(contains(first.out, "sequences/s")) << first.out;
  for (const char* line : {"mlm loss: ", "unigram baseline: ", "mlm accuracy: ", "nsp accuracy: "})
    EXPECT_TRUE(contains(first.out, line)) << line << "\n" << first.out;
  int vocab_files = 0;
  for (const auto& entry : fs::directory_iterator(work))
    vocab_files += entry.path().filename().string().rfind("vocab-2000-", 0) == 0;
  EXPECT_EQ(vocab_files, 1);

  CliRun second = run_train_cli(args);  // reads the cached vocab
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_TRUE(contains(second.out, "vocab: ")) << second.out;
  EXPECT_FALSE(contains(second.out, "vocab: built")) << second.out;
}

TEST(BertMlmFortunes, TooSmallACorpusIsAClearError) {
  const std::string corpus = fortunes_file("bert_small_corpus", 5);
  CliRun result = run_train_cli({"--recipe=bert_mlm_fortunes", "--model=bert_tiny",
                                 "--data=" + corpus, "--work_dir=" + fresh_dir("bert_small_work")});
  EXPECT_EQ(result.code, 1);
  EXPECT_TRUE(contains(result.err, "holds 5 documents; at least 20 are needed")) << result.err;
}

// ---- checkpoints and resume ----

TEST(Checkpoints, SavedEveryEpochAndEveryNStepsKeepingTheNewestThree) {
  const std::string data = idx_folder("checkpoint_data", 16, 4);
  const std::string dir = fresh_dir("checkpoint_rotation");
  CliRun result =
      run_train_cli({"--data=" + data, "--model=resnet18", "--batch_size=8", "--epochs=3",
                     "--checkpoint_dir=" + dir, "--checkpoint_every=1", "--threads=1"});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_TRUE(contains(result.out, "checkpoint " + dir + "/step_6")) << result.out;
  std::vector<std::string> kept;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_directory()) kept.push_back(entry.path().filename().string());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"step_4", "step_5", "step_6"}));
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_6");
}

// Trains `steps` steps uninterrupted, and separately `first` steps then a resume to `steps`; the
// final checkpoints (parameters, buffers, optimizer state, schedule, RNG) must be identical.
void expect_exact_resume(const std::vector<std::string>& base, int first, int steps,
                         const std::string& name) {
  const std::string straight = fresh_dir(name + "_straight");
  const std::string split = fresh_dir(name + "_split");
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  CliRun uninterrupted =
      run_train_cli(with({"--steps=" + std::to_string(steps), "--checkpoint_dir=" + straight}));
  ASSERT_EQ(uninterrupted.code, 0) << uninterrupted.err << uninterrupted.out;
  CliRun before =
      run_train_cli(with({"--steps=" + std::to_string(first), "--checkpoint_dir=" + split}));
  ASSERT_EQ(before.code, 0) << before.err;
  CliRun after = run_train_cli(
      with({"--steps=" + std::to_string(steps), "--checkpoint_dir=" + split, "--resume"}));
  ASSERT_EQ(after.code, 0) << after.err << after.out;
  EXPECT_TRUE(contains(after.out, "resumed from " + split + "/step_" + std::to_string(first) +
                                      " at step " + std::to_string(first)))
      << after.out;
  const std::string last = "/step_" + std::to_string(steps);
  expect_bitwise_equal(straight + last + "/model.safetensors", split + last + "/model.safetensors");
  expect_bitwise_equal(straight + last + "/train_state.safetensors",
                       split + last + "/train_state.safetensors");
}

TEST(Checkpoints, ResNetResumeMidEpochMatchesAnUninterruptedRunBitwise) {
  // 20 images in batches of 8: 3 batches per epoch; stop at step 2 (mid-epoch 1), finish at 5
  // (mid-epoch 2), so the resumed run skips batches and crosses an epoch boundary.
  const std::string data = idx_folder("resume_resnet_data", 20, 4);
  expect_exact_resume({"--data=" + data, "--batch_size=8", "--epochs=3", "--threads=1"}, 2, 5,
                      "resume_resnet");
}

TEST(Checkpoints, BertResumeMatchesAnUninterruptedRunBitwise) {
  // Dropout draws from the global RNG, so this also checks that the RNG state is restored.
  const std::string corpus = fortunes_file("resume_bert_corpus");
  expect_exact_resume({"--recipe=bert_mlm_fortunes", "--model=bert_tiny", "--data=" + corpus,
                       "--work_dir=" + fresh_dir("resume_bert_work"), "--batch_size=8",
                       "--epochs=2", "--threads=2"},
                      3, 6, "resume_bert");
}

TEST(Checkpoints, ResumeFromAnExplicitCheckpointFolder) {
  const std::string data = idx_folder("resume_path_data", 16, 4);
  const std::string dir = fresh_dir("resume_path");
  const std::vector<std::string> base = {
      "--data=" + data, "--model=resnet18", "--batch_size=8",         "--epochs=3",
      "--threads=1",    "--log_every=1",    "--checkpoint_dir=" + dir};
  auto with = [&](std::string extra) {
    std::vector<std::string> args = base;
    args.push_back(extra);
    return args;
  };
  ASSERT_EQ(run_train_cli(with("--steps=2")).code, 0);
  CliRun resumed = run_train_cli(with("--resume=" + dir + "/step_2"));
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.out, "at step 2")) << resumed.out;
  EXPECT_TRUE(contains(resumed.out, "train step      3 | epoch 2/3")) << resumed.out;
}

TEST(Checkpoints, ResumeProblemsAreClearErrors) {
  const std::string data = idx_folder("resume_errors_data", 16, 4);
  const std::string empty = fresh_dir("resume_errors_empty");
  CliRun nothing =
      run_train_cli({"--data=" + data, "--checkpoint_dir=" + empty, "--resume", "--threads=1"});
  EXPECT_EQ(nothing.code, 1);
  EXPECT_TRUE(contains(nothing.err, "--resume: no checkpoint in '" + empty + "'")) << nothing.err;

  CliRun no_dir = run_train_cli({"--data=" + data, "--resume"});
  EXPECT_EQ(no_dir.code, 1);
  EXPECT_TRUE(contains(no_dir.err, "--resume without a value resumes from the newest checkpoint"))
      << no_dir.err;

  CliRun missing = run_train_cli({"--data=" + data, "--resume=/nonexistent/checkpoints"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(contains(missing.err, "'/nonexistent/checkpoints' does not exist")) << missing.err;

  const std::string dir = fresh_dir("resume_errors_seed");
  ASSERT_EQ(run_train_cli({"--data=" + data, "--batch_size=8", "--steps=1", "--threads=1",
                           "--checkpoint_dir=" + dir})
                .code,
            0);
  CliRun other_seed = run_train_cli({"--data=" + data, "--batch_size=8", "--seed=5", "--threads=1",
                                     "--checkpoint_dir=" + dir, "--resume"});
  EXPECT_EQ(other_seed.code, 1);
  EXPECT_TRUE(contains(other_seed.err, "resume with the same --data, --batch_size and --seed"))
      << other_seed.err;
}

TEST(Checkpoints, CheckpointEveryNeedsADirectory) {
  CliRun result = run_train_cli({"--checkpoint_every=10"});
  EXPECT_EQ(result.code, 1);
  EXPECT_TRUE(contains(result.err, "--checkpoint_every needs --checkpoint_dir")) << result.err;
  CliRun negative = run_train_cli({"--checkpoint_every=-2"});
  EXPECT_NE(negative.code, 0);
  EXPECT_TRUE(contains(negative.err, "--checkpoint_every: must be non-negative")) << negative.err;
}

}  // namespace
}  // namespace tessel::train
