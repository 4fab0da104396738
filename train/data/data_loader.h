// DataLoader: batches of a Dataset in a seeded shuffled (or fixed) order, with the next batches
// prepared on a background thread while the current one trains.
//   DataLoader loader(train, DataLoaderOptions().batch_size(128).shuffle(true).seed(1));
//   for (int64_t epoch = 0; epoch < 3; ++epoch) {
//     loader.start_epoch(epoch);
//     while (auto batch = loader.next()) train_step(batch->inputs, batch->targets);
//   }
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "core/error.h"
#include "train/data/dataset.h"

namespace tessel::data {

struct DataLoaderOptions {
  int64_t batch_size_ = 64;
  bool shuffle_ = true;
  uint64_t seed_ = 0;
  bool drop_last_ = false;
  int64_t prefetch_ = 2;  // batches prepared ahead; 0 prepares each batch in next()

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
};

// The order of `size` examples in epoch `epoch`: a Fisher-Yates shuffle driven by Philox
// (core/rng.h) keyed by `seed`, so the same (seed, epoch) always gives the same order.
std::vector<int64_t> shuffled_indices(int64_t size, uint64_t seed, int64_t epoch);

class DataLoader {
 public:
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
