// Memory snapshots and timelines as JSON, for tools/plot_memory.py and for people reading them.
// write_memory_json writes {"device", "stats", "blocks": [...], "timeline": [...]}.
//   memory::write_memory_json("memory.json", *allocator);   // then: tools/plot_memory.py
//   memory.json
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "memory/caching_allocator.h"

namespace tessel::memory {

nlohmann::json stats_json(const MemoryStats& stats);
// Every block in address order: address, offset (from the lowest segment), size, allocated,
// owner, requested, segment, allocated_at.
nlohmann::json snapshot_json(const CachingAllocator& allocator);
// Kept events, oldest first: clock, kind, bytes, allocated_after, reserved_after, address.
nlohmann::json timeline_json(const CachingAllocator& allocator);
// {"device", "stats", "blocks", "timeline", "timeline_dropped"}.
nlohmann::json memory_json(const CachingAllocator& allocator);
// Writes memory_json(allocator) to `path`; throws tessel::Error when the file cannot be written.
void write_memory_json(const std::string& path, const CachingAllocator& allocator);

}  // namespace tessel::memory
