#include "parallel/mpi_communicator.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <deque>
#include <functional>
#include <numeric>
#include <sstream>
#include <thread>

#include "core/autograd.h"
#include "core/shape.h"
#include "core/storage.h"
#include "ops/ops.h"

namespace tessel::parallel {

using Clock = std::chrono::steady_clock;

namespace {

enum class Collective : int64_t {
  kAllReduce = 1,
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kBarrier = 5,
};

const char* collective_name(int64_t kind) {
  switch (static_cast<Collective>(kind)) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kBarrier:
      return "barrier";
  }
  return "an unknown collective";
}

// Tags on the side communicator, which carries nothing else.
constexpr int kArrivalTag = 1;
constexpr int kDiagnosisTag = 2;
constexpr int kMaxUserTag = 32767;  // the smallest MPI_TAG_UB the standard allows

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, length);
}

void check_mpi(int code, const std::string& what) {
  TESSEL_CHECK(code == MPI_SUCCESS, what, ": ", mpi_error_string(code));
}

std::chrono::duration<double> seconds(double value) { return std::chrono::duration<double>(value); }

// How a rank waits between polls of a collective. A nonblocking collective advances only while
// its ranks poll, round by round, so a rank asleep holds up every other: waiting ranks poll
// without sleeping, yielding the core between polls to a rank that shares it and is still
// computing (ranks are often oversubscribed). A wait past kPollWithoutSleep (a rank held up by
// I/O, a checkpoint, a much longer step) sleeps between polls, a little longer each round up to
// about a millisecond, so that long waits do not keep a core busy.
class Backoff {
 public:
  void pause() {
    if (sleep_rounds_ == 0 && Clock::now() - start_ < kPollWithoutSleep) {
      std::this_thread::yield();
      return;
    }
    const int shift = std::min(sleep_rounds_++, 7);
    std::this_thread::sleep_for(std::chrono::microseconds(8 << shift));
  }

 private:
  static constexpr std::chrono::milliseconds kPollWithoutSleep{50};
  const Clock::time_point start_ = Clock::now();
  int sleep_rounds_ = 0;
};

// bf16 and f16 travel as 16-bit words; MPI cannot add them, so reductions run in f32.
MPI_Datatype wire_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kBFloat16:
    case DType::kFloat16:
      return MPI_UINT16_T;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kUInt8:
      return MPI_UINT8_T;
    case DType::kBool:
      static_assert(sizeof(bool) == 1, "bool tensors are stored one byte per element");
      return MPI_C_BOOL;
  }
  TESSEL_FAIL("MpiCommunicator: unknown dtype ", static_cast<int>(dtype));
}

DType reduce_dtype(DType dtype) {
  return dtype == DType::kBFloat16 || dtype == DType::kFloat16 ? DType::kFloat32 : dtype;
}

MPI_Op mpi_op(ReduceOp op, DType dtype) {
  if (dtype == DType::kBool) return op == ReduceOp::kMin ? MPI_LAND : MPI_LOR;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  TESSEL_FAIL("MpiCommunicator: unknown reduce op");
}

std::string tensor_label(const Tensor& tensor) {
  return detail::str_cat(dtype_name(tensor.dtype()), " ", shape_str(tensor.sizes()));
}

void check_cpu_tensor(const Tensor& tensor, const char* what, const char* argument) {
  TESSEL_CHECK(tensor.defined(), what, ": ", argument, " is an undefined tensor");
  TESSEL_CHECK(tensor.device().is_cpu(), what, ": MpiCommunicator moves CPU tensors, but ",
               argument, " is on ", tensor.device().str(),
               " (CUDA tensors go through the NCCL communicator)");
  TESSEL_CHECK(tensor.numel() <= INT_MAX, what, ": ", argument, " has ", tensor.numel(),
               " elements, more than one MPI call can count (", INT_MAX,
               "); split it into smaller tensors");
}

void check_writable(const Tensor& tensor, const char* what, const char* argument) {
  TESSEL_CHECK(!tensor.has_internal_overlap(), what, ": ", argument, " (", tensor_label(tensor),
               ", strides ", tensor.strides(),
               ") is an expanded view whose elements share memory, so it cannot receive values; "
               "pass a tensor that owns its elements (.contiguous())");
}

void check_reduce_op(DType dtype, ReduceOp op, const char* what) {
  TESSEL_CHECK(op != ReduceOp::kMean || is_floating(dtype), what,
               ": op mean needs a floating-point tensor, got ", dtype_name(dtype),
               " (use sum and divide, or convert with .to(DType::kFloat32))");
}

void check_rank(int rank, int size, const char* what, const char* argument) {
  TESSEL_CHECK(rank >= 0 && rank < size, what, ": ", argument, " ", rank,
               " is out of range for a communicator of ", size, " ranks");
}

// `tensor` itself when it is contiguous with that dtype, else a contiguous converted copy.
Tensor contiguous_as(const Tensor& tensor, DType dtype) {
  if (tensor.dtype() == dtype) return contiguous(tensor);
  return contiguous(to_dtype(tensor, dtype));
}

// Writes `buffer`'s values into `destination` unless they are the same tensor, in which case
// MPI wrote the bytes directly and only the version counter needs to move.
void deliver(const Tensor& buffer, const Tensor& destination) {
  if (buffer.is_same(destination)) {
    destination.storage()->bump_version();
  } else {
    Tensor target = destination;
    target.copy_(buffer);
  }
}

int64_t row_elements(const Tensor& tensor) {
  int64_t elements = 1;
  for (int64_t d = 1; d < tensor.dim(); ++d) elements *= tensor.size(d);
  return elements;
}

}  // namespace

struct MpiCommunicator::State {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm side = MPI_COMM_NULL;  // arrival and diagnosis messages only
  int rank = 0;
  int size = 1;
  std::string name;
  double timeout_s = 300;
  std::vector<int> world_ranks;
  bool ranks_are_world_ranks = true;
  uint64_t sequence = 0;  // collectives started on this communicator
  // Set by a timeout or a detected mismatch: the ranks no longer agree on what comes next.
  std::string failure;

  struct SmallSend {
    std::vector<int64_t> message;  // must live until the send completes
    MPI_Request request = MPI_REQUEST_NULL;
  };
  std::deque<SmallSend> small_sends;

  ~State() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // Sends still under way read their messages until they complete: the requests are let go
    // and the messages kept (a few bytes each).
    std::deque<SmallSend> unfinished;
    for (auto& send : small_sends) {
      if (send.request == MPI_REQUEST_NULL) continue;
      int done = 0;
      if (MPI_Test(&send.request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) continue;
      MPI_Request_free(&send.request);
      unfinished.push_back(std::move(send));
    }
    if (!unfinished.empty()) {
      (void)new std::deque<SmallSend>(std::move(unfinished));  // deliberately leaked
    }
    if (side != MPI_COMM_NULL) MPI_Comm_free(&side);
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }

  std::string rank_label(int r) const {
    if (ranks_are_world_ranks) return "rank " + std::to_string(r);
    return "rank " + std::to_string(r) + " (world rank " + std::to_string(world_ranks[r]) + ")";
  }

  std::string ranks_label(const std::vector<int>& ranks) const {
    if (ranks.size() == 1) return rank_label(ranks[0]);
    std::string text = "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) {
      text += (i ? ", " : "") + std::to_string(ranks[i]);
      if (!ranks_are_world_ranks) text += " (world " + std::to_string(world_ranks[ranks[i]]) + ")";
    }
    return text;
  }

  void check_usable(const char* what) const {
    TESSEL_CHECK(failure.empty(), what, ": communicator '", name,
                 "' is unusable after an earlier failure: ", failure);
  }

  // Completed small sends leave the queue (their order of completion does not matter).
  void reap_small_sends() {
    for (auto it = small_sends.begin(); it != small_sends.end();) {
      int done = 0;
      check_mpi(MPI_Test(&it->request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      it = done ? small_sends.erase(it) : std::next(it);
    }
  }

  void post_small(std::vector<int64_t> message, int destination, int tag) {
    small_sends.push_back({std::move(message), MPI_REQUEST_NULL});
    auto& send = small_sends.back();
    check_mpi(MPI_Isend(send.message.data(), static_cast<int>(send.message.size()), MPI_INT64_T,
                        destination, tag, side, &send.request),
              "MPI_Isend");
  }

  std::string timeout_hint() const {
    return detail::str_cat(
        ". Every rank must call the same collectives in the same order; if a rank is only slow, "
        "raise TESSEL_COLLECTIVE_TIMEOUT_S (now ",
        timeout_s, " s)");
  }
};

namespace {

using State = MpiCommunicator::State;

class MpiWork : public Work {
 public:
  std::shared_ptr<State> state;
  Collective kind = Collective::kBarrier;
  int64_t count = 0;
  uint64_t sequence = 0;
  std::string description;  // "all_reduce #3 (sum, f32 [4, 5])"
  MPI_Request request = MPI_REQUEST_NULL;
  bool request_done = false;
  // Rank 0 only: one receive per other rank for its arrival message {sequence, kind, count}.
  std::vector<MPI_Request> arrivals;
  std::vector<std::array<int64_t, 3>> arrival_messages;
  std::vector<char> arrived;
  // The storages MPI reads or writes stay alive and pinned (resident, not evictable) until
  // completion.
  std::vector<Tensor> buffers;
  std::vector<std::unique_ptr<StorageAccess>> pins;
  std::vector<int> counts, displacements;  // MPI reads these until completion
  std::function<void()> finish;
  Clock::time_point deadline;
  bool finished = false;

  ~MpiWork() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finished && !request_done && !finalized && request != MPI_REQUEST_NULL) {
      int done = 0;
      request_done = MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done;
    }
    // A collective abandoned unfinished keeps its buffers: MPI may still write them.
    if (!finished && !request_done) {
      for (auto& pin : pins) pin.release();
      // Deliberately leaked: the buffers and the counts and displacements MPI reads.
      (void)new std::vector<Tensor>(std::move(buffers));
      (void)new std::vector<int>(std::move(counts));
      (void)new std::vector<int>(std::move(displacements));
    }
    // Rank 0: arrival messages not received yet still land in their receive buffers when they
    // come (late, or after a failure). The receives stay posted, so that a late message is not
    // taken for a later collective's, and their buffers are kept (24 bytes per rank).
    if (!finalized) {
      bool pending = false;
      for (size_t r = 0; r < arrivals.size(); ++r) {
        if (arrived[r] || arrivals[r] == MPI_REQUEST_NULL) continue;
        MPI_Request_free(&arrivals[r]);
        pending = true;
      }
      if (pending) {
        (void)new std::vector<std::array<int64_t, 3>>(
            std::move(arrival_messages));  // deliberately leaked
      }
    }
  }

  void* pin(const Tensor& tensor) {
    buffers.push_back(tensor);
    pins.push_back(std::make_unique<StorageAccess>(tensor.storage()));
    return static_cast<char*>(pins.back()->data()) +
           tensor.storage_offset() * static_cast<int64_t>(tensor.element_size());
  }

  void launched(int code, const char* call) {
    if (code != MPI_SUCCESS) {
      state->failure =
          detail::str_cat(description, ": ", call, " failed: ", mpi_error_string(code));
      TESSEL_FAIL(state->failure);
    }
  }

  bool poll() override {
    if (finished) return true;
    state->check_usable(description.c_str());
    if (!request_done) {
      int done = 0;
      int code = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
      if (code != MPI_SUCCESS) {
        state->failure = detail::str_cat(description, " on communicator '", state->name,
                                         "' failed: ", mpi_error_string(code));
        TESSEL_FAIL(state->failure);
      }
      request_done = done != 0;
    }
    bool all_arrived = true;
    for (size_t r = 0; r < arrivals.size(); ++r) {
      if (arrived[r]) continue;
      int done = 0;
      check_mpi(MPI_Test(&arrivals[r], &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (done) {
        arrived[r] = 1;
        check_arrival(static_cast<int>(r));
      } else {
        all_arrived = false;
      }
    }
    return request_done && all_arrived;
  }

  void wait() override {
    Backoff backoff;
    while (!poll()) {
      if (Clock::now() > deadline) fail_timeout();
      backoff.pause();
    }
    if (finished) return;
    finished = true;
    pins.clear();
    buffers.clear();
    NoGradGuard no_grad;
    if (finish) finish();
  }

 private:
  // Rank 0: another rank's arrival message must describe the same collective.
  void check_arrival(int r) {
    const auto& message = arrival_messages[r];
    if (message[0] == static_cast<int64_t>(sequence) && message[1] == static_cast<int64_t>(kind) &&
        message[2] == count) {
      return;
    }
    state->failure = detail::str_cat(
        "collective mismatch on communicator '", state->name, "': this rank called ", description,
        " with ", count, " elements, but ", state->rank_label(r), "'s collective #", message[0],
        " was ", collective_name(message[1]), " with ", message[2],
        " elements. Every rank must call the same collectives in the same order with the same "
        "sizes");
    TESSEL_FAIL(state->failure);
  }

  [[noreturn]] void fail_timeout() {
    std::vector<int> missing;
    bool known = false;
    if (state->rank == 0) {
      known = true;
      for (size_t r = 1; r < arrivals.size(); ++r) {
        if (!arrived[r]) missing.push_back(static_cast<int>(r));
      }
      // Tell the ranks that did arrive who is missing, so they can say it too.
      std::vector<int64_t> report = {static_cast<int64_t>(sequence),
                                     static_cast<int64_t>(missing.size())};
      report.insert(report.end(), missing.begin(), missing.end());
      for (size_t r = 1; r < arrivals.size(); ++r) {
        if (arrived[r]) state->post_small(report, static_cast<int>(r), kDiagnosisTag);
      }
    } else {
      known = await_diagnosis(missing);
    }

    std::string who;
    if (!known) {
      who = detail::str_cat(
          "rank 0, which collects arrivals, did not report, so rank 0 itself "
          "probably did not arrive");
    } else if (missing.empty()) {
      who = "every rank arrived but the transfer did not finish in time";
    } else {
      who = state->ranks_label(missing) + " did not arrive";
    }
    state->failure =
        detail::str_cat(description, " on communicator '", state->name, "' timed out after ",
                        state->timeout_s, " s: ", who, state->timeout_hint());
    TESSEL_FAIL(state->failure);
  }

  // Ranks other than 0 wait a little for rank 0's list of missing ranks for this collective.
  bool await_diagnosis(std::vector<int>& missing) {
    double grace_s = std::min(30.0, std::max(1.0, 0.25 * state->timeout_s));
    auto grace_deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(seconds(grace_s));
    Backoff backoff;
    while (Clock::now() < grace_deadline) {
      int found = 0;
      MPI_Status status;
      check_mpi(MPI_Iprobe(0, kDiagnosisTag, state->side, &found, &status), "MPI_Iprobe");
      if (!found) {
        backoff.pause();
        continue;
      }
      int length = 0;
      MPI_Get_count(&status, MPI_INT64_T, &length);
      std::vector<int64_t> report(std::max(length, 0));
      check_mpi(MPI_Recv(report.data(), length, MPI_INT64_T, 0, kDiagnosisTag, state->side,
                         MPI_STATUS_IGNORE),
                "MPI_Recv");
      if (report.size() < 2 || report[0] != static_cast<int64_t>(sequence)) continue;
      for (size_t i = 2; i < report.size(); ++i) missing.push_back(static_cast<int>(report[i]));
      return true;
    }
    return false;
  }
};

std::shared_ptr<MpiWork> begin_collective(const std::shared_ptr<State>& state, Collective kind,
                                          int64_t count, const std::string& detail) {
  state->check_usable(collective_name(static_cast<int64_t>(kind)));
  state->reap_small_sends();
  auto work = std::make_shared<MpiWork>();
  work->state = state;
  work->kind = kind;
  work->count = count;
  work->sequence = ++state->sequence;
  work->description = detail::str_cat(collective_name(static_cast<int64_t>(kind)), " #",
                                      work->sequence, detail.empty() ? "" : " (" + detail + ")");
  work->deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(seconds(state->timeout_s));
  if (state->size > 1) {
    if (state->rank == 0) {
      work->arrivals.assign(state->size, MPI_REQUEST_NULL);
      work->arrival_messages.resize(state->size);
      work->arrived.assign(state->size, 0);
      work->arrived[0] = 1;
      for (int r = 1; r < state->size; ++r) {
        check_mpi(MPI_Irecv(work->arrival_messages[r].data(), 3, MPI_INT64_T, r, kArrivalTag,
                            state->side, &work->arrivals[r]),
                  "MPI_Irecv");
      }
    } else {
      state->post_small({static_cast<int64_t>(work->sequence), static_cast<int64_t>(kind), count},
                        0, kArrivalTag);
    }
  }
  return work;
}

// Point to point: waits for `request` against the deadline; a timeout makes the communicator
// unusable (the unmatched message would confuse everything after it).
MPI_Status wait_point_to_point(State& state, MPI_Request& request, const std::string& what,
                               const std::string& peer_missing) {
  auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(seconds(state.timeout_s));
  Backoff backoff;
  MPI_Status status;
  while (true) {
    int done = 0;
    int code = MPI_Test(&request, &done, &status);
    int error_class = MPI_SUCCESS;
    if (code != MPI_SUCCESS) MPI_Error_class(code, &error_class);
    // A truncated message was consumed whole, so the ranks still agree on what comes next.
    TESSEL_CHECK(error_class != MPI_ERR_TRUNCATE, what,
                 ": the message is larger than the tensor; send and recv must use tensors of the "
                 "same size and dtype");
    if (code != MPI_SUCCESS) {
      state.failure = detail::str_cat(what, " on communicator '", state.name,
                                      "' failed: ", mpi_error_string(code));
      TESSEL_FAIL(state.failure);
    }
    if (done) return status;
    if (Clock::now() > deadline) {
      state.failure = detail::str_cat(what, " on communicator '", state.name, "' timed out after ",
                                      state.timeout_s, " s: ", peer_missing, state.timeout_hint());
      TESSEL_FAIL(state.failure);
    }
    backoff.pause();
  }
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, CommOptions options)
    : state_(std::make_shared<State>()) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  TESSEL_CHECK(initialized && !finalized,
               "MpiCommunicator: MPI is not initialised (or already finalised); run the program "
               "through tessel::parallel::run_ranks (parallel/launch.h) or call MPI_Init first");
  TESSEL_CHECK(comm != MPI_COMM_NULL,
               "MpiCommunicator: got MPI_COMM_NULL (a rank left out of a split has no "
               "communicator)");
  TESSEL_CHECK(std::isfinite(options.timeout_s()) && options.timeout_s() > 0,
               "MpiCommunicator: timeout must be a positive number of seconds, got ",
               options.timeout_s());
  state_->name = options.name();
  state_->timeout_s = options.timeout_s();
  check_mpi(MPI_Comm_dup(comm, &state_->comm), "MPI_Comm_dup");
  check_mpi(MPI_Comm_dup(comm, &state_->side), "MPI_Comm_dup");
  // Errors come back as codes and become tessel::Error instead of aborting the job.
  MPI_Comm_set_errhandler(state_->comm, MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(state_->side, MPI_ERRORS_RETURN);
  MPI_Comm_rank(state_->comm, &state_->rank);
  MPI_Comm_size(state_->comm, &state_->size);

  MPI_Group group, world_group;
  MPI_Comm_group(state_->comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  std::vector<int> ranks(state_->size);
  std::iota(ranks.begin(), ranks.end(), 0);
  state_->world_ranks.assign(state_->size, MPI_UNDEFINED);
  MPI_Group_translate_ranks(group, state_->size, ranks.data(), world_group,
                            state_->world_ranks.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  state_->ranks_are_world_ranks = state_->size == world_size && state_->world_ranks == ranks;
}

MpiCommunicator::~MpiCommunicator() = default;

std::shared_ptr<MpiCommunicator> MpiCommunicator::world(CommOptions options) {
  return std::make_shared<MpiCommunicator>(MPI_COMM_WORLD, std::move(options));
}

int MpiCommunicator::rank() const { return state_->rank; }
int MpiCommunicator::size() const { return state_->size; }
const std::string& MpiCommunicator::name() const { return state_->name; }
Device MpiCommunicator::device() const { return Device::cpu(); }
double MpiCommunicator::timeout_s() const { return state_->timeout_s; }
MPI_Comm MpiCommunicator::mpi_comm() const { return state_->comm; }
const std::vector<int>& MpiCommunicator::world_ranks() const { return state_->world_ranks; }

void MpiCommunicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  all_reduce_async(tensor, op)->wait();
}

std::shared_ptr<Work> MpiCommunicator::all_reduce_async(const Tensor& tensor, ReduceOp op) {
  const char* what = "all_reduce";
  check_cpu_tensor(tensor, what, "tensor");
  check_writable(tensor, what, "tensor");
  check_reduce_op(tensor.dtype(), op, what);
  NoGradGuard no_grad;
  DType dtype = reduce_dtype(tensor.dtype());
  Tensor buffer = contiguous_as(tensor, dtype);
  auto work = begin_collective(state_, Collective::kAllReduce, tensor.numel(),
                               std::string(reduce_op_name(op)) + ", " + tensor_label(tensor));
  void* data = work->pin(buffer);
  work->launched(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(buffer.numel()),
                                wire_type(dtype), mpi_op(op, dtype), state_->comm, &work->request),
                 "MPI_Iallreduce");
  int size = state_->size;
  work->finish = [buffer, tensor, op, size] {
    if (op == ReduceOp::kMean) Tensor(buffer).mul_(1.0 / size);
    deliver(buffer, tensor);
  };
  return work;
}

void MpiCommunicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  const char* what = "reduce_scatter";
  check_cpu_tensor(input, what, "input");
  check_cpu_tensor(output, what, "output");
  check_writable(output, what, "output");
  check_reduce_op(input.dtype(), op, what);
  TESSEL_CHECK(input.dtype() == output.dtype(), what, ": input is ", dtype_name(input.dtype()),
               " but output is ", dtype_name(output.dtype()), "; they must match");
  TESSEL_CHECK(input.dim() >= 1, what,
               ": input must have at least one dimension to split, got a "
               "scalar");
  int64_t rows = input.size(0);
  Shape expected = input.sizes();
  expected[0] = part_rows(rows, state_->size, state_->rank);
  TESSEL_CHECK(output.sizes() == expected, what, ": output has shape ", shape_str(output.sizes()),
               " but rank ", state_->rank, "'s part of input ", shape_str(input.sizes()),
               " split over ", state_->size, " ranks along dim 0 has shape ", shape_str(expected));
  NoGradGuard no_grad;
  DType dtype = reduce_dtype(input.dtype());
  Tensor send = contiguous_as(input, dtype);
  if (send.storage() == output.storage()) send = clone(send);  // MPI buffers must not overlap
  Tensor receive = output.is_contiguous() && output.dtype() == dtype
                       ? output
                       : empty(output.sizes(), TensorOptions(dtype));
  auto work = begin_collective(state_, Collective::kReduceScatter, input.numel(),
                               std::string(reduce_op_name(op)) + ", " + tensor_label(input));
  int64_t row = row_elements(input);
  work->counts.resize(state_->size);
  for (int r = 0; r < state_->size; ++r)
    work->counts[r] = static_cast<int>(part_rows(rows, state_->size, r) * row);
  void* send_data = work->pin(send);
  void* receive_data = work->pin(receive);
  work->launched(MPI_Ireduce_scatter(send_data, receive_data, work->counts.data(), wire_type(dtype),
                                     mpi_op(op, dtype), state_->comm, &work->request),
                 "MPI_Ireduce_scatter");
  int size = state_->size;
  work->finish = [receive, output, op, size] {
    if (op == ReduceOp::kMean) Tensor(receive).mul_(1.0 / size);
    deliver(receive, output);
  };
  work->wait();
}

void MpiCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  all_gather_async(input, output)->wait();
}

std::shared_ptr<Work> MpiCommunicator::all_gather_async(const Tensor& input, const Tensor& output) {
  const char* what = "all_gather";
  check_cpu_tensor(input, what, "input");
  check_cpu_tensor(output, what, "output");
  check_writable(output, what, "output");
  TESSEL_CHECK(input.dtype() == output.dtype(), what, ": input is ", dtype_name(input.dtype()),
               " but output is ", dtype_name(output.dtype()), "; they must match");
  TESSEL_CHECK(output.dim() >= 1, what,
               ": output must have at least one dimension to gather "
               "along, got a scalar");
  int64_t rows = output.size(0);
  Shape expected = output.sizes();
  expected[0] = part_rows(rows, state_->size, state_->rank);
  TESSEL_CHECK(input.sizes() == expected, what, ": input has shape ", shape_str(input.sizes()),
               " but rank ", state_->rank, "'s part of output ", shape_str(output.sizes()),
               " split over ", state_->size, " ranks along dim 0 has shape ", shape_str(expected));
  NoGradGuard no_grad;
  Tensor send = contiguous(input);
  if (send.storage() == output.storage()) send = clone(send);  // MPI buffers must not overlap
  Tensor receive = output.is_contiguous() ? output : empty(output.sizes(), output.dtype());
  auto work =
      begin_collective(state_, Collective::kAllGather, output.numel(), tensor_label(output));
  int64_t row = row_elements(output);
  work->counts.resize(state_->size);
  work->displacements.resize(state_->size);
  for (int r = 0; r < state_->size; ++r) {
    work->counts[r] = static_cast<int>(part_rows(rows, state_->size, r) * row);
    work->displacements[r] = static_cast<int>(part_start(rows, state_->size, r) * row);
  }
  MPI_Datatype type = wire_type(output.dtype());
  void* send_data = work->pin(send);
  void* receive_data = work->pin(receive);
  work->launched(MPI_Iallgatherv(send_data, work->counts[state_->rank], type, receive_data,
                                 work->counts.data(), work->displacements.data(), type,
                                 state_->comm, &work->request),
                 "MPI_Iallgatherv");
  work->finish = [receive, output] { deliver(receive, output); };
  return work;
}

void MpiCommunicator::broadcast(const Tensor& tensor, int root) {
  const char* what = "broadcast";
  check_cpu_tensor(tensor, what, "tensor");
  check_writable(tensor, what, "tensor");
  check_rank(root, state_->size, what, "root");
  NoGradGuard no_grad;
  Tensor buffer = contiguous(tensor);
  auto work = begin_collective(state_, Collective::kBroadcast, tensor.numel(),
                               "root " + std::to_string(root) + ", " + tensor_label(tensor));
  void* data = work->pin(buffer);
  work->launched(MPI_Ibcast(data, static_cast<int>(buffer.numel()), wire_type(tensor.dtype()), root,
                            state_->comm, &work->request),
                 "MPI_Ibcast");
  bool receives = state_->rank != root;
  work->finish = [buffer, tensor, receives] {
    if (receives) deliver(buffer, tensor);
  };
  work->wait();
}

void MpiCommunicator::barrier() {
  auto work = begin_collective(state_, Collective::kBarrier, 0, "");
  work->launched(MPI_Ibarrier(state_->comm, &work->request), "MPI_Ibarrier");
  work->wait();
}

void MpiCommunicator::send(const Tensor& tensor, int destination, int tag) {
  const char* what = "send";
  check_cpu_tensor(tensor, what, "tensor");
  check_rank(destination, state_->size, what, "destination");
  TESSEL_CHECK(destination != state_->rank, what, ": rank ", state_->rank,
               " cannot send to itself");
  TESSEL_CHECK(tag >= 0 && tag <= kMaxUserTag, what, ": tag ", tag, " is outside [0, ", kMaxUserTag,
               "]");
  state_->check_usable(what);
  NoGradGuard no_grad;
  Tensor buffer = contiguous(tensor);
  StorageAccess access(buffer.storage());
  void* data = static_cast<char*>(access.data()) +
               buffer.storage_offset() * static_cast<int64_t>(buffer.element_size());
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Isend(data, static_cast<int>(buffer.numel()), wire_type(buffer.dtype()),
                      destination, tag, state_->comm, &request),
            "send: MPI_Isend");
  std::string label = detail::str_cat("send of ", tensor_label(tensor), " to ",
                                      state_->rank_label(destination), " with tag ", tag);
  wait_point_to_point(*state_, request, label,
                      state_->rank_label(destination) + " did not receive it");
}

void MpiCommunicator::recv(const Tensor& tensor, int source, int tag) {
  const char* what = "recv";
  check_cpu_tensor(tensor, what, "tensor");
  check_writable(tensor, what, "tensor");
  check_rank(source, state_->size, what, "source");
  TESSEL_CHECK(source != state_->rank, what, ": rank ", state_->rank,
               " cannot receive from itself");
  TESSEL_CHECK(tag >= 0 && tag <= kMaxUserTag, what, ": tag ", tag, " is outside [0, ", kMaxUserTag,
               "]");
  state_->check_usable(what);
  NoGradGuard no_grad;
  Tensor buffer = contiguous(tensor);
  MPI_Datatype type = wire_type(buffer.dtype());
  std::string label = detail::str_cat("recv of ", tensor_label(tensor), " from ",
                                      state_->rank_label(source), " with tag ", tag);
  {
    StorageAccess access(buffer.storage());
    void* data = static_cast<char*>(access.data()) +
                 buffer.storage_offset() * static_cast<int64_t>(buffer.element_size());
    MPI_Request request = MPI_REQUEST_NULL;
    check_mpi(MPI_Irecv(data, static_cast<int>(buffer.numel()), type, source, tag, state_->comm,
                        &request),
              "recv: MPI_Irecv");
    MPI_Status status = wait_point_to_point(*state_, request, label,
                                            state_->rank_label(source) + " did not send it");
    int received = 0;
    MPI_Get_count(&status, type, &received);
    TESSEL_CHECK(received == buffer.numel(), label, ": expected ", buffer.numel(),
                 " elements but the message holds ", received,
                 "; send and recv must use tensors of the same size and dtype");
  }
  deliver(buffer, tensor);
}

}  // namespace tessel::parallel
