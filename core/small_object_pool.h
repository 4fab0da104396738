// Blocks for the small objects every op makes and drops (tensor and storage headers): each thread
// keeps the blocks freed on it and hands them out again, so that making a tensor skips malloc.
//   auto impl = std::allocate_shared<TensorImpl>(PoolAllocator<TensorImpl>(), ...);
#pragma once

#include <cstddef>
#include <new>

namespace tessel {

// Blocks of up to kPoolLargestBlock bytes from this thread's lists, larger ones from new.
constexpr size_t kPoolLargestBlock = 512;
void* pool_allocate(size_t bytes);
void pool_free(void* block, size_t bytes);

template <typename T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() = default;
  template <typename U>
  PoolAllocator(const PoolAllocator<U>&) {}  // NOLINT: rebinding, as allocate_shared does
  T* allocate(size_t count) {
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "over-aligned for the pool");
    return static_cast<T*>(pool_allocate(count * sizeof(T)));
  }
  void deallocate(T* block, size_t count) { pool_free(block, count * sizeof(T)); }
  template <typename U>
  bool operator==(const PoolAllocator<U>&) const {
    return true;
  }
  template <typename U>
  bool operator!=(const PoolAllocator<U>&) const {
    return false;
  }
};

}  // namespace tessel
