#include "tools/plan/plan_cli.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "models/simulate.h"
#include "models/trace.h"
#include "parallel/planner/plan_io.h"
#include "parallel/planner/planner.h"
#include "parallel/planner/report.h"

namespace tessel::planner {

namespace {

bool file_exists(const std::string& path) {
  struct stat info;
  return ::stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

std::string program_path() {
  char buffer[4096];
  const ssize_t length = ::readlink("/proc/self/exe", buffer, sizeof buffer - 1);
  return length > 0 ? std::string(buffer, length) : std::string();
}

// Files the binary carries as Bazel data: found from the working directory (bazel run and bazel
// test start there), the runfiles tree beside the binary, or the source tree.
std::string find_data_file(const std::string& relative) {
  std::vector<std::string> candidates;
  if (const char* dir = std::getenv("RUNFILES_DIR"))
    candidates.push_back(std::string(dir) + "/tessel/" + relative);
  if (const char* dir = std::getenv("TEST_SRCDIR"))
    candidates.push_back(std::string(dir) + "/tessel/" + relative);
  candidates.push_back(relative);
  const std::string program = program_path();
  if (!program.empty()) candidates.push_back(program + ".runfiles/tessel/" + relative);
  if (const char* dir = std::getenv("BUILD_WORKSPACE_DIRECTORY"))
    candidates.push_back(std::string(dir) + "/" + relative);
  for (const auto& candidate : candidates)
    if (file_exists(candidate)) return candidate;
  return "";
}

std::string quote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::vector<double> parse_fractions(const std::string& text) {
  std::vector<double> fractions;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    char* end = nullptr;
    const double value = std::strtod(item.c_str(), &end);
    TESSEL_CHECK(!item.empty() && *end == '\0' && value > 0 && value <= 1,
                 "--remat: expected fractions in (0, 1] separated by commas (1: no recompute), "
                 "got '",
                 text, "'");
    fractions.push_back(value);
  }
  TESSEL_CHECK(!fractions.empty(), "--remat: give at least one fraction (1: no recompute)");
  return fractions;
}

std::vector<int> parse_zero_stages(const std::string& text) {
  std::vector<int> stages;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    TESSEL_CHECK(item == "0" || item == "1" || item == "2" || item == "3",
                 "--zero: expected ZeRO stages 0, 1, 2 or 3 separated by commas, got '", text, "'");
    stages.push_back(std::stoi(item));
  }
  TESSEL_CHECK(!stages.empty(), "--zero: give at least one stage (0: none)");
  return stages;
}

int optimizer_states(const std::string& optimizer) {
  if (optimizer == "adam" || optimizer == "adamw") return 2;
  if (optimizer == "sgd_momentum") return 1;
  if (optimizer == "sgd") return 0;
  TESSEL_FAIL("--optimizer: expected adam, adamw, sgd_momentum or sgd, got '", optimizer, "'");
}

}  // namespace

std::string user_path(const std::string& path) {
  if (path.empty() || path[0] == '/') return path;
  if (const char* dir = std::getenv("BUILD_WORKING_DIRECTORY"))
    return std::string(dir) + "/" + path;
  return path;
}

std::string find_profile(const std::string& name_or_path) {
  const std::string given = user_path(name_or_path);
  if (file_exists(given)) return given;
  if (file_exists(name_or_path)) return name_or_path;
  if (name_or_path.find('/') == std::string::npos) {
    std::string name = name_or_path;
    if (name.size() < 5 || name.substr(name.size() - 5) != ".json") name += ".json";
    const std::string found = find_data_file("parallel/profiles/" + name);
    if (!found.empty()) return found;
  }
  return given;  // load_profile reports it missing
}

namespace {

// The command line as given.
struct PlanCliOptions {
  std::string model, memory_text, profile_name = "h200_cluster", optimizer = "adam";
  bool profile_given = false;  // --profile on the command line, else the default
  std::string remat = "1,0.5,0.25", zero = "0", out_path, png_path, frontier_path;
  std::string batch_norm = "whole_batch";
  int devices = 8, max_tp = 0;
  int64_t batch = 0, seq = 128, image_size = 224, num_classes = 1000, in_channels = 3;
  bool small_image_stem = false;
  size_t max_points = 32, rows = 20;
  int point = -1;  // --point: the frontier point --out writes (-1: the chosen one)
  bool per_op_degrees = false, show_ops = false, any_plan = false, simulate_remat = false;
};

// The known models, comma-separated: for --model's help and the unknown-model error.
std::string known_models_text() {
  std::string text;
  for (const auto& name : models::known_models()) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// Parses the command line into `cli`; returns the exit code when the command should stop
// (--help, or a bad argument), nothing when it should go on.
std::optional<int> parse_options(int argc, const char* const* argv, PlanCliOptions& cli,
                                 std::ostream& out, std::ostream& err) {
  CLI::App app(
      "Prints a model's frontier of (memory per device, time per iteration) over every way of "
      "splitting its ops on D devices, marks the fastest plan that fits in memory, writes it "
      "(--out) and draws the frontier (--png).",
      "plan");
  app.add_option("--model", cli.model, "model to plan: " + known_models_text())->required();
  app.add_option("--devices", cli.devices, "number of devices (ranks)")->capture_default_str();
  app.add_option("--memory_per_device", cli.memory_text,
                 "memory limit per device, e.g. 16GiB (default: the profile's)");
  auto* profile_option = app.add_option(
      "--profile", cli.profile_name,
      "device profile: a JSON file, or a name in parallel/profiles (h200_cluster: H200 GPUs; "
      "cpu_2core_example: a 2-core CPU; //tools/calibrate measures this machine)");
  profile_option->capture_default_str();
  app.add_option("--batch", cli.batch,
                 "global batch (default: 8 per device for BERT, 32 otherwise)");
  app.add_option("--seq", cli.seq, "BERT sequence length")->capture_default_str();
  app.add_option("--image_size", cli.image_size, "ResNet / ShuffleNet image size")
      ->capture_default_str();
  app.add_option("--num_classes", cli.num_classes, "ResNet / ShuffleNet classes")
      ->capture_default_str();
  app.add_option("--in_channels", cli.in_channels,
                 "ResNet / ShuffleNet image channels (1 for the Fashion-MNIST recipes)")
      ->capture_default_str();
  app.add_flag("--small_image_stem", cli.small_image_stem,
               "ResNet / ShuffleNet with the stem for small images (the Fashion-MNIST recipes' "
               "ShuffleNet)");
  app.add_option("--optimizer", cli.optimizer,
                 "optimizer whose state is counted: adam, adamw (2 states per parameter), "
                 "sgd_momentum (1), sgd (0)")
      ->capture_default_str();
  app.add_option("--max_tp", cli.max_tp,
                 "largest tensor-parallel group (default 0: the profile's devices per node)")
      ->capture_default_str();
  app.add_option("--remat", cli.remat,
                 "fractions of activation memory the memory layer may keep (auto policy); 1: no "
                 "recomputation")
      ->capture_default_str();
  app.add_option(
         "--zero", cli.zero,
         "ZeRO stages to price, e.g. 0,1,2,3: 1 keeps the optimizer state in data-parallel "
         "parts, 2 the gradients too, 3 the parameters too (parallel/zero.h; --out keeps the "
         "chosen point's stage)")
      ->capture_default_str();
  app.add_option("--batch_norm", cli.batch_norm,
                 "batch norm over a batch split: whole_batch (the statistics of the whole batch, "
                 "gathered over the data-parallel ranks: the plan trains as one process does) or "
                 "per_rank (each rank's own rows, as DDP: no collective)")
      ->check(CLI::IsMember({"whole_batch", "per_rank"}))
      ->capture_default_str();
  app.add_flag("--simulate_remat", cli.simulate_remat,
               "price each --remat fraction below 1 by simulating the model's training step under "
               "that budget with the auto policy on the profile's device (the memory simulator; "
               "the whole batch on one device, seconds to minutes), instead of the profile's "
               "constant remat_overhead_k; fractions that do not fit there are dropped");
  app.add_option("--max_points", cli.max_points,
                 "most points per partial frontier (0: exact, may be slow on large models)")
      ->capture_default_str();
  app.add_flag("--per_op_degrees", cli.per_op_degrees,
               "let each op pick its own dp x tp degrees too (TensorOpt's full space; the default "
               "keeps one dp x tp grid per plan, each op choosing its split on it)");
  app.add_flag("--any_plan", cli.any_plan,
               "choose among every frontier point, also those the runtime's recipes do not run as "
               "priced (by default: a parameter cut on one op's grid that an op on another grid "
               "reads is listed but not chosen)");
  app.add_option("--rows", cli.rows,
                 "frontier points printed, spread over the frontier with the chosen one "
                 "(0: all)")
      ->capture_default_str();
  app.add_flag("--show_ops", cli.show_ops, "also list every op of the chosen plan with its split");
  app.add_option("--out", cli.out_path, "write the chosen plan here (JSON, for --plan=FILE)");
  app.add_option("--point", cli.point,
                 "with --out: write frontier point K (as the table numbers it) instead of the "
                 "chosen one");
  app.add_option("--png", cli.png_path, "draw the frontier here (tools/plot_frontier.py)");
  app.add_option("--frontier_json", cli.frontier_path, "write the frontier points here (JSON)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error, out, err);
  }
  cli.profile_given = profile_option->count() > 0;
  return std::nullopt;
}

// Checks the arguments (in the order their errors are reported), checks the model's name and
// loads the profile.
PlanOptions plan_options(const PlanCliOptions& cli) {
  TESSEL_CHECK(cli.devices >= 1, "--devices must be at least 1, got ", cli.devices);
  TESSEL_CHECK(cli.batch >= 0, "--batch must not be negative (0: the default), got ", cli.batch);
  TESSEL_CHECK(cli.max_tp >= 0, "--max_tp must not be negative, got ", cli.max_tp);
  PlanOptions options;
  options.config.devices = cli.devices;
  options.config.max_tp = cli.max_tp;
  options.config.optimizer_states = optimizer_states(cli.optimizer);
  options.remat_fractions = parse_fractions(cli.remat);
  options.zero_stages = parse_zero_stages(cli.zero);
  options.config.whole_batch_norm = cli.batch_norm == "whole_batch";
  options.frontier.max_points = cli.max_points;
  options.per_op_degrees = cli.per_op_degrees;
  options.executable_only = !cli.any_plan;
  if (!cli.memory_text.empty())
    options.memory_per_device = parse_bytes(cli.memory_text, "--memory_per_device");
  const std::vector<std::string> names = models::known_models();
  TESSEL_CHECK(std::find(names.begin(), names.end(), cli.model) != names.end(), "unknown model '",
               cli.model, "' (known: ", known_models_text(), ")");
  options.config.profile = load_profile(find_profile(cli.profile_name));
  return options;
}

ModelSpec model_spec(const PlanCliOptions& cli) {
  ModelSpec spec;
  spec.name = cli.model;
  spec.batch =
      cli.batch > 0 ? cli.batch : (is_bert(cli.model) ? 8 : 32) * static_cast<int64_t>(cli.devices);
  spec.seq = cli.seq;
  spec.image_size = cli.image_size;
  spec.num_classes = cli.num_classes;
  spec.in_channels = cli.in_channels;
  spec.small_image_stem = cli.small_image_stem;
  return spec;
}

// --simulate_remat: each fraction's factor from the memory simulator; fractions that do not
// train there are dropped from the search.
void simulate_remat(std::ostream& out, const ModelSpec& spec, PlanOptions& options) {
  out << "simulating " << spec.name << " at batch " << spec.batch << " under the auto policy on "
      << options.config.profile.name << "..." << std::endl;
  const models::RematOverhead overhead =
      models::simulate_remat_overhead(spec, options.config.profile, options.remat_fractions);
  options.remat_overhead_k = overhead.k;
  char line[256];
  std::snprintf(line, sizeof line,
                "simulated step %s (forward %s); recomputation priced per fraction of the "
                "activations kept:",
                format_seconds(overhead.step_seconds).c_str(),
                format_seconds(overhead.forward_seconds).c_str());
  out << line << "\n";
  std::vector<double> kept;
  for (double fraction : options.remat_fractions) {
    if (fraction >= 1) {
      kept.push_back(fraction);
      continue;
    }
    auto failed = overhead.failed.find(fraction);
    if (failed != overhead.failed.end()) {
      out << "  " << fraction << ": dropped, does not train there (" << failed->second << ")\n";
      continue;
    }
    std::snprintf(line, sizeof line, "  %g: step %.2fx, remat_overhead_k %.2f (profile: %.2f)",
                  fraction, overhead.slowdown.at(fraction), overhead.k.at(fraction),
                  options.config.profile.remat_overhead_k);
    out << line << "\n";
    kept.push_back(fraction);
  }
  TESSEL_CHECK(!kept.empty(),
               "--simulate_remat: no --remat fraction trains on the simulated "
               "device; add 1 (no recomputation) or larger fractions");
  options.remat_fractions = kept;
  out << "\n";
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// What was planned: the model, the devices, the profile and the search.
void print_setup(std::ostream& out, const PlanCliOptions& cli, const Graph& graph,
                 const ModelSpec& spec, const PlanOptions& options, const PlanResult& result) {
  const DeviceProfile& profile = options.config.profile;
  const std::vector<int> degrees = tensor_parallel_degrees(options.config);
  char line[512];
  std::snprintf(line, sizeof line, "%s: %.1fM parameters, %zu ops traced on the meta device",
                cli.model.c_str(), graph.parameter_count() / 1e6, graph.ops.size());
  out << line << "\n";
  out << "devices " << cli.devices << " (" << profile.devices_per_node
      << " per node, tensor parallel up to " << degrees.back() << "), global batch " << spec.batch;
  if (is_bert(cli.model))
    out << ", seq " << spec.seq;
  else
    out << ", image " << spec.image_size << "x" << spec.image_size;
  out << ", optimizer " << cli.optimizer << "\n";
  out << "profile " << profile.name << " (compute measured with " << profile.layout_description()
      << ")\n";
  if (!cli.profile_given)
    out << "note: " << profile.name << " is the default profile (a cluster of H200 GPUs); to "
        << "plan for this machine's CPUs give --profile=cpu_2core_example or a profile measured "
        << "here by //tools/calibrate\n";
  const int ranks_per_node = std::min(cli.devices, profile.devices_per_node);
  if (profile.calibrated_ranks > 0 && profile.calibrated_ranks != ranks_per_node)
    out << "note: this plan puts " << ranks_per_node << " rank(s) on a node, but the profile's "
        << "compute was measured with " << profile.calibrated_ranks
        << " at once; ranks sharing cores run slower than it says (calibrate under mpirun -np "
        << ranks_per_node << " with threads = cores / ranks)\n";
  out << "frontier: " << result.frontier.size() << " points (series "
      << result.stats.series_eliminations << ", leaf " << result.stats.leaf_eliminations
      << ", parallel " << result.stats.parallel_merges << ", conditioned "
      << result.stats.conditioned_nodes << "; "
      << (cli.max_points
              ? "at most " + std::to_string(cli.max_points) + " points per partial frontier"
              : std::string("exact"))
      << ")\n\n";
}

// What the table's notes mean for this command's flags.
void print_frontier_hints(std::ostream& out, const PlanResult& result, const PlanCliOptions& cli) {
  const bool any_unexecutable = std::any_of(result.frontier.begin(), result.frontier.end(),
                                            [](const PlannedPoint& p) { return !p.executable; });
  if (any_unexecutable && !cli.any_plan)
    out << "(points [not run as priced] are not chosen; --any_plan chooses among them too)\n";
  if (cli.rows > 0 && result.frontier.size() > cli.rows) out << "(--rows=0 shows every point)\n";
  out << "\n";
}

void print_timings(std::ostream& out, double trace_seconds, double search_seconds,
                   double total_seconds) {
  char line[512];
  std::snprintf(line, sizeof line, "traced in %.2f s, frontier in %.2f s, %.2f s in all",
                trace_seconds, search_seconds, total_seconds);
  out << line << "\n";
}

// --frontier_json and --png: the frontier as JSON, drawn by tools/plot_frontier.py (through a
// temporary JSON file beside the PNG when --frontier_json is not given).
void write_frontier_files(std::ostream& out, const PlanCliOptions& cli, const PlanResult& result,
                          const std::string& profile_name) {
  if (cli.frontier_path.empty() && cli.png_path.empty()) return;
  std::string json_path = cli.frontier_path.empty() ? user_path(cli.png_path) + ".frontier.json"
                                                    : user_path(cli.frontier_path);
  std::ofstream file(json_path);
  TESSEL_CHECK(file.good(), "cannot write the frontier to '", json_path, "'");
  file << frontier_to_json(result, cli.model, cli.devices, profile_name);
  file.close();
  if (!cli.png_path.empty()) {
    const std::string script = find_data_file("tools/plot_frontier.py");
    TESSEL_CHECK(!script.empty(),
                 "--png: cannot find tools/plot_frontier.py (run from the "
                 "repository or with bazel run)");
    const std::string command = "/usr/bin/python3 " + quote(script) + " " + quote(json_path) +
                                " --out " + quote(user_path(cli.png_path));
    const int status = std::system(command.c_str());
    TESSEL_CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
                 "--png: tools/plot_frontier.py failed (", command, ")");
    if (cli.frontier_path.empty()) std::remove(json_path.c_str());
    out << "wrote " << cli.png_path << "\n";
  }
  if (!cli.frontier_path.empty()) out << "wrote " << cli.frontier_path << "\n";
}

// Why no point was chosen: every point that fits is one the runtime does not run as priced, or
// none fits.
void report_nothing_chosen(std::ostream& err, const PlanResult& result, bool any_plan) {
  if (!any_plan) {
    bool fits = false;
    for (const PlannedPoint& point : result.frontier)
      fits = fits || point.cost.memory <= result.memory_per_device;
    if (fits) {
      err << "plan: every plan that fits in " << format_bytes(result.memory_per_device)
          << " is one the runtime does not run as priced (--any_plan chooses among them)"
          << std::endl;
      return;
    }
  }
  err << "plan: no plan fits in " << format_bytes(result.memory_per_device)
      << " per device; the smallest needs " << format_bytes(result.frontier.front().cost.memory)
      << " (use more devices, a smaller --batch, or a smaller --remat fraction)" << std::endl;
}

}  // namespace

int run_plan_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  PlanCliOptions cli;
  if (const std::optional<int> exit_code = parse_options(argc, argv, cli, out, err))
    return *exit_code;
  try {
    // The trace time includes checking the arguments and loading the profile.
    const auto start = std::chrono::steady_clock::now();
    PlanOptions options = plan_options(cli);
    const ModelSpec spec = model_spec(cli);
    if (cli.simulate_remat) simulate_remat(out, spec, options);
    const Graph graph = models::trace_model(spec);
    const double trace_seconds = seconds_since(start);
    const PlanResult result = plan_graph(graph, options);
    const double total_seconds = seconds_since(start);

    print_setup(out, cli, graph, spec, options, result);
    print_frontier(out, result, spec.batch, cli.rows);
    print_frontier_hints(out, result, cli);
    print_timings(out, trace_seconds, result.search_seconds, total_seconds);
    write_frontier_files(out, cli, result, options.config.profile.name);
    if (result.chosen < 0) {
      report_nothing_chosen(err, result, cli.any_plan);
      return 2;
    }
    print_chosen(out, graph, result, cli.show_ops);
    if (!cli.out_path.empty()) {
      TESSEL_CHECK(cli.point < static_cast<int>(result.frontier.size()), "--point=", cli.point,
                   ": the frontier has points 0 to ", result.frontier.size() - 1);
      const int written = cli.point >= 0 ? cli.point : result.chosen;
      write_plan(make_plan_file(graph, result, written, spec, options), user_path(cli.out_path));
      out << "wrote " << cli.out_path;
      if (written != result.chosen) out << " (point " << written << ")";
      out << "\n";
    }
    return 0;
  } catch (const Error& error) {
    err << "plan: error: " << error.message() << std::endl;
    return 1;
  } catch (const std::exception& error) {
    err << "plan: error: " << error.what() << std::endl;
    return 1;
  }
}

}  // namespace tessel::planner
