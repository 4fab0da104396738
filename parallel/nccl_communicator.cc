#include "parallel/nccl_communicator.h"

#include <chrono>
#include <thread>

#include "core/autograd.h"
#include "core/error.h"
#include "core/shape.h"
#include "core/storage.h"
#include "cuda/runtime.h"
#include "ops/ops.h"
#include "parallel/deadline_wait.h"

namespace tessel::parallel {

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kUInt8:
    case DType::kBool:
      return ncclUint8;
  }
  TESSEL_FAIL("NcclCommunicator: unsupported dtype");
}

bool nccl_floating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat16;
}

// bool: sum and max are a logical or, min a logical and, on bytes that hold 0 or 1.
ncclRedOp_t nccl_op(ReduceOp op, DType dtype) {
  const bool boolean = dtype == DType::kBool;
  switch (op) {
    case ReduceOp::kSum:
      return boolean ? ncclMax : ncclSum;
    case ReduceOp::kMean:
      TESSEL_CHECK(nccl_floating(dtype),
                   "NcclCommunicator: mean needs a floating-point tensor, got ", dtype_name(dtype));
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  TESSEL_FAIL("NcclCommunicator: unknown reduce op");
}

// The device address of a contiguous tensor's first element.
void* device_pointer(const Tensor& tensor, StorageAccess& access) {
  return static_cast<char*>(access.data()) +
         tensor.storage_offset() * static_cast<int64_t>(tensor.element_size());
}

}  // namespace

struct NcclCommunicator::State {
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;
  std::string name;
  double timeout_s = 300;
  int64_t sequence = 0;
  bool broken = false;

  cudaStream_t stream() const { return cuda::compute_stream(device); }

  void check_usable(const char* what) const {
    TESSEL_CHECK(!broken, what, " on NCCL communicator '", name,
                 "': the communicator was aborted after an earlier error or timeout");
  }

  void check_tensor(const Tensor& tensor, const char* what, const char* argument) const {
    TESSEL_CHECK(tensor.defined(), what, ": ", argument, " is undefined");
    TESSEL_CHECK(tensor.device() == Device::cuda(device), what, " on NCCL communicator '", name,
                 "': ", argument, " is on ", tensor.device().str(), " but the communicator is on ",
                 Device::cuda(device).str(), " (MPI communicators take CPU tensors)");
  }

  std::string describe() const {
    return detail::str_cat("NCCL communicator '", name, "' (rank ", rank, " of ", size, ")");
  }

  // NCCL's asynchronous state: kPending while an operation of this non-blocking communicator is
  // still being set up (ncclInProgress), kFailed on an error.
  PollState async_state() const {
    ncclResult_t async_error = ncclSuccess;
    TESSEL_NCCL_CHECK(ncclCommGetAsyncError(comm, &async_error));
    if (async_error == ncclSuccess) return PollState::kDone;
    return async_error == ncclInProgress ? PollState::kPending : PollState::kFailed;
  }

  // Waits on the host until `poll` says done, within the timeout from now; on an NCCL error or
  // past the deadline aborts the communicator and raises an error naming `what`.
  void wait_until(const std::function<PollState()>& poll, const std::string& what,
                  const std::string& late_reason) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
    DeadlineWait wait;
    wait.poll = poll;
    wait.failure = [this] {
      ncclResult_t async_error = ncclSuccess;
      ncclCommGetAsyncError(comm, &async_error);
      const char* last = ncclGetLastError(comm);
      return detail::str_cat(ncclGetErrorString(async_error), " (NCCL error ",
                             static_cast<int>(async_error), ")",
                             last && *last ? detail::str_cat(": ", last) : std::string());
    };
    wait.abort = [this] {
      broken = true;
      if (comm != nullptr) ncclCommAbort(comm);
      comm = nullptr;
    };
    wait_until_done(wait, deadline, timeout_s, detail::str_cat(what, " on ", describe()),
                    late_reason);
  }

  // Waits on the host for `event` until the deadline; on timeout aborts the communicator.
  void wait_event(cudaEvent_t event, const std::string& what) {
    wait_until(
        [&] {
          const cudaError_t status = cudaEventQuery(event);
          if (status == cudaSuccess) return PollState::kDone;
          if (status != cudaErrorNotReady) TESSEL_CUDA_CHECK(status);
          cudaGetLastError();  // "not ready" is recorded as the last error: a later check sees it
          const PollState nccl = async_state();
          return nccl == PollState::kFailed ? nccl : PollState::kPending;
        },
        what, "a rank never arrived or stopped");
  }

  // Checks the result of an NCCL call on this non-blocking communicator: ncclInProgress means
  // the call is still being issued, and the next one may only follow once it is.
  void check_call(ncclResult_t status, const char* what) {
    if (status == ncclInProgress) {
      wait_until([this] { return async_state(); }, what, "NCCL could not issue it");
      return;
    }
    TESSEL_NCCL_CHECK(status);
  }

  std::string label(const char* what) { return detail::str_cat(what, " #", ++sequence); }
};

namespace {

// NCCL reads and writes dense buffers: runs `call(data, buffer)` on `tensor` itself when it is
// contiguous, else on a dense copy (of its values when `load`, uninitialised otherwise) whose
// result is copied back, queued on the same stream after the call.
template <typename Call>
void on_dense_buffer(const Tensor& tensor, int device, bool load, Call&& call) {
  const bool direct = tensor.is_contiguous();
  Tensor buffer =
      direct ? tensor
      : load ? contiguous(tensor)
             : empty(tensor.sizes(), TensorOptions(tensor.dtype()).device(tensor.device()));
  {
    StorageAccess access(buffer.storage());
    void* data = device_pointer(buffer, access);
    cuda::DeviceGuard guard(device);
    call(data, buffer);
  }
  if (!direct) {
    Tensor target = tensor;
    target.copy_(buffer);
  }
}

// A recorded event on the compute stream, waited for on the host by Work::wait.
class NcclWork : public Work {
 public:
  NcclWork(std::shared_ptr<NcclCommunicator::State> state, std::string what)
      : state_(std::move(state)), what_(std::move(what)) {
    cuda::DeviceGuard guard(state_->device);
    TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    TESSEL_CUDA_CHECK(cudaEventRecord(event_, state_->stream()));
  }
  ~NcclWork() override {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  bool poll() override {
    if (done_) return true;
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      cudaGetLastError();  // not an error: clear it before a kernel launch check sees it
      return false;
    }
    TESSEL_CUDA_CHECK(status);
    return true;
  }
  void wait() override {
    if (done_) return;
    state_->wait_event(event_, what_);
    done_ = true;
  }

 private:
  std::shared_ptr<NcclCommunicator::State> state_;
  std::string what_;
  cudaEvent_t event_ = nullptr;
  bool done_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm comm, int device, CommOptions options)
    : state_(std::make_shared<State>()) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  TESSEL_CHECK(initialized,
               "NcclCommunicator: MPI is not initialised (start the program through "
               "parallel::run_ranks)");
  TESSEL_CHECK(options.timeout_s() > 0, "NcclCommunicator: timeout_s must be positive, got ",
               options.timeout_s());
  cuda::check_device(device, "NcclCommunicator");
  MPI_Comm_rank(comm, &state_->rank);
  MPI_Comm_size(comm, &state_->size);
  state_->device = device;
  state_->name = options.name();
  state_->timeout_s = options.timeout_s();
  ncclUniqueId id;
  if (state_->rank == 0) TESSEL_NCCL_CHECK(ncclGetUniqueId(&id));
  // Non-blocking, so that a rank 0 that never sends (it failed, or never got here) is an error
  // within the timeout rather than a hang.
  MPI_Request request = MPI_REQUEST_NULL;
  TESSEL_CHECK(MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, comm, &request) == MPI_SUCCESS,
               "NcclCommunicator: MPI_Ibcast of the NCCL unique id failed");
  const auto deadline = Clock::now() + std::chrono::duration<double>(state_->timeout_s);
  for (int done = 0; !done;) {
    TESSEL_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS,
                 "NcclCommunicator: MPI_Test of the NCCL unique id broadcast failed");
    if (done) break;
    TESSEL_CHECK(Clock::now() < deadline, "NcclCommunicator '", state_->name, "': rank ",
                 state_->rank, " of ", state_->size,
                 " did not receive the NCCL unique id from rank ", "0 within ", state_->timeout_s,
                 " s (rank 0 failed or never created the group)");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  cuda::DeviceGuard guard(device);
  // Non-blocking, so that joining is bounded by the timeout too: ncclCommInitRank would wait
  // forever for a rank that never calls it.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t status =
      ncclCommInitRankConfig(&state_->comm, state_->size, id, state_->rank, &config);
  // The usual cause on one node: two ranks on one GPU (NCCL refuses a GPU twice in a communicator).
  const std::string one_gpu_each =
      "every rank of an NCCL communicator needs a GPU of its own: start at most as many ranks per "
      "node as it has GPUs";
  if (status != ncclSuccess && status != ncclInProgress) {
    if (state_->comm != nullptr) ncclCommAbort(state_->comm);
    state_->comm = nullptr;
    TESSEL_FAIL("NcclCommunicator '", state_->name, "': rank ", state_->rank, " of ", state_->size,
                " could not join on ", Device::cuda(device).str(), ": ", ncclGetErrorString(status),
                " (", one_gpu_each, ")");
  }
  state_->wait_until([this] { return state_->async_state(); },
                     detail::str_cat("joining on ", Device::cuda(device).str()),
                     detail::str_cat("a rank never joined (", one_gpu_each, ")"));
}

NcclCommunicator::~NcclCommunicator() {
  if (!state_ || state_->comm == nullptr) return;
  try {
    // Queued collectives finish first, within the timeout; past it (a peer is gone) abort.
    cuda::DeviceGuard guard(state_->device);
    cuda::Event queued;
    queued.record(state_->stream());
    state_->wait_event(queued.get(), "closing");
    // Finalising a non-blocking communicator may go on after the call returns.
    state_->check_call(ncclCommFinalize(state_->comm), "closing");
    ncclCommDestroy(state_->comm);
  } catch (const Error&) {
    // wait_event aborted the communicator (comm is null then), or CUDA is shutting down.
    if (state_->comm != nullptr) ncclCommAbort(state_->comm);
  }
  cudaGetLastError();
}

std::shared_ptr<NcclCommunicator> NcclCommunicator::world(int device, CommOptions options) {
  return std::make_shared<NcclCommunicator>(MPI_COMM_WORLD, device, std::move(options));
}

int NcclCommunicator::rank() const { return state_->rank; }
int NcclCommunicator::size() const { return state_->size; }
const std::string& NcclCommunicator::name() const { return state_->name; }
Device NcclCommunicator::device() const { return Device::cuda(state_->device); }

void NcclCommunicator::all_reduce(const Tensor& tensor, ReduceOp op) {
  all_reduce_async(tensor, op);  // stream-ordered: nothing to wait for on the host
}

std::shared_ptr<Work> NcclCommunicator::all_reduce_async(const Tensor& tensor, ReduceOp op) {
  const char* what = "all_reduce";
  state_->check_tensor(tensor, what, "tensor");
  state_->check_usable(what);
  const ncclRedOp_t nccl_reduce = nccl_op(op, tensor.dtype());
  NoGradGuard no_grad;
  on_dense_buffer(tensor, state_->device, /*load=*/true, [&](void* data, const Tensor& buffer) {
    state_->check_call(
        ncclAllReduce(data, data, static_cast<size_t>(buffer.numel()), nccl_type(buffer.dtype()),
                      nccl_reduce, state_->comm, state_->stream()),
        what);
  });
  return std::make_shared<NcclWork>(state_, state_->label(what));
}

void NcclCommunicator::reduce_scatter(const Tensor& input, const Tensor& output, ReduceOp op) {
  const char* what = "reduce_scatter";
  state_->check_tensor(input, what, "input");
  state_->check_tensor(output, what, "output");
  state_->check_usable(what);
  TESSEL_CHECK(input.dim() >= 1 && input.dtype() == output.dtype(), what,
               ": input and output need the same dtype and at least one dim, got ",
               shape_str(input.sizes()), " ", dtype_name(input.dtype()), " and ",
               shape_str(output.sizes()), " ", dtype_name(output.dtype()));
  const int64_t rows = input.size(0);
  Shape expected = input.sizes();
  expected[0] = part_rows(rows, state_->size, state_->rank);
  TESSEL_CHECK(output.sizes() == expected, what, ": output must be ", shape_str(expected),
               " (this rank's part of input ", shape_str(input.sizes()), "), got ",
               shape_str(output.sizes()));
  const ncclRedOp_t nccl_reduce = nccl_op(op, input.dtype());
  NoGradGuard no_grad;
  // NCCL needs equal parts: each part goes into a slot of the largest part's rows.
  const int64_t slot_rows = part_rows(rows, state_->size, 0);
  const int64_t row_elements = rows > 0 ? input.numel() / rows : 0;
  Shape padded_sizes = input.sizes();
  padded_sizes[0] = slot_rows * state_->size;
  Tensor padded = zeros(padded_sizes, TensorOptions(input.dtype()).device(input.device()));
  for (int r = 0; r < state_->size; ++r) {
    const int64_t count = part_rows(rows, state_->size, r);
    if (count == 0) continue;
    Tensor slot = padded.narrow(0, r * slot_rows, count);
    slot.copy_(input.narrow(0, part_start(rows, state_->size, r), count));
  }
  Shape slot_sizes = input.sizes();
  slot_sizes[0] = slot_rows;
  Tensor received = empty(slot_sizes, TensorOptions(input.dtype()).device(input.device()));
  {
    StorageAccess in_access(padded.storage());
    StorageAccess out_access(received.storage());
    cuda::DeviceGuard guard(state_->device);
    state_->check_call(
        ncclReduceScatter(device_pointer(padded, in_access), device_pointer(received, out_access),
                          static_cast<size_t>(slot_rows * row_elements), nccl_type(input.dtype()),
                          nccl_reduce, state_->comm, state_->stream()),
        what);
  }
  state_->label(what);
  if (expected[0] > 0) {
    Tensor target = output;
    target.copy_(received.narrow(0, 0, expected[0]));
  }
}

void NcclCommunicator::all_gather(const Tensor& input, const Tensor& output) {
  const char* what = "all_gather";
  state_->check_tensor(input, what, "input");
  state_->check_tensor(output, what, "output");
  state_->check_usable(what);
  TESSEL_CHECK(output.dim() >= 1 && input.dtype() == output.dtype(), what,
               ": input and output need the same dtype and at least one dim");
  const int64_t rows = output.size(0);
  Shape expected = output.sizes();
  expected[0] = part_rows(rows, state_->size, state_->rank);
  TESSEL_CHECK(input.sizes() == expected, what, ": input must be ", shape_str(expected),
               " (this rank's part of output ", shape_str(output.sizes()), "), got ",
               shape_str(input.sizes()));
  NoGradGuard no_grad;
  const int64_t slot_rows = part_rows(rows, state_->size, 0);
  const int64_t row_elements = rows > 0 ? output.numel() / rows : 0;
  Shape slot_sizes = output.sizes();
  slot_sizes[0] = slot_rows;
  Tensor mine = zeros(slot_sizes, TensorOptions(input.dtype()).device(input.device()));
  if (expected[0] > 0) mine.narrow(0, 0, expected[0]).copy_(input);
  Shape gathered_sizes = output.sizes();
  gathered_sizes[0] = slot_rows * state_->size;
  Tensor gathered = empty(gathered_sizes, TensorOptions(input.dtype()).device(input.device()));
  {
    StorageAccess in_access(mine.storage());
    StorageAccess out_access(gathered.storage());
    cuda::DeviceGuard guard(state_->device);
    state_->check_call(
        ncclAllGather(device_pointer(mine, in_access), device_pointer(gathered, out_access),
                      static_cast<size_t>(slot_rows * row_elements), nccl_type(input.dtype()),
                      state_->comm, state_->stream()),
        what);
  }
  state_->label(what);
  for (int r = 0; r < state_->size; ++r) {
    const int64_t count = part_rows(rows, state_->size, r);
    if (count == 0) continue;
    output.narrow(0, part_start(rows, state_->size, r), count)
        .copy_(gathered.narrow(0, r * slot_rows, count));
  }
}

void NcclCommunicator::broadcast(const Tensor& tensor, int root) {
  const char* what = "broadcast";
  state_->check_tensor(tensor, what, "tensor");
  state_->check_usable(what);
  TESSEL_CHECK(root >= 0 && root < state_->size, what, ": root ", root, " is not a rank of ",
               state_->size);
  NoGradGuard no_grad;
  on_dense_buffer(tensor, state_->device, /*load=*/true, [&](void* data, const Tensor& buffer) {
    state_->check_call(
        ncclBroadcast(data, data, static_cast<size_t>(buffer.numel()), nccl_type(buffer.dtype()),
                      root, state_->comm, state_->stream()),
        what);
  });
  state_->label(what);
}

void NcclCommunicator::send(const Tensor& tensor, int destination, int tag) {
  const char* what = "send";
  state_->check_tensor(tensor, what, "tensor");
  state_->check_usable(what);
  TESSEL_CHECK(destination >= 0 && destination < state_->size && destination != state_->rank, what,
               ": destination ", destination, " is not another rank of ", state_->size);
  TESSEL_CHECK(tag >= 0 && tag <= 32767, what, ": tag ", tag, " is outside [0, 32767]");
  NoGradGuard no_grad;
  Tensor buffer = contiguous(tensor);
  StorageAccess access(buffer.storage());
  cuda::DeviceGuard guard(state_->device);
  state_->check_call(
      ncclSend(device_pointer(buffer, access), static_cast<size_t>(buffer.numel()),
               nccl_type(buffer.dtype()), destination, state_->comm, state_->stream()),
      what);
  state_->label(what);
}

void NcclCommunicator::recv(const Tensor& tensor, int source, int tag) {
  const char* what = "recv";
  state_->check_tensor(tensor, what, "tensor");
  state_->check_usable(what);
  TESSEL_CHECK(source >= 0 && source < state_->size && source != state_->rank, what, ": source ",
               source, " is not another rank of ", state_->size);
  TESSEL_CHECK(tag >= 0 && tag <= 32767, what, ": tag ", tag, " is outside [0, 32767]");
  NoGradGuard no_grad;
  on_dense_buffer(tensor, state_->device, /*load=*/false, [&](void* data, const Tensor& buffer) {
    state_->check_call(ncclRecv(data, static_cast<size_t>(buffer.numel()),
                                nccl_type(buffer.dtype()), source, state_->comm, state_->stream()),
                       what);
  });
  state_->label(what);
}

void NcclCommunicator::synchronize() {
  state_->check_usable("synchronize");
  cuda::DeviceGuard guard(state_->device);
  cudaEvent_t event = nullptr;
  TESSEL_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  TESSEL_CUDA_CHECK(cudaEventRecord(event, state_->stream()));
  try {
    state_->wait_event(event, detail::str_cat("the collectives up to #", state_->sequence));
  } catch (...) {
    cudaEventDestroy(event);
    throw;
  }
  cudaEventDestroy(event);
  cuda::raise_device_errors(state_->device);  // the compute stream was waited for
}

void NcclCommunicator::barrier() {
  Tensor token = zeros({1}, TensorOptions(DType::kInt32).device(Device::cuda(state_->device)));
  all_reduce(token, ReduceOp::kSum);
  synchronize();
}

namespace {
// The backend make_device_communicator uses for CUDA tensors; this library is alwayslink
// (tools/cuda.bzl), so linking it is enough.
const bool kNcclRegistered = [] {
  DeviceCommunicatorBackend backend;
  backend.device_count = [] { return cuda::device_count(); };
  backend.use_device = [](int device) { cuda::set_process_device(device); };
  backend.make = [](MPI_Comm comm, int device, CommOptions options) {
    return std::static_pointer_cast<Communicator>(
        std::make_shared<NcclCommunicator>(comm, device, std::move(options)));
  };
  set_device_communicator_backend(DeviceType::kCuda, std::move(backend));
  return true;
}();
}  // namespace

}  // namespace tessel::parallel
