// The residency manager: core's ResidencyHooks and the caching allocator's PressureHandler. It
// keeps an access clock, the op record and cost of every tensor, and under memory pressure evicts
// (to recompute later, DTR), swaps to host, or lets the dispatcher split an op (MegTaiChi).
//   auto manager = std::make_shared<ResidencyManager>(allocator, ResidencyOptions(Policy::kDtr));
//   allocator->set_pressure_handler(manager.get());  set_residency_hooks(manager);
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/arg.h"
#include "core/op.h"
#include "core/storage.h"
#include "memory/access_pattern.h"
#include "memory/caching_allocator.h"
#include "memory/host_allocator.h"
#include "memory/host_link.h"
#include "memory/step_plan.h"
#include "memory/way_chooser.h"

namespace tessel::memory {

// What to do when a request does not fit the budget.
enum class Policy {
  kNone,   // nothing: out of memory is an error
  kDtr,    // evict tensors that have an op record, recompute them on access
  kSwap,   // copy tensors to host memory, copy them back on access
  kSplit,  // evict (dtr); run an op in chunks when its working memory does not fit, keeping
           // operands on host chunk by chunk when they do not fit whole; swap where stuck
  kAuto,   // per tensor, swap or recompute, whichever costs less; split when neither is enough
};
const char* policy_name(Policy policy);
// "none", "dtr", "swap", "split", "auto"; anything else is an error listing them.
Policy parse_policy(const std::string& name);

// Where an op record's cost comes from: the measured kernel time (default), an estimate from the
// op's registered cost (FLOPs and bytes), or a cost model given as a function (the memory
// simulator's device model); the last two make decisions independent of timing.
enum class CostSource { kMeasured, kEstimated, kModel };
using OpCostModel = std::function<double(const OpDef& op, const std::vector<Tensor>& inputs,
                                         const std::vector<Tensor>& outputs, const Attrs& attrs)>;

class ResidencyOptions {
 public:
  ResidencyOptions(Policy policy = Policy::kDtr) : policy_(policy) {}  // NOLINT: implicit
  // Score about sqrt(N) candidates drawn with a generator seeded by `seed` instead of all N.
  ResidencyOptions& sample_candidates(bool value, uint64_t seed = 0) {
    sample_candidates_ = value;
    sample_seed_ = seed;
    return *this;
  }
  // The device behind CostSource::kEstimated: FLOPs and bytes of memory traffic per second.
  ResidencyOptions& estimated_throughput(double flops_per_second, double bytes_per_second) {
    estimated_flops_per_second_ = flops_per_second;
    estimated_bytes_per_second_ = bytes_per_second;
    return *this;
  }
  // Op record costs from `model` (CostSource::kModel).
  ResidencyOptions& cost_model(OpCostModel model) {
    cost_model_ = std::move(model);
    cost_source(CostSource::kModel);
    return *this;
  }
  const OpCostModel& cost_model() const { return cost_model_; }
  bool sample_candidates() const { return sample_candidates_; }
  uint64_t sample_seed() const { return sample_seed_; }
  double estimated_flops_per_second() const { return estimated_flops_per_second_; }
  double estimated_bytes_per_second() const { return estimated_bytes_per_second_; }

  TESSEL_ARG(Policy, policy);
  // Tensors smaller than this share of the mean size of the resident tensors are never evicted
  // or swapped (the DTR paper's rule: 1%), so the threshold follows the model: a small model's
  // tensors stay candidates, and the many tiny tensors of a large one are left alone.
  TESSEL_ARG(double, min_candidate_share) = 0.01;
  // A floor in bytes on top of that share (0: none).
  TESSEL_ARG(size_t, min_candidate_bytes) = 0;
  // Host link bandwidth in bytes per second (<= 0: unthrottled).
  TESSEL_ARG(double, host_bandwidth) = HostLink::kDefaultBandwidth;
  TESSEL_ARG(CostSource, cost_source) = CostSource::kMeasured;
  // In backward, copy swapped tensors back ahead of need (the next ones backward will read, in
  // reverse order of their last use) while free memory allows; on by default.
  TESSEL_ARG(bool, prefetch) = true;
  // In forward under pressure, start swap-outs before an allocation must wait for them, keeping
  // room for the largest output seen; on by default.
  TESSEL_ARG(bool, swap_ahead) = true;
  // auto: a trial step that runs this many times the best estimate of its ways so far is given
  // up, with its way (memory/way_chooser.h); above 1.
  TESSEL_ARG(double, auto_give_up_factor) = 3;

 private:
  bool sample_candidates_ = false;
  uint64_t sample_seed_ = 0;
  // A rough CPU core pair; only the ratios to each other and to host_bandwidth matter.
  double estimated_flops_per_second_ = 5e10;
  double estimated_bytes_per_second_ = 1e10;
  OpCostModel cost_model_;
};

// How a candidate would leave the device.
enum class ResidencyAction { kNone, kRecompute, kSwap };
const char* action_name(ResidencyAction action);

// The manager's own counts (the allocator's PolicyCounters hold evictions, recomputes, swaps and
// splits as well; these add what only the manager sees).
struct ResidencyStats {
  PolicyCounters policy;
  int64_t placeholders = 0;      // dropped tensors kept as evicted placeholders for op records
  int64_t snapshots = 0;         // copies of overwritten bytes kept for op records (copy-on-write)
  int64_t defragment_moves = 0;  // tensors moved to host or slid down to join free blocks
  int64_t gathers = 0;           // ops run again with one hole made for their inputs and outputs
  int64_t storages = 0;          // storages tracked now
  int64_t in_flight_swaps = 0;   // swap-outs whose copy has not been released yet
  int64_t prefetches = 0;        // swap-ins started ahead of need
  int64_t prefetch_hits = 0;     // prefetched tensors read before memory pressure dropped them
  int64_t clock = 0;             // logical access clock
  // Replays since installation by op name: how often, the bytes they brought back and their
  // cost (the op records' seconds): which ops a policy recomputes, and what that costs.
  struct Replays {
    int64_t count = 0;
    int64_t bytes = 0;
    double seconds = 0;
  };
  std::map<std::string, Replays> replays_by_op;
  // auto only: how it chooses, "mixed" (recompute or swap, whichever the tensor's costs favour),
  // "recompute first" (swap only what cannot be recomputed), "recompute only" (swap only where
  // nothing else frees room) or "planned" (a plan made from the previous step), and whether it is
  // still trying them; empty under other policies.
  const char* auto_mode = "";
  bool auto_tuning = false;
  int64_t planned_steps = 0;  // auto: steps run under a plan made from the previous step
  int64_t ways_given_up = 0;  // auto: ways whose trial step thrashed (memory/way_chooser.h)
  std::string plan;           // auto: the last plan's summary (StepPlan::summary), if any
};

class ResidencyManager : public ResidencyHooks, public PressureHandler {
 public:
  // Manages the storages of `allocator` (others it only tracks). Install it with
  // allocator->set_pressure_handler(this) and set_residency_hooks(shared_ptr).
  ResidencyManager(std::shared_ptr<CachingAllocator> allocator, ResidencyOptions options);
  ~ResidencyManager() override;
  ResidencyManager(const ResidencyManager&) = delete;
  ResidencyManager& operator=(const ResidencyManager&) = delete;

  // ResidencyHooks.
  void make_resident(StorageImpl& storage) override;
  void on_access(StorageImpl& storage) override;
  void on_op_recorded(const std::shared_ptr<OpCall>& call, double seconds) override;
  void on_user_release(StorageImpl& storage) override;
  void on_destroy(StorageImpl& storage) override;
  void before_write(StorageImpl& storage) override;
  bool allow_split(const OpDef& op) override;
  void on_split(const OpDef& op, int64_t chunks) override;
  std::string explain_out_of_memory(const std::string& report) override;
  bool gather(const std::vector<StorageImpl*>& inputs,
              const std::vector<size_t>& output_bytes) override;
  bool stage_on_host(StorageImpl& storage, bool keep_contents) override;
  void read_staged(StorageImpl& storage, size_t offset, size_t bytes, void* device_bytes) override;
  void write_staged(StorageImpl& storage, size_t offset, size_t bytes,
                    const void* device_bytes) override;
  void end_staging(StorageImpl& storage) override;

  // PressureHandler: frees room for one more try (evicts or swaps one candidate, or releases a
  // finished swap-out); false when nothing can be freed.
  bool relieve(size_t bytes_needed, size_t largest_free_block) override;

  // Evicts (or swaps) the candidate with the smallest score now; false when there is none.
  bool evict_one();
  // What relieve would do with `storage`: kNone when it is not a candidate now.
  ResidencyAction planned_action(const StorageImpl& storage);
  // The eviction score of a candidate (smaller goes first); infinity for a non-candidate.
  double score(const StorageImpl& storage);
  // Forces `storage` off the device: evicts it (it needs a valid op record) or swaps it to host.
  // Throws naming the reason when it is pinned, not resident, or cannot be recomputed.
  void evict(StorageImpl& storage);
  void swap_out(StorageImpl& storage);
  // Waits for queued swap-outs and releases their device bytes.
  void finish_swaps();

  // Brings back every storage the program still holds that is evicted or on host, then forgets
  // every op record and per-storage record (before the manager is uninstalled).
  void restore_and_detach();

  const ResidencyOptions& options() const { return options_; }
  void set_min_candidate_bytes(size_t bytes);
  // The size below which no tensor is a candidate now.
  size_t candidate_threshold();
  void set_host_bandwidth(double bytes_per_second);
  ResidencyStats stats() const;
  // Whether auto is still trying its ways (once memory has been short; 35 to 63 steps): a
  // measurement of its steady state waits until this is false. False for the other policies.
  bool auto_trying() const;
  CachingAllocator& allocator() const { return *allocator_; }
  HostLink& host_link() { return link_; }

 private:
  struct Record;
  struct Component;
  struct Candidate {
    StorageImpl* storage;
    ResidencyAction action;
    double score;
  };

  static std::shared_ptr<Component> find_root(std::shared_ptr<Component> component);
  Record& record_of(StorageImpl& storage);
  void register_storage(StorageImpl& storage);
  Record* find_record(const StorageImpl& storage) const;
  bool keeps_records() const;
  bool swaps_now() const;  // swap is among the ways out now (auto: not while recomputing only)
  bool managed(const StorageImpl& storage) const;
  bool can_recompute(StorageImpl& storage);
  using CandidatePool = std::vector<std::shared_ptr<StorageImpl>>;
  // Before assessing candidates: sets candidate_threshold_ from the resident tensors now
  // (min_candidate_share of their mean size, at least min_candidate_bytes) and
  // link_backlog_seconds_ from the host link. Returns, from the same walk over the registry, the
  // resident unpinned tensors at or above the threshold (in id order), whom a victim choice ranks.
  CandidatePool prepare_assessment();
  // Which tensors a round of victim choice leaves alone, from the first round to the last.
  enum class Spare {
    kStateAndForwardReads,  // state (no op record from forward: parameters, optimizer state,
                            // inputs, gradients) and what kForwardReads spares
    kForwardReads,          // tensors forward has read back (while gradients are recorded)
                            // and inputs held for a waiting recompute
    kNothing,
  };
  // Candidate action and score; action kNone for a non-candidate or one `spare` leaves alone.
  // recompute_only: a tensor that can be recomputed is, even where swapping it costs less.
  Candidate assess(StorageImpl& storage, Spare spare = Spare::kNothing,
                   bool recompute_only = false);
  // DTR's cost of evicting it: its op plus its evicted neighbourhood (the union-find bound).
  double recompute_cost(StorageImpl& storage);
  // Whether recomputing it would hold more than the budget at once (it and its op's inputs).
  bool exceeds_budget_to_recompute(const StorageImpl& storage) const;
  double evicted_neighbourhood_cost(StorageImpl& storage);
  std::vector<StorageImpl*> evicted_neighbours(StorageImpl& storage);
  // The candidate with the smallest score, sparing (while gradients are recorded) tensors that
  // forward has read back before, unless nothing else is left.
  Candidate choose_victim();
  // The best-scored candidate; with `recompute_only`, the best of those to be recomputed.
  Candidate choose_victim_among_candidates(const CandidatePool& pool, Spare spare,
                                           bool recompute_only = false);
  void apply(const Candidate& victim);
  void evict_locked(StorageImpl& storage, bool count_as_eviction);
  void start_swap_out(StorageImpl& storage);
  bool release_finished_swaps();
  size_t in_flight_bytes() const;  // of the swap-outs under way
  void complete_swap_out(StorageImpl& storage);
  void cancel_swap_out(StorageImpl& storage);
  void swap_in(StorageImpl& storage);
  // Frees `storage`'s host copy now, or once `copy` (which reads it) is done.
  void release_host_copy_after(StorageImpl& storage, std::shared_ptr<HostTransfer> copy);
  // Frees the host copies whose copies are done; with `wait`, waits for all of them first.
  void free_copied_host_copies(bool wait);
  // Starts swap-ins of the on-host tensors last used just before `clock` (backward reads them
  // next), while free memory allows.
  void prefetch_before(int64_t clock);
  // Under pressure: gives back the device bytes of the prefetched tensor needed last.
  bool drop_prefetch();
  void swap_ahead();
  // A training step begins (the first forward op after a backward pass): auto's tuning.
  void on_step_boundary();
  // Waits for a prefetch copy of `storage`, keeping its device bytes (true) or dropping them.
  void settle_prefetch(StorageImpl& storage, bool keep);
  void rematerialize(StorageImpl& storage);
  // Lets go of the pinned inputs of recomputes waiting for another input (held_for_replay
  // instead): they may then be swapped.
  void hold_waiting_inputs();
  void replay(OpCall& record);
  void drop_if_unreferenced(StorageImpl& storage);
  bool defragment(size_t bytes_needed);
  bool compact(size_t bytes_needed);
  // Ends the hold rematerialize() put on inputs waiting for their recompute (held_for_replay).
  void release_held(std::vector<std::shared_ptr<StorageImpl>>& held);
  void snapshot_for_readers(StorageImpl& storage,
                            const std::vector<std::shared_ptr<OpCall>>& readers);
  void mark_consumed(StorageImpl& storage);  // and the other outputs of its op record
  void join_component(StorageImpl& storage);
  void leave_component(StorageImpl& storage);
  void label(StorageImpl& storage);
  void count(const char* kind, size_t bytes);
  std::string describe_holders();

  const uint64_t serial_;
  std::shared_ptr<CachingAllocator> allocator_;
  ResidencyOptions options_;
  HostLink link_;
  mutable std::recursive_mutex mutex_;
  // Every storage with a record, by id (a deterministic order), walked at every victim choice:
  // a vector, as walking a map cost more than the choice itself. The entries of destroyed
  // storages expire and are dropped when a new entry comes (never during a walk). Walks read the
  // storage through `raw` while `weak` has not expired and take a strong reference only for the
  // few they keep: under the mutex a storage cannot finish its destructor (on_destroy waits).
  struct Registered {
    uint64_t id;
    StorageImpl* raw;
    std::weak_ptr<StorageImpl> weak;
    StorageImpl* live() const { return weak.expired() ? nullptr : raw; }
  };
  std::vector<Registered> storages_;
  size_t expired_storages_ = 0;                  // entries whose storage is gone, not yet dropped
  std::map<uint64_t, StorageImpl*> prefetched_;  // by id: storages with a prefetch not yet read
  std::vector<const Registered*> resident_;      // prepare_assessment's scratch
  std::vector<StorageImpl*> in_flight_;          // swap-outs in submission order
  struct RecomputeFrame;
  std::vector<std::vector<RecomputeFrame>*> recompute_stacks_;  // rematerialize()s under way
  // Host copies of swapped-in tensors, freed once the copies issued on the device have read them.
  struct HostRelease {
    std::shared_ptr<HostAllocator> allocator;
    void* host;
    size_t bytes;
    std::shared_ptr<HostTransfer> copy;
  };
  std::vector<HostRelease> host_releases_;
  int64_t clock_ = 0;
  PolicyCounters counters_;
  int64_t placeholders_ = 0;
  bool detaching_ = false;  // restoring before uninstall: nothing new leaves the device
  int64_t snapshots_ = 0;
  int64_t defragment_moves_ = 0;
  int64_t gathers_ = 0;
  int64_t prefetches_ = 0;
  int64_t prefetch_hits_ = 0;
  std::map<std::string, ResidencyStats::Replays> replays_by_op_;
  bool gathering_ = false;           // gather() is making one hole: prefetches must not take it
  bool prefetching_ = false;         // a prefetch allocates: pressure must not evict for it
  bool last_resort_ = false;         // split / auto recomputing only: swapping where stuck
  bool pressure_seen_ = false;       // a request has not fitted since installation
  size_t last_request_bytes_ = 0;    // the allocation relieve() was last asked to make room for
  size_t largest_output_bytes_ = 0;  // of the managed op outputs recorded
  size_t candidate_threshold_ = 0;   // tensors below it are no candidates (see the options)
  double link_backlog_seconds_ = 0;  // until the copies queued on the host link are done
  // auto's ways of choosing. Mixed takes, per tensor, whichever of recompute and swap costs
  // less, but a swap stalls the step when its copy cannot hide behind compute (a slow link, or a
  // tensor needed soon), which per-tensor costs do not see; recompute first swaps only what
  // cannot be recomputed (state, when every activation is gone), and recompute only swaps only
  // where nothing else frees room (it never swaps ahead); planned runs the plan made from the
  // previous step (StepPlan: swaps start after their tensor's last forward read and come back
  // ahead of backward's first read, drops for recompute likewise), meets pressure the plan did not
  // foresee as recompute first does, and keeps its prefetches until nothing else frees room. The
  // plan leaves a part of the budget for what it does not reckon with (fragmentation, tensors
  // recomputed on the way): planned is two ways, one per headroom. Once memory has been short,
  // way_chooser_ keeps the fastest by the steps' times (memory/way_chooser.h: a trial of each in
  // that order, then a second one of those close to the best).
  enum class AutoMode { kMixed, kRecomputeFirst, kRecomputeOnly, kPlanned };
  static constexpr int kPlanHeadroomChoices = 2;
  static constexpr double kPlanHeadrooms[kPlanHeadroomChoices] = {0.1, 0.3};
  static constexpr int kAutoWays = 3 + kPlanHeadroomChoices;
  void use_way(int way);  // sets auto_mode_ and headroom_choice_ (a new plan for planned ways)
  void give_up_thrashing_way();
  AutoMode auto_mode_ = AutoMode::kMixed;
  int headroom_choice_ = 0;
  int running_way_ = 0;  // way_chooser_'s way as last applied by use_way (-1 in a step given up)
  WayChooser way_chooser_;
  int64_t steps_ = 0;           // training steps begun after the first
  bool backward_seen_ = false;  // a backward pass ran since the step began
  double step_started_at_ = 0;  // on the host link's clock (simulated, or wall time)

  AccessPattern pattern_;  // auto: which tensors each op of a step reads, this step and the last
  // auto: what this step runs and makes, the previous step's, and the plan made from it.
  StepTrace trace_, previous_trace_;
  StepPlan plan_;
  std::unordered_map<uint64_t, std::weak_ptr<StorageImpl>> step_tensors_;  // by pattern key
  std::vector<uint64_t> waiting_prefetches_;  // planned prefetches that found no room yet
  size_t boundary_output_bytes_ = 0;          // made by the op that began the step
  int64_t planned_steps_ = 0;
  void make_plan();
  void run_planned_actions(int64_t position);
  void prefetch(StorageImpl& storage);  // starts a swap-in ahead of need into free room
  std::mt19937_64 sampler_;
};

}  // namespace tessel::memory
