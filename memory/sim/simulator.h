// The memory simulator: the real memory layer (caching allocator, residency manager, every
// policy) run over ops on the meta device, against a modelled device. Storages on meta get
// virtual addresses from the caching allocator (no bytes behind them), each op advances a
// simulated clock by its modelled time (SimulatedDevice; a planner device profile gives FLOPs and
// bytes over its rates plus a launch overhead), and swaps occupy a modelled host link on their
// own stream. Evictions, recomputes
// (re-dispatched on meta), swaps, splits, fragmentation and the peak come out exactly as the
// memory layer decides them, deterministically: the same program gives the same result on any
// machine at any load.
//   memory::sim::Simulation simulation(planner::simulated_device(profile));
//   auto net = models::resnet50();
//   net->to(Device::meta());  // parameters: virtual bytes
//   memory::MemoryScope scope(memory::MemoryOptions().device(Device::meta()).budget(80e9));
//   ... a training step on meta tensors ...
//   double seconds = simulation.now();
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/op.h"
#include "memory/caching_allocator.h"
#include "memory/host_allocator.h"
#include "memory/host_link.h"
#include "memory/residency_manager.h"

namespace tessel::memory::sim {

// What is simulated: an op's time on the device, and the bandwidths its copies take. A planner
// device profile gives one (planner::simulated_device: roofline rates plus a launch overhead).
struct SimulatedDevice {
  std::string name = "simulated device";
  OpCostModel op_seconds;          // the modelled time of one kernel
  double memory_bandwidth = 0;     // bytes/s inside the device (copies read and write)
  double host_link_bandwidth = 0;  // bytes/s each way between the device and host memory
};

// How budgeted allocators on meta lay out memory: segments taken on demand up to the budget, as
// on a GPU (the default), or one arena of the budget's size, as on the CPU.
enum class MemoryLayout { kSegments, kArena };

// Addresses without memory: each segment gets a fresh range of a 64-bit address space that is
// never dereferenced (nor reused, so a stale pointer can never alias a new block).
class VirtualSegmentSource : public SegmentSource {
 public:
  void* allocate_segment(size_t bytes) override;
  void free_segment(void* ptr, size_t bytes) override;
  size_t reserved_bytes() const { return reserved_; }

 private:
  uintptr_t next_ = uintptr_t{1} << 44;
  size_t reserved_ = 0;
};

// What the simulated device did since the simulation began (or since reset_counters; the clock
// itself never goes back, since copies in flight are scheduled on it).
struct SimulationCounters {
  int64_t ops = 0;             // kernels run (recomputes included)
  double compute_seconds = 0;  // their modelled time
  double stall_seconds = 0;    // time the compute stream waited for the host link
  // Copies inside the device (copy-on-write snapshots, defragmentation moves), on the compute
  // stream: reading and writing the bytes at the memory bandwidth.
  double device_copy_seconds = 0;
};

// Thrown by the op that carries the simulated clock past Simulation::set_deadline.
class DeadlinePassed : public Error {
 public:
  DeadlinePassed(std::string message, const char* file, int line)
      : Error(std::move(message), file, line) {}
};

// Installs the simulated device for its lifetime (one at a time, on one thread): a caching
// allocator for meta over virtual segments (unlimited; a MemoryScope on Device::meta() replaces
// it with a budgeted one, as on a GPU), a host allocator over virtual segments for swapped
// tensors, a copy engine for meta on the simulated clock (host link at the device's
// host_link_bandwidth) and the executor that stands for every kernel on meta. The destructor
// puts back what was there. Meta tensors made before it hold no bytes. While it lives the host
// allocator is virtual too, so no memory policy may swap real tensors meanwhile.
class Simulation {
 public:
  explicit Simulation(const SimulatedDevice& device, MemoryLayout layout = MemoryLayout::kSegments);
  ~Simulation();
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  const SimulatedDevice& device() const { return device_; }
  // Seconds of simulated time: the compute stream's clock.
  double now() const { return clock_->now(); }
  SimulatedClock& clock() { return *clock_; }
  SimulationCounters counters() const;
  void reset_counters();
  // The op that carries the clock past `seconds` throws DeadlinePassed (infinity: never): a
  // search over budgets or batches stops a run that thrashes instead of simulating all of it.
  void set_deadline(double seconds);
  // The host link bandwidth swaps run at (MemoryOptions::host_bandwidth for a scope on meta).
  double host_bandwidth() const { return device_.host_link_bandwidth; }

 private:
  class Executor;
  class Engine;

  SimulatedDevice device_;
  std::shared_ptr<SimulatedClock> clock_;
  SimulationCounters counters_;  // stall_seconds filled in by counters()
  double deadline_;
  std::shared_ptr<VirtualSegmentSource> source_;
  std::shared_ptr<Executor> executor_;
  std::shared_ptr<MetaExecutor> previous_executor_;
  std::shared_ptr<Allocator> previous_allocator_;
  std::shared_ptr<HostAllocator> previous_host_allocator_;
  std::shared_ptr<CopyEngine> previous_engine_;
  double stall_base_ = 0;  // the clock's stalls before reset_counters
};

}  // namespace tessel::memory::sim
