#include "memory/sim/simulator.h"

#include <algorithm>
#include <limits>
#include <string>

#include "core/error.h"

namespace tessel::memory::sim {

namespace {

// The one simulation alive (Simulation checks there is at most one); the meta allocator maker,
// a plain function, reads its segment source from here.
std::shared_ptr<VirtualSegmentSource> active_source;
MemoryLayout active_layout = MemoryLayout::kSegments;

std::shared_ptr<CachingAllocator> make_meta_allocator(Device device,
                                                      const CachingAllocatorOptions& options) {
  TESSEL_CHECK(active_source != nullptr, "memory budget on meta: no memory simulation is active");
  CachingAllocatorOptions laid_out = options;
  laid_out.arena(active_layout == MemoryLayout::kArena);
  return std::make_shared<CachingAllocator>(device, laid_out, active_source);
}

}  // namespace

void* VirtualSegmentSource::allocate_segment(size_t bytes) {
  // Page-aligned ranges with a gap, like real segments (never adjacent by accident).
  constexpr uintptr_t kAlignment = uintptr_t{2} << 20;
  void* segment = reinterpret_cast<void*>(next_);
  next_ += (static_cast<uintptr_t>(bytes) + 2 * kAlignment - 1) / kAlignment * kAlignment;
  reserved_ += bytes;
  return segment;
}

void VirtualSegmentSource::free_segment(void* /*ptr*/, size_t bytes) { reserved_ -= bytes; }

// Stands for every kernel on meta: advances the clock by the op's modelled time.
class Simulation::Executor : public MetaExecutor {
 public:
  Executor(const SimulatedDevice& device, SimulatedClock& clock, SimulationCounters& counters,
           const double& deadline)
      : device_(device), clock_(clock), counters_(counters), deadline_(deadline) {}
  double seconds(const OpDef& op, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& outputs, const Attrs& attrs) override {
    return device_.op_seconds(op, inputs, outputs, attrs);
  }
  void run(const KernelContext& context) override {
    const double time = seconds(context.op, context.inputs, context.outputs, context.attrs);
    clock_.advance(time);
    ++counters_.ops;
    counters_.compute_seconds += time;
    if (clock_.now() > deadline_)
      throw DeadlinePassed("simulated time passed its deadline of " + std::to_string(deadline_) +
                               " s in " + context.op.name,
                           __FILE__, __LINE__);
  }

 private:
  const SimulatedDevice& device_;
  SimulatedClock& clock_;
  SimulationCounters& counters_;
  const double& deadline_;
};

// The copy engine of meta: host-link copies run on the simulated clock (HostLink asks for it);
// copies inside the device (copy-on-write snapshots, defragmentation moves) take the time of
// reading and writing the bytes at the memory bandwidth, on the compute stream.
class Simulation::Engine : public CopyEngine {
 public:
  Engine(const SimulatedDevice& device, SimulatedClock& clock, SimulationCounters& counters)
      : device_(device), clock_(clock), counters_(counters) {}
  std::shared_ptr<void> prepare(void*, const void*, size_t) override { return nullptr; }
  void copy(void*, const void*, size_t bytes, const std::shared_ptr<void>&) override {
    const double time = 2.0 * static_cast<double>(bytes) / device_.memory_bandwidth;
    clock_.advance(time);
    counters_.device_copy_seconds += time;
  }
  SimulatedClock* simulated_clock() override { return &clock_; }

 private:
  const SimulatedDevice& device_;
  SimulatedClock& clock_;
  SimulationCounters& counters_;
};

Simulation::Simulation(const SimulatedDevice& device, MemoryLayout layout)
    : device_(device),
      clock_(std::make_shared<SimulatedClock>()),
      deadline_(std::numeric_limits<double>::infinity()),
      source_(std::make_shared<VirtualSegmentSource>()) {
  TESSEL_CHECK(active_source == nullptr, "a memory simulation is already active (one at a time)");
  TESSEL_CHECK(device_.op_seconds != nullptr, "memory simulation of '", device_.name,
               "': no op time model");
  TESSEL_CHECK(device_.memory_bandwidth > 0 && device_.host_link_bandwidth > 0,
               "memory simulation of '", device_.name,
               "': memory_bandwidth and host_link_bandwidth must be positive, got ",
               device_.memory_bandwidth, " and ", device_.host_link_bandwidth, " bytes/s");
  active_source = source_;
  active_layout = layout;
  executor_ = std::make_shared<Executor>(device_, *clock_, counters_, deadline_);
  previous_executor_ = set_meta_executor(executor_);
  set_caching_allocator_maker(DeviceType::kMeta, make_meta_allocator);
  previous_allocator_ = set_allocator(
      DeviceType::kMeta,
      std::make_shared<CachingAllocator>(Device::meta(), CachingAllocatorOptions{}, source_));
  host_allocator();  // the process-wide one exists, to be put back
  previous_host_allocator_ = set_host_allocator(std::make_shared<HostAllocator>(source_));
  previous_engine_ = copy_engine_for(DeviceType::kMeta);
  set_copy_engine(DeviceType::kMeta, std::make_shared<Engine>(device_, *clock_, counters_));
}

Simulation::~Simulation() {
  set_copy_engine(DeviceType::kMeta, previous_engine_);
  set_host_allocator(previous_host_allocator_);
  set_allocator(DeviceType::kMeta, previous_allocator_);
  set_caching_allocator_maker(DeviceType::kMeta, nullptr);
  set_meta_executor(previous_executor_);
  active_source.reset();
}

SimulationCounters Simulation::counters() const {
  SimulationCounters counters = counters_;
  counters.stall_seconds = clock_->stalled_seconds() - stall_base_;
  return counters;
}

void Simulation::reset_counters() {
  counters_ = {};
  stall_base_ = clock_->stalled_seconds();
}

void Simulation::set_deadline(double seconds) { deadline_ = seconds; }

}  // namespace tessel::memory::sim
