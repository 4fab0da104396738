#include "parallel/planner/plan_io.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace tessel::planner {

using nlohmann::json;

PlanFile make_plan_file(const Graph& graph, const PlanResult& result, int point,
                        const ModelSpec& spec, const PlanOptions& options) {
  TESSEL_CHECK(point >= 0 && point < static_cast<int>(result.frontier.size()),
               "make_plan_file: no frontier point ", point, " (", result.frontier.size(),
               " points)");
  const PlannedPoint& chosen = result.frontier[point];
  PlanFile plan;
  plan.model = spec.name;
  plan.devices = options.config.devices;
  plan.batch = spec.batch;
  plan.seq = is_bert(spec.name) ? spec.seq : 0;
  plan.image_size = is_bert(spec.name) ? 0 : spec.image_size;
  plan.in_channels = is_bert(spec.name) ? 0 : spec.in_channels;
  plan.small_image_stem = !is_bert(spec.name) && spec.small_image_stem;
  plan.profile = options.config.profile.name;
  plan.profile_layout = options.config.profile.layout_description();
  plan.memory_per_device = result.memory_per_device;
  plan.mesh_dp = chosen.dp;
  plan.mesh_tp = chosen.tp;
  plan.remat_fraction = chosen.remat_fraction;
  plan.zero_stage = chosen.zero_stage;
  plan.batch_norm = options.config.whole_batch_norm ? "whole_batch" : "per_rank";
  if (chosen.remat_fraction < 1) {
    plan.memory_policy = "auto";
    plan.memory_budget = chosen.cost.memory;
  }
  plan.predicted_memory = chosen.cost.memory;
  plan.predicted_time = chosen.cost.time;
  plan.summary = chosen.summary;

  std::vector<int> parameter_index(graph.tensors.size(), -1);
  for (const TracedTensor& tensor : graph.tensors) {
    if (!tensor.is_parameter()) continue;
    parameter_index[tensor.id] = static_cast<int>(plan.parameters.size());
    plan.parameters.push_back({tensor.parameter, tensor.sizes, -1, 1});
  }
  for (const TracedOp& op : graph.ops) {
    const Strategy& s = result.strategies[op.id][chosen.choice[op.id]];
    PlanFile::Op entry;
    entry.index = op.id;
    entry.op = op.name;
    entry.strategy = split_kind_name(s.kind);
    entry.dp = s.dp;
    entry.tp = s.tp;
    for (const ParameterSplit& split : s.parameters) {
      if (!split.owned) continue;
      PlanFile::Parameter& parameter = plan.parameters[parameter_index[split.tensor]];
      parameter.split_dim = split.dim;
      parameter.parts = split.parts;
      entry.parameters.push_back(parameter.name);
    }
    plan.ops.push_back(std::move(entry));
  }
  return plan;
}

std::string plan_to_json(const PlanFile& plan) {
  json root = json::object();
  root["format"] = "tessel-plan";
  root["version"] = PlanFile::kVersion;
  root["model"] = plan.model;
  root["devices"] = plan.devices;
  root["batch"] = plan.batch;
  root["seq"] = plan.seq;
  root["image_size"] = plan.image_size;
  root["in_channels"] = plan.in_channels;
  root["small_image_stem"] = plan.small_image_stem;
  root["profile"] = plan.profile;
  root["profile_layout"] = plan.profile_layout;
  root["memory_per_device"] = plan.memory_per_device;
  root["mesh"] = {{"dp", plan.mesh_dp}, {"tp", plan.mesh_tp}};
  root["memory_policy"] = plan.memory_policy;
  root["memory_budget"] = plan.memory_budget;
  root["remat_fraction"] = plan.remat_fraction;
  root["zero_stage"] = plan.zero_stage;
  root["batch_norm"] = plan.batch_norm;
  root["predicted"] = {{"memory_bytes", plan.predicted_memory}, {"time_s", plan.predicted_time}};
  root["summary"] = plan.summary;
  json parameters = json::array();
  for (const auto& p : plan.parameters)
    parameters.push_back(
        {{"name", p.name}, {"shape", p.shape}, {"split_dim", p.split_dim}, {"parts", p.parts}});
  root["parameters"] = parameters;
  json ops = json::array();
  for (const auto& op : plan.ops)
    ops.push_back({{"index", op.index},
                   {"op", op.op},
                   {"strategy", op.strategy},
                   {"dp", op.dp},
                   {"tp", op.tp},
                   {"parameters", op.parameters}});
  root["ops"] = ops;
  return root.dump(1) + "\n";
}

namespace {

// Field access with errors that name the field and the file.
class Reader {
 public:
  explicit Reader(std::string where) : where_(std::move(where)) {}

  const json& get(const json& object, const std::string& key, const std::string& path) const {
    TESSEL_CHECK(object.is_object(), "plan ", where_, ": '", path, "' must be a JSON object");
    auto found = object.find(key);
    TESSEL_CHECK(found != object.end(), "plan ", where_, ": missing field '", name(path, key), "'");
    return *found;
  }
  std::string text(const json& object, const std::string& key, const std::string& path) const {
    const json& value = get(object, key, path);
    TESSEL_CHECK(value.is_string(), "plan ", where_, ": field '", name(path, key),
                 "' must be a string, got ", value.dump());
    return value.get<std::string>();
  }
  double number(const json& object, const std::string& key, const std::string& path,
                double minimum) const {
    const json& value = get(object, key, path);
    TESSEL_CHECK(value.is_number(), "plan ", where_, ": field '", name(path, key),
                 "' must be a number, got ", value.dump());
    const double result = value.get<double>();
    TESSEL_CHECK(result >= minimum, "plan ", where_, ": field '", name(path, key),
                 "' must be at least ", minimum, ", got ", value.dump());
    return result;
  }
  int64_t integer(const json& object, const std::string& key, const std::string& path,
                  int64_t minimum, int64_t maximum = std::numeric_limits<int64_t>::max()) const {
    const json& value = get(object, key, path);
    TESSEL_CHECK(value.is_number_integer(), "plan ", where_, ": field '", name(path, key),
                 "' must be an integer, got ", value.dump());
    // Compared unsigned when unsigned: above the int64 range get<int64_t> would turn negative.
    const bool above = value.is_number_unsigned()
                           ? value.get<uint64_t>() > static_cast<uint64_t>(maximum)
                           : value.get<int64_t>() > maximum;
    TESSEL_CHECK(!above, "plan ", where_, ": field '", name(path, key), "' must be at most ",
                 maximum, ", got ", value.dump());
    const int64_t result = value.get<int64_t>();
    TESSEL_CHECK(result >= minimum, "plan ", where_, ": field '", name(path, key),
                 "' must be at least ", minimum, ", got ", result);
    return result;
  }
  // The same for a field the plan holds as an int.
  int small_integer(const json& object, const std::string& key, const std::string& path,
                    int minimum) const {
    return static_cast<int>(integer(object, key, path, minimum, std::numeric_limits<int>::max()));
  }
  const json& array(const json& object, const std::string& key, const std::string& path) const {
    const json& value = get(object, key, path);
    TESSEL_CHECK(value.is_array(), "plan ", where_, ": field '", name(path, key),
                 "' must be an array");
    return value;
  }

 private:
  static std::string name(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  std::string where_;
};

}  // namespace

PlanFile plan_from_json(const std::string& text, const std::string& where) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& error) {
    TESSEL_FAIL("plan ", where, ": not valid JSON (", error.what(), ")");
  }
  Reader r(where);
  TESSEL_CHECK(root.is_object(), "plan ", where, ": expected a JSON object");
  TESSEL_CHECK(r.text(root, "format", "") == "tessel-plan", "plan ", where,
               ": field 'format' must be \"tessel-plan\" (is this a plan written by "
               "//parallel:plan?)");
  const int64_t version = r.integer(root, "version", "", 1);
  TESSEL_CHECK(version == PlanFile::kVersion, "plan ", where, ": version ", version,
               " is not supported (this build reads version ", PlanFile::kVersion, ")");
  PlanFile plan;
  plan.model = r.text(root, "model", "");
  plan.devices = r.small_integer(root, "devices", "", 1);
  plan.batch = r.integer(root, "batch", "", 1);
  plan.seq = r.integer(root, "seq", "", 0);
  plan.image_size = r.integer(root, "image_size", "", 0);
  // Absent from plans written before they were recorded: ImageNet's three channels and stem.
  plan.in_channels = root.contains("in_channels") ? r.integer(root, "in_channels", "", 0)
                                                  : (plan.image_size > 0 ? 3 : 0);
  if (root.contains("small_image_stem")) {
    TESSEL_CHECK(root["small_image_stem"].is_boolean(), "plan ", where,
                 ": field 'small_image_stem' must be true or false");
    plan.small_image_stem = root["small_image_stem"].get<bool>();
  }
  plan.profile = r.text(root, "profile", "");
  if (root.contains("profile_layout") && root["profile_layout"].is_string())
    plan.profile_layout = root["profile_layout"].get<std::string>();
  plan.memory_per_device = r.number(root, "memory_per_device", "", 0);
  const json& mesh = r.get(root, "mesh", "");
  plan.mesh_dp = r.small_integer(mesh, "dp", "mesh", 1);
  plan.mesh_tp = r.small_integer(mesh, "tp", "mesh", 1);
  TESSEL_CHECK(static_cast<int64_t>(plan.mesh_dp) * plan.mesh_tp <= plan.devices, "plan ", where,
               ": mesh dp=", plan.mesh_dp, " tp=", plan.mesh_tp, " needs more than the ",
               plan.devices, " devices");
  plan.memory_policy = r.text(root, "memory_policy", "");
  TESSEL_CHECK(plan.memory_policy == "none" || plan.memory_policy == "auto", "plan ", where,
               ": field 'memory_policy' must be \"none\" or \"auto\", got \"", plan.memory_policy,
               "\"");
  plan.memory_budget = r.number(root, "memory_budget", "", 0);
  plan.remat_fraction = r.number(root, "remat_fraction", "", 0);
  TESSEL_CHECK(plan.remat_fraction > 0 && plan.remat_fraction <= 1, "plan ", where,
               ": field 'remat_fraction' must be in (0, 1], got ", plan.remat_fraction);
  // Absent from plans written before ZeRO was priced: no ZeRO.
  if (root.contains("zero_stage")) plan.zero_stage = r.small_integer(root, "zero_stage", "", 0);
  TESSEL_CHECK(plan.zero_stage >= 0 && plan.zero_stage <= 3, "plan ", where,
               ": field 'zero_stage' must be 0, 1, 2 or 3, got ", plan.zero_stage);
  // Absent from plans written before it was a choice: the whole batch's statistics.
  if (root.contains("batch_norm")) plan.batch_norm = r.text(root, "batch_norm", "");
  TESSEL_CHECK(plan.batch_norm == "whole_batch" || plan.batch_norm == "per_rank", "plan ", where,
               ": field 'batch_norm' must be \"whole_batch\" or \"per_rank\", got \"",
               plan.batch_norm, "\"");
  const json& predicted = r.get(root, "predicted", "");
  plan.predicted_memory = r.number(predicted, "memory_bytes", "predicted", 0);
  plan.predicted_time = r.number(predicted, "time_s", "predicted", 0);
  plan.summary = r.text(root, "summary", "");

  const json& parameters = r.array(root, "parameters", "");
  for (size_t i = 0; i < parameters.size(); ++i) {
    const std::string path = "parameters[" + std::to_string(i) + "]";
    PlanFile::Parameter p;
    p.name = r.text(parameters[i], "name", path);
    const json& shape = r.array(parameters[i], "shape", path);
    for (const json& size : shape) {
      TESSEL_CHECK(size.is_number_integer() && size.get<int64_t>() >= 0, "plan ", where,
                   ": field '", path, ".shape' must hold non-negative integers, got ",
                   shape.dump());
      p.shape.push_back(size.get<int64_t>());
    }
    p.split_dim = r.small_integer(parameters[i], "split_dim", path, -1);
    p.parts = r.small_integer(parameters[i], "parts", path, 1);
    TESSEL_CHECK(p.split_dim < static_cast<int>(p.shape.size()), "plan ", where, ": ", path, " (",
                 p.name, ") splits dim ", p.split_dim, " of a ", p.shape.size(), "-d parameter");
    TESSEL_CHECK(p.split_dim >= 0 || p.parts == 1, "plan ", where, ": ", path, " (", p.name,
                 ") has ", p.parts, " parts but no split_dim");
    TESSEL_CHECK(p.split_dim < 0 || p.shape[p.split_dim] % p.parts == 0, "plan ", where, ": ", path,
                 " (", p.name, ") dim ", p.split_dim, " of size ",
                 p.split_dim >= 0 ? p.shape[p.split_dim] : 0, " does not split into ", p.parts,
                 " parts");
    plan.parameters.push_back(std::move(p));
  }
  const json& ops = r.array(root, "ops", "");
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::string path = "ops[" + std::to_string(i) + "]";
    PlanFile::Op op;
    op.index = r.small_integer(ops[i], "index", path, 0);
    op.op = r.text(ops[i], "op", path);
    op.strategy = r.text(ops[i], "strategy", path);
    parse_split_kind(op.strategy);  // throws naming the accepted kinds
    op.dp = r.small_integer(ops[i], "dp", path, 1);
    op.tp = r.small_integer(ops[i], "tp", path, 1);
    TESSEL_CHECK(static_cast<int64_t>(op.dp) * op.tp <= plan.devices, "plan ", where, ": ", path,
                 " (", op.op, ") uses dp=", op.dp, " tp=", op.tp, " on ", plan.devices, " devices");
    for (const json& name : r.array(ops[i], "parameters", path)) {
      TESSEL_CHECK(name.is_string(), "plan ", where, ": ", path, ".parameters must hold names");
      op.parameters.push_back(name.get<std::string>());
    }
    plan.ops.push_back(std::move(op));
  }
  // ZeRO cuts over the ranks that split the batch: the mesh's dp group, or under per-op degrees
  // the line of every rank, which some op must split the batch over.
  const bool batch_split =
      plan.mesh_dp > 1 || std::any_of(plan.ops.begin(), plan.ops.end(),
                                      [](const PlanFile::Op& op) { return op.dp > 1; });
  TESSEL_CHECK(plan.zero_stage == 0 || batch_split, "plan ", where, ": ZeRO (zero_stage ",
               plan.zero_stage,
               ") needs ranks that split the batch, but the mesh is dp=", plan.mesh_dp,
               " tp=", plan.mesh_tp, " and no op splits the batch");
  return plan;
}

void write_plan(const PlanFile& plan, const std::string& path) {
  std::ofstream file(path);
  TESSEL_CHECK(file.good(), "cannot write plan '", path, "'");
  file << plan_to_json(plan);
  TESSEL_CHECK(file.good(), "writing plan '", path, "' failed");
}

PlanFile read_plan(const std::string& path) {
  std::ifstream file(path);
  TESSEL_CHECK(file.good(), "cannot open plan '", path, "'");
  std::stringstream text;
  text << file.rdbuf();
  return plan_from_json(text.str(), path);
}

std::string frontier_to_json(const PlanResult& result, const std::string& model, int devices,
                             const std::string& profile) {
  json root = json::object();
  root["model"] = model;
  root["devices"] = devices;
  root["profile"] = profile;
  root["memory_per_device"] = result.memory_per_device;
  root["chosen"] = result.chosen;
  json points = json::array();
  for (const PlannedPoint& point : result.frontier)
    points.push_back({{"memory_bytes", point.cost.memory},
                      {"time_s", point.cost.time},
                      {"remat_fraction", point.remat_fraction},
                      {"zero_stage", point.zero_stage},
                      {"executable", point.executable},
                      {"summary", point.summary},
                      {"breakdown",
                       {{"parameter_bytes", point.breakdown.parameter_bytes},
                        {"activation_bytes", point.breakdown.activation_bytes},
                        {"backward_working_bytes", point.breakdown.backward_working_bytes},
                        {"compute_s", point.breakdown.compute_s},
                        {"comm_s", point.breakdown.comm_s},
                        {"gradient_sync_s", point.breakdown.gradient_sync_s},
                        {"redistribution_s", point.breakdown.redistribution_s},
                        {"sync_wait_s", point.breakdown.sync_wait_s},
                        {"recompute_s", point.breakdown.recompute_s}}}});
  root["points"] = points;
  return root.dump(1) + "\n";
}

}  // namespace tessel::planner
