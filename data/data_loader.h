// DataLoader: batches of a Dataset in a seeded shuffled (or fixed) order, with the next batches
// prepared on a background thread while the current one trains.
//   DataLoader loader(train, DataLoaderOptions().batch_size(128).shuffle(true).seed(1));
//   for (int64_t epoch = 0; epoch < 3; ++epoch)
//     for (Batch& batch : loader.epoch(epoch)) train_step(batch.inputs, batch.targets);
// `for (Batch& batch : loader)` runs the epoch after the last one started (0 the first time);
// start_epoch(epoch) + while (auto batch = loader.next()) is the same loop written out.
// Per-sample augmentation runs on the same background thread through options.transform(...)
// (data/augment.h: .transform(augmentation.batch_transform())).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/error.h"
#include "data/dataset.h"

namespace tessel::data {

// What a BatchTransform knows about the batch it rewrites.
struct BatchInfo {
  const std::vector<int64_t>& indices;  // the examples' positions in the data set
  int64_t epoch;
  uint64_t seed;  // DataLoaderOptions::seed
};
// Rewrites a batch after Dataset::get_batch, on the thread that prepared it (the loader's
// background thread, whose ops run on one thread beside the step's, or next()'s caller when
// prefetch is 0). Random choices must depend only on `info` (e.g. Philox keyed by seed, epoch and
// index) so that results do not depend on timing. Batches from get_batch are fresh tensors; a
// transform may replace or modify them.
using BatchTransform = std::function<void(Batch& batch, const BatchInfo& info)>;

struct DataLoaderOptions {
  int64_t batch_size_ = 64;
  bool shuffle_ = true;
  uint64_t seed_ = 0;
  bool drop_last_ = false;
  int64_t prefetch_ = 2;      // batches prepared ahead; 0 prepares each batch in next()
  BatchTransform transform_;  // none when empty
  int64_t shard_index_ = 0;   // with shard_count_ > 1: the part of each batch this loader reads
  int64_t shard_count_ = 1;

  DataLoaderOptions& batch_size(int64_t value) {
    TESSEL_CHECK(value > 0, "DataLoaderOptions: batch_size must be positive, got ", value);
    batch_size_ = value;
    return *this;
  }
  DataLoaderOptions& shuffle(bool value) {
    shuffle_ = value;
    return *this;
  }
  DataLoaderOptions& seed(uint64_t value) {
    seed_ = value;
    return *this;
  }
  DataLoaderOptions& drop_last(bool value) {
    drop_last_ = value;
    return *this;
  }
  DataLoaderOptions& prefetch(int64_t value) {
    TESSEL_CHECK(value >= 0, "DataLoaderOptions: prefetch must be >= 0, got ", value);
    prefetch_ = value;
    return *this;
  }
  DataLoaderOptions& transform(BatchTransform value) {
    transform_ = std::move(value);
    return *this;
  }
  // Data-parallel ranks: each batch (batch_size examples of the shared order) is cut into `count`
  // near-equal parts in order (the first batch_size % count one example longer), and this loader
  // reads, transforms and returns part `index` only.
  DataLoaderOptions& shard(int64_t index, int64_t count) {
    TESSEL_CHECK(count >= 1 && index >= 0 && index < count,
                 "DataLoaderOptions: shard index must be in [0, count), got index ", index, " of ",
                 count);
    shard_index_ = index;
    shard_count_ = count;
    return *this;
  }
};

// The order of `size` examples in epoch `epoch`: a Fisher-Yates shuffle driven by Philox
// (core/rng.h) keyed by `seed`, so the same (seed, epoch) always gives the same order.
std::vector<int64_t> shuffled_indices(int64_t size, uint64_t seed, int64_t epoch);

class DataLoader {
 public:
  // Walks one epoch with next(); the end is reached when next() returns nothing.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    Iterator() = default;  // the end
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++() {
      current_ = loader_->next();
      return *this;
    }
    // Only "at the end or not" is compared: an input iterator over one pass.
    bool operator==(const Iterator& other) const {
      return current_.has_value() == other.current_.has_value();
    }
    bool operator!=(const Iterator& other) const { return !(*this == other); }

   private:
    friend class DataLoader;
    explicit Iterator(DataLoader* loader) : loader_(loader), current_(loader->next()) {}
    DataLoader* loader_ = nullptr;
    std::optional<Batch> current_;
  };

  // One epoch as a range; begin() starts it (start_epoch(number)).
  class Epoch {
   public:
    Iterator begin() {
      loader_->start_epoch(number_);
      return Iterator(loader_);
    }
    Iterator end() { return Iterator(); }

   private:
    friend class DataLoader;
    Epoch(DataLoader* loader, int64_t number) : loader_(loader), number_(number) {}
    DataLoader* loader_;
    int64_t number_;
  };

  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches per epoch (the last partial one counts unless drop_last).
  int64_t num_batches() const;
  const DataLoaderOptions& options() const { return options_; }
  const Dataset& dataset() const { return *dataset_; }

  // Starts epoch `epoch` (its order depends on seed and epoch), abandoning any unread batches.
  void start_epoch(int64_t epoch);
  // The epoch last started (0 before any).
  int64_t epoch() const { return epoch_; }
  // Epoch `number` as a range: for (Batch& batch : loader.epoch(3)) { ... }
  Epoch epoch(int64_t number) { return Epoch(this, number); }
  // The epoch after the last one started, or epoch 0 when none was: consecutive range-for loops
  // over the loader see epochs 0, 1, 2, ... (each with its own shuffled order).
  Iterator begin() { return epoch(epoch_started_ ? epoch_ + 1 : 0).begin(); }
  Iterator end() { return Iterator(); }
  // The next batch of the current epoch, or nothing at its end. Errors raised while preparing
  // a batch are rethrown here.
  std::optional<Batch> next();

 private:
  void stop_worker();
  void worker_loop();
  Batch make_batch(int64_t batch_index) const;

  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  std::vector<int64_t> order_;
  int64_t epoch_ = 0;
  int64_t next_to_return_ = 0;  // batch index next() hands out
  bool epoch_started_ = false;

  // Shared with the worker thread (under mutex_).
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Batch> ready_;
  std::exception_ptr worker_error_;
  int64_t next_to_prepare_ = 0;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace tessel::data
