#include "memory/residency_manager.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "core/autograd.h"
#include "core/error.h"
#include "core/tensor.h"
#include "memory/host_allocator.h"

namespace tessel::memory {

namespace {

std::atomic<uint64_t> next_manager_serial{1};

// Seconds added to every cost, so zero-cost candidates still order by size and staleness.
constexpr double kCostEpsilon = 1e-9;
// Clock ticks added to staleness, so a tensor touched just now has a finite score.
constexpr double kStalenessEpsilon = 1e-3;
// Each recompute of a tensor makes evicting it again slightly less attractive (MegEngine).
constexpr double kRecomputePenalty = 1.0001;
// Marks a report this layer has already explained.
constexpr const char* kExplainedMarker = "\n  memory policy: ";

bool keeps_records_for(Policy policy) {
  return policy == Policy::kDtr || policy == Policy::kSplit || policy == Policy::kAuto;
}
bool swaps_for(Policy policy) { return policy == Policy::kSwap || policy == Policy::kAuto; }

bool is_mutated_input(const OpDef& op, size_t index) {
  return std::find(op.mutated_inputs.begin(), op.mutated_inputs.end(), static_cast<int>(index)) !=
         op.mutated_inputs.end();
}

// Moves `bytes` from `source` to the lower `destination` within `device`; the ranges may
// overlap. Copies other than memmove must not overlap, so they go forward in pieces no longer than
// the distance moved, or through host memory when that would take many pieces.
void move_bytes_down(Device device, void* destination, const void* source, size_t bytes) {
  if (device.is_cpu()) {
    std::memmove(destination, source, bytes);
    return;
  }
  if (device.is_meta()) {  // no bytes: the simulated device charges the time of one copy
    copy_device_bytes(device, destination, source, bytes);
    return;
  }
  constexpr size_t kMaxPieces = 16;
  const size_t distance =
      static_cast<size_t>(static_cast<const char*>(source) - static_cast<char*>(destination));
  if (bytes <= distance * kMaxPieces) {
    for (size_t offset = 0; offset < bytes; offset += distance)
      copy_device_bytes(device, static_cast<char*>(destination) + offset,
                        static_cast<const char*>(source) + offset,
                        std::min(distance, bytes - offset));
    return;
  }
  void* host = host_allocator()->allocate(bytes, Stream{});
  copy_device_bytes(device, host, source, bytes);
  copy_device_bytes(device, destination, host, bytes);
  host_allocator()->deallocate(host, bytes, Stream{});
}

void free_host_copy(StorageImpl& storage) {
  if (!storage.host_data) return;
  host_allocator()->deallocate(storage.host_data, storage.nbytes(), Stream{});
  storage.host_data = nullptr;
}

std::string producer_name(const StorageImpl& storage) {
  return storage.producer ? storage.producer->op->name + " output"
                          : std::string("tensor without an op record");
}

}  // namespace

const char* policy_name(Policy policy) {
  switch (policy) {
    case Policy::kNone:
      return "none";
    case Policy::kDtr:
      return "dtr";
    case Policy::kSwap:
      return "swap";
    case Policy::kSplit:
      return "split";
    case Policy::kAuto:
      return "auto";
  }
  return "?";
}

Policy parse_policy(const std::string& name) {
  for (Policy policy :
       {Policy::kNone, Policy::kDtr, Policy::kSwap, Policy::kSplit, Policy::kAuto}) {
    if (name == policy_name(policy)) return policy;
  }
  TESSEL_FAIL("unknown memory policy '", name, "' (expected one of: none, dtr, swap, split, auto)");
}

const char* action_name(ResidencyAction action) {
  switch (action) {
    case ResidencyAction::kNone:
      return "none";
    case ResidencyAction::kRecompute:
      return "recompute";
    case ResidencyAction::kSwap:
      return "swap";
  }
  return "?";
}

// A union-find set of evicted tensors that touch each other through op records, with the sum of
// their recompute costs at the root (DTR's h_eq approximation of the evicted neighbourhood).
struct ResidencyManager::Component {
  std::shared_ptr<Component> parent;
  double cost = 0;
};

// What the manager keeps per storage (in StorageImpl::residency_data).
struct ResidencyManager::Record {
  uint64_t manager_serial = 0;
  int64_t recomputes = 0;
  std::vector<std::weak_ptr<OpCall>> consumers;  // op records that read this storage
  size_t consumers_pruned_at = 8;
  std::shared_ptr<Component> component;  // while evicted
  double component_cost = 0;             // what this storage added to it
  std::shared_ptr<HostTransfer> pending_out;
  std::shared_ptr<HostTransfer> pending_in;  // a prefetch: device bytes held, host copy kept
  // A recorded op has read it, or another output of its op, since it was made: an output read
  // only by backward (dropout's mask, pooling's indices) waits for it as long as the saved
  // activations do, and is a candidate once its op's result has been read.
  bool consumed = false;
  bool rematerializing = false;  // being recomputed: not a candidate
  bool producer_stale = false;   // an input of its op record was (or is being) written in place
  bool read_back_in_forward = false;  // swapped out, then read again while gradients recorded
  // Made by a backward op: a gradient on its way to its consumers. Never recomputed: its op
  // record reads upstream gradients that backward drops as soon as they are consumed, so a
  // recompute that looks cheap when chosen turns into a replay of backward from the loss.
  bool made_in_backward = false;
  // Inputs of recomputes waiting for another of their inputs to be recomputed (policies that
  // swap): not pinned, so a long chain does not hold every level's inputs at once, but moved
  // only by swapping, so they come back without recursing when their recompute resumes.
  int held_for_replay = 0;
  // Kept on host while an op runs over chunks of it (stage_on_host): not prefetched.
  int staged = 0;
  // auto: the same tensor in the previous training step (AccessPattern), and where in this
  // step's program it was last read.
  uint64_t pattern_key = 0;
  int64_t last_position = 0;
};

ResidencyManager::ResidencyManager(std::shared_ptr<CachingAllocator> allocator,
                                   ResidencyOptions options)
    : serial_(next_manager_serial.fetch_add(1)),
      allocator_(std::move(allocator)),
      options_(options),
      link_(options.host_bandwidth(),
            copy_engine_for(allocator_ ? allocator_->device().type : DeviceType::kCpu)),
      way_chooser_(kAutoWays,
                   [&] {
                     WayChooserOptions chooser;
                     chooser.give_up_factor = options.auto_give_up_factor();
                     return chooser;
                   }()),
      sampler_(options.sample_seed()) {
  TESSEL_CHECK(allocator_ != nullptr, "ResidencyManager: allocator must not be null");
}

ResidencyManager::~ResidencyManager() {
  try {
    finish_swaps();
    free_copied_host_copies(/*wait=*/true);
  } catch (...) {
    // Destructors do not throw; the copies are done, only releasing failed.
  }
}

// ---- records ----

ResidencyManager::Record* ResidencyManager::find_record(const StorageImpl& storage) const {
  if (!storage.residency_data) return nullptr;
  auto* record = static_cast<Record*>(storage.residency_data.get());
  return record->manager_serial == serial_ ? record : nullptr;
}

ResidencyManager::Record& ResidencyManager::record_of(StorageImpl& storage) {
  if (Record* record = find_record(storage)) return *record;
  auto record = std::make_shared<Record>();
  record->manager_serial = serial_;
  storage.residency_data = record;
  register_storage(storage);
  storage.last_access = clock_;
  label(storage);
  return *record;
}

void ResidencyManager::register_storage(StorageImpl& storage) {
  if (expired_storages_ > storages_.size() / 2) {
    storages_.erase(std::remove_if(storages_.begin(), storages_.end(),
                                   [](const Registered& entry) { return entry.weak.expired(); }),
                    storages_.end());
    expired_storages_ = 0;
  }
  const uint64_t id = storage.id();
  Registered registered{id, &storage, storage.weak_from_this()};
  if (storages_.empty() || storages_.back().id < id) {
    storages_.push_back(std::move(registered));  // the usual case: a new storage
    return;
  }
  auto entry = std::lower_bound(storages_.begin(), storages_.end(), id,
                                [](const Registered& entry, uint64_t id) { return entry.id < id; });
  if (entry != storages_.end() && entry->id == id) {
    *entry = std::move(registered);
  } else {
    storages_.insert(entry, std::move(registered));
  }
}

bool ResidencyManager::keeps_records() const { return keeps_records_for(options_.policy()); }

bool ResidencyManager::auto_trying() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return options_.policy() == Policy::kAuto && pressure_seen_ && way_chooser_.trying();
}

bool ResidencyManager::swaps_now() const {
  return last_resort_ ||
         (swaps_for(options_.policy()) &&
          !(options_.policy() == Policy::kAuto && auto_mode_ == AutoMode::kRecomputeOnly));
}

bool ResidencyManager::managed(const StorageImpl& storage) const {
  return storage.allocator().get() == allocator_.get();
}

void ResidencyManager::label(StorageImpl& storage) {
  if (!managed(storage) || !storage.data_unchecked()) return;
  allocator_->set_owner(storage.data_unchecked(), producer_name(storage));
}

void ResidencyManager::count(const char* kind, size_t bytes) {
  const auto amount = static_cast<int64_t>(bytes);
  const std::string name = kind;
  if (name == "evict") {
    ++counters_.evictions;
    counters_.evicted_bytes += amount;
  } else if (name == "recompute") {
    ++counters_.recomputes;
    counters_.recomputed_bytes += amount;
  } else if (name == "swap_out") {
    ++counters_.swaps_out;
    counters_.swapped_out_bytes += amount;
  } else if (name == "swap_in") {
    ++counters_.swaps_in;
    counters_.swapped_in_bytes += amount;
  } else if (name == "split") {
    ++counters_.splits;
  }
  allocator_->record_event(name, bytes);
}

// ---- union-find over evicted tensors ----

std::shared_ptr<ResidencyManager::Component> ResidencyManager::find_root(
    std::shared_ptr<Component> component) {
  auto root = component;
  while (root->parent) root = root->parent;
  while (component->parent && component->parent != root) {
    auto next = component->parent;
    component->parent = root;
    component = next;
  }
  return root;
}

std::vector<StorageImpl*> ResidencyManager::evicted_neighbours(StorageImpl& storage) {
  std::vector<StorageImpl*> result;
  auto add = [&](StorageImpl* neighbour) {
    if (neighbour == &storage || neighbour->state() != Residency::kEvicted) return;
    Record* record = find_record(*neighbour);
    if (record && record->component) result.push_back(neighbour);
  };
  if (storage.producer) {
    for (const auto& input : storage.producer->inputs)
      if (input.storage) add(input.storage.get());
  }
  if (Record* record = find_record(storage)) {
    for (const auto& weak_call : record->consumers) {
      auto call = weak_call.lock();
      if (!call) continue;
      for (const auto& weak_output : call->output_storages)
        if (auto output = weak_output.lock()) add(output.get());
    }
  }
  return result;
}

void ResidencyManager::join_component(StorageImpl& storage) {
  Record& record = record_of(storage);
  record.component_cost = storage.producer ? storage.producer->cost_seconds : 0.0;
  record.component = std::make_shared<Component>();
  record.component->cost = record.component_cost;
  for (StorageImpl* neighbour : evicted_neighbours(storage)) {
    auto mine = find_root(record.component);
    auto theirs = find_root(find_record(*neighbour)->component);
    if (mine == theirs) continue;
    theirs->parent = mine;
    mine->cost += theirs->cost;
  }
}

void ResidencyManager::leave_component(StorageImpl& storage) {
  Record* record = find_record(storage);
  if (!record || !record->component) return;
  auto root = find_root(record->component);
  root->cost = std::max(0.0, root->cost - record->component_cost);
  record->component.reset();
  record->component_cost = 0;
}

double ResidencyManager::evicted_neighbourhood_cost(StorageImpl& storage) {
  std::unordered_set<Component*> roots;
  double cost = 0;
  for (StorageImpl* neighbour : evicted_neighbours(storage)) {
    auto root = find_root(find_record(*neighbour)->component);
    if (roots.insert(root.get()).second) cost += root->cost;
  }
  return cost;
}

// ---- candidates and scores ----

bool ResidencyManager::can_recompute(StorageImpl& storage) {
  if (!keeps_records() || !storage.producer) return false;
  Record* record = find_record(storage);
  if (record && record->producer_stale) return false;
  const OpCall& producer = *storage.producer;
  for (size_t i = 0; i < producer.inputs.size(); ++i) {
    const RecordedTensor& input = producer.inputs[i];
    if (!input.storage) continue;
    if (input.storage.get() == &storage) return false;
    if (!is_mutated_input(*producer.op, i) && input.storage->version() != input.version)
      return false;
    if (input.storage->state() == Residency::kEvicted) {
      Record* input_record = find_record(*input.storage);
      if (!input.storage->producer || (input_record && input_record->producer_stale)) return false;
    }
  }
  return true;
}

bool ResidencyManager::exceeds_budget_to_recompute(const StorageImpl& storage) const {
  const size_t budget = allocator_->budget();
  if (budget == 0 || !storage.producer) return false;
  size_t bytes = storage.nbytes();
  std::vector<const StorageImpl*> counted{&storage};
  for (const RecordedTensor& input : storage.producer->inputs) {
    const StorageImpl* read = input.storage.get();
    if (!read || std::find(counted.begin(), counted.end(), read) != counted.end()) continue;
    counted.push_back(read);
    bytes += read->nbytes();
  }
  return bytes > budget;
}

double ResidencyManager::recompute_cost(StorageImpl& storage) {
  return storage.producer->cost_seconds + evicted_neighbourhood_cost(storage);
}

ResidencyManager::Candidate ResidencyManager::assess(StorageImpl& storage, Spare spare,
                                                     bool recompute_only) {
  Candidate none{&storage, ResidencyAction::kNone, std::numeric_limits<double>::infinity()};
  if (!managed(storage) || storage.state() != Residency::kResident || storage.pins() > 0 ||
      storage.nbytes() < candidate_threshold_ || !storage.data_unchecked())
    return none;
  Record* record = find_record(storage);
  if (!record || record->rematerializing) return none;
  // A tensor every forward reads (a parameter) comes right back when moved off during forward.
  if (spare != Spare::kNothing && record->read_back_in_forward && GradMode::is_enabled())
    return none;
  // An input held for a waiting recompute is read again as soon as the chain under it ends:
  // swapping it out sends it straight back over the link. It goes only where nothing else can.
  if (spare != Spare::kNothing && record->held_for_replay > 0) return none;
  // State comes back every step (and a gradient soon, for the optimizer), while activations are
  // read once more at most; staleness alone, counted within a step, cannot tell them apart.
  if (spare == Spare::kStateAndForwardReads && (!storage.producer || record->made_in_backward))
    return none;
  // A recompute keeps its output whole beside its op's inputs: where that is more than the
  // budget it can never run, so split and auto move such a tensor to host instead.
  const bool too_large_to_recompute = storage.producer && allow_split(*storage.producer->op) &&
                                      exceeds_budget_to_recompute(storage);
  // Nothing has read it yet, so it is about to be read (a gradient waiting for the optimizer,
  // an output waiting for its consumer): recomputing it would redo its whole chain at once.
  const bool recompute_ok = record->consumed && !record->made_in_backward &&
                            record->held_for_replay == 0 && !too_large_to_recompute &&
                            can_recompute(storage);
  const bool swap_ok = !recompute_only && (swaps_now() || too_large_to_recompute);
  if (!recompute_ok && !swap_ok) return none;

  // A swap frees nothing until its copy is out, behind the copies queued before it, and the
  // tensor comes back over the link again: both directions plus the backlog.
  const double swap_cost = 2 * link_.seconds_for(storage.nbytes()) + link_backlog_seconds_;
  // Swap or recompute by what each runs: the op record's own time against the copies. Its
  // evicted neighbourhood, the union-find bound below, over-counts what a recompute runs (an
  // evicted ancestor, once recomputed, serves all its evicted descendants) and would send most
  // tensors over the host link, whose copies stall the step; it only ranks the candidates.
  Candidate result = none;
  result.action = recompute_ok && (!swap_ok || storage.producer->cost_seconds <= swap_cost)
                      ? ResidencyAction::kRecompute
                      : ResidencyAction::kSwap;
  const double recompute = result.action == ResidencyAction::kRecompute
                               ? recompute_cost(storage)
                               : std::numeric_limits<double>::infinity();
  const double cost = result.action == ResidencyAction::kRecompute ? recompute : swap_cost;
  // score = cost * 1.0001^recomputes / ((bytes + free neighbours) * staleness)
  const double bytes =
      static_cast<double>(storage.nbytes()) +
      static_cast<double>(allocator_->free_bytes_adjacent(storage.data_unchecked()));
  double staleness = static_cast<double>(clock_ - storage.last_access) + kStalenessEpsilon;
  // auto: staleness guesses how soon a tensor is read again; training steps repeat, so the
  // previous step's reads tell. The geometric mean of the two ranks candidates whatever the
  // units (accesses, ops); the guess alone still counts where the pattern misleads (the
  // previous step may have recomputed where this one does not).
  if (options_.policy() == Policy::kAuto && pattern_.known()) {
    const double distance =
        pattern_.distance_to_next_read(record->pattern_key, record->last_position);
    staleness = std::sqrt(staleness * distance);
  }
  result.score =
      (cost + kCostEpsilon) * std::pow(kRecomputePenalty, record->recomputes) / (bytes * staleness);
  return result;
}

ResidencyManager::CandidatePool ResidencyManager::prepare_assessment() {
  // Strong references: assessing must not destroy anything while the pool is walked.
  resident_.clear();
  size_t bytes = 0;
  for (const Registered& entry : storages_) {
    StorageImpl* storage = entry.live();
    if (!storage || !managed(*storage) || storage->state() != Residency::kResident) continue;
    bytes += storage->nbytes();
    resident_.push_back(&entry);
  }
  const double mean =
      resident_.empty() ? 0.0 : static_cast<double>(bytes) / static_cast<double>(resident_.size());
  candidate_threshold_ = std::max(options_.min_candidate_bytes(),
                                  static_cast<size_t>(options_.min_candidate_share() * mean));
  link_backlog_seconds_ = link_.backlog_seconds();
  CandidatePool pool;
  for (const Registered* entry : resident_) {
    if (entry->raw->pins() > 0 || entry->raw->nbytes() < candidate_threshold_) continue;
    if (auto storage = entry->weak.lock()) pool.push_back(std::move(storage));
  }
  return pool;
}

size_t ResidencyManager::candidate_threshold() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  prepare_assessment();
  return candidate_threshold_;
}

ResidencyManager::Candidate ResidencyManager::choose_victim() {
  const CandidatePool pool = prepare_assessment();
  if (auto_mode_ == AutoMode::kRecomputeFirst || auto_mode_ == AutoMode::kPlanned || last_resort_) {
    for (Spare spare : {Spare::kStateAndForwardReads, Spare::kForwardReads, Spare::kNothing}) {
      const Candidate victim = choose_victim_among_candidates(pool, spare, /*recompute_only=*/true);
      if (victim.action == ResidencyAction::kRecompute) return victim;
    }
  }
  // Where recomputing an activation is the cheapest way out, state stays (moving it costs a
  // round trip over the link every step); where swapping is (a fast link, as on the CPU), state
  // competes with the rest by score.
  const Candidate activation = choose_victim_among_candidates(pool, Spare::kStateAndForwardReads);
  if (activation.action == ResidencyAction::kRecompute) return activation;
  const Candidate spared = choose_victim_among_candidates(pool, Spare::kForwardReads);
  return spared.action != ResidencyAction::kNone
             ? spared
             : choose_victim_among_candidates(pool, Spare::kNothing);
}

ResidencyManager::Candidate ResidencyManager::choose_victim_among_candidates(
    const CandidatePool& pool, Spare spare, bool recompute_only) {
  if (options_.sample_candidates() && pool.size() > 4) {
    // Partial Fisher-Yates over a copy: the first ceil(sqrt(N)) entries become a uniform sample.
    CandidatePool shuffled = pool;
    const size_t sample =
        static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(shuffled.size()))));
    for (size_t i = 0; i < sample; ++i) {
      std::uniform_int_distribution<size_t> pick(i, shuffled.size() - 1);
      std::swap(shuffled[i], shuffled[pick(sampler_)]);
    }
    // The sample may hold no candidate at all (all without op records, say): then score them all.
    Candidate best{nullptr, ResidencyAction::kNone, std::numeric_limits<double>::infinity()};
    for (size_t i = 0; i < sample; ++i) {
      Candidate candidate = assess(*shuffled[i], spare, recompute_only);
      if (candidate.action != ResidencyAction::kNone && candidate.score < best.score)
        best = candidate;
    }
    if (best.action != ResidencyAction::kNone) return best;
  }
  Candidate best{nullptr, ResidencyAction::kNone, std::numeric_limits<double>::infinity()};
  for (const auto& storage : pool) {
    Candidate candidate = assess(*storage, spare, recompute_only);
    if (candidate.action != ResidencyAction::kNone &&
        (best.action == ResidencyAction::kNone || candidate.score < best.score))
      best = candidate;
  }
  return best;
}

void ResidencyManager::apply(const Candidate& victim) {
  if (victim.action == ResidencyAction::kRecompute) {
    evict_locked(*victim.storage, /*count_as_eviction=*/true);
  } else if (victim.action == ResidencyAction::kSwap) {
    start_swap_out(*victim.storage);
  }
}

void ResidencyManager::evict_locked(StorageImpl& storage, bool count_as_eviction) {
  const size_t bytes = storage.nbytes();
  storage.release_bytes(Residency::kEvicted);
  join_component(storage);
  if (count_as_eviction) count("evict", bytes);
}

// ---- swaps ----

void ResidencyManager::start_swap_out(StorageImpl& storage) {
  Record& record = record_of(storage);
  const size_t bytes = storage.nbytes();
  storage.host_data = host_allocator()->allocate(bytes, Stream{});
  record.pending_out = link_.copy_async(storage.host_data, storage.data_unchecked(), bytes);
  // Reads from now on wait for (and cancel) the copy; the device bytes go when it is done.
  storage.set_state(Residency::kOnHost);
  in_flight_.push_back(&storage);
  count("swap_out", bytes);
}

void ResidencyManager::complete_swap_out(StorageImpl& storage) {
  Record& record = record_of(storage);
  link_.wait(record.pending_out);
  record.pending_out.reset();
  in_flight_.erase(std::remove(in_flight_.begin(), in_flight_.end(), &storage), in_flight_.end());
  if (storage.pins() > 0) {
    // Another thread is reading it right now: keep the device bytes.
    free_host_copy(storage);
    storage.set_state(Residency::kResident);
    return;
  }
  storage.release_bytes(Residency::kOnHost);
}

void ResidencyManager::cancel_swap_out(StorageImpl& storage) {
  Record& record = record_of(storage);
  link_.wait(record.pending_out);
  record.pending_out.reset();
  in_flight_.erase(std::remove(in_flight_.begin(), in_flight_.end(), &storage), in_flight_.end());
  free_host_copy(storage);
  storage.set_state(Residency::kResident);
}

size_t ResidencyManager::in_flight_bytes() const {
  size_t bytes = 0;
  for (const StorageImpl* storage : in_flight_) bytes += storage->nbytes();
  return bytes;
}

bool ResidencyManager::release_finished_swaps() {
  std::vector<StorageImpl*> finished;
  for (StorageImpl* storage : in_flight_) {
    Record* record = find_record(*storage);
    if (record && record->pending_out && record->pending_out->done()) finished.push_back(storage);
  }
  for (StorageImpl* storage : finished) complete_swap_out(*storage);
  return !finished.empty();
}

void ResidencyManager::finish_swaps() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  while (!in_flight_.empty()) complete_swap_out(*in_flight_.front());
}

void ResidencyManager::swap_in(StorageImpl& storage) {
  Record& record = record_of(storage);
  if (record.pending_out) {
    cancel_swap_out(storage);
    return;
  }
  TESSEL_CHECK(storage.host_data != nullptr, "storage ", storage.id(),
               " is on host but its host copy is missing");
  const size_t bytes = storage.nbytes();
  std::shared_ptr<HostTransfer> copy;
  if (record.pending_in) {
    copy = record.pending_in;
    settle_prefetch(storage, /*keep=*/true);
    ++prefetch_hits_;
  } else {
    if (GradMode::is_enabled()) record.read_back_in_forward = true;
    storage.allocate_bytes();  // may relieve pressure; this storage is not a candidate meanwhile
    // On a GPU the compute stream waits for the copy, not the host.
    copy = link_.copy_to_device(storage.data_unchecked(), storage.host_data, bytes);
    link_.order_device_after(copy);
  }
  release_host_copy_after(storage, std::move(copy));
  count("swap_in", bytes);
  label(storage);
  prefetch_before(storage.last_access);
}

void ResidencyManager::release_host_copy_after(StorageImpl& storage,
                                               std::shared_ptr<HostTransfer> copy) {
  free_copied_host_copies(/*wait=*/false);
  if (!storage.host_data) return;
  if (!copy || copy->done()) {
    free_host_copy(storage);
    return;
  }
  // A copy issued on the device still reads it: the block goes back once the copy is done.
  host_releases_.push_back(
      {host_allocator(), storage.host_data, storage.nbytes(), std::move(copy)});
  storage.host_data = nullptr;
}

void ResidencyManager::free_copied_host_copies(bool wait) {
  for (auto it = host_releases_.begin(); it != host_releases_.end();) {
    if (wait) link_.wait(it->copy);
    if (!it->copy->done()) {
      ++it;
      continue;
    }
    it->allocator->deallocate(it->host, it->bytes, Stream{});
    it = host_releases_.erase(it);
  }
}

void ResidencyManager::prefetch_before(int64_t clock) {
  // Forward reads swapped tensors rarely and in no useful order; backward reads them in reverse.
  if (!options_.prefetch() || GradMode::is_enabled() || detaching_ || gathering_) return;
  constexpr size_t kDepth = 2;                     // prefetches in flight or waiting to be read
  std::vector<std::shared_ptr<StorageImpl>> next;  // on host, last used before `clock`
  for (const Registered& entry : storages_) {
    StorageImpl* storage = entry.live();
    if (!storage || storage->state() != Residency::kOnHost || !managed(*storage) ||
        storage->last_access >= clock || storage->user_refs() == 0)
      continue;
    Record* record = find_record(*storage);
    if (!record || record->pending_out || record->staged) continue;
    if (auto strong = entry.weak.lock()) next.push_back(std::move(strong));
  }
  const auto depth = std::min(kDepth, next.size());
  std::partial_sort(next.begin(), next.begin() + depth, next.end(),
                    [](const auto& a, const auto& b) { return a->last_access > b->last_access; });
  next.resize(depth);
  for (const auto& storage : next) {
    Record& record = record_of(*storage);
    if (record.pending_in) continue;
    // Only into room the step does not need: at most half of the largest allocatable block.
    const size_t bytes = storage->nbytes();
    if (allocator_->largest_allocatable() < 2 * CachingAllocator::round_size(bytes)) return;
    prefetch(*storage);
    if (!record.pending_in) return;
  }
}

void ResidencyManager::prefetch(StorageImpl& storage) {
  Record& record = record_of(storage);
  prefetching_ = true;
  try {
    storage.allocate_bytes(Residency::kOnHost);
  } catch (const OutOfMemory&) {
    prefetching_ = false;
    return;
  }
  prefetching_ = false;
  record.pending_in =
      link_.copy_to_device(storage.data_unchecked(), storage.host_data, storage.nbytes());
  prefetched_[storage.id()] = &storage;
  ++prefetches_;
}

void ResidencyManager::settle_prefetch(StorageImpl& storage, bool keep) {
  Record& record = record_of(storage);
  // The device bytes' next user (the reader, or the block's next owner) comes after the copy.
  link_.order_device_after(record.pending_in);
  record.pending_in.reset();
  prefetched_.erase(storage.id());
  if (keep) {
    storage.set_state(Residency::kResident);
  } else {
    storage.release_bytes(Residency::kOnHost);
  }
}

bool ResidencyManager::drop_prefetch() {
  StorageImpl* last = nullptr;
  for (const auto& entry : prefetched_) {
    StorageImpl* storage = entry.second;
    if (storage->state() == Residency::kOnHost &&
        (!last || storage->last_access < last->last_access))
      last = storage;
  }
  if (!last) return false;
  settle_prefetch(*last, /*keep=*/false);
  return true;
}

// ---- recompute ----

void ResidencyManager::replay(OpCall& record) {
  std::vector<std::shared_ptr<StorageImpl>> evicted;
  for (const auto& weak_output : record.output_storages) {
    auto output = weak_output.lock();
    if (output && output->state() == Residency::kEvicted) evicted.push_back(std::move(output));
  }
  // Outputs being recomputed are not candidates while the others are allocated.
  struct Guard {
    ResidencyManager* manager;
    std::vector<std::shared_ptr<StorageImpl>>& storages;
    ~Guard() {
      for (auto& storage : storages) manager->record_of(*storage).rematerializing = false;
    }
  } guard{this, evicted};
  for (auto& output : evicted) record_of(*output).rematerializing = true;

  replay_op_call(record);
  ResidencyStats::Replays& replays = replays_by_op_[record.op->name];
  ++replays.count;
  replays.seconds += record.cost_seconds;
  for (const auto& output : evicted) replays.bytes += static_cast<int64_t>(output->nbytes());

  for (auto& output : evicted) {
    Record& record = record_of(*output);
    leave_component(*output);
    ++record.recomputes;
    count("recompute", output->nbytes());
    label(*output);
  }
}

void ResidencyManager::drop_if_unreferenced(StorageImpl& storage) {
  if (!keeps_records() || detaching_ || storage.user_refs() > 0 || storage.record_refs() == 0 ||
      storage.state() != Residency::kResident || storage.pins() > 0 || !managed(storage))
    return;
  Record* record = find_record(storage);
  if (!record || record->rematerializing || !can_recompute(storage)) return;
  evict_locked(storage, /*count_as_eviction=*/false);
  ++placeholders_;
}

namespace {

// The order in which a recompute looks at its op's inputs: the resident ones keep their places
// (each pinned, or held, once reached), and those that are not take the places of the others by
// the bytes of evicted tensors their recompute chains make again (as far as a bounded walk goes),
// largest first. The result of the largest chain then waits alone while the smaller ones run,
// rather than their results waiting through it (Sethi-Ullman's order).
std::vector<size_t> recompute_order(const OpCall& record) {
  std::vector<size_t> order(record.inputs.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::vector<size_t> slots;  // of the inputs that are not resident, ascending
  for (size_t i = 0; i < record.inputs.size(); ++i) {
    const StorageImpl* input = record.inputs[i].storage.get();
    if (input && input->state() != Residency::kResident) slots.push_back(i);
  }
  if (slots.size() < 2) return order;
  constexpr size_t kMaxWalk = 256;
  std::vector<size_t> chain_bytes(record.inputs.size(), 0);
  std::vector<StorageImpl*> pending;
  std::unordered_set<StorageImpl*> seen;
  for (size_t i : slots) {
    pending.assign(1, record.inputs[i].storage.get());
    seen.clear();
    while (!pending.empty() && seen.size() < kMaxWalk) {
      StorageImpl* storage = pending.back();
      pending.pop_back();
      if (storage->state() != Residency::kEvicted || !seen.insert(storage).second) continue;
      chain_bytes[i] += storage->nbytes();
      if (!storage->producer) continue;
      for (const RecordedTensor& ancestor : storage->producer->inputs)
        if (ancestor.storage) pending.push_back(ancestor.storage.get());
    }
  }
  std::vector<size_t> chains = slots;
  std::stable_sort(chains.begin(), chains.end(),
                   [&](size_t a, size_t b) { return chain_bytes[a] > chain_bytes[b]; });
  for (size_t k = 0; k < slots.size(); ++k) order[slots[k]] = chains[k];
  return order;
}

}  // namespace

struct ResidencyManager::RecomputeFrame {
  StorageImpl* storage;
  std::shared_ptr<OpCall> record;
  size_t next_input = 0;      // into `order`
  std::vector<size_t> order;  // of the record's inputs (recompute_order)
  std::vector<StorageAccess> pinned_inputs;
  // Resident inputs left unpinned (held_for_replay) while another input is recomputed.
  std::vector<std::shared_ptr<StorageImpl>> held;

  // Waiting for another input: the inputs found so far are held instead of pinned, and looked
  // at again (from the first) on resume.
  void hold_pinned(ResidencyManager& manager) {
    for (const StorageAccess& input : pinned_inputs) {
      std::shared_ptr<StorageImpl> storage = input.storage()->shared_from_this();
      ++manager.record_of(*storage).held_for_replay;
      held.push_back(std::move(storage));
    }
    pinned_inputs.clear();
    next_input = 0;
  }
};

// Makes `target` resident with an explicit stack (chains of evicted tensors can be thousands
// long): look at the top; while an input of its op record is not resident, push that input; once
// all are resident, replay the op record and pop. As in DTR, each input is pinned as soon as it is
// resident, until its consumer has replayed, so computing one input never evicts another.
void ResidencyManager::rematerialize(StorageImpl& target) {
  using Frame = RecomputeFrame;
  std::vector<Frame> stack;
  // Whatever way the recompute ends, held inputs become ordinary candidates again.
  struct Unregister {
    ResidencyManager& manager;
    std::vector<Frame>& stack;
    ~Unregister() {
      manager.recompute_stacks_.pop_back();
      for (Frame& frame : stack) manager.release_held(frame.held);
    }
  };
  recompute_stacks_.push_back(&stack);
  Unregister unregister_on_exit{*this, stack};
  std::unordered_set<StorageImpl*> on_stack;
  // Swapping policies hold the inputs of a waiting recompute (they may be swapped meanwhile, so a
  // recompute chain through a residual stage does not pin one tensor per level); recomputing only
  // (dtr, and auto's third way) pins them as DTR does, and auto lets go of them only where
  // nothing else frees room (hold_waiting_inputs).
  const bool hold_unpinned = swaps_now();
  stack.push_back(Frame{&target, nullptr, 0, {}, {}, {}});
  on_stack.insert(&target);
  while (!stack.empty()) {
    Frame& frame = stack.back();
    StorageImpl& storage = *frame.storage;
    if (!frame.record) {
      if (storage.state() != Residency::kEvicted) {
        if (storage.state() == Residency::kOnHost) swap_in(storage);
        on_stack.erase(&storage);
        stack.pop_back();
        continue;
      }
      // What needed it, innermost first, for the error messages.
      auto needed_by = [&] {
        std::string chain;
        for (size_t i = stack.size() - 1; i-- > 0;)
          chain += " <- " + producer_name(*stack[i].storage) + " (storage " +
                   std::to_string(stack[i].storage->id()) + ")";
        return chain;
      };
      TESSEL_CHECK(storage.producer != nullptr, "storage ", storage.id(), " (", storage.nbytes(),
                   " bytes) was evicted but has no op record to recompute it from", needed_by());
      Record* record = find_record(storage);
      TESSEL_CHECK(!(record && record->producer_stale), "cannot recompute a ",
                   storage.producer->op->name, " output (storage ", storage.id(),
                   "): an input of its op record was modified in place after it was evicted",
                   needed_by());
      frame.record = storage.producer;
    }
    const OpCall& record = *frame.record;
    bool waiting = false;
    if (frame.order.empty()) frame.order = recompute_order(record);
    while (frame.next_input < record.inputs.size()) {
      const RecordedTensor& input = record.inputs[frame.order[frame.next_input]];
      if (!input.storage) {
        ++frame.next_input;
        continue;
      }
      StorageImpl& needed = *input.storage;
      if (needed.state() == Residency::kResident) {
        frame.pinned_inputs.emplace_back(needed);
        ++frame.next_input;
        continue;
      }
      TESSEL_CHECK(on_stack.insert(&needed).second, "cannot recompute ", record.op->name,
                   ": its op record depends on its own output");
      if (hold_unpinned) frame.hold_pinned(*this);
      stack.push_back(Frame{&needed, nullptr, 0, {}, {}, {}});
      waiting = true;
      break;
    }
    if (waiting) continue;
    // Inputs recomputed on the way stay resident, candidates like any other: dropping them at
    // once would recompute shared ancestors again for every consumer (exponentially in diamonds).
    std::shared_ptr<OpCall> done = frame.record;
    replay(*done);
    // The replay read its inputs: they are candidates again, as after their first reader.
    for (const StorageAccess& input : frame.pinned_inputs) mark_consumed(*input.storage());
    release_held(frame.held);
    on_stack.erase(&storage);
    stack.pop_back();  // unpins the inputs
  }
}

void ResidencyManager::mark_consumed(StorageImpl& storage) {
  Record& record = record_of(storage);
  if (record.consumed) return;
  record.consumed = true;
  if (!storage.producer) return;
  for (const auto& weak : storage.producer->output_storages)
    if (auto sibling = weak.lock(); sibling && sibling.get() != &storage)
      record_of(*sibling).consumed = true;
}

void ResidencyManager::hold_waiting_inputs() {
  for (std::vector<RecomputeFrame>* stack : recompute_stacks_) {
    // The top frame's inputs may be read by its replay right now.
    for (size_t i = 0; i + 1 < stack->size(); ++i) (*stack)[i].hold_pinned(*this);
  }
}

void ResidencyManager::release_held(std::vector<std::shared_ptr<StorageImpl>>& held) {
  for (const auto& storage : held)
    if (Record* record = find_record(*storage)) --record->held_for_replay;
  held.clear();
}

// ---- ResidencyHooks ----

void ResidencyManager::make_resident(StorageImpl& storage) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (storage.state() == Residency::kResident) return;
  record_of(storage);
  try {
    if (storage.state() == Residency::kOnHost) {
      swap_in(storage);
    } else {
      rematerialize(storage);
    }
  } catch (const OutOfMemory& error) {
    throw OutOfMemory(explain_out_of_memory(error.message()), error.file(), error.line());
  }
}

void ResidencyManager::on_access(StorageImpl& storage) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Record& record = record_of(storage);
  storage.last_access = ++clock_;
  if (options_.policy() != Policy::kAuto) return;
  // Tensors that no op of this step made (parameters, optimizer state, inputs) keep their storage
  // from step to step: their id names them.
  if (record.pattern_key == 0) record.pattern_key = AccessPattern::state_key(storage.id());
  record.last_position = pattern_.position();
  pattern_.read(record.pattern_key);
  // What a recompute reads is not the program's: the plan follows the program.
  if (recompute_stacks_.empty()) trace_.read(record.pattern_key, pattern_.position());
}

void ResidencyManager::on_op_recorded(const std::shared_ptr<OpCall>& call, double seconds) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  const bool in_backward = in_backward_pass();
  if (in_backward) {
    backward_seen_ = true;
  } else if (backward_seen_ && GradMode::is_enabled()) {
    backward_seen_ = false;
    // The step's first op has run: its outputs are not state the step keeps.
    boundary_output_bytes_ = 0;
    for (const auto& weak_output : call->output_storages)
      if (auto output = weak_output.lock()) boundary_output_bytes_ += output->nbytes();
    on_step_boundary();
  }
  double cost = seconds;
  const bool modelled = options_.cost_source() == CostSource::kModel && options_.cost_model();
  if (modelled || (options_.cost_source() == CostSource::kEstimated && call->op->cost)) {
    std::vector<Tensor> inputs, outputs;
    for (const auto& input : call->inputs)
      inputs.push_back(input.storage ? input.materialize() : Tensor());
    for (size_t k = 0; k < call->outputs.size(); ++k) {
      auto storage = call->output_storages[k].lock();
      const RecordedTensor& geometry = call->outputs[k];
      outputs.push_back(storage ? Tensor(make_tensor_impl(storage, geometry.sizes, geometry.strides,
                                                          geometry.offset, geometry.dtype))
                                : Tensor());
    }
    try {
      if (modelled) {
        cost = options_.cost_model()(*call->op, inputs, outputs, call->attrs);
      } else {
        OpCost estimate = call->op->cost(inputs, outputs, call->attrs);
        cost = estimate.flops / options_.estimated_flops_per_second() +
               estimate.bytes / options_.estimated_bytes_per_second();
      }
    } catch (const Error&) {
      // An op whose cost rule cannot handle these inputs keeps the measured time.
    }
  }
  call->cost_seconds = cost;
  // Backward's outputs are never recomputed (see Record::made_in_backward), so their op records
  // are not kept: kept, they would hold every upstream gradient and saved activation they read
  // as placeholders until the step ends, and join them all into one evicted component whose
  // cost then weighs on every candidate next to it.
  const bool keep = keeps_records() && !in_backward;
  for (size_t k = 0; k < call->output_storages.size(); ++k) {
    auto output = call->output_storages[k].lock();
    if (!output) continue;
    Record& output_record = record_of(*output);
    output_record.made_in_backward = in_backward;
    if (options_.policy() == Policy::kAuto) {
      output_record.pattern_key = pattern_.output_key(k);
      output_record.last_position = pattern_.position();
      pattern_.read(output_record.pattern_key);
      TracedTensor traced;
      traced.key = output_record.pattern_key;
      traced.bytes = output->nbytes();
      traced.made_at = pattern_.position();
      traced.producer_seconds = cost;
      traced.recomputable = keep && managed(*output);
      for (const auto& input : call->inputs) {
        const Record* input_record = input.storage ? find_record(*input.storage) : nullptr;
        traced.input_keys.push_back(input_record ? input_record->pattern_key : 0);
      }
      trace_.output(std::move(traced));
      if (auto_mode_ == AutoMode::kPlanned) step_tensors_[output_record.pattern_key] = output;
    }
    if (managed(*output)) largest_output_bytes_ = std::max(largest_output_bytes_, output->nbytes());
    if (keep) {
      output->producer = call;
      label(*output);
    }
  }
  if (keeps_records()) {
    for (const auto& input : call->inputs) {
      if (!input.storage) continue;
      mark_consumed(*input.storage);
      if (!keep) continue;
      Record& record = record_of(*input.storage);
      record.consumers.push_back(call);
      if (record.consumers.size() > record.consumers_pruned_at) {
        auto& consumers = record.consumers;
        consumers.erase(std::remove_if(consumers.begin(), consumers.end(),
                                       [](const std::weak_ptr<OpCall>& c) { return c.expired(); }),
                        consumers.end());
        record.consumers_pruned_at = std::max<size_t>(8, 2 * consumers.size());
      }
    }
  }
  if (options_.policy() == Policy::kAuto) {
    trace_.op(pattern_.position(), cost, in_backward);
    if (auto_mode_ == AutoMode::kPlanned) run_planned_actions(pattern_.position());
    pattern_.next_op();
    give_up_thrashing_way();
  }
  swap_ahead();
}

void ResidencyManager::make_plan() {
  StepPlanSettings settings;
  settings.budget = allocator_->budget();
  const auto allocated = static_cast<size_t>(allocator_->memory_stats().base.allocated_bytes);
  settings.state_bytes = allocated - std::min(allocated, boundary_output_bytes_);
  settings.link_bytes_per_second = link_.bandwidth();
  settings.min_bytes = candidate_threshold_;
  settings.headroom = kPlanHeadrooms[headroom_choice_];
  plan_ = plan_step(previous_trace_, settings);
}

void ResidencyManager::run_planned_actions(int64_t position) {
  for (size_t i = 0; i < waiting_prefetches_.size();) {
    auto found = step_tensors_.find(waiting_prefetches_[i]);
    auto storage = found == step_tensors_.end() ? nullptr : found->second.lock();
    Record* record = storage ? find_record(*storage) : nullptr;
    if (record && storage->state() == Residency::kOnHost && !record->pending_in &&
        !record->pending_out && !record->staged)
      prefetch(*storage);
    if (!record || storage->state() != Residency::kOnHost || record->pending_in) {
      waiting_prefetches_.erase(waiting_prefetches_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  if (position >= plan_.length()) return;
  for (const PlannedAction& action : plan_.after[position]) {
    auto found = step_tensors_.find(action.key);
    auto storage = found == step_tensors_.end() ? nullptr : found->second.lock();
    if (!storage || !managed(*storage)) continue;
    Record& record = record_of(*storage);
    if (action.kind == PlannedAction::Kind::kPrefetch) {
      if (storage->state() != Residency::kOnHost || record.pending_in || record.staged) continue;
      if (!record.pending_out) prefetch(*storage);
      if (!record.pending_in) waiting_prefetches_.push_back(action.key);
      continue;
    }
    if (storage->state() != Residency::kResident || storage->pins() > 0 ||
        !storage->data_unchecked() || record.rematerializing || record.held_for_replay > 0 ||
        record.staged)
      continue;
    if (action.kind == PlannedAction::Kind::kSwapOut) {
      start_swap_out(*storage);
    } else if (record.consumed && !record.made_in_backward && can_recompute(*storage)) {
      evict_locked(*storage, /*count_as_eviction=*/true);
    }
  }
}

void ResidencyManager::on_step_boundary() {
  ++steps_;
  pattern_.begin_step();
  if (options_.policy() == Policy::kAuto) {
    previous_trace_ = std::move(trace_);
    trace_.clear();
    step_tensors_.clear();
    waiting_prefetches_.clear();
  }
  const double now = link_.now();
  const double step_seconds = now - step_started_at_;
  step_started_at_ = now;
  if (options_.policy() != Policy::kAuto || !pressure_seen_) return;
  if (auto_mode_ == AutoMode::kPlanned) ++planned_steps_;
  // The first step (warm-up: it makes the optimizer's state) is not compared; then the chooser
  // keeps the way whose steps take least time: the step's time counts what per-tensor costs miss
  // (stalls, copies inside the device, recompute chains).
  if (steps_ < 2) return;
  way_chooser_.on_step(step_seconds);
  if (way_chooser_.way() != running_way_) use_way(way_chooser_.way());
}

// A way on trial that thrashes is given up within its step (memory/way_chooser.h): checked after
// each op and whenever an allocation waits for room, since one op's recomputes can take a step's
// time many times over.
void ResidencyManager::give_up_thrashing_way() {
  if (options_.policy() != Policy::kAuto) return;
  const double give_up_after = way_chooser_.give_up_after();
  if (give_up_after > 0 && link_.now() - step_started_at_ > give_up_after) {
    use_way(way_chooser_.give_up());
    running_way_ = -1;  // the next step takes its way afresh (a plan made at a step's start)
  }
}

void ResidencyManager::use_way(int way) {
  running_way_ = way;
  const bool planned = way >= static_cast<int>(AutoMode::kPlanned);
  auto_mode_ = planned ? AutoMode::kPlanned : static_cast<AutoMode>(way);
  if (!planned) return;
  headroom_choice_ = way - static_cast<int>(AutoMode::kPlanned);
  // The plan follows the step just run: the same program, whatever way ran it.
  make_plan();
}

// Forward under pressure (once a request has had to wait for room): keeps room for the largest
// output seen so far, free or on its way out, so the copies run while the next ops compute
// instead of while an allocation waits for them.
void ResidencyManager::swap_ahead() {
  if (!options_.swap_ahead() || !pressure_seen_ || !swaps_now() ||
      auto_mode_ == AutoMode::kRecomputeFirst || auto_mode_ == AutoMode::kPlanned ||
      !GradMode::is_enabled() || detaching_)
    return;
  const size_t room = allocator_->largest_allocatable();  // unlimited without a budget
  if (room >= largest_output_bytes_) return;
  size_t pending = in_flight_bytes();
  while (room + pending < largest_output_bytes_) {
    const Candidate victim = choose_victim();
    if (victim.action != ResidencyAction::kSwap) return;
    start_swap_out(*victim.storage);
    pending += victim.storage->nbytes();
  }
}

void ResidencyManager::on_user_release(StorageImpl& storage) {
  if (!keeps_records()) return;
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  drop_if_unreferenced(storage);
}

void ResidencyManager::on_destroy(StorageImpl& storage) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Record* record = find_record(storage);
  if (record && record->pending_out) {
    link_.wait(record->pending_out);
    record->pending_out.reset();
    in_flight_.erase(std::remove(in_flight_.begin(), in_flight_.end(), &storage), in_flight_.end());
  }
  std::shared_ptr<HostTransfer> prefetch = record ? record->pending_in : nullptr;
  if (prefetch) settle_prefetch(storage, /*keep=*/false);
  release_host_copy_after(storage, std::move(prefetch));
  if (!record) return;
  leave_component(storage);
  ++expired_storages_;  // its entry has expired with it
}

void ResidencyManager::before_write(StorageImpl& storage) {
  if (!keeps_records()) return;
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  record_of(storage);
  // An in-place update reads the old bytes: bring them back while the op record still holds.
  if (storage.state() != Residency::kResident) {
    StorageAccess access(storage);
  }

  // The op records that read these bytes (running statistics read by batch norm are not part of
  // its op record), the outputs they made, and what lies downstream of them through tensors that
  // are evicted or that nobody holds (those would be dropped below).
  std::vector<std::shared_ptr<OpCall>> readers;
  std::vector<std::shared_ptr<StorageImpl>> affected;
  std::unordered_set<StorageImpl*> seen;
  auto passes_through = [](const StorageImpl& node) {
    return node.state() == Residency::kEvicted ||
           (node.state() == Residency::kResident && node.user_refs() == 0);
  };
  auto visit_consumers = [&](StorageImpl& source, bool is_written) {
    Record* record = find_record(source);
    if (!record) return;
    for (const auto& weak_call : record->consumers) {
      auto call = weak_call.lock();
      if (!call) continue;
      if (is_written) {
        bool reads = false;
        for (size_t i = 0; i < call->inputs.size(); ++i)
          reads = reads ||
                  (call->inputs[i].storage.get() == &source && !is_mutated_input(*call->op, i));
        if (!reads) continue;
        readers.push_back(call);
      }
      for (const auto& weak_output : call->output_storages) {
        auto output = weak_output.lock();
        if (!output || output.get() == &source || !seen.insert(output.get()).second) continue;
        // Evicted with a stale op record: an earlier write already released it and everything
        // downstream (an optimizer step writes many parameters that feed one graph).
        if (output->state() == Residency::kEvicted) {
          Record* output_record = find_record(*output);
          if (output_record && output_record->producer_stale) continue;
        }
        // Direct outputs all lose their op record; further down only what recomputes through them.
        if (is_written || passes_through(*output)) affected.push_back(output);
      }
    }
  };
  visit_consumers(storage, true);
  for (size_t i = 0; i < affected.size(); ++i)
    if (passes_through(*affected[i])) visit_consumers(*affected[i], false);

  bool held_downstream = false;
  for (const auto& node : affected)
    held_downstream =
        held_downstream || (node->state() == Residency::kEvicted && node->user_refs() > 0);
  if (held_downstream) {
    // The program still holds evicted tensors that need the old bytes: keep a copy of them for
    // the op records (copy-on-write, as DTR does), so every op record stays valid.
    snapshot_for_readers(storage, readers);
  } else {
    // Nothing held needs the old bytes: what was made from them is never recomputed again, and
    // what nobody holds is of no use any more: its bytes go.
    for (const auto& node : affected) {
      record_of(*node).producer_stale = true;
      if (node->state() == Residency::kResident && node->user_refs() == 0 && node->pins() == 0 &&
          managed(*node)) {
        node->release_bytes(Residency::kEvicted);
        ++placeholders_;
      }
    }
    // The readers' op records made only stale outputs: they let go of the old bytes, so the new
    // ones are not kept for them once the program drops them (batch norm's input gradient,
    // written over its input, would otherwise stay on the device until evicted).
    for (const auto& call : readers) {
      for (size_t i = 0; i < call->inputs.size(); ++i) {
        RecordedTensor& input = call->inputs[i];
        if (input.storage.get() != &storage || is_mutated_input(*call->op, i)) continue;
        storage.release_record_ref();
        input.storage.reset();
      }
    }
  }

  // Its own op record no longer describes its bytes.
  std::shared_ptr<OpCall> old_record = std::move(storage.producer);
  storage.producer.reset();
  label(storage);
}

void ResidencyManager::snapshot_for_readers(StorageImpl& storage,
                                            const std::vector<std::shared_ptr<OpCall>>& readers) {
  auto snapshot = std::make_shared<StorageImpl>(storage.nbytes(), storage.device());
  {
    StorageAccess from(storage);
    StorageAccess to(*snapshot);
    copy_device_bytes(storage.device(), to.data(), from.data(), storage.nbytes());
  }
  Record& snapshot_record = record_of(*snapshot);
  for (const auto& call : readers) {
    for (size_t i = 0; i < call->inputs.size(); ++i) {
      RecordedTensor& input = call->inputs[i];
      if (input.storage.get() != &storage || is_mutated_input(*call->op, i)) continue;
      snapshot->add_record_ref();
      storage.release_record_ref();
      input.storage = snapshot;
      input.version = snapshot->version();
    }
    snapshot_record.consumers.push_back(call);
  }
  ++snapshots_;
  allocator_->record_event("snapshot", storage.nbytes());
}

// TESSEL_SPLIT_OPS=conv2d,relu_backward lets only the named ops run over chunks ("-": none), to
// find out which op's chunks change a result; unset, every op with a split rule may.
static bool split_allowed_by_environment(const std::string& op) {
  static const std::optional<std::unordered_set<std::string>> allowed =
      []() -> std::optional<std::unordered_set<std::string>> {
    const char* value = std::getenv("TESSEL_SPLIT_OPS");
    if (!value) return std::nullopt;
    std::unordered_set<std::string> names;
    std::stringstream list(value);
    for (std::string name; std::getline(list, name, ',');) names.insert(name);
    return names;
  }();
  return !allowed || allowed->count(op) > 0;
}

bool ResidencyManager::allow_split(const OpDef& op) {
  return (options_.policy() == Policy::kSplit || options_.policy() == Policy::kAuto) &&
         split_allowed_by_environment(op.name);
}

void ResidencyManager::on_split(const OpDef& /*op*/, int64_t /*chunks*/) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  count("split", 0);
}

// ---- PressureHandler ----

bool ResidencyManager::relieve(size_t bytes_needed, size_t largest_free_block) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (options_.policy() == Policy::kNone || detaching_) return false;
  last_request_bytes_ = bytes_needed;
  if (options_.policy() == Policy::kSplit) {
    // Prefer running the kernel in more chunks while the dispatcher can.
    const KernelInProgress* kernel = kernel_in_progress();
    if (kernel && kernel->can_split_further) return false;
  }
  if (prefetching_) return false;  // a prefetch only takes room that is free anyway
  pressure_seen_ = true;
  give_up_thrashing_way();
  // A planned prefetch was timed to be read soon: it goes back only where nothing else can.
  const bool keep_prefetches = auto_mode_ == AutoMode::kPlanned;
  if (release_finished_swaps() || (!keep_prefetches && drop_prefetch())) return true;
  // Swap-outs under way that cover the request: wait for the oldest rather than add more.
  auto wait_if_covered = [&] {
    if (in_flight_.empty() || in_flight_bytes() + largest_free_block < bytes_needed) return false;
    complete_swap_out(*in_flight_.front());
    return true;
  };
  if (wait_if_covered()) return true;
  Candidate victim = choose_victim();
  const bool recomputes_until_stuck =
      options_.policy() == Policy::kSplit || auto_mode_ == AutoMode::kRecomputeOnly;
  if (victim.action == ResidencyAction::kNone && recomputes_until_stuck) {
    // Where dtr would defragment, so do split and auto recomputing only; where dtr would fail,
    // they still swap, recomputing first (after letting go of the pinned inputs of waiting
    // recomputes): auto never fails where its other ways would not, and split, whose chunks
    // already stage operands on host, trains where a recompute chain needs more than the budget.
    if (!in_flight_.empty()) {
      complete_swap_out(*in_flight_.front());
      return true;
    }
    if (defragment(bytes_needed)) return true;
    hold_waiting_inputs();
    last_resort_ = true;
    victim = choose_victim();
    last_resort_ = false;
  }
  if (victim.action != ResidencyAction::kNone) {
    apply(victim);
    // Copies run while the next victims are chosen; wait once they cover the request.
    if (victim.action == ResidencyAction::kSwap) wait_if_covered();
    return true;
  }
  if (!in_flight_.empty()) {
    complete_swap_out(*in_flight_.front());
    return true;
  }
  if (keep_prefetches && drop_prefetch()) return true;
  return defragment(bytes_needed);
}

// Last resort when the free bytes (with the budget not reserved yet) would fit the request but no
// single block does: move a live tensor, of any size and with or without an op record, to host
// memory (it comes back elsewhere on its next access), choosing the one whose move makes room for
// the largest request: its block with its free neighbours, or its whole segment, given back, where
// it is the last tensor there.
bool ResidencyManager::defragment(size_t bytes_needed) {
  const MemoryStats stats = allocator_->memory_stats();
  if (stats.free_bytes + allocator_->unreserved_bytes() < bytes_needed) return false;
  std::vector<std::shared_ptr<StorageImpl>> pool;
  for (const Registered& entry : storages_)
    if (auto storage = entry.weak.lock()) pool.push_back(std::move(storage));
  StorageImpl* best = nullptr;
  size_t best_hole = 0;
  for (const auto& storage : pool) {
    if (!managed(*storage) || storage->state() != Residency::kResident || storage->pins() > 0 ||
        !storage->data_unchecked())
      continue;
    Record* record = find_record(*storage);
    if (!record || record->rematerializing) continue;
    const size_t hole = allocator_->room_if_freed(storage->data_unchecked());
    if (hole > best_hole || (hole == best_hole && best && storage->nbytes() < best->nbytes())) {
      best = storage.get();
      best_hole = hole;
    }
  }
  if (!best) return compact(bytes_needed);
  start_swap_out(*best);
  complete_swap_out(*best);
  ++defragment_moves_;
  return true;
}

// Every tensor left is pinned (inputs of ops waiting for their other inputs to come back), yet
// the free bytes would fit: compact. In address order, each tensor with free bytes just below it
// slides down, so the free bytes gather above the last one. Only while no kernel runs anywhere: a
// running kernel holds its tensors' addresses.
bool ResidencyManager::compact(size_t bytes_needed) {
  if (kernels_running() > 0) return false;
  const MemoryStats before = allocator_->memory_stats();
  if (before.free_bytes < bytes_needed) return false;
  std::vector<std::shared_ptr<StorageImpl>> movable;
  for (const Registered& entry : storages_) {
    auto storage = entry.weak.lock();
    if (!storage || !managed(*storage) || storage->state() != Residency::kResident ||
        !storage->data_unchecked() || storage->host_data)
      continue;
    const Record* record = find_record(*storage);
    if (record && (record->pending_out || record->pending_in)) continue;
    movable.push_back(std::move(storage));
  }
  std::sort(movable.begin(), movable.end(), [](const auto& a, const auto& b) {
    return std::less<const void*>()(a->data_unchecked(), b->data_unchecked());
  });
  for (const auto& storage : movable) {
    if (allocator_->free_bytes_below(storage->data_unchecked()) == 0) continue;
    const Device device = storage->device();
    const size_t bytes = storage->nbytes();
    const void* from = storage->data_unchecked();
    storage->moved_bytes_to(
        allocator_->slide_down(from, [&](void* to) { move_bytes_down(device, to, from, bytes); }));
    ++defragment_moves_;
  }
  return allocator_->memory_stats().largest_free_block > before.largest_free_block;
}

bool ResidencyManager::gather(const std::vector<StorageImpl*>& inputs,
                              const std::vector<size_t>& output_bytes) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (options_.policy() == Policy::kNone || detaching_) return false;
  std::vector<StorageImpl*> distinct;
  for (StorageImpl* storage : inputs)
    if (std::find(distinct.begin(), distinct.end(), storage) == distinct.end())
      distinct.push_back(storage);
  auto hole_needed = [&] {
    size_t bytes = 0;
    for (size_t output : output_bytes) bytes += CachingAllocator::round_size(output);
    for (StorageImpl* storage : distinct)
      if (storage->state() != Residency::kResident)
        bytes += CachingAllocator::round_size(storage->nbytes());
    return bytes;
  };
  // Moves tensors off the device (the policy's victims first, then defragmenting moves) until
  // one free block holds what is still to come.
  auto make_hole = [&] {
    while (true) {
      const size_t needed = hole_needed();
      const size_t largest = allocator_->memory_stats().largest_free_block;
      if (largest >= needed) return true;
      if (!relieve(needed, largest)) return false;
    }
  };
  gathering_ = true;
  struct EndGathering {
    bool& flag;
    ~EndGathering() { flag = false; }
  } end_gathering{gathering_};
  // The op's resident inputs stay where they are if the hole can be made around them.
  std::vector<StorageAccess> held;
  held.reserve(distinct.size());
  for (StorageImpl* storage : distinct)
    if (storage->state() == Residency::kResident) held.emplace_back(*storage);
  bool made = make_hole();
  held.clear();
  if (!made) made = make_hole();
  if (!made) return false;
  // Best fit places each input in the hole or in a smaller one, so the hole keeps room for the
  // rest; each stays pinned until all are in. Those not resident come first: a recompute chain
  // may then move the resident ones off (they come back after it) rather than fail beside them.
  std::stable_partition(distinct.begin(), distinct.end(), [](const StorageImpl* storage) {
    return storage->state() != Residency::kResident;
  });
  std::vector<StorageAccess> brought_back;
  brought_back.reserve(distinct.size());
  for (StorageImpl* storage : distinct) brought_back.emplace_back(*storage);
  ++gathers_;
  return true;
}

bool ResidencyManager::stage_on_host(StorageImpl& storage, bool keep_contents) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (options_.policy() == Policy::kNone || detaching_ || !managed(storage)) return false;
  Record& record = record_of(storage);
  if (storage.state() == Residency::kResident) {
    if (storage.pins() > 0) return false;
    if (keep_contents) {
      start_swap_out(storage);
      complete_swap_out(storage);
    } else {
      storage.host_data = host_allocator()->allocate(storage.nbytes(), Stream{});
      storage.release_bytes(Residency::kOnHost);
    }
  } else if (storage.state() == Residency::kOnHost) {
    if (record.pending_out) complete_swap_out(storage);
    if (record.pending_in) settle_prefetch(storage, /*keep=*/false);
  }
  if (storage.state() != Residency::kOnHost || !storage.host_data) return false;
  ++record.staged;
  return true;
}

void ResidencyManager::read_staged(StorageImpl& storage, size_t offset, size_t bytes,
                                   void* device_bytes) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  auto copy =
      link_.copy_to_device(device_bytes, static_cast<char*>(storage.host_data) + offset, bytes);
  link_.order_device_after(copy);
  count("swap_in", bytes);
}

void ResidencyManager::write_staged(StorageImpl& storage, size_t offset, size_t bytes,
                                    const void* device_bytes) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  // The device buffer is reused for the next chunk: wait for the copy.
  link_.wait(link_.copy_async(static_cast<char*>(storage.host_data) + offset, device_bytes, bytes));
  count("swap_out", bytes);
}

void ResidencyManager::end_staging(StorageImpl& storage) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (Record* record = find_record(storage)) --record->staged;
}

// ---- direct control ----

bool ResidencyManager::evict_one() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Candidate victim = choose_victim();
  if (victim.action == ResidencyAction::kNone) return false;
  apply(victim);
  if (victim.action == ResidencyAction::kSwap) complete_swap_out(*victim.storage);
  return true;
}

ResidencyAction ResidencyManager::planned_action(const StorageImpl& storage) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  prepare_assessment();
  return assess(const_cast<StorageImpl&>(storage)).action;
}

double ResidencyManager::score(const StorageImpl& storage) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  prepare_assessment();
  return assess(const_cast<StorageImpl&>(storage)).score;
}

void ResidencyManager::evict(StorageImpl& storage) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  record_of(storage);
  TESSEL_CHECK(storage.state() == Residency::kResident, "evict: storage ", storage.id(), " is ",
               residency_name(storage.state()));
  TESSEL_CHECK(storage.pins() == 0, "evict: storage ", storage.id(), " is pinned");
  TESSEL_CHECK(can_recompute(storage), "evict: storage ", storage.id(), " (",
               producer_name(storage), ") has no valid op record under policy ",
               policy_name(options_.policy()), "; only swap can move it");
  evict_locked(storage, /*count_as_eviction=*/true);
}

void ResidencyManager::swap_out(StorageImpl& storage) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  record_of(storage);
  TESSEL_CHECK(storage.state() == Residency::kResident, "swap_out: storage ", storage.id(), " is ",
               residency_name(storage.state()));
  TESSEL_CHECK(storage.pins() == 0, "swap_out: storage ", storage.id(), " is pinned");
  start_swap_out(storage);
  complete_swap_out(storage);
}

void ResidencyManager::restore_and_detach() {
  std::vector<std::shared_ptr<OpCall>> records;  // freed after the records are gone
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  detaching_ = true;
  while (!in_flight_.empty()) cancel_swap_out(*in_flight_.front());
  std::vector<std::shared_ptr<StorageImpl>> tracked;
  for (const Registered& entry : storages_)
    if (auto storage = entry.weak.lock()) tracked.push_back(std::move(storage));
  for (const auto& storage : tracked) {
    Record* record = find_record(*storage);
    if (record && record->pending_in) settle_prefetch(*storage, /*keep=*/false);
  }
  link_.wait_all();  // no copy reads a host copy any more
  free_copied_host_copies(/*wait=*/true);
  for (const auto& storage : tracked) {
    if (storage->user_refs() == 0 || storage->state() == Residency::kResident) continue;
    try {
      StorageAccess access(*storage);
    } catch (const Error&) {
      // Left evicted with its op record: a later access reports why it cannot come back.
    }
  }
  for (const auto& storage : tracked) {
    if (storage->state() == Residency::kOnHost && storage->user_refs() == 0) {
      free_host_copy(*storage);
      storage->set_state(Residency::kEvicted);
    }
    if (storage->state() == Residency::kResident || storage->user_refs() == 0)
      records.push_back(std::move(storage->producer));
    storage->residency_data.reset();
  }
  storages_.clear();
  expired_storages_ = 0;
  prefetched_.clear();
  tracked.clear();
}

void ResidencyManager::set_min_candidate_bytes(size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  options_.min_candidate_bytes(bytes);
}

void ResidencyManager::set_host_bandwidth(double bytes_per_second) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  options_.host_bandwidth(bytes_per_second);
  link_.set_bandwidth(bytes_per_second);
}

ResidencyStats ResidencyManager::stats() const {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  ResidencyStats result;
  result.policy = counters_;
  result.placeholders = placeholders_;
  result.snapshots = snapshots_;
  result.defragment_moves = defragment_moves_;
  result.gathers = gathers_;
  result.storages = static_cast<int64_t>(std::count_if(
      storages_.begin(), storages_.end(), [](const auto& entry) { return !entry.weak.expired(); }));
  result.in_flight_swaps = static_cast<int64_t>(in_flight_.size());
  result.prefetches = prefetches_;
  result.prefetch_hits = prefetch_hits_;
  result.replays_by_op = replays_by_op_;
  result.clock = clock_;
  if (options_.policy() == Policy::kAuto) {
    static const char* const kModeNames[] = {"mixed", "recompute first", "recompute only",
                                             "planned"};
    result.auto_mode = kModeNames[static_cast<int>(auto_mode_)];
    result.auto_tuning = !pressure_seen_ || way_chooser_.trying();
    result.planned_steps = planned_steps_;
    for (int way = 0; way < kAutoWays; ++way) result.ways_given_up += way_chooser_.given_up(way);
    if (plan_.length() > 0) result.plan = plan_.summary();
  }
  return result;
}

// ---- reports ----

std::string ResidencyManager::describe_holders() {
  struct Holder {
    std::shared_ptr<StorageImpl> storage;
    std::string why;
  };
  prepare_assessment();
  std::vector<Holder> holders;
  int64_t pinned = 0, without_record = 0, small = 0, candidates = 0;
  size_t pinned_bytes = 0, without_record_bytes = 0, small_bytes = 0, candidate_bytes = 0;
  for (const Registered& entry : storages_) {
    auto storage = entry.weak.lock();
    if (!storage || !managed(*storage) || storage->state() != Residency::kResident) continue;
    std::string why;
    if (storage->pins() > 0) {
      ++pinned;
      pinned_bytes += storage->nbytes();
      why = "pinned by a running op";
    } else if (storage->nbytes() < candidate_threshold_) {
      ++small;
      small_bytes += storage->nbytes();
      why = "below the minimum candidate size";
    } else if (assess(*storage).action != ResidencyAction::kNone) {
      ++candidates;
      candidate_bytes += CachingAllocator::round_size(storage->nbytes());
      why = "candidate";
    } else {
      ++without_record;
      without_record_bytes += storage->nbytes();
      Record* record = find_record(*storage);
      why = !storage->producer              ? "no op record"
            : (record && !record->consumed) ? "not read yet"
                                            : "op record no longer valid";
    }
    holders.push_back(Holder{std::move(storage), why});
  }
  std::sort(holders.begin(), holders.end(), [](const Holder& a, const Holder& b) {
    return a.storage->nbytes() != b.storage->nbytes() ? a.storage->nbytes() > b.storage->nbytes()
                                                      : a.storage->id() < b.storage->id();
  });
  std::ostringstream out;
  out << kExplainedMarker << policy_name(options_.policy()) << " (tensors of at least "
      << format_bytes(static_cast<double>(candidate_threshold_))
      << " are candidates) could not free enough: " << candidates << " candidates left";
  out << "\n    resident tensors: " << pinned << " pinned by running ops ("
      << format_bytes(static_cast<double>(pinned_bytes)) << "), " << without_record
      << " that only swap can move (" << format_bytes(static_cast<double>(without_record_bytes))
      << ": parameters, inputs, optimizer state, gradients or tensors written in place), " << small
      << " below the minimum size (" << format_bytes(static_cast<double>(small_bytes)) << ")";
  const PolicyCounters& c = counters_;
  out << "\n    so far: " << c.evictions << " evictions, " << c.recomputes << " recomputes, "
      << c.swaps_out << " swaps out, " << c.swaps_in << " swaps in, " << c.splits << " splits";
  constexpr size_t kShown = 8;
  if (!holders.empty()) out << "\n    top holders (what made them):";
  for (size_t i = 0; i < holders.size() && i < kShown; ++i) {
    const StorageImpl& storage = *holders[i].storage;
    out << "\n      " << format_bytes(static_cast<double>(storage.nbytes())) << "  "
        << producer_name(storage) << " (storage " << storage.id() << ", " << holders[i].why << ")";
  }
  const bool swaps = options_.policy() == Policy::kSwap || options_.policy() == Policy::kAuto;
  if (!swaps)
    out << "\n    tensors without an op record can only leave the device with the swap or auto "
           "policy";
  // What this policy cannot move off the device (every allocated byte but the candidates', so
  // memory the manager never saw, allocated outside ops, counts too), plus the request: a lower
  // bound on the budget this op needs (other ops of the step may need more).
  const auto allocated = static_cast<size_t>(allocator_->memory_stats().base.allocated_bytes);
  const size_t unmovable = allocated > candidate_bytes ? allocated - candidate_bytes : 0;
  out << "\n    least budget for this op under " << policy_name(options_.policy()) << ": "
      << describe_bytes(unmovable + last_request_bytes_) << ": what the policy cannot move, "
      << format_bytes(static_cast<double>(unmovable)) << ", plus the request, "
      << format_bytes(static_cast<double>(last_request_bytes_))
      << "; no smaller budget can run this step";
  return out.str();
}

std::string ResidencyManager::explain_out_of_memory(const std::string& report) {
  if (report.find(kExplainedMarker) != std::string::npos) return report;
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  return report + describe_holders();
}

}  // namespace tessel::memory
