// Communicator: the collectives every backend offers (MPI for CPU tensors here; NCCL for CUDA
// tensors implements the same interface). Every rank of the group calls the same collectives in
// the same order; a rank that never arrives makes the others fail within a timeout.
//   comm->all_reduce(grad, ReduceOp::kMean);   comm->all_gather(my_rows, all_rows);
//   auto nccl = make_device_communicator(MPI_COMM_WORLD, Device::cuda(0));  // --config=cuda
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/arg.h"
#include "core/device.h"
#include "core/tensor.h"

namespace tessel::parallel {

enum class ReduceOp {
  kSum,   // bool: logical or; integers wrap as their C++ type does
  kMean,  // floating-point dtypes only: the sum divided by the group size
  kMax,   // bool: logical or
  kMin,   // bool: logical and
};

const char* reduce_op_name(ReduceOp op);

// Layout of reduce_scatter and all_gather: dim 0 of the full tensor is split into `parts`
// near-equal parts in rank order, like torch.tensor_split(full, parts, dim=0): the first
// `rows % parts` parts have one row more than the others, and parts may be empty (rows < parts).
// These give the row count and the first row of part `index`.
int64_t part_rows(int64_t rows, int parts, int index);
int64_t part_start(int64_t rows, int parts, int index);

// Seconds a collective waits for the other ranks before failing: TESSEL_COLLECTIVE_TIMEOUT_S
// when set (a positive number), else 300.
double collective_timeout_from_env();

// Options shared by every backend, with fluent setters: CommOptions().name("dp").timeout_s(3).
class CommOptions {
 public:
  CommOptions() = default;
  // Shown in error messages ("all_reduce #12 on communicator 'dp' ...").
  CommOptions& name(std::string value) {
    name_ = std::move(value);
    return *this;
  }
  const std::string& name() const { return name_; }

  // Must be positive; checked by the communicator's constructor.
  TESSEL_ARG(double, timeout_s) = collective_timeout_from_env();

 private:
  std::string name_ = "world";
};

// A collective in flight (from all_reduce_async). wait() blocks until it is done, finishes it
// (division for kMean, copies back into non-contiguous or converted tensors) and throws a
// tessel::Error when it times out. The tensor must not be touched before wait() returns.
class Work {
 public:
  virtual ~Work() = default;
  // Makes progress and says whether wait() would return at once; never blocks.
  virtual bool poll() = 0;
  virtual void wait() = 0;
};

// Tensors may have any dtype (f32, f64, bf16, f16, i32, i64, u8, bool) and any strides
// (non-contiguous ones go through a contiguous copy); a tensor written to must not be an
// expanded view (a stride 0 over a dimension > 1). bf16 and f16 are reduced in f32.
// Bad arguments throw before any communication, so every rank sees the same error.
// A collective returns on a rank once that rank's part is done (a broadcast may finish early on
// ranks that only receive), so the ranks that still need a missing rank are the ones that time
// out. After a timeout the communicator is unusable: every later call throws.
// Call a communicator from one thread at a time (MPI is initialised as funneled).
// Work that is already done (wait() returns at once): what a communicator that finishes a
// collective before returning hands back from its *_async calls.
std::shared_ptr<Work> finished_work();

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;
  // Where the tensors it moves live: cpu for MPI, this rank's GPU for NCCL.
  virtual Device device() const = 0;

  // In place: every rank ends with op over all ranks' tensors (same shape and dtype everywhere).
  virtual void all_reduce(const Tensor& tensor, ReduceOp op = ReduceOp::kSum) = 0;
  // The same, started now and finished by Work::wait(); several may be in flight.
  virtual std::shared_ptr<Work> all_reduce_async(const Tensor& tensor,
                                                 ReduceOp op = ReduceOp::kSum) = 0;
  // input (rows, ...) is the same shape on every rank; output receives this rank's part
  // (part_rows(rows, size(), rank()), ...) of op over all ranks' inputs.
  virtual void reduce_scatter(const Tensor& input, const Tensor& output,
                              ReduceOp op = ReduceOp::kSum) = 0;
  // input is this rank's part (part_rows(rows, size(), rank()), ...); output (rows, ...) receives
  // every rank's part in rank order.
  virtual void all_gather(const Tensor& input, const Tensor& output) = 0;
  // The same, started now and finished by Work::wait() (checks as all_gather's, at once). This
  // default gathers at once and returns finished work; MPI overlaps it with what follows.
  virtual std::shared_ptr<Work> all_gather_async(const Tensor& input, const Tensor& output);
  // Every rank ends with root's values.
  virtual void broadcast(const Tensor& tensor, int root) = 0;
  // Point to point: blocks until the tensor can be reused / has arrived. recv's tensor must have
  // the sender's element count and dtype. Tags are in [0, 32767].
  virtual void send(const Tensor& tensor, int destination, int tag = 0) = 0;
  virtual void recv(const Tensor& tensor, int source, int tag = 0) = 0;
  virtual void barrier() = 0;
};

// ---- communicators for device tensors, found through a registry so that code built without
// --config=cuda can ask for one (and get a clear error) without including the NCCL header.

// A backend for the tensors of one device type, registered at load time by the library that
// implements it: //parallel:nccl (NCCL, for CUDA), linked into --config=cuda builds.
struct DeviceCommunicatorBackend {
  // Devices of this type this process sees (0 when none); never throws.
  std::function<int()> device_count;
  // A collective over `comm`'s ranks, each on its device index `device`.
  std::function<std::shared_ptr<Communicator>(MPI_Comm comm, int device, CommOptions options)> make;
  // Makes device `device` current for the whole process (a rank's own GPU); may be empty when
  // the device type has no notion of a current device.
  std::function<void(int device)> use_device;
};

// Installs (or replaces) the backend for `type`; an empty backend removes it. CPU tensors always
// go through MpiCommunicator.
void set_device_communicator_backend(DeviceType type, DeviceCommunicatorBackend backend);
bool has_device_communicator_backend(DeviceType type);

// A communicator over `comm`'s ranks for tensors on `device` (a collective call): an
// MpiCommunicator for the CPU, the registered backend's for other devices. A tessel::Error when
// none is registered (CUDA: "NCCL needs a --config=cuda build"), before any communication.
std::shared_ptr<Communicator> make_device_communicator(MPI_Comm comm, Device device,
                                                       CommOptions options = {});

// Devices of `type` that make_device_communicator can use in this process (the backend's count;
// 1 for the CPU). A tessel::Error when no backend is registered for `type`.
int communicator_device_count(DeviceType type);

// Makes `device` this process's device for good, through its type's backend, before the rank
// touches any other device (without it every rank would also work on, and hold memory of, GPU 0).
// Nothing for the CPU. A tessel::Error when no backend is registered for `device`'s type.
void use_rank_device(Device device);

}  // namespace tessel::parallel
