#include "core/small_object_pool.h"

#include "core/allocator.h"

namespace tessel {

namespace {

constexpr size_t kClassBytes = 64;  // blocks come in sizes of 64, 128, ... kPoolLargestBlock
constexpr size_t kClasses = kPoolLargestBlock / kClassBytes;
constexpr int kKeptPerClass = 256;  // at most 128 KiB per class and thread stay cached

struct FreeBlock {
  FreeBlock* next;
};

struct ThreadLists {
  FreeBlock* head[kClasses] = {};
  int count[kClasses] = {};
  ~ThreadLists();
};

// A thread's lists end before some of its other thread_local objects, which may still free
// blocks: from then on they go straight back to the heap.
thread_local bool lists_ended = false;
thread_local ThreadLists lists;

ThreadLists::~ThreadLists() {
  lists_ended = true;
  for (FreeBlock*& first : head) {
    while (first) {
      FreeBlock* next = first->next;
      ::operator delete(first);
      first = next;
    }
  }
}

// AddressSanitizer builds take every block from the heap, so that it sees each use after free.
constexpr bool kPooling = !memory::kAddressSanitizer;

}  // namespace

void* pool_allocate(size_t bytes) {
  if (!kPooling || bytes == 0 || bytes > kPoolLargestBlock) return ::operator new(bytes);
  const size_t size_class = (bytes - 1) / kClassBytes;
  if (!lists_ended) {
    ThreadLists& mine = lists;
    if (FreeBlock* block = mine.head[size_class]) {
      mine.head[size_class] = block->next;
      --mine.count[size_class];
      return block;
    }
  }
  return ::operator new((size_class + 1) * kClassBytes);
}

void pool_free(void* block, size_t bytes) {
  if (!kPooling || bytes == 0 || bytes > kPoolLargestBlock) return ::operator delete(block);
  const size_t size_class = (bytes - 1) / kClassBytes;
  if (!lists_ended) {
    ThreadLists& mine = lists;
    if (mine.count[size_class] < kKeptPerClass) {
      auto* freed = static_cast<FreeBlock*>(block);
      freed->next = mine.head[size_class];
      mine.head[size_class] = freed;
      ++mine.count[size_class];
      return;
    }
  }
  ::operator delete(block);
}

}  // namespace tessel
