#include "train/cli.h"

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "core/error.h"
#include "memory/memory.h"
#include "train/engine/setup.h"

namespace tessel::train {
namespace {

std::string recipes_help() {
  std::ostringstream text;
  text << "Recipes (--recipe; the first is the default):\n";
  for (const auto& recipe : recipes()) {
    text << "  " << recipe.name << "\n      " << recipe.description << "\n"
         << "      --data: "
         << (recipe.defaults.data.empty() ? recipe.data_help
                                          : recipe.defaults.data + " (" + recipe.data_help + ")")
         << "\n      --model: ";
    for (size_t i = 0; i < recipe.models.size(); ++i) text << (i ? ", " : "") << recipe.models[i];
    text << " (default " << recipe.defaults.model << ")\n      --optimizer: ";
    for (size_t i = 0; i < recipe.optimizers.size(); ++i)
      text << (i ? ", " : "") << recipe.optimizers[i];
    text << "\n      defaults: --batch_size=" << recipe.defaults.batch_size
         << " --lr=" << recipe.defaults.lr << " --epochs=" << recipe.defaults.epochs << "\n";
  }
  text << "\nCheckpoints: --checkpoint_dir=DIR saves after every epoch (and every "
          "--checkpoint_every steps, and when --steps stops the run), keeping the newest 3. "
          "--resume continues from the newest checkpoint in --checkpoint_dir (or --resume=PATH: a "
          "checkpoint folder DIR/step_N or a checkpoint DIR) with the same data order, "
          "augmentation, RNG and schedule, so parameters match an uninterrupted run exactly; pass "
          "the same --recipe, --model, --data, --batch_size, --lr, --epochs and --seed.\n";
  return text.str();
}

// Value checks with plain messages ("--lr: must be positive, got 0").
CLI::Validator number_check(const std::string& description, bool integer, double minimum,
                            bool inclusive) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const char* begin = text.c_str();
        char* end = nullptr;
        errno = 0;
        const double value =
            integer ? static_cast<double>(std::strtoll(begin, &end, 10)) : std::strtod(begin, &end);
        if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(value))
          return std::string("expected ") + (integer ? "an integer" : "a number") + ", got '" +
                 text + "'";
        if (inclusive ? value < minimum : value <= minimum)
          return "must be " + description + ", got " + text;
        return "";
      },
      description);
}
const CLI::Validator kPositiveInteger = number_check("positive", true, 0, false);
const CLI::Validator kNonNegativeInteger = number_check("non-negative", true, 0, true);
const CLI::Validator kPositiveNumber = number_check("positive", false, 0, false);
// A probability that leaves something to keep: 1 would zero every activation.
const CLI::Validator kDropoutProbability(
    [](std::string& text) -> std::string {
      const std::string number =
          number_check("", false, -std::numeric_limits<double>::infinity(), true)(text);
      if (!number.empty()) return number;
      const double value = std::strtod(text.c_str(), nullptr);
      if (value < 0 || value >= 1) return "must be in [0, 1), got " + text;
      return "";
    },
    "in [0, 1)");
// The memory layer's own parsers, so the flag and the library accept and reject the same text.
const CLI::Validator kMemoryBudget(
    [](std::string& text) -> std::string {
      try {
        memory::parse_budget(text);
      } catch (const Error& error) {
        return error.message();
      }
      return "";
    },
    "BYTES|FRACTION");
const CLI::Validator kMemoryPolicy(
    [](std::string& text) -> std::string {
      try {
        memory::parse_policy(text);
      } catch (const Error& error) {
        return error.message();
      }
      return "";
    },
    "none|dtr|swap|split|auto");
// Device::parse's syntax, less the meta device (shapes only).
const CLI::Validator kTrainingDevice(
    [](std::string& text) -> std::string {
      try {
        parse_training_device(text);
      } catch (const Error& error) {
        return error.message();
      }
      return "";
    },
    "cpu|cuda|cuda:N");

}  // namespace

int parse_train_flags(int argc, const char* const* argv, TrainConfig* config, std::ostream& out,
                      std::ostream& err) {
  CLI::App app("Trains a model with one of Tessel's recipes.", "train");
  app.footer(recipes_help());

  TrainConfig flags;
  std::string model, data, optimizer;
  int64_t batch_size = 0, epochs = 0;
  double lr = 0, dropout = 0;
  app.add_option("--recipe", flags.recipe, "recipe to run, by name (listed below)")
      ->capture_default_str();
  auto* model_option =
      app.add_option("--model", model, "model the recipe trains (default: the recipe's)");
  auto* data_option = app.add_option("--data", data, "data set directory (default: the recipe's)");
  auto* batch_option =
      app.add_option("--batch_size", batch_size, "examples per step (default: the recipe's)")
          ->check(kPositiveInteger);
  auto* lr_option =
      app.add_option("--lr", lr, "learning rate (default: the recipe's)")->check(kPositiveNumber);
  auto* optimizer_option =
      app.add_option("--optimizer", optimizer,
                     "sgd (momentum 0.9), adam or adamw, those the recipe offers (default: the "
                     "recipe's first)")
          ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  auto* dropout_option =
      app.add_option("--dropout", dropout,
                     "dropout probability of the models that have dropout (BERT; default: the "
                     "model's, 0.1); --dropout=0 makes --dp ranks train as one process does")
          ->check(kDropoutProbability);
  auto* epochs_option =
      app.add_option("--epochs", epochs, "passes over the training set (default: the recipe's)")
          ->check(kPositiveInteger);
  app.add_option("--steps", flags.steps, "stop after this many steps in all; 0: no limit")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  app.add_option("--seed", flags.seed, "seed of model initialisation and data order")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  app.add_option("--threads", flags.threads, "intra-op threads; 0: every core")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  app.add_option("--eval_every", flags.eval_every,
                 "also evaluate every N steps; 0: after each epoch only")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  app.add_option("--log_every", flags.log_every, "steps between status lines")
      ->check(kPositiveInteger)
      ->capture_default_str();
  app.add_option("--metrics", flags.metrics_path, "write metrics as JSON lines to this file");
  app.add_option("--checkpoint_dir", flags.checkpoint_dir,
                 "save checkpoints here after every epoch, keeping the newest 3");
  app.add_option("--checkpoint_every", flags.checkpoint_every,
                 "also save every N steps (needs --checkpoint_dir); 0: after each epoch only")
      ->check(kNonNegativeInteger)
      ->capture_default_str();
  std::string resume;
  auto* resume_option =
      app.add_option("--resume", resume,
                     "continue from the newest checkpoint in --checkpoint_dir, or from PATH "
                     "(--resume=PATH: DIR/step_N or a checkpoint DIR)")
          ->expected(0, 1);
  app.add_option("--dp", flags.dp,
                 "data-parallel replicas under mpirun (each trains on its shard of every batch; "
                 "--batch_size is the global batch); 0: the ranks --tp leaves")
      ->check(kNonNegativeInteger);
  app.add_option("--tp", flags.tp,
                 "tensor-parallel slices under mpirun (BERT: heads, MLP and vocabulary split; "
                 "ResNet/ShuffleNet: batch-split convolutions, class-split classifier); dp x tp "
                 "must equal the rank count")
      ->check(kNonNegativeInteger);
  app.add_option("--zero", flags.zero,
                 "ZeRO over the data-parallel ranks: 1 keeps each rank's part of the optimizer "
                 "state, 2 of the gradients too, 3 of the parameters too, gathered when used "
                 "(with --dp > 1; 3 without a memory policy)")
      ->check(CLI::Range(0, 3));
  app.add_option("--plan", flags.plan,
                 "a plan file from `bazel run //parallel:plan -- --out=FILE` that sets dp and tp")
      ->check(CLI::ExistingFile);
  app.add_option("--work_dir", flags.work_dir,
                 "where recipes cache what they prepare once, such as the BERT vocabulary "
                 "(default: $HOME/.cache/tessel/RECIPE)");

  app.add_option("--memory_budget", flags.memory_budget,
                 "train within this much memory: bytes with a unit (1.5GiB, 512MiB, 2GB, 4096B) "
                 "or a fraction f in (0, 1] of the activation memory (0.4): the first step runs "
                 "unconstrained and measures the peak; then the budget is fixed + f x (peak - "
                 "fixed), fixed being parameters, gradients, optimizer state and buffers")
      ->check(kMemoryBudget);
  app.add_option("--memory_policy", flags.memory_policy,
                 "how to stay within --memory_budget: none, dtr (evict and recompute), swap (to "
                 "host), split (evict and recompute, run ops in chunks, with operands on host "
                 "where they do not fit whole), auto (per tensor, the cheapest; the default with "
                 "a budget)")
      ->check(kMemoryPolicy);
  app.add_option("--precision", flags.precision,
                 "f32, or bf16: matmul, linear and conv2d of each training step run in bf16 "
                 "(autocast; parameters and optimizer state stay f32)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--device", flags.device,
                 "where to train: cpu, cuda (= cuda:0) or cuda:N; the same recipe code runs on "
                 "each, batches are read on the CPU and copied over. CUDA needs a binary built "
                 "with --config=cuda and a GPU (checked before training starts). Under mpirun "
                 "only `cuda` (with --dp; not --tp > 1): each rank takes cuda:(its rank on the "
                 "node % GPUs) and gradients are all-reduced over NCCL")
      ->check(kTrainingDevice)
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error, out, err);  // 0 for --help, non-zero for errors
  }
  if (model_option->count()) flags.model = model;
  if (data_option->count()) flags.data = data;
  if (batch_option->count()) flags.batch_size = batch_size;
  if (lr_option->count()) flags.lr = lr;
  if (optimizer_option->count()) flags.optimizer = optimizer;
  if (epochs_option->count()) flags.epochs = epochs;
  if (dropout_option->count()) flags.dropout = dropout;
  if (resume_option->count()) flags.resume = resume;
  *config = std::move(flags);
  return -1;
}

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  TrainConfig config;
  const int parse_code = parse_train_flags(argc, argv, &config, out, err);
  if (parse_code >= 0) return parse_code;
  try {
    run_recipe(config, out);
  } catch (const Error& error) {
    err << "train: error: " << error.message() << std::endl;
    return 1;
  } catch (const std::exception& error) {
    err << "train: error: " << error.what() << std::endl;
    return 1;
  }
  return 0;
}

}  // namespace tessel::train
