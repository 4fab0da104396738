#include "memory/memory_json.h"

#include <fstream>

#include "core/error.h"

namespace tessel::memory {

nlohmann::json stats_json(const MemoryStats& stats) {
  const PolicyCounters& policy = stats.policy;
  return {
      {"allocated_bytes", stats.base.allocated_bytes},
      {"peak_allocated_bytes", stats.base.peak_allocated_bytes},
      {"reserved_bytes", stats.base.reserved_bytes},
      {"requested_bytes", stats.requested_bytes},
      {"num_allocations", stats.base.num_allocations},
      {"num_frees", stats.base.num_frees},
      {"budget", stats.budget},
      {"free_bytes", stats.free_bytes},
      {"free_blocks", stats.free_blocks},
      {"largest_free_block", stats.largest_free_block},
      {"fragmentation", stats.fragmentation},
      {"segments", stats.segments},
      {"pressure_calls", stats.pressure_calls},
      {"ooms", stats.ooms},
      {"policy",
       {{"evictions", policy.evictions},
        {"evicted_bytes", policy.evicted_bytes},
        {"recomputes", policy.recomputes},
        {"recomputed_bytes", policy.recomputed_bytes},
        {"swaps_out", policy.swaps_out},
        {"swapped_out_bytes", policy.swapped_out_bytes},
        {"swaps_in", policy.swaps_in},
        {"swapped_in_bytes", policy.swapped_in_bytes},
        {"splits", policy.splits}}},
  };
}

nlohmann::json snapshot_json(const CachingAllocator& allocator) {
  std::vector<BlockInfo> blocks = allocator.snapshot();
  uintptr_t lowest = blocks.empty() ? 0 : blocks.front().address;
  nlohmann::json result = nlohmann::json::array();
  for (const BlockInfo& block : blocks) {
    result.push_back({{"address", block.address},
                      {"offset", block.address - lowest},
                      {"size", block.size},
                      {"allocated", block.allocated},
                      {"owner", block.owner},
                      {"requested", block.requested},
                      {"segment", block.segment},
                      {"allocated_at", block.allocated_at}});
  }
  return result;
}

nlohmann::json timeline_json(const CachingAllocator& allocator) {
  nlohmann::json result = nlohmann::json::array();
  for (const TimelineEvent& event : allocator.timeline()) {
    result.push_back({{"clock", event.clock},
                      {"kind", event.kind},
                      {"bytes", event.bytes},
                      {"allocated_after", event.allocated_after},
                      {"reserved_after", event.reserved_after},
                      {"address", event.address}});
  }
  return result;
}

nlohmann::json memory_json(const CachingAllocator& allocator) {
  return {{"device", allocator.device().str()},
          {"stats", stats_json(allocator.memory_stats())},
          {"blocks", snapshot_json(allocator)},
          {"timeline", timeline_json(allocator)},
          {"timeline_dropped", allocator.timeline_dropped()}};
}

void write_memory_json(const std::string& path, const CachingAllocator& allocator) {
  std::ofstream out(path);
  TESSEL_CHECK(out.good(), "write_memory_json: cannot open '", path, "' for writing");
  out << memory_json(allocator).dump(1) << '\n';
  out.close();
  TESSEL_CHECK(out.good(), "write_memory_json: writing '", path, "' failed (disk full?)");
}

}  // namespace tessel::memory
