#include "memory/memory.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "core/autograd.h"
#include "core/error.h"
#include "memory/host_link.h"

namespace tessel::memory {

namespace detail {
// One installed budget/policy: the allocator and manager, and what they replaced.
struct MemorySetup {
  MemoryOptions options;
  bool scoped = false;
  std::shared_ptr<CachingAllocator> allocator;
  std::shared_ptr<ResidencyManager> manager;
  std::shared_ptr<Allocator> previous_allocator;
  std::shared_ptr<ResidencyHooks> previous_hooks;
  bool hooks_installed = false;
  PolicyCounters step_start;
};
}  // namespace detail

namespace {

using detail::MemorySetup;

std::mutex& setups_mutex() {
  static std::mutex mutex;
  return mutex;
}
// Innermost last: process-wide setups (configure, set_budget, set_policy) and MemoryScopes.
std::vector<std::shared_ptr<MemorySetup>>& setups() {
  static auto* stack = new std::vector<std::shared_ptr<MemorySetup>>;
  return *stack;
}

// What CostSource::kEstimated assumes of a GPU (an H100/H200 class device in f32 with tensor
// cores, and its HBM); swaps are priced at the host link's bandwidth.
constexpr double kGpuFlopsPerSecond = 1e14;
constexpr double kGpuBytesPerSecond = 3e12;

const char* kBudgetForms =
    "expected bytes with a unit (e.g. 1.5GiB, 512MiB, 2GB, 4096B), a whole number of bytes "
    "(4096), or a fraction of activation memory in (0, 1] (0.4)";

std::string trim(const std::string& text) {
  size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// Installs a scope's allocator (or puts back the one it replaced), returning the one before. The
// CPU's serves its one device; a GPU's, that GPU alone.
std::shared_ptr<Allocator> replace_allocator(Device device, std::shared_ptr<Allocator> allocator) {
  return device.is_cpu() ? set_allocator(DeviceType::kCpu, std::move(allocator))
                         : set_allocator(device, std::move(allocator));
}

void install_manager(MemorySetup& setup) {
  if (setup.options.policy() == Policy::kNone) return;
  setup.manager = std::make_shared<ResidencyManager>(setup.allocator, setup.options.residency());
  setup.allocator->set_pressure_handler(setup.manager.get());
  setup.previous_hooks = set_residency_hooks(setup.manager);
  setup.hooks_installed = true;
}

void remove_manager(MemorySetup& setup) {
  if (!setup.manager) return;
  // Everything the program holds comes back while the manager can still recompute it.
  setup.manager->restore_and_detach();
  setup.allocator->set_pressure_handler(nullptr);
  if (setup.hooks_installed) set_residency_hooks(setup.previous_hooks);
  setup.previous_hooks.reset();
  setup.hooks_installed = false;
  setup.manager.reset();
}

std::shared_ptr<MemorySetup> install(const MemoryOptions& options, bool scoped) {
  check_budget(options.budget(), options.fixed_bytes());
  // Checked before anything is replaced: a bad option leaves the memory settings as they were.
  TESSEL_CHECK(options.residency().auto_give_up_factor() > 1,
               "memory options: auto_give_up_factor must be above 1, got ",
               options.residency().auto_give_up_factor());
  auto setup = std::make_shared<MemorySetup>();
  setup->options = options;
  setup->scoped = scoped;
  CachingAllocatorOptions allocator_options;
  if (options.budget() > 0) allocator_options.budget(options.budget());
  // An outer manager's copies finish before its storages may be seen by an inner one.
  if (!setups().empty() && setups().back()->manager) setups().back()->manager->finish_swaps();
  const Device device = options.device();
  setup->allocator = make_caching_allocator(device, allocator_options);
  setup->previous_allocator = replace_allocator(device, setup->allocator);
  if (device.is_cuda()) {
    setup->options.residency()
        .cost_source(CostSource::kEstimated)
        .estimated_throughput(kGpuFlopsPerSecond, kGpuBytesPerSecond);
  }
  install_manager(*setup);
  setups().push_back(setup);
  return setup;
}

void uninstall(const std::shared_ptr<MemorySetup>& setup) {
  remove_manager(*setup);
  replace_allocator(setup->options.device(), setup->previous_allocator);
  auto& stack = setups();
  stack.erase(std::remove(stack.begin(), stack.end(), setup), stack.end());
}

void uninstall_process_wide() {
  auto& stack = setups();
  for (const auto& setup : stack)
    TESSEL_CHECK(!setup->scoped,
                 "cannot replace the process-wide memory settings while a MemoryScope is active");
  while (!stack.empty()) uninstall(stack.back());
}

PolicyCounters subtract(const PolicyCounters& a, const PolicyCounters& b) {
  PolicyCounters result;
  result.evictions = a.evictions - b.evictions;
  result.evicted_bytes = a.evicted_bytes - b.evicted_bytes;
  result.recomputes = a.recomputes - b.recomputes;
  result.recomputed_bytes = a.recomputed_bytes - b.recomputed_bytes;
  result.swaps_out = a.swaps_out - b.swaps_out;
  result.swapped_out_bytes = a.swapped_out_bytes - b.swapped_out_bytes;
  result.swaps_in = a.swaps_in - b.swaps_in;
  result.swapped_in_bytes = a.swapped_in_bytes - b.swapped_in_bytes;
  result.splits = a.splits - b.splits;
  return result;
}

}  // namespace

// ---- budgets ----

size_t Budget::resolve(size_t fixed_bytes, size_t peak_bytes) const {
  if (!is_fraction()) return bytes;
  return activation_budget(fixed_bytes, peak_bytes, fraction);
}

std::string Budget::str() const {
  if (!is_fraction()) return format_bytes(static_cast<double>(bytes));
  std::ostringstream out;
  out << fraction << " of activation memory";
  return out.str();
}

Budget parse_budget(const std::string& text) {
  const std::string trimmed = trim(text);
  TESSEL_CHECK(!trimmed.empty(), "memory budget: empty text (", kBudgetForms, ")");
  // The number: optional sign, digits with at most one decimal point, optional exponent.
  size_t position = 0;
  if (trimmed[position] == '+' || trimmed[position] == '-') ++position;
  const size_t digits_begin = position;
  bool seen_digit = false, seen_point = false, seen_exponent = false;
  while (position < trimmed.size()) {
    char c = trimmed[position];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      seen_digit = true;
    } else if (c == '.' && !seen_point) {
      seen_point = true;
    } else if ((c == 'e' || c == 'E') && seen_digit && position + 1 < trimmed.size() &&
               (std::isdigit(static_cast<unsigned char>(trimmed[position + 1])) ||
                trimmed[position + 1] == '-' || trimmed[position + 1] == '+')) {
      seen_exponent = true;
      position += 2;
      while (position < trimmed.size() &&
             std::isdigit(static_cast<unsigned char>(trimmed[position])))
        ++position;
      break;
    } else {
      break;
    }
    ++position;
  }
  TESSEL_CHECK(seen_digit && position > digits_begin, "memory budget: cannot read '", text, "' (",
               kBudgetForms, ")");
  const std::string number = trimmed.substr(0, position);
  const double value = std::strtod(number.c_str(), nullptr);
  const std::string unit = lower(trim(trimmed.substr(position)));
  TESSEL_CHECK(std::isfinite(value), "memory budget: cannot read '", text, "' (", kBudgetForms,
               ")");
  TESSEL_CHECK(value >= 0 && trimmed[0] != '-', "memory budget: '", text,
               "' is negative; a budget must be positive (", kBudgetForms, ")");
  TESSEL_CHECK(value > 0, "memory budget: '", text,
               "' is zero; a budget must leave room for the model (", kBudgetForms, ")");

  Budget budget;
  if (unit.empty()) {
    if (seen_point || seen_exponent || value < 1) {
      TESSEL_CHECK(value <= 1, "memory budget: '", text,
                   "' is read as a fraction of activation memory, which must be in (0, 1]; for "
                   "bytes add a unit, e.g. ",
                   number, "GiB");
      budget.fraction = value;
      return budget;
    }
    // Converting a double above the size_t range is undefined.
    TESSEL_CHECK(value < 1.8e19, "memory budget: '", text, "' is too large");
    budget.bytes = static_cast<size_t>(value);
  } else {
    static const std::pair<const char*, double> kUnits[] = {
        {"b", 1.0},         {"kb", 1e3},           {"mb", 1e6},
        {"gb", 1e9},        {"tb", 1e12},          {"kib", 1024.0},
        {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
    double multiplier = 0;
    for (const auto& entry : kUnits)
      if (unit == entry.first) multiplier = entry.second;
    TESSEL_CHECK(multiplier > 0, "memory budget: unknown unit '", trim(trimmed.substr(position)),
                 "' in '", text, "' (units: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
    const double bytes = value * multiplier;
    TESSEL_CHECK(bytes < 1.8e19, "memory budget: '", text, "' is too large");
    budget.bytes = static_cast<size_t>(bytes);
  }
  TESSEL_CHECK(budget.bytes >= CachingAllocator::kMinBlockSize, "memory budget: '", text, "' is ",
               budget.bytes, " bytes; a budget must be at least ", CachingAllocator::kMinBlockSize,
               " bytes");
  return budget;
}

size_t activation_budget(size_t fixed_bytes, size_t peak_bytes, double fraction) {
  TESSEL_CHECK(fraction > 0 && fraction <= 1, "activation budget: the fraction ", fraction,
               " must be in (0, 1]");
  if (peak_bytes <= fixed_bytes) return fixed_bytes;
  return fixed_bytes +
         static_cast<size_t>(fraction * static_cast<double>(peak_bytes - fixed_bytes));
}

size_t fixed_memory_bytes(const std::vector<Tensor>& parameters,
                          int optimizer_states_per_parameter) {
  TESSEL_CHECK(optimizer_states_per_parameter >= 0,
               "fixed_memory_bytes: optimizer_states_per_parameter must be >= 0, got ",
               optimizer_states_per_parameter);
  size_t total = 0;
  for (const auto& parameter : parameters)
    total += CachingAllocator::round_size(parameter.nbytes()) *
             static_cast<size_t>(2 + optimizer_states_per_parameter);
  return total;
}

namespace {

// Every TensorImpl of `tensors`, their gradients included.
std::vector<TensorImpl*> with_gradients(const std::vector<Tensor>& tensors) {
  std::vector<TensorImpl*> impls;
  for (const Tensor& tensor : tensors) {
    if (!tensor.defined()) continue;
    impls.push_back(tensor.impl());
    if (tensor.impl()->grad) impls.push_back(tensor.impl()->grad.get());
  }
  return impls;
}

}  // namespace

size_t held_bytes(const std::vector<Tensor>& tensors) {
  std::unordered_set<const StorageImpl*> seen;
  size_t total = 0;
  for (TensorImpl* impl : with_gradients(tensors))
    if (seen.insert(impl->storage.get()).second)
      total += CachingAllocator::round_size(impl->storage->nbytes());
  return total;
}

void move_to_current_allocator(const std::vector<Tensor>& tensors) {
  NoGradGuard no_grad;
  // One new storage per old one, so tensors that share bytes (tied weights, views) still do.
  std::unordered_map<StorageImpl*, std::shared_ptr<StorageImpl>> moved;
  for (TensorImpl* impl : with_gradients(tensors)) {
    const std::shared_ptr<StorageImpl>& old_storage = impl->storage;
    if (!old_storage->allocator()) continue;  // meta outside the simulator: no bytes
    auto found = moved.find(old_storage.get());
    if (found == moved.end()) {
      auto copy = std::make_shared<StorageImpl>(old_storage->nbytes(), old_storage->device());
      {
        StorageAccess from(*old_storage);
        StorageAccess to(*copy);
        copy_device_bytes(old_storage->device(), to.data(), from.data(), old_storage->nbytes());
      }
      found = moved.emplace(old_storage.get(), std::move(copy)).first;
    }
    if (found->second == impl->storage) continue;
    // As Module::to does: the TensorImpl keeps its identity, only its bytes change.
    found->second->add_user_ref();
    std::shared_ptr<StorageImpl> previous = std::move(impl->storage);
    impl->storage = found->second;
    previous->release_user_ref();
  }
}

void check_budget(size_t budget_bytes, size_t fixed_bytes) {
  if (budget_bytes == 0 || budget_bytes >= fixed_bytes) return;
  throw TESSEL_ERROR_TYPE(
      OutOfMemory, "memory budget ", format_bytes(static_cast<double>(budget_bytes)),
      " is below the fixed memory of ", format_bytes(static_cast<double>(fixed_bytes)),
      " (parameters, their gradients and the optimizer state, which every step needs at once); "
      "raise the budget above ",
      format_bytes(static_cast<double>(fixed_bytes)),
      " plus room for activations, or train a smaller model");
}

// ---- scopes and process-wide settings ----

MemoryScope::MemoryScope(const MemoryOptions& options) {
  std::lock_guard<std::mutex> lock(setups_mutex());
  setup_ = install(options, /*scoped=*/true);
}

MemoryScope::MemoryScope(size_t budget_bytes, Policy policy)
    : MemoryScope(MemoryOptions().budget(budget_bytes).policy(policy)) {}

MemoryScope::MemoryScope(const Budget& budget, Policy policy)
    : MemoryScope(budget, MemoryOptions().policy(policy)) {}

MemoryScope::MemoryScope(const Budget& budget, const MemoryOptions& options)
    : MemoryScope(budget.is_fraction()
                      ? MemoryOptions().device(options.device())  // measuring: no limit, no policy
                      : MemoryOptions(options).budget(budget.bytes).fixed_bytes(0)) {
  if (budget.is_fraction()) {
    TESSEL_CHECK(budget.fraction <= 1,
                 "MemoryScope: a fraction of the activation memory must be in (0, 1], got ",
                 budget.fraction);
    pending_fraction_ = budget.fraction;
    pending_options_ = options;
  }
}

size_t MemoryScope::end_step(const std::vector<Tensor>& held) {
  std::unique_lock<std::mutex> lock(setups_mutex());
  if (pending_fraction_ > 0) {
    TESSEL_CHECK(setups().back() == setup_,
                 "MemoryScope::end_step: an inner memory scope or setting is active; resolve the "
                 "fraction in the innermost scope");
    const size_t fixed = held_bytes(held);
    const auto peak = static_cast<size_t>(setup_->allocator->stats().peak_allocated_bytes);
    const size_t bytes = activation_budget(fixed, peak, pending_fraction_);
    pending_fraction_ = 0;
    // A CPU budget is an arena sized when the allocator is made: a new setup replaces the
    // measuring one, and what is held moves into it.
    MemoryOptions options = pending_options_;
    options.budget(bytes).fixed_bytes(fixed);
    uninstall(setup_);
    setup_ = install(options, /*scoped=*/true);
    lock.unlock();
    move_to_current_allocator(held);
  }
  return setup_->allocator->budget();
}

MemoryScope::~MemoryScope() {
  std::lock_guard<std::mutex> lock(setups_mutex());
  try {
    uninstall(setup_);
  } catch (...) {
    // A destructor must not throw; what could not be restored reports itself when accessed.
  }
}

CachingAllocator& MemoryScope::allocator() const { return *setup_->allocator; }
ResidencyManager* MemoryScope::manager() const { return setup_->manager.get(); }

void configure(const MemoryOptions& options) {
  std::lock_guard<std::mutex> lock(setups_mutex());
  uninstall_process_wide();
  install(options, /*scoped=*/false);
}

void reset() {
  std::lock_guard<std::mutex> lock(setups_mutex());
  uninstall_process_wide();
}

void set_budget(size_t bytes) {
  TESSEL_CHECK(bytes > 0,
               "set_budget: a budget must be positive (memory::reset() removes the budget)");
  std::lock_guard<std::mutex> lock(setups_mutex());
  auto& stack = setups();
  if (stack.empty()) {
    install(MemoryOptions().budget(bytes), /*scoped=*/false);
    return;
  }
  MemorySetup& setup = *stack.back();
  check_budget(bytes, setup.options.fixed_bytes());
  setup.allocator->set_budget(bytes);
  setup.options.budget(bytes);
}

void set_policy(Policy policy) {
  std::lock_guard<std::mutex> lock(setups_mutex());
  auto& stack = setups();
  if (stack.empty()) {
    install(MemoryOptions().policy(policy), /*scoped=*/false);
    return;
  }
  MemorySetup& setup = *stack.back();
  remove_manager(setup);
  setup.options.policy(policy);
  install_manager(setup);
}

void set_policy(const std::string& name) { set_policy(parse_policy(name)); }

MemoryStatus status() {
  std::lock_guard<std::mutex> lock(setups_mutex());
  MemoryStatus result;
  auto& stack = setups();
  if (stack.empty()) {
    result.stats.base = allocator_for(Device::cpu())->stats();
    return result;
  }
  const MemorySetup& setup = *stack.back();
  result.active = true;
  result.policy = setup.options.policy();
  result.budget = setup.allocator->budget();
  result.stats = setup.allocator->memory_stats();
  if (setup.manager) result.residency = setup.manager->stats();
  return result;
}

PolicyCounters step_counters() {
  std::lock_guard<std::mutex> lock(setups_mutex());
  auto& stack = setups();
  if (stack.empty()) return {};
  MemorySetup& setup = *stack.back();
  PolicyCounters now = setup.allocator->policy_counters();
  PolicyCounters step = subtract(now, setup.step_start);
  setup.step_start = now;
  return step;
}

std::string format_counters(const PolicyCounters& counters) {
  std::ostringstream out;
  out << counters.evictions << " evictions ("
      << format_bytes(static_cast<double>(counters.evicted_bytes)) << "), " << counters.recomputes
      << " recomputes (" << format_bytes(static_cast<double>(counters.recomputed_bytes)) << "), "
      << counters.swaps_out << " swaps out ("
      << format_bytes(static_cast<double>(counters.swapped_out_bytes)) << "), " << counters.swaps_in
      << " swaps in (" << format_bytes(static_cast<double>(counters.swapped_in_bytes)) << "), "
      << counters.splits << " splits";
  return out.str();
}

std::string status_line(const MemoryStatus& status) {
  std::ostringstream out;
  out << "memory: policy " << policy_name(status.policy) << ", budget "
      << (status.budget ? format_bytes(static_cast<double>(status.budget))
                        : std::string("unlimited"))
      << ", in use " << format_bytes(static_cast<double>(status.stats.base.allocated_bytes))
      << ", peak " << format_bytes(static_cast<double>(status.stats.base.peak_allocated_bytes))
      << "; " << format_counters(status.stats.policy);
  return out.str();
}

}  // namespace tessel::memory
