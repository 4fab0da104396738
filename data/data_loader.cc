#include "data/data_loader.h"

#include <algorithm>
#include <utility>

#include "core/rng.h"
#include "core/threading.h"

namespace tessel::data {

std::vector<int64_t> shuffled_indices(int64_t size, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) order[i] = i;
  // Each epoch draws from its own counter range; two 32-bit words per swap.
  const uint64_t base_counter = static_cast<uint64_t>(epoch) << 40;
  for (int64_t i = size - 1; i > 0; --i) {
    const uint64_t draw = static_cast<uint64_t>(size - 1 - i);
    const auto words = philox4x32(seed, base_counter + draw / 2);
    const int lane = static_cast<int>(draw % 2) * 2;
    const uint64_t bits = (uint64_t{words[lane]} << 32) | words[lane + 1];
    const auto j = static_cast<int64_t>(bits % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(options) {
  TESSEL_CHECK(dataset_ != nullptr, "DataLoader: dataset is null");
}

DataLoader::~DataLoader() { stop_worker(); }

int64_t DataLoader::num_batches() const {
  const int64_t size = dataset_->size();
  return options_.drop_last_ ? size / options_.batch_size_
                             : (size + options_.batch_size_ - 1) / options_.batch_size_;
}

Batch DataLoader::make_batch(int64_t batch_index) const {
  int64_t begin = batch_index * options_.batch_size_;
  int64_t end = std::min<int64_t>(begin + options_.batch_size_, dataset_->size());
  if (options_.shard_count_ > 1) {  // this rank's part of the batch
    const int64_t rows = end - begin, parts = options_.shard_count_, index = options_.shard_index_;
    const int64_t start = index * (rows / parts) + std::min(index, rows % parts);
    end = begin + start + rows / parts + (index < rows % parts ? 1 : 0);
    begin += start;
  }
  const std::vector<int64_t> indices(order_.begin() + begin, order_.begin() + end);
  Batch batch = dataset_->get_batch(indices);
  if (options_.transform_) options_.transform_(batch, BatchInfo{indices, epoch_, options_.seed_});
  return batch;
}

void DataLoader::stop_worker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void DataLoader::start_epoch(int64_t epoch) {
  stop_worker();
  if (options_.shuffle_) {
    order_ = shuffled_indices(dataset_->size(), options_.seed_, epoch);
  } else {
    order_.resize(static_cast<size_t>(dataset_->size()));
    for (int64_t i = 0; i < dataset_->size(); ++i) order_[i] = i;
  }
  epoch_ = epoch;
  next_to_return_ = 0;
  epoch_started_ = true;
  ready_.clear();
  worker_error_ = nullptr;
  next_to_prepare_ = 0;
  stopping_ = false;
  if (options_.prefetch_ > 0 && num_batches() > 0) worker_ = std::thread([this] { worker_loop(); });
}

void DataLoader::worker_loop() {
  // The step's ops use every thread set_num_threads allows; this thread's run beside them.
  ThreadCap one_thread(1);
  const int64_t total = num_batches();
  while (true) {
    int64_t batch_index;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      changed_.wait(lock, [&] {
        return stopping_ || static_cast<int64_t>(ready_.size()) < options_.prefetch_;
      });
      if (stopping_ || next_to_prepare_ >= total) return;
      batch_index = next_to_prepare_++;
    }
    try {
      Batch batch = make_batch(batch_index);
      std::lock_guard<std::mutex> lock(mutex_);
      ready_.push_back(std::move(batch));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      worker_error_ = std::current_exception();
      stopping_ = true;
    }
    changed_.notify_all();
  }
}

std::optional<Batch> DataLoader::next() {
  TESSEL_CHECK(epoch_started_, "DataLoader::next: call start_epoch(epoch) first");
  if (next_to_return_ >= num_batches()) return std::nullopt;
  if (options_.prefetch_ == 0) return make_batch(next_to_return_++);

  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || worker_error_ != nullptr; });
  if (ready_.empty()) {
    // Report the failure once; the epoch is over.
    std::exception_ptr error = worker_error_;
    next_to_return_ = num_batches();
    std::rethrow_exception(error);
  }
  Batch batch = std::move(ready_.front());
  ready_.pop_front();
  ++next_to_return_;
  lock.unlock();
  changed_.notify_all();
  return batch;
}

}  // namespace tessel::data
