#include "core/storage.h"

#include <atomic>
#include <mutex>

#include "core/error.h"

namespace tessel {

const char* residency_name(Residency residency) {
  switch (residency) {
    case Residency::kResident:
      return "resident";
    case Residency::kEvicted:
      return "evicted";
    case Residency::kOnHost:
      return "on host";
    case Residency::kSharded:
      return "sharded over ranks";
  }
  return "?";
}

namespace {
std::mutex hooks_mutex;
std::shared_ptr<ResidencyHooks> installed_hooks;
std::atomic<ResidencyHooks*> current_hooks{nullptr};
std::atomic<uint64_t> next_storage_id{1};
}  // namespace

std::shared_ptr<ResidencyHooks> set_residency_hooks(std::shared_ptr<ResidencyHooks> hooks) {
  std::lock_guard<std::mutex> lock(hooks_mutex);
  std::swap(installed_hooks, hooks);
  current_hooks.store(installed_hooks.get());
  return hooks;
}

ResidencyHooks* residency_hooks() { return current_hooks.load(std::memory_order_acquire); }

namespace {
// Each thread takes ids in blocks, so that making a storage takes no locked instruction: ids stay
// unique and grow along each thread.
uint64_t new_storage_id() {
  constexpr uint64_t kBlock = 1024;
  thread_local uint64_t next = 0, end = 0;
  if (next == end) {
    next = next_storage_id.fetch_add(kBlock);
    end = next + kBlock;
  }
  return next++;
}
}  // namespace

StorageImpl::StorageImpl(size_t nbytes, Device device, memory::Stream stream)
    : nbytes_(nbytes), device_(device), stream_(stream), id_(new_storage_id()) {
  // Meta storages get (virtual) bytes only from an allocator installed for meta (the simulator).
  allocator_ =
      device.is_meta() ? memory::installed_allocator(device) : memory::allocator_for(device);
  if (allocator_) data_ = allocator_->allocate(nbytes_, stream_);
}

StorageImpl::~StorageImpl() {
  if (auto* hooks = residency_hooks()) hooks->on_destroy(*this);
  if (data_) allocator_->deallocate(data_, nbytes_, stream_);
}

void StorageImpl::release_user_ref() {
  if (user_refs_.fetch_sub(1) == 1) {
    if (auto* hooks = residency_hooks()) hooks->on_user_release(*this);
  }
}

void StorageImpl::release_bytes(Residency new_state) {
  TESSEL_CHECK(pins_.load() == 0, "cannot release the bytes of a pinned storage (", pins_.load(),
               " pins)");
  if (data_) allocator_->deallocate(data_, nbytes_, stream_);
  data_ = nullptr;
  state_ = new_state;
}

void StorageImpl::allocate_bytes(Residency new_state) {
  if (!data_ && allocator_) data_ = allocator_->allocate(nbytes_, stream_);
  state_ = new_state;
}

StorageAccess::StorageAccess(StorageImpl& storage) : storage_(&storage) {
  storage.pin();
  if (storage.state_ == Residency::kSharded && storage.sharded) {
    try {
      storage.sharded->gather(storage);
    } catch (...) {
      storage.unpin();
      throw;
    }
  }
  ResidencyHooks* hooks = residency_hooks();
  if (storage.state_ != Residency::kResident) {
    if (!hooks) {
      storage.unpin();
      TESSEL_FAIL("storage ", storage.id_, " is ", residency_name(storage.state_),
                  " but no memory layer is installed to bring it back");
    }
    try {
      hooks->make_resident(storage);
    } catch (...) {
      storage.unpin();
      throw;
    }
  }
  if (hooks) hooks->on_access(storage);
}

StorageAccess::~StorageAccess() {
  if (!storage_) return;
  storage_->unpin();
  if (storage_->sharded && storage_->pins() == 0 && storage_->state_ == Residency::kResident)
    storage_->sharded->on_unpinned(*storage_);
}

}  // namespace tessel
