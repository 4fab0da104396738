#include "train/state/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "core/shape.h"
#include "ops/ops.h"

namespace tessel::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kFormat = "tessel-checkpoint-1";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kTrainStateFile = "train_state.safetensors";
constexpr const char* kLatestFile = "latest";
constexpr const char* kTempMarker = ".tmp.";
constexpr const char* kOptimizerPrefix = "optimizer.";
constexpr const char* kSchedulerPrefix = "scheduler.";
constexpr const char* kExtraPrefix = "extra.";
constexpr const char* kRankRngPrefix = "rng.rank.";

std::string step_folder_name(int64_t step) { return "step_" + std::to_string(step); }

// The step of a folder named "step_<digits>", or -1.
int64_t step_of_folder_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return -1;
  const std::string digits = name.substr(5);
  const bool all_digits = std::all_of(digits.begin(), digits.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c));
  });
  // Only the names save_checkpoint writes: no sign, no leading zeros, within int64.
  if (!all_digits || digits.size() > 18 || (digits.size() > 1 && digits[0] == '0')) return -1;
  return std::stoll(digits);
}

bool starts_with(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// Exact text for a double: %.17g reads back to the same bits (inf and nan included).
std::string format_exact(double value) {
  char buffer[40];
  std::snprintf(buffer, sizeof(buffer), "%.17g", value);
  return buffer;
}

// Distinguishes one save from another (never from Tessel's RNG: saving must not move it).
std::string new_save_id() {
  static std::atomic<uint64_t> counter{0};
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  char buffer[64];
  std::snprintf(
      buffer, sizeof(buffer), "%016" PRIx64 "-%08x-%" PRIu64,
      static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()),
      static_cast<unsigned>(::getpid()), counter.fetch_add(1));
  return buffer;
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), O_RDONLY | (directory ? O_DIRECTORY : 0) | O_CLOEXEC);
  TESSEL_CHECK(fd >= 0, "save_checkpoint: cannot open '", path,
               "' to sync it to disk: ", std::strerror(errno));
  const int result = ::fsync(fd);
  const int fsync_errno = errno;
  ::close(fd);
  TESSEL_CHECK(result == 0, "save_checkpoint: fsync of '", path,
               "' failed: ", std::strerror(fsync_errno));
}

// Writes `final_path` atomically: `write(temp_path)` fills a temporary file beside it, which is
// synced and renamed over `final_path`; then the folder is synced so the rename is durable.
template <typename WriteFn>
void write_atomically(const fs::path& final_path, WriteFn write) {
  const fs::path temp_path =
      final_path.string() + kTempMarker + std::to_string(static_cast<long>(::getpid()));
  try {
    write(temp_path.string());
    fsync_path(temp_path.string(), /*directory=*/false);
  } catch (...) {
    std::error_code ignored;
    fs::remove(temp_path, ignored);
    throw;
  }
  if (::rename(temp_path.c_str(), final_path.c_str()) != 0) {
    const int rename_errno = errno;
    std::error_code ignored;
    fs::remove(temp_path, ignored);
    TESSEL_FAIL("save_checkpoint: renaming '", temp_path.string(), "' to '", final_path.string(),
                "' failed: ", std::strerror(rename_errno));
  }
  fsync_path(final_path.parent_path().string(), /*directory=*/true);
}

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  TESSEL_CHECK(out.is_open(), "save_checkpoint: cannot open '", path,
               "' for writing: ", std::strerror(errno));
  out << text;
  out.close();
  TESSEL_CHECK(!out.fail(), "save_checkpoint: writing '", path, "' failed: ", std::strerror(errno));
}

// The folder name `<dir>/latest` holds, or "" when there is no such file.
std::string read_latest_name(const fs::path& dir) {
  const fs::path latest = dir / kLatestFile;
  std::error_code error;
  if (!fs::exists(latest, error)) return "";
  std::ifstream in(latest);
  TESSEL_CHECK(in.is_open(), "checkpoint: cannot read '", latest.string(),
               "': ", std::strerror(errno));
  std::string name;
  std::getline(in, name);
  TESSEL_CHECK(step_of_folder_name(name) >= 0, "checkpoint: '", latest.string(),
               "' is corrupt: expected a folder name like step_100, got '", name, "'");
  return name;
}

void write_latest(const fs::path& dir, const std::string& folder_name) {
  write_atomically(dir / kLatestFile,
                   [&](const std::string& path) { write_text_file(path, folder_name + "\n"); });
}

// Both files present (their contents are checked when loaded).
bool looks_complete(const fs::path& folder) {
  std::error_code error;
  return fs::is_regular_file(folder / kModelFile, error) &&
         fs::is_regular_file(folder / kTrainStateFile, error);
}

// step -> folder, for every step_<N> folder under `dir`.
std::map<int64_t, fs::path> step_folders(const fs::path& dir) {
  std::map<int64_t, fs::path> folders;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const int64_t step = step_of_folder_name(entry.path().filename().string());
    if (step >= 0 && entry.is_directory()) folders[step] = entry.path();
  }
  return folders;
}

// Removes the temporaries of `files` that a crashed save left in `folder` (nothing else).
void remove_stale_temporaries(const fs::path& folder, std::initializer_list<const char*> files) {
  for (const auto& entry : fs::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    for (const char* file : files) {
      if (starts_with(name, std::string(file) + kTempMarker)) {
        std::error_code ignored;
        fs::remove(entry.path(), ignored);
      }
    }
  }
}

void check_scalar_name(const std::string& name) {
  TESSEL_CHECK(!name.empty(), "save_checkpoint: an extra scalar has an empty name");
}

// ---- loading ----

std::string require(const SafetensorsMetadata& metadata, const std::string& key,
                    const std::string& file) {
  auto found = metadata.find(key);
  TESSEL_CHECK(found != metadata.end(), "load_checkpoint: '", file, "' has no '", key,
               "' in its metadata (not a Tessel checkpoint, or a corrupt one)");
  return found->second;
}

double parse_double(const std::string& text, const std::string& key, const std::string& file) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(begin, &end);
  TESSEL_CHECK(!text.empty() && end == begin + text.size() && errno != ERANGE, "load_checkpoint: '",
               file, "' metadata '", key, "' is not a number: '", text, "'");
  return value;
}

uint64_t parse_unsigned(const std::string& text, const std::string& key, const std::string& file) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const unsigned long long value = std::strtoull(begin, &end, 10);
  TESSEL_CHECK(!text.empty() && std::isdigit(static_cast<unsigned char>(text[0])) &&
                   end == begin + text.size() && errno != ERANGE,
               "load_checkpoint: '", file, "' metadata '", key,
               "' is not a non-negative integer: '", text, "'");
  return value;
}

// Scalars stored under `prefix` ("optimizer.lr" -> {"lr", value}).
NamedScalars scalars_with_prefix(const SafetensorsMetadata& metadata, const std::string& prefix,
                                 const std::string& file) {
  NamedScalars scalars;
  for (const auto& [key, text] : metadata)
    if (starts_with(key, prefix))
      scalars.emplace_back(key.substr(prefix.size()), parse_double(text, key, file));
  return scalars;
}

std::map<std::string, Tensor> read_checkpoint_file(const fs::path& path,
                                                   SafetensorsMetadata* metadata) {
  std::error_code error;
  TESSEL_CHECK(fs::is_regular_file(path, error), "load_checkpoint: '", path.string(),
               "' is missing (an incomplete checkpoint? load the one `latest` names)");
  try {
    return load_safetensors(path.string(), metadata);
  } catch (const Error& failure) {
    TESSEL_FAIL("load_checkpoint: cannot read '", path.string(), "': ", failure.message());
  }
}

// This rank's part of the whole tensor `name` (the tensor itself when it is not split).
Tensor this_part(const CheckpointSharding& sharding, const std::string& name, const Tensor& whole,
                 const std::string& file) {
  auto dim = sharding.split_dims.find(name);
  if (dim == sharding.split_dims.end()) return whole;
  TESSEL_CHECK(dim->second >= 0 && dim->second < whole.dim(), "load_checkpoint: '", file,
               "' holds '", name, "' of shape ", shape_str(whole.sizes()),
               ", but this run splits it along dim ", dim->second);
  const int64_t size = whole.size(dim->second);
  auto other = sharding.other_parts.find(name);
  const int parts = other == sharding.other_parts.end() ? sharding.parts : other->second.first;
  const int index = other == sharding.other_parts.end() ? sharding.part : other->second.second;
  TESSEL_CHECK(size % parts == 0, "load_checkpoint: '", file, "' holds '", name, "' of shape ",
               shape_str(whole.sizes()), ", whose dim ", dim->second, " (", size,
               ") does not split into ", parts, " equal parts for this run's ", parts,
               " tensor-parallel ranks");
  const int64_t part = size / parts;
  return contiguous(narrow(whole, dim->second, index * part, part));
}

}  // namespace

CheckpointContents capture_checkpoint(int64_t step, const nn::Module& module,
                                      const optim::Optimizer& optimizer,
                                      const optim::LRScheduler* scheduler,
                                      const NamedScalars& extra, const CheckpointSharding* sharding,
                                      const optim::NamedTensors* optimizer_state) {
  TESSEL_CHECK(step >= 0, "save_checkpoint: step must be >= 0, got ", step);
  TESSEL_CHECK(optimizer_state != nullptr || !optimizer.collective_state(), "save_checkpoint: the ",
               optimizer.name(),
               " optimizer's state is spread over ranks: gather it on every rank "
               "(state_tensors()) and pass it in");
  TESSEL_CHECK(scheduler == nullptr || &scheduler->optimizer() == &optimizer,
               "save_checkpoint: the scheduler (", scheduler ? scheduler->name() : "",
               ") drives another optimizer than the one given");
  std::set<std::string> extra_names;
  for (const auto& [name, value] : extra) {
    check_scalar_name(name);
    TESSEL_CHECK(extra_names.insert(name).second, "save_checkpoint: extra scalar '", name,
                 "' is given twice");
  }
  TESSEL_CHECK(sharding == nullptr || (sharding->parts >= 1 && sharding->gather),
               "save_checkpoint: the sharding needs a part count and a gather function");
  // Split tensors are gathered in the order of state_dict and state_tensors, the same on every
  // rank.
  // GPU tensors are copied to the host (a blocking copy, after the step's kernels), so the
  // contents are CPU tensors whatever device trained: writing them reads host bytes only.
  auto whole = [&](const std::string& name, const Tensor& tensor) {
    Tensor result = tensor;
    if (sharding != nullptr && sharding->parts > 1) {
      auto dim = sharding->split_dims.find(name);
      if (sharding->other_parts.count(name))
        result = sharding->gather_other(name, tensor);
      else if (dim != sharding->split_dims.end())
        result = sharding->gather(tensor, dim->second);
    }
    return result.device().is_cuda() ? result.to(Device::cpu()) : result;
  };
  CheckpointContents contents;
  contents.step = step;
  for (const auto& [name, tensor] : module.state_dict())
    contents.model.emplace_back(name, whole(name, tensor));
  contents.optimizer_name = optimizer.name();
  for (const auto& [name, tensor] : optimizer_state ? *optimizer_state : optimizer.state_tensors())
    contents.optimizer_tensors.emplace_back(name, whole(name.substr(0, name.rfind('.')), tensor));
  contents.optimizer_scalars = optimizer.state_scalars();
  if (scheduler) {
    contents.scheduler_name = scheduler->name();
    contents.scheduler_scalars = scheduler->state_scalars();
  }
  contents.extra = extra;
  contents.rng = get_rng_state();
  return contents;
}

std::string save_checkpoint(const std::string& dir, int64_t step, const nn::Module& module,
                            const optim::Optimizer& optimizer, const optim::LRScheduler* scheduler,
                            const NamedScalars& extra, const CheckpointOptions& options) {
  TESSEL_CHECK(!dir.empty(), "save_checkpoint: the checkpoint directory is empty");
  return write_checkpoint(dir, capture_checkpoint(step, module, optimizer, scheduler, extra),
                          options);
}

std::string write_checkpoint(const std::string& dir, const CheckpointContents& contents,
                             const CheckpointOptions& options) {
  TESSEL_CHECK(!dir.empty(), "save_checkpoint: the checkpoint directory is empty");
  const int64_t step = contents.step;
  TESSEL_CHECK(step >= 0, "save_checkpoint: step must be >= 0, got ", step);
  TESSEL_CHECK(options.keep_last >= 0, "save_checkpoint: keep_last must be >= 0, got ",
               options.keep_last);

  // Everything to write is gathered before touching the disk.
  const std::string save_id = new_save_id();
  SafetensorsMetadata model_metadata{
      {"format", kFormat}, {"save_id", save_id}, {"step", std::to_string(step)}};
  SafetensorsMetadata train_metadata = model_metadata;
  train_metadata["rng.seed"] = std::to_string(contents.rng.seed);
  train_metadata["rng.offset"] = std::to_string(contents.rng.offset);
  if (!contents.rank_rngs.empty()) {
    TESSEL_CHECK(contents.rank_rngs[0] == contents.rng,
                 "save_checkpoint: rank_rngs[0] is not rank 0's RNG state `rng`");
    train_metadata["rng.ranks"] = std::to_string(contents.rank_rngs.size());
    train_metadata["rng.layout"] = contents.rank_layout;
    for (size_t r = 0; r < contents.rank_rngs.size(); ++r) {
      const std::string prefix = kRankRngPrefix + std::to_string(r);
      train_metadata[prefix + ".seed"] = std::to_string(contents.rank_rngs[r].seed);
      train_metadata[prefix + ".offset"] = std::to_string(contents.rank_rngs[r].offset);
    }
  }
  train_metadata["optimizer"] = contents.optimizer_name;
  for (const auto& [name, value] : contents.optimizer_scalars)
    train_metadata[kOptimizerPrefix + name] = format_exact(value);
  if (!contents.scheduler_name.empty()) {
    train_metadata["scheduler"] = contents.scheduler_name;
    for (const auto& [name, value] : contents.scheduler_scalars)
      train_metadata[kSchedulerPrefix + name] = format_exact(value);
  }
  for (const auto& [name, value] : contents.extra)
    train_metadata[kExtraPrefix + name] = format_exact(value);
  std::vector<std::pair<std::string, Tensor>> optimizer_tensors;
  for (const auto& [name, tensor] : contents.optimizer_tensors)
    optimizer_tensors.emplace_back(kOptimizerPrefix + name, tensor);
  const nn::NamedTensors& model_tensors = contents.model;

  const fs::path root(dir);
  const std::string folder_name = step_folder_name(step);
  const fs::path folder = root / folder_name;
  std::error_code error;
  fs::create_directories(folder, error);
  TESSEL_CHECK(!error, "save_checkpoint: cannot create '", folder.string(), "': ", error.message());
  fsync_path(root.string(), /*directory=*/true);

  // Rewriting the checkpoint `latest` names: point `latest` at the newest earlier complete one
  // first, so a crash halfway does not leave it naming a half-written folder.
  if (read_latest_name(root) == folder_name) {
    std::string fallback;  // folders come in ascending steps: the last complete one wins
    for (const auto& [other_step, other_folder] : step_folders(root))
      if (other_step < step && looks_complete(other_folder))
        fallback = other_folder.filename().string();
    if (!fallback.empty()) write_latest(root, fallback);
  }

  remove_stale_temporaries(folder, {kModelFile, kTrainStateFile});
  remove_stale_temporaries(root, {kLatestFile});
  write_atomically(folder / kModelFile, [&](const std::string& path) {
    save_safetensors(path, model_tensors, model_metadata);
  });
  write_atomically(folder / kTrainStateFile, [&](const std::string& path) {
    save_safetensors(path, optimizer_tensors, train_metadata);
  });
  write_latest(root, folder_name);

  // Only now that the new checkpoint is complete: drop the oldest beyond keep_last.
  if (options.keep_last > 0) {
    std::vector<fs::path> older;  // newest first
    const auto folders = step_folders(root);
    for (auto it = folders.rbegin(); it != folders.rend(); ++it)
      if (it->first < step) older.push_back(it->second);
    for (size_t i = static_cast<size_t>(options.keep_last) - 1; i < older.size(); ++i) {
      fs::remove_all(older[i], error);
      TESSEL_CHECK(!error, "save_checkpoint: the new checkpoint '", folder.string(),
                   "' is complete, but deleting the old '", older[i].string(),
                   "' failed: ", error.message());
    }
  }
  return folder.string();
}

int64_t load_checkpoint(const std::string& path, nn::Module& module, optim::Optimizer& optimizer,
                        optim::LRScheduler* scheduler, NamedScalars* extra,
                        const CheckpointSharding* sharding, CheckpointRank* rank) {
  const fs::path folder(path);
  std::error_code error;
  TESSEL_CHECK(fs::exists(folder, error), "load_checkpoint: '", path, "' does not exist");
  TESSEL_CHECK(fs::is_directory(folder, error), "load_checkpoint: '", path,
               "' is not a checkpoint folder (expected a folder like <dir>/step_100 holding ",
               kModelFile, " and ", kTrainStateFile, ")");
  TESSEL_CHECK(scheduler == nullptr || &scheduler->optimizer() == &optimizer,
               "load_checkpoint: the scheduler (", scheduler ? scheduler->name() : "",
               ") drives another optimizer than the one given");

  // Read and check everything before changing anything.
  const std::string model_path = (folder / kModelFile).string();
  const std::string train_path = (folder / kTrainStateFile).string();
  SafetensorsMetadata model_metadata;
  SafetensorsMetadata train_metadata;
  std::map<std::string, Tensor> model_state = read_checkpoint_file(model_path, &model_metadata);
  const std::map<std::string, Tensor> train_state =
      read_checkpoint_file(train_path, &train_metadata);

  for (const auto* file : {&model_path, &train_path}) {
    const auto& metadata = file == &model_path ? model_metadata : train_metadata;
    const std::string format = require(metadata, "format", *file);
    TESSEL_CHECK(format == kFormat, "load_checkpoint: '", *file, "' has format '", format,
                 "'; this version of Tessel reads '", kFormat, "'");
  }
  TESSEL_CHECK(require(model_metadata, "save_id", model_path) ==
                   require(train_metadata, "save_id", train_path),
               "load_checkpoint: '", model_path, "' and '", train_path,
               "' come from different saves (a save was interrupted?); load the checkpoint "
               "`latest` names");
  const std::string step_text = require(train_metadata, "step", train_path);
  const uint64_t step = parse_unsigned(step_text, "step", train_path);
  TESSEL_CHECK(step <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
               "load_checkpoint: '", train_path, "' has an out-of-range step ", step_text);
  RngState rng;
  rng.seed =
      parse_unsigned(require(train_metadata, "rng.seed", train_path), "rng.seed", train_path);
  rng.offset =
      parse_unsigned(require(train_metadata, "rng.offset", train_path), "rng.offset", train_path);
  // This rank's own state when the same ranks in the same layout saved it; else rank 0's.
  uint64_t saved_ranks = 1;
  std::string saved_layout;
  if (train_metadata.count("rng.ranks")) {
    saved_ranks = parse_unsigned(train_metadata.at("rng.ranks"), "rng.ranks", train_path);
    TESSEL_CHECK(
        saved_ranks >= 1 && saved_ranks <= static_cast<uint64_t>(std::numeric_limits<int>::max()),
        "load_checkpoint: '", train_path, "' has an out-of-range rng.ranks ", saved_ranks);
    saved_layout = require(train_metadata, "rng.layout", train_path);
  }
  const bool same_layout = rank != nullptr && rank->rank >= 0 && rank->rank < rank->ranks &&
                           saved_ranks == static_cast<uint64_t>(rank->ranks) &&
                           saved_layout == rank->layout;
  if (same_layout && rank->rank > 0) {
    const std::string prefix = kRankRngPrefix + std::to_string(rank->rank);
    rng.seed = parse_unsigned(require(train_metadata, prefix + ".seed", train_path),
                              prefix + ".seed", train_path);
    rng.offset = parse_unsigned(require(train_metadata, prefix + ".offset", train_path),
                                prefix + ".offset", train_path);
  }

  const std::string saved_optimizer = require(train_metadata, "optimizer", train_path);
  TESSEL_CHECK(saved_optimizer == optimizer.name(), "load_checkpoint: '", train_path,
               "' holds the state of a ", saved_optimizer, " optimizer, not of ", optimizer.name());
  const NamedScalars optimizer_scalars =
      scalars_with_prefix(train_metadata, kOptimizerPrefix, train_path);
  optim::NamedTensors optimizer_tensors;
  for (const auto& [name, tensor] : train_state) {
    TESSEL_CHECK(starts_with(name, kOptimizerPrefix), "load_checkpoint: '", train_path,
                 "' holds an unexpected tensor '", name, "'");
    optimizer_tensors.emplace_back(name.substr(std::strlen(kOptimizerPrefix)), tensor);
  }
  if (sharding != nullptr && sharding->parts > 1) {
    for (auto& [name, tensor] : model_state)
      tensor = this_part(*sharding, name, tensor, model_path);
    for (auto& [name, tensor] : optimizer_tensors)
      tensor = this_part(*sharding, name.substr(0, name.rfind('.')), tensor, train_path);
  }

  NamedScalars scheduler_scalars;
  if (scheduler) {
    auto saved_scheduler = train_metadata.find("scheduler");
    TESSEL_CHECK(saved_scheduler != train_metadata.end(), "load_checkpoint: '", train_path,
                 "' was saved without a learning-rate scheduler, but a ", scheduler->name(),
                 " was given to restore");
    TESSEL_CHECK(saved_scheduler->second == scheduler->name(), "load_checkpoint: '", train_path,
                 "' holds the state of a ", saved_scheduler->second, " scheduler, not of ",
                 scheduler->name());
    scheduler_scalars = scalars_with_prefix(train_metadata, kSchedulerPrefix, train_path);
  }
  const NamedScalars extra_scalars = scalars_with_prefix(train_metadata, kExtraPrefix, train_path);

  // Apply: optimizer and scheduler first (their old state is cheap to put back), the module
  // last (load_state_dict checks everything before copying, so it fails without changes).
  const optim::NamedTensors old_optimizer_tensors = optimizer.state_tensors();
  const NamedScalars old_optimizer_scalars = optimizer.state_scalars();
  const NamedScalars old_scheduler_scalars =
      scheduler ? scheduler->state_scalars() : NamedScalars{};
  auto restore_old_state = [&]() {
    if (scheduler) scheduler->load_state_scalars(old_scheduler_scalars);
    optimizer.load_state_tensors(old_optimizer_tensors);
    optimizer.load_state_scalars(old_optimizer_scalars);
  };
  try {
    optimizer.load_state_tensors(optimizer_tensors);
    optimizer.load_state_scalars(optimizer_scalars);
    if (scheduler) scheduler->load_state_scalars(scheduler_scalars);
  } catch (const Error& failure) {
    restore_old_state();
    TESSEL_FAIL("load_checkpoint: '", train_path,
                "' does not match this optimizer: ", failure.message());
  }
  try {
    module.load_state_dict(model_state, /*strict=*/true);
  } catch (const Error& failure) {
    restore_old_state();
    TESSEL_FAIL("load_checkpoint: '", model_path,
                "' does not match this model: ", failure.message());
  }
  set_rng_state(rng);
  if (rank) {
    rank->own_rng = same_layout;
    rank->saved_ranks = static_cast<int>(saved_ranks);
    rank->saved_layout = saved_layout;
  }
  if (extra) *extra = extra_scalars;
  return static_cast<int64_t>(step);
}

std::string latest_checkpoint(const std::string& dir) {
  std::error_code error;
  if (!fs::is_directory(dir, error)) return "";
  const std::string name = read_latest_name(dir);
  return name.empty() ? "" : (fs::path(dir) / name).string();
}

int64_t load_latest_checkpoint(const std::string& dir, nn::Module& module,
                               optim::Optimizer& optimizer, optim::LRScheduler* scheduler,
                               NamedScalars* extra) {
  std::error_code error;
  TESSEL_CHECK(fs::exists(dir, error), "load_latest_checkpoint: the checkpoint directory '", dir,
               "' does not exist");
  TESSEL_CHECK(fs::is_directory(dir, error), "load_latest_checkpoint: '", dir,
               "' is not a directory");
  const std::string name = read_latest_name(dir);
  TESSEL_CHECK(!name.empty(), "load_latest_checkpoint: '", dir, "' has no '", kLatestFile,
               "' file: no complete checkpoint was saved there");
  return load_checkpoint((fs::path(dir) / name).string(), module, optimizer, scheduler, extra);
}

}  // namespace tessel::train
