// The storage handle: the bytes behind one or more tensors, and everything the memory layer
// needs to move them: residency state, version counter, pins, user references kept apart from
// op record references, the op record (op call) that produced it, and a logical access clock.
// Raw bytes are reached only through StorageAccess (pins, makes resident, unpins at scope end).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"

namespace tessel {

struct OpCall;
struct OpDef;
class StorageImpl;

enum class Residency : uint8_t {
  kResident,  // bytes on the device
  kEvicted,   // no bytes; recompute from the producer op record
  kOnHost,    // bytes swapped to host memory
  kSharded,   // no bytes here: parts of them on a group's ranks, gathered on access (ZeRO stage 3)
};

const char* residency_name(Residency residency);

// What the memory layer plugs into core. Every method may be called from several threads.
class ResidencyHooks {
 public:
  virtual ~ResidencyHooks() = default;
  // Bytes of `storage` are about to be touched and it is not resident: bring them back.
  virtual void make_resident(StorageImpl& storage) = 0;
  // Every access through StorageAccess (after make_resident); for access clocks.
  virtual void on_access(StorageImpl& /*storage*/) {}
  // The dispatcher ran an op whose outputs own new storage; `call` is its pure op record and
  // `seconds` the measured kernel time. The hook decides whether to keep the op record.
  virtual void on_op_recorded(const std::shared_ptr<OpCall>& /*call*/, double /*seconds*/) {}
  // The last user reference to `storage` is gone (op records may still refer to it).
  virtual void on_user_release(StorageImpl& /*storage*/) {}
  // `storage` is being destroyed.
  virtual void on_destroy(StorageImpl& /*storage*/) {}
  // The dispatcher is about to write `storage` in place (an out= tensor or an input the op
  // mutates): op records that read its old bytes, and its own producer op record, stop being valid.
  virtual void before_write(StorageImpl& /*storage*/) {}
  // The kernel of `op` ran out of memory: may the dispatcher run it in chunks along one of the
  // op's SplitRules? `on_split` reports a call that ran in `chunks` pieces.
  virtual bool allow_split(const OpDef& /*op*/) { return false; }
  virtual void on_split(const OpDef& /*op*/, int64_t /*chunks*/) {}
  // An OutOfMemory report on its way to the user; returns it with what the memory layer knows
  // (policy, candidates, top holders and the ops that made them).
  virtual std::string explain_out_of_memory(const std::string& report) { return report; }
  // The second try of an op that ran out of memory under a policy: make one free block that holds
  // every input not resident and `output_bytes` (the outputs, each rounded as the allocator rounds
  // it), moving other tensors off the device and, if that is not enough, the op's own resident
  // inputs too; then bring the inputs back into it. False when no such block can be made; the
  // dispatcher then runs the op anyway and reports what fails.
  virtual bool gather(const std::vector<StorageImpl*>& /*inputs*/,
                      const std::vector<size_t>& /*output_bytes*/) {
    return false;
  }
  // The last resort of a policy that splits, for an op whose operands do not fit on the device
  // beside each other even when it runs in chunks: some of them stay in host memory ("staged")
  // while the dispatcher runs the op chunk by chunk, copying each chunk's part of them in and
  // out. `stage_on_host` moves `storage` there (its bytes copied when `keep_contents`; an output
  // not yet written only gives its device bytes back) and keeps it there until `end_staging`;
  // false when it cannot (pinned, evicted, not this layer's).
  virtual bool stage_on_host(StorageImpl& /*storage*/, bool /*keep_contents*/) { return false; }
  // Copies bytes [offset, offset + bytes) of a staged storage to device memory, or back.
  virtual void read_staged(StorageImpl& /*storage*/, size_t /*offset*/, size_t /*bytes*/,
                           void* /*device_bytes*/) {}
  virtual void write_staged(StorageImpl& /*storage*/, size_t /*offset*/, size_t /*bytes*/,
                            const void* /*device_bytes*/) {}
  virtual void end_staging(StorageImpl& /*storage*/) {}
};

// The owner of bytes kept in parts over a group of ranks (parallel::ZeroOptimizer's stage 3). An
// access scope on a kSharded storage gathers the whole bytes (a collective: every rank touches
// such storages in the same order), and once the last scope ends the owner may drop them again.
class ShardedBytes {
 public:
  virtual ~ShardedBytes() = default;
  // `storage` is kSharded and pinned by the access asking for it: leave it kResident with the
  // whole bytes.
  virtual void gather(StorageImpl& storage) = 0;
  // The last access scope of a resident `storage` ended (no pins left).
  virtual void on_unpinned(StorageImpl& storage) = 0;
};

// Installs hooks process-wide (nullptr removes them); returns the previous ones.
std::shared_ptr<ResidencyHooks> set_residency_hooks(std::shared_ptr<ResidencyHooks> hooks);
ResidencyHooks* residency_hooks();

// Always owned by a shared_ptr (the memory layer keeps weak references to the storages it tracks).
class StorageImpl : public std::enable_shared_from_this<StorageImpl> {
 public:
  // Allocates `nbytes` on `device` (meta: no bytes, unless an allocator is installed for meta).
  StorageImpl(size_t nbytes, Device device, memory::Stream stream = {});
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  memory::Stream stream() const { return stream_; }
  Residency state() const { return state_; }
  uint64_t id() const { return id_; }

  // Version counter: bumped by every in-place write, checked by autograd and op records.
  uint64_t version() const { return version_.load(); }
  void bump_version() { version_.fetch_add(1); }

  int pins() const { return pins_.load(); }
  int user_refs() const { return user_refs_.load(); }
  int record_refs() const { return record_refs_.load(); }
  void add_user_ref() { user_refs_.fetch_add(1); }
  // The first user reference of a storage no other thread can see yet: set, not counted.
  void set_first_user_ref() { user_refs_.store(1, std::memory_order_relaxed); }
  void release_user_ref();
  void add_record_ref() { record_refs_.fetch_add(1); }
  void release_record_ref() { record_refs_.fetch_sub(1); }

  // The op record that produced these bytes (set by the memory layer's hook), and its own state.
  std::shared_ptr<OpCall> producer;
  std::shared_ptr<void> residency_data;
  // Set while the bytes are kept in parts over several ranks (kSharded); see ShardedBytes.
  std::shared_ptr<ShardedBytes> sharded;
  int64_t last_access = 0;  // logical clock, maintained by the memory layer

  // For the memory layer only: the raw pointer regardless of pins, and moving bytes.
  void* data_unchecked() const { return data_; }
  void* host_data = nullptr;                // while kOnHost
  void release_bytes(Residency new_state);  // frees device bytes; state becomes new_state
  // Gets device bytes again; the state becomes `new_state` (kOnHost while a prefetch copies in).
  void allocate_bytes(Residency new_state = Residency::kResident);
  // Points at bytes the memory layer moved within the allocator (defragmentation). Allowed while
  // pinned: the caller checks that no kernel holds the old address.
  void moved_bytes_to(void* data) { data_ = data; }
  void set_state(Residency state) { state_ = state; }
  std::recursive_mutex& mutex() { return mutex_; }
  // The allocator the bytes come from (and go back to); null on the meta device without one.
  const std::shared_ptr<memory::Allocator>& allocator() const { return allocator_; }

 private:
  friend class StorageAccess;
  friend class StoragePin;
  void pin() { pins_.fetch_add(1); }
  void unpin() { pins_.fetch_sub(1); }

  size_t nbytes_;
  Device device_;
  memory::Stream stream_;
  std::shared_ptr<memory::Allocator> allocator_;
  void* data_ = nullptr;
  Residency state_ = Residency::kResident;
  uint64_t id_;
  std::atomic<uint64_t> version_{0};
  std::atomic<int> pins_{0};
  std::atomic<int> user_refs_{0};
  std::atomic<int> record_refs_{0};
  std::recursive_mutex mutex_;
};

// The one accessor to raw bytes: pins the storage and makes it resident for its lifetime.
class StorageAccess {
 public:
  explicit StorageAccess(StorageImpl& storage);
  explicit StorageAccess(const std::shared_ptr<StorageImpl>& storage) : StorageAccess(*storage) {}
  ~StorageAccess();
  StorageAccess(const StorageAccess&) = delete;
  StorageAccess& operator=(const StorageAccess&) = delete;
  StorageAccess(StorageAccess&& other) noexcept : storage_(other.storage_) {
    other.storage_ = nullptr;
  }
  void* data() const { return storage_->data_; }
  StorageImpl* storage() const { return storage_; }

 private:
  StorageImpl* storage_;
};

// Keeps a resident storage's bytes where they are (the memory layer moves no pinned storage)
// without bringing it back or counting an access: an op's resident inputs while its outputs are
// allocated.
class StoragePin {
 public:
  explicit StoragePin(StorageImpl& storage) : storage_(&storage) { storage.pin(); }
  ~StoragePin() {
    if (storage_) storage_->unpin();
  }
  StoragePin(const StoragePin&) = delete;
  StoragePin& operator=(const StoragePin&) = delete;
  StoragePin(StoragePin&& other) noexcept : storage_(other.storage_) { other.storage_ = nullptr; }

 private:
  StorageImpl* storage_;
};

}  // namespace tessel
