// ReservedSegmentSource over a counting source: segments come from one reservation taken up
// front, freed ones are reused and joined, and the source is asked again only when every
// reservation is full (doubling what is reserved), or for exactly a segment when it is short.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "memory/host_allocator.h"
#include "tests/testing.h"

namespace tessel::memory {
namespace {

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * 1024;

// Host memory with a call log and an optional cap on one request, like cudaHostAlloc refusing
// a large pin.
class CountingSource : public SegmentSource {
 public:
  std::vector<size_t> requests;  // every allocate_segment, granted or not
  int64_t live = 0;
  size_t largest_granted = SIZE_MAX;

  void* allocate_segment(size_t bytes) override {
    requests.push_back(bytes);
    if (bytes > largest_granted) return nullptr;
    ++live;
    return std::aligned_alloc(ReservedSegmentSource::kAlignment, bytes);
  }
  void free_segment(void* ptr, size_t) override {
    --live;
    std::free(ptr);
  }
};

TEST(ReservedSegments, SegmentsComeFromOneReservationTakenOnTheFirstRequest) {
  auto source = std::make_shared<CountingSource>();
  {
    ReservedSegmentSource reserved(source, 8 * kMiB);
    EXPECT_EQ(reserved.reservations(), 0);
    std::vector<void*> segments;
    for (int i = 0; i < 4; ++i) segments.push_back(reserved.allocate_segment(2 * kMiB));
    EXPECT_EQ(source->requests, std::vector<size_t>{8 * kMiB});
    EXPECT_EQ(reserved.reserved_bytes(), 8 * kMiB);
    // Distinct, page-aligned, non-overlapping and writable.
    for (size_t i = 0; i < segments.size(); ++i) {
      ASSERT_NE(segments[i], nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(segments[i]) % ReservedSegmentSource::kAlignment, 0u);
      std::memset(segments[i], static_cast<int>(i), 2 * kMiB);
    }
    for (size_t i = 0; i < segments.size(); ++i)
      EXPECT_EQ(static_cast<unsigned char*>(segments[i])[2 * kMiB - 1], i);
    for (void* segment : segments) reserved.free_segment(segment, 2 * kMiB);
    EXPECT_EQ(source->live, 1);  // the reservation stays for the next segments
  }
  EXPECT_EQ(source->live, 0);  // given back with the pool
}

TEST(ReservedSegments, FreedNeighboursJoinSoALargerSegmentFitsWithoutGrowing) {
  auto source = std::make_shared<CountingSource>();
  ReservedSegmentSource reserved(source, 6 * kMiB);
  void* a = reserved.allocate_segment(2 * kMiB);
  void* b = reserved.allocate_segment(2 * kMiB);
  void* c = reserved.allocate_segment(2 * kMiB);
  reserved.free_segment(c, 2 * kMiB);
  reserved.free_segment(a, 2 * kMiB);
  reserved.free_segment(b, 2 * kMiB);  // joins both neighbours
  void* whole = reserved.allocate_segment(6 * kMiB);
  EXPECT_EQ(whole, a);
  EXPECT_EQ(reserved.reservations(), 1);
  EXPECT_EQ(source->requests.size(), 1u);
  // Sizes are rounded to pages on both sides: an odd size frees what it took.
  reserved.free_segment(whole, 6 * kMiB);
  void* odd = reserved.allocate_segment(5 * kKiB);
  reserved.free_segment(odd, 5 * kKiB);
  EXPECT_EQ(reserved.allocate_segment(6 * kMiB), a);
}

TEST(ReservedSegments, AFullPoolGrowsRarelyByDoublingWhatIsReserved) {
  auto source = std::make_shared<CountingSource>();
  ReservedSegmentSource reserved(source, 4 * kMiB);
  for (int i = 0; i < 14; ++i) ASSERT_NE(reserved.allocate_segment(2 * kMiB), nullptr);
  // 28 MiB in 2 MiB segments: reservations of 4, 4, 8 and 16 MiB, four requests in all.
  const std::vector<size_t> requests = {4 * kMiB, 4 * kMiB, 8 * kMiB, 16 * kMiB};
  EXPECT_EQ(source->requests, requests);
  EXPECT_EQ(reserved.reserved_bytes(), 32 * kMiB);
  // A segment larger than a doubling gets a reservation of its own size.
  ASSERT_NE(reserved.allocate_segment(100 * kMiB), nullptr);
  EXPECT_EQ(source->requests.back(), 100 * kMiB);
}

TEST(ReservedSegments, WhenAReservationIsRefusedItSettlesForTheSegment) {
  auto source = std::make_shared<CountingSource>();
  source->largest_granted = 3 * kMiB;
  ReservedSegmentSource reserved(source, 64 * kMiB);
  EXPECT_NE(reserved.allocate_segment(2 * kMiB), nullptr);
  const std::vector<size_t> requests = {64 * kMiB, 2 * kMiB};
  EXPECT_EQ(source->requests, requests);
  // Nothing left anywhere: the caller (the caching allocator) sees nullptr, not an error.
  EXPECT_EQ(reserved.allocate_segment(4 * kMiB), nullptr);
  EXPECT_EQ(reserved.reserved_bytes(), 2 * kMiB);
}

TEST(ReservedSegments, FreeingMemoryItDidNotGiveIsAnError) {
  auto source = std::make_shared<CountingSource>();
  ReservedSegmentSource reserved(source, 4 * kMiB);
  reserved.allocate_segment(kMiB);
  int outside = 0;
  EXPECT_TRUE(testing::throws_error([&] { reserved.free_segment(&outside, kMiB); },
                                    "is not a segment of its reservations"));
}

TEST(ReservedSegments, AHostAllocatorOverItReusesTheReservation) {
  auto source = std::make_shared<CountingSource>();
  auto reserved = std::make_shared<ReservedSegmentSource>(source, 16 * kMiB);
  HostAllocator host(reserved);
  std::vector<void*> blocks;
  // Blocks over 1 MiB get segments of their own, rounded to 2 MiB: four of 4 MiB fill it.
  for (int i = 0; i < 4; ++i) blocks.push_back(host.allocate(3 * kMiB, Stream{}));
  EXPECT_EQ(source->requests, std::vector<size_t>{16 * kMiB});
  for (void* block : blocks) host.deallocate(block, 3 * kMiB, Stream{});
  host.empty_cache();  // segments go back to the reservation, not to the source
  EXPECT_EQ(source->live, 1);
  void* again = host.allocate(12 * kMiB, Stream{});
  EXPECT_NE(again, nullptr);
  EXPECT_EQ(source->requests.size(), 1u);
  host.deallocate(again, 12 * kMiB, Stream{});
}

}  // namespace
}  // namespace tessel::memory
