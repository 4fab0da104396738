#include "parallel/planner/cost_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "ops/optimizer_updates.h"

namespace tessel::planner {

const char* collective_name(Collective collective) {
  switch (collective) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
  }
  return "?";
}

const char* link_level_name(LinkLevel level) {
  return level == LinkLevel::kIntraNode ? "intra_node" : "inter_node";
}

double DeviceProfile::collective_time(Collective collective, int64_t ranks, double bytes,
                                      LinkLevel level) const {
  if (ranks <= 1 || bytes <= 0) return 0;
  const AlphaBeta& cost = link(collective, level);
  const double p = static_cast<double>(ranks);
  const double steps = collective == Collective::kAllReduce ? 2 * (p - 1) : p - 1;
  const double moved =
      collective == Collective::kAllReduce ? 2 * (p - 1) / p * bytes : (p - 1) / p * bytes;
  return steps * (cost.alpha_s + collective_turn_s) + moved / cost.bus_bandwidth;
}

double DeviceProfile::compute_time(double flops, double bytes, const std::string& kind,
                                   bool low_precision) const {
  double throughput = kind == "gemm" ? gemm_flops : kind == "conv" ? conv_flops : elementwise_flops;
  if (low_precision && kind == "gemm" && gemm_flops_16bit > 0) throughput = gemm_flops_16bit;
  if (low_precision && kind == "conv" && conv_flops_16bit > 0) throughput = conv_flops_16bit;
  return std::max(flops / throughput, bytes / memory_bandwidth);
}

std::string op_shape_key(const std::string& op,
                         const std::vector<std::optional<Shape>>& input_shapes,
                         const std::vector<bool>& needs_gradient, const Attrs& attrs) {
  std::string key = op;
  for (size_t slot = 0; slot < input_shapes.size(); ++slot) {
    key += " " + (input_shapes[slot] ? shape_str(*input_shapes[slot]) : std::string("-"));
    if (slot < needs_gradient.size() && needs_gradient[slot]) key += "'";
  }
  return key + " " + attrs.str();
}

double DeviceProfile::op_seconds(const OpDef& op, const std::vector<Tensor>& inputs,
                                 const std::vector<Tensor>& outputs, const Attrs& attrs) const {
  auto bytes_of = [](const std::vector<Tensor>& tensors) {
    double bytes = 0;
    for (const auto& tensor : tensors)
      if (tensor.defined())
        bytes +=
            static_cast<double>(tensor.numel()) * static_cast<double>(element_size(tensor.dtype()));
    return bytes;
  };
  const OpCost cost =
      op.cost ? op.cost(inputs, outputs, attrs) : OpCost{0, bytes_of(inputs) + bytes_of(outputs)};
  const std::string kind = op_rate_kind(op, attrs);
  if (op_kinds.count(kind)) return op_overhead_s + op_time(kind, cost.flops, cost.bytes, false);
  bool low_precision = false;
  for (const auto& input : inputs)
    low_precision = low_precision || (input.defined() && (input.dtype() == DType::kBFloat16 ||
                                                          input.dtype() == DType::kFloat16));
  const std::string roofline = kind == "conv_grouped" ? "conv" : kind;
  return op_overhead_s + compute_time(cost.flops, cost.bytes, roofline, low_precision);
}

memory::sim::SimulatedDevice simulated_device(const DeviceProfile& profile) {
  TESSEL_CHECK(profile.host_link_bandwidth > 0, "profile '", profile.name,
               "' has no host_link_bandwidth (bytes/s each way between the device and host "
               "memory), which the memory simulator needs for swaps");
  memory::sim::SimulatedDevice device;
  device.name = profile.name;
  device.op_seconds = [profile](const OpDef& op, const std::vector<Tensor>& inputs,
                                const std::vector<Tensor>& outputs, const Attrs& attrs) {
    return profile.op_seconds(op, inputs, outputs, attrs);
  };
  device.memory_bandwidth = profile.memory_bandwidth;
  device.host_link_bandwidth = profile.host_link_bandwidth;
  return device;
}

std::string op_rate_kind(const OpDef& op, const Attrs& attrs) {
  if (op.planner.rate) return op.planner.rate;
  switch (op.kind) {
    case OpKind::kGemm:
      return "gemm";
    case OpKind::kConv:
      return attrs.get_or<int64_t>("groups", 1) > 1 ? "conv_grouped" : "conv";
    case OpKind::kActivation:
      return "activation";
    case OpKind::kUnspecified:
    case OpKind::kPointwise:
    case OpKind::kReduction:
    case OpKind::kNorm:
    case OpKind::kPool:
    case OpKind::kLoss:
    case OpKind::kDataMovement:
    case OpKind::kIndexing:
    case OpKind::kFactory:
    case OpKind::kOptimizer:
    case OpKind::kCommunication:
      break;
  }
  return "elementwise";
}

double DeviceProfile::op_time(const std::string& kind, double flops, double bytes, bool backward,
                              double work_factor) const {
  auto found = op_kinds.find(kind);
  if (found != op_kinds.end()) {
    const OpKindRate& rate = found->second;
    const double work = rate.per == "bytes" ? bytes : flops;
    return (backward ? rate.backward_call_s : rate.forward_call_s) +
           work_factor * work / (backward ? rate.backward : rate.forward);
  }
  const std::string roofline = kind == "gemm"                             ? "gemm"
                               : kind == "conv" || kind == "conv_grouped" ? "conv"
                                                                          : "elementwise";
  return work_factor * compute_time(flops, bytes, roofline);
}

double DeviceProfile::optimizer_time(double parameters, int states) const {
  // Profiles measure each update under its op's name (calibrate_main.cc).
  const char* kind = states >= 2 ? ops::adam_update.name() : ops::sgd_update.name();
  auto found = op_kinds.find(kind);
  if (found != op_kinds.end()) return parameters / found->second.forward;
  return (3.0 + 2.0 * states) * 4.0 * parameters / memory_bandwidth;
}

std::string DeviceProfile::layout_description() const {
  if (calibrated_ranks <= 0) return "layout not recorded";
  return std::to_string(calibrated_ranks) + (calibrated_ranks == 1 ? " rank x " : " ranks x ") +
         std::to_string(calibrated_threads) + (calibrated_threads == 1 ? " thread" : " threads") +
         (calibrated_ranks > 1 ? " at once" : "");
}

namespace {

using nlohmann::json;

constexpr const char* kFormatHint =
    " (see parallel/profiles/h200_cluster.json for the format; every number is in SI units: "
    "bytes, bytes per second, FLOP/s, seconds)";

const json& field(const json& object, const std::string& key, const std::string& path,
                  const std::string& where) {
  TESSEL_CHECK(object.is_object(), "profile ", where, ": '", path.empty() ? "(root)" : path,
               "' must be a JSON object", kFormatHint);
  auto found = object.find(key);
  const std::string full = path.empty() ? key : path + "." + key;
  TESSEL_CHECK(found != object.end(), "profile ", where, ": missing field '", full, "'",
               kFormatHint);
  return *found;
}

double positive_number(const json& object, const std::string& key, const std::string& path,
                       const std::string& where) {
  const json& value = field(object, key, path, where);
  const std::string full = path.empty() ? key : path + "." + key;
  TESSEL_CHECK(value.is_number(), "profile ", where, ": field '", full, "' must be a number, got ",
               value.dump());
  const double number = value.get<double>();
  TESSEL_CHECK(std::isfinite(number) && number > 0, "profile ", where, ": field '", full,
               "' must be positive, got ", value.dump());
  return number;
}

// A positive whole number that fits an int (devices, ranks, threads).
int whole_count(const json& object, const std::string& key, const std::string& path,
                const std::string& where) {
  const double number = positive_number(object, key, path, where);
  const std::string full = path.empty() ? key : path + "." + key;
  TESSEL_CHECK(number == std::floor(number) && number <= std::numeric_limits<int>::max(),
               "profile ", where, ": field '", full, "' must be a whole number up to ",
               std::numeric_limits<int>::max(), ", got ", number);
  return static_cast<int>(number);
}

std::string optional_text(const json& object, const std::string& key, const std::string& fallback,
                          const std::string& where) {
  auto found = object.find(key);
  if (found == object.end()) return fallback;
  TESSEL_CHECK(found->is_string(), "profile ", where, ": field '", key, "' must be a string, got ",
               found->dump());
  return found->get<std::string>();
}

double optional_number(const json& object, const std::string& key, double fallback,
                       const std::string& where, bool allow_zero) {
  auto found = object.find(key);
  if (found == object.end()) return fallback;
  TESSEL_CHECK(found->is_number(), "profile ", where, ": field '", key, "' must be a number, got ",
               found->dump());
  const double number = found->get<double>();
  TESSEL_CHECK(std::isfinite(number) && (allow_zero ? number >= 0 : number > 0), "profile ", where,
               ": field '", key, "' must be ", allow_zero ? "non-negative" : "positive", ", got ",
               found->dump());
  return number;
}

}  // namespace

DeviceProfile parse_profile(const std::string& json_text, const std::string& where) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& error) {
    TESSEL_FAIL("profile ", where, ": not valid JSON (", error.what(), ")");
  }
  TESSEL_CHECK(root.is_object(), "profile ", where, ": expected a JSON object", kFormatHint);
  DeviceProfile profile;
  profile.name = optional_text(root, "name", "unnamed", where);
  profile.description = optional_text(root, "description", "", where);
  profile.devices_per_node = whole_count(root, "devices_per_node", "", where);
  const json& memory = field(root, "memory_per_device", "", where);
  if (memory.is_string()) {
    profile.memory_per_device =
        parse_bytes(memory.get<std::string>(), "profile " + where + ": memory_per_device");
  } else {
    profile.memory_per_device = positive_number(root, "memory_per_device", "", where);
  }
  const json& compute = field(root, "compute_flops", "", where);
  profile.gemm_flops = positive_number(compute, "gemm", "compute_flops", where);
  profile.conv_flops = positive_number(compute, "conv", "compute_flops", where);
  profile.elementwise_flops = positive_number(compute, "elementwise", "compute_flops", where);
  auto compute_16bit = root.find("compute_flops_16bit");
  if (compute_16bit != root.end()) {
    profile.gemm_flops_16bit =
        positive_number(*compute_16bit, "gemm", "compute_flops_16bit", where);
    profile.conv_flops_16bit =
        positive_number(*compute_16bit, "conv", "compute_flops_16bit", where);
  }
  profile.memory_bandwidth = positive_number(root, "memory_bandwidth", "", where);
  profile.host_link_bandwidth = optional_number(root, "host_link_bandwidth", 0.0, where, true);
  profile.op_overhead_s = optional_number(root, "op_overhead_s", 0.0, where, true);
  profile.remat_overhead_k = optional_number(root, "remat_overhead_k", 1.0, where, true);
  auto kinds = root.find("op_kinds");
  if (kinds != root.end()) {
    TESSEL_CHECK(kinds->is_object(), "profile ", where, ": 'op_kinds' must be a JSON object",
                 kFormatHint);
    for (auto entry = kinds->begin(); entry != kinds->end(); ++entry) {
      const std::string path = "op_kinds." + entry.key();
      OpKindRate rate;
      const json& per = field(entry.value(), "per", path, where);
      TESSEL_CHECK(per.is_string() && (per == "flops" || per == "bytes" || per == "parameters"),
                   "profile ", where, ": field '", path,
                   ".per' must be \"flops\", \"bytes\" or \"parameters\", got ", per.dump());
      rate.per = per.get<std::string>();
      rate.forward = positive_number(entry.value(), "forward", path, where);
      rate.backward = positive_number(entry.value(), "backward", path, where);
      rate.forward_call_s = optional_number(entry.value(), "forward_call_s", 0.0, where, true);
      rate.backward_call_s = optional_number(entry.value(), "backward_call_s", 0.0, where, true);
      profile.op_kinds[entry.key()] = rate;
    }
  }
  auto shapes = root.find("op_shapes");
  if (shapes != root.end()) {
    TESSEL_CHECK(shapes->is_object(), "profile ", where, ": 'op_shapes' must be a JSON object",
                 kFormatHint);
    for (auto entry = shapes->begin(); entry != shapes->end(); ++entry) {
      const std::string path = "op_shapes." + entry.key();
      profile.op_shapes[entry.key()] = {
          positive_number(entry.value(), "forward_s", path, where),
          optional_number(entry.value(), "backward_s", 0.0, where, true)};
    }
  }
  profile.rank_skew = optional_number(root, "rank_skew", 0.0, where, true);
  profile.sync_jitter = optional_number(root, "sync_jitter", 0.0, where, true);
  profile.sync_exponent = optional_number(root, "sync_exponent", 0.5, where, true);
  TESSEL_CHECK(profile.sync_exponent <= 1, "profile ", where,
               ": field 'sync_exponent' must be in [0, 1], got ", profile.sync_exponent);
  profile.collective_turn_s = optional_number(root, "collective_turn_s", 0.0, where, true);
  auto layout = root.find("calibrated_layout");
  if (layout != root.end()) {
    profile.calibrated_ranks = whole_count(*layout, "ranks_at_once", "calibrated_layout", where);
    profile.calibrated_threads =
        whole_count(*layout, "threads_per_rank", "calibrated_layout", where);
  }
  const json& collectives = field(root, "collectives", "", where);
  for (LinkLevel level : {LinkLevel::kIntraNode, LinkLevel::kInterNode}) {
    const std::string level_path = std::string("collectives.") + link_level_name(level);
    const json& links = field(collectives, link_level_name(level), "collectives", where);
    for (Collective collective :
         {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter}) {
      const std::string path = level_path + "." + collective_name(collective);
      const json& entry = field(links, collective_name(collective), level_path, where);
      AlphaBeta& cost = profile.collectives[static_cast<int>(level)][static_cast<int>(collective)];
      const json& alpha = field(entry, "alpha_s", path, where);
      TESSEL_CHECK(alpha.is_number() && alpha.get<double>() >= 0, "profile ", where, ": field '",
                   path, ".alpha_s' must be a non-negative number, got ", alpha.dump());
      cost.alpha_s = alpha.get<double>();
      cost.bus_bandwidth = positive_number(entry, "bus_bandwidth", path, where);
    }
  }
  auto sources = root.find("sources");
  if (sources != root.end()) profile.sources_json = sources->dump();
  return profile;
}

DeviceProfile load_profile(const std::string& path) {
  std::ifstream file(path);
  TESSEL_CHECK(file.good(), "cannot open profile '", path,
               "' (give a JSON file such as parallel/profiles/h200_cluster.json, or measure one "
               "with `bazel run //tools/calibrate -- --out=FILE`)");
  std::stringstream text;
  text << file.rdbuf();
  return parse_profile(text.str(), path);
}

std::string profile_to_json(const DeviceProfile& profile) {
  json root = json::object();
  root["name"] = profile.name;
  root["description"] = profile.description;
  root["devices_per_node"] = profile.devices_per_node;
  root["memory_per_device"] = profile.memory_per_device;
  root["compute_flops"] = {{"gemm", profile.gemm_flops},
                           {"conv", profile.conv_flops},
                           {"elementwise", profile.elementwise_flops}};
  if (profile.gemm_flops_16bit > 0)
    root["compute_flops_16bit"] = {{"gemm", profile.gemm_flops_16bit},
                                   {"conv", profile.conv_flops_16bit}};
  root["memory_bandwidth"] = profile.memory_bandwidth;
  if (profile.host_link_bandwidth > 0) root["host_link_bandwidth"] = profile.host_link_bandwidth;
  root["op_overhead_s"] = profile.op_overhead_s;
  root["remat_overhead_k"] = profile.remat_overhead_k;
  if (!profile.op_kinds.empty()) {
    json kinds = json::object();
    for (const auto& [kind, rate] : profile.op_kinds)
      kinds[kind] = {{"per", rate.per},
                     {"forward", rate.forward},
                     {"backward", rate.backward},
                     {"forward_call_s", rate.forward_call_s},
                     {"backward_call_s", rate.backward_call_s}};
    root["op_kinds"] = kinds;
  }
  if (!profile.op_shapes.empty()) {
    json shapes = json::object();
    for (const auto& [key, time] : profile.op_shapes)
      shapes[key] = {{"forward_s", time.forward_s}, {"backward_s", time.backward_s}};
    root["op_shapes"] = shapes;
  }
  if (profile.rank_skew > 0) root["rank_skew"] = profile.rank_skew;
  if (profile.sync_jitter > 0) {
    root["sync_jitter"] = profile.sync_jitter;
    root["sync_exponent"] = profile.sync_exponent;
  }
  if (profile.collective_turn_s > 0) root["collective_turn_s"] = profile.collective_turn_s;
  if (profile.calibrated_ranks > 0)
    root["calibrated_layout"] = {{"ranks_at_once", profile.calibrated_ranks},
                                 {"threads_per_rank", profile.calibrated_threads}};
  json collectives = json::object();
  for (LinkLevel level : {LinkLevel::kIntraNode, LinkLevel::kInterNode}) {
    json links = json::object();
    for (Collective collective :
         {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter}) {
      const AlphaBeta& cost = profile.link(collective, level);
      links[collective_name(collective)] = {{"alpha_s", cost.alpha_s},
                                            {"bus_bandwidth", cost.bus_bandwidth}};
    }
    collectives[link_level_name(level)] = links;
  }
  root["collectives"] = collectives;
  root["sources"] = json::parse(profile.sources_json.empty() ? "{}" : profile.sources_json);
  return root.dump(2) + "\n";
}

void save_profile(const DeviceProfile& profile, const std::string& path) {
  std::ofstream file(path);
  TESSEL_CHECK(file.good(), "cannot write profile '", path, "'");
  file << profile_to_json(profile);
  TESSEL_CHECK(file.good(), "writing profile '", path, "' failed");
}

double trimmed_mean(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t cut = values.size() / 4;
  double sum = 0;
  for (size_t i = cut; i < values.size() - cut; ++i) sum += values[i];
  return sum / static_cast<double>(values.size() - 2 * cut);
}

std::vector<double> shared_core_times(const std::vector<std::vector<double>>& cpu_samples,
                                      double wall_s, double cpu_s) {
  const double ratio = cpu_s > 0 && wall_s > 0 ? wall_s / cpu_s : 1.0;
  std::vector<double> times;
  times.reserve(cpu_samples.size());
  for (const std::vector<double>& samples : cpu_samples)
    times.push_back(trimmed_mean(samples) * ratio);
  return times;
}

double parse_bytes(const std::string& text, const std::string& what) {
  const std::string accepted =
      " (expected a size such as 16GiB, 1.5GB, 512MiB or a byte count; units B, KB, MB, GB, TB, "
      "KiB, MiB, GiB, TiB)";
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    TESSEL_FAIL(what, ": cannot read '", text, "' as a size", accepted);
  }
  std::string unit = text.substr(end);
  unit.erase(std::remove_if(unit.begin(), unit.end(), [](unsigned char c) { return c == ' '; }),
             unit.end());
  std::transform(unit.begin(), unit.end(), unit.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  static const std::pair<const char*, double> kUnits[] = {{"", 1},
                                                          {"b", 1},
                                                          {"kb", 1e3},
                                                          {"mb", 1e6},
                                                          {"gb", 1e9},
                                                          {"tb", 1e12},
                                                          {"kib", 1024.0},
                                                          {"mib", 1048576.0},
                                                          {"gib", 1073741824.0},
                                                          {"tib", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits) {
    if (unit != name) continue;
    TESSEL_CHECK(std::isfinite(value) && value > 0, what, ": size must be positive, got '", text,
                 "'");
    TESSEL_CHECK(std::isfinite(value * scale), what, ": size '", text, "' is too large");
    return value * scale;
  }
  TESSEL_FAIL(what, ": unknown unit '", text.substr(end), "' in '", text, "'", accepted);
}

std::string format_bytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && std::abs(bytes) >= 1024) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.2f %s", bytes, kUnits[unit]);
  return text;
}

std::string format_seconds(double seconds) {
  char text[32];
  if (seconds >= 1)
    std::snprintf(text, sizeof text, "%.3f s", seconds);
  else if (seconds >= 1e-3)
    std::snprintf(text, sizeof text, "%.3f ms", seconds * 1e3);
  else
    std::snprintf(text, sizeof text, "%.1f us", seconds * 1e6);
  return text;
}

}  // namespace tessel::planner
