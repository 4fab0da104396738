#include "parallel/communicator.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "parallel/mpi_communicator.h"

namespace tessel::parallel {

namespace {
class FinishedWork : public Work {
 public:
  bool poll() override { return true; }
  void wait() override {}
};
}  // namespace

std::shared_ptr<Work> finished_work() { return std::make_shared<FinishedWork>(); }

std::shared_ptr<Work> Communicator::all_gather_async(const Tensor& input, const Tensor& output) {
  all_gather(input, output);
  return finished_work();
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

int64_t part_rows(int64_t rows, int parts, int index) {
  TESSEL_CHECK(parts >= 1, "part_rows: expected at least one part, got ", parts);
  TESSEL_CHECK(index >= 0 && index < parts, "part_rows: part ", index, " out of range for ", parts,
               " parts");
  TESSEL_CHECK(rows >= 0, "part_rows: negative row count ", rows);
  return rows / parts + (index < rows % parts ? 1 : 0);
}

int64_t part_start(int64_t rows, int parts, int index) {
  TESSEL_CHECK(parts >= 1, "part_start: expected at least one part, got ", parts);
  TESSEL_CHECK(index >= 0 && index <= parts, "part_start: part ", index, " out of range for ",
               parts, " parts");
  int64_t base = rows / parts;
  int64_t extra = rows % parts;
  return index * base + std::min<int64_t>(index, extra);
}

double collective_timeout_from_env() {
  const char* text = std::getenv("TESSEL_COLLECTIVE_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return 300.0;
  char* end = nullptr;
  errno = 0;
  double seconds = std::strtod(text, &end);
  TESSEL_CHECK(errno == 0 && end != text && *end == '\0' && std::isfinite(seconds) && seconds > 0,
               "TESSEL_COLLECTIVE_TIMEOUT_S must be a positive number of seconds, got '", text,
               "'");
  return seconds;
}

namespace {

struct BackendRegistry {
  std::mutex mutex;
  DeviceCommunicatorBackend backends[kNumDeviceTypes];
};

// Function-local: backends register from static initialisers in other translation units.
BackendRegistry& backend_registry() {
  static BackendRegistry registry;
  return registry;
}

const char* device_type_name(DeviceType type) {
  switch (type) {
    case DeviceType::kCpu:
      return "cpu";
    case DeviceType::kCuda:
      return "cuda";
    case DeviceType::kMeta:
      return "meta";
  }
  return "unknown";
}

// The registered backend for `type`; a clear error when there is none.
DeviceCommunicatorBackend find_backend(DeviceType type, const char* what) {
  BackendRegistry& registry = backend_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  const DeviceCommunicatorBackend& backend = registry.backends[static_cast<int>(type)];
  if (backend.make) return backend;
  if (type == DeviceType::kCuda) {
    TESSEL_FAIL(what,
                ": this binary has no communicator for CUDA tensors: NCCL needs a --config=cuda "
                "build (with //parallel:nccl linked, as //train:train does)");
  }
  TESSEL_FAIL(what, ": no communicator moves tensors on ", device_type_name(type),
              " devices (MPI moves CPU tensors, NCCL CUDA tensors)");
}

}  // namespace

void set_device_communicator_backend(DeviceType type, DeviceCommunicatorBackend backend) {
  TESSEL_CHECK(type != DeviceType::kCpu,
               "set_device_communicator_backend: CPU tensors always go through MpiCommunicator");
  TESSEL_CHECK(static_cast<bool>(backend.make) == static_cast<bool>(backend.device_count),
               "set_device_communicator_backend: the backend for ", device_type_name(type),
               " needs both make and device_count (or neither, to remove it)");
  BackendRegistry& registry = backend_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  registry.backends[static_cast<int>(type)] = std::move(backend);
}

bool has_device_communicator_backend(DeviceType type) {
  if (type == DeviceType::kCpu) return true;
  BackendRegistry& registry = backend_registry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  return static_cast<bool>(registry.backends[static_cast<int>(type)].make);
}

std::shared_ptr<Communicator> make_device_communicator(MPI_Comm comm, Device device,
                                                       CommOptions options) {
  if (device.is_cpu()) return std::make_shared<MpiCommunicator>(comm, std::move(options));
  const DeviceCommunicatorBackend backend = find_backend(device.type, "make_device_communicator");
  return backend.make(comm, device.index, std::move(options));
}

int communicator_device_count(DeviceType type) {
  if (type == DeviceType::kCpu) return 1;
  return find_backend(type, "communicator_device_count").device_count();
}

void use_rank_device(Device device) {
  if (device.is_cpu()) return;
  const DeviceCommunicatorBackend backend = find_backend(device.type, "use_rank_device");
  if (backend.use_device) backend.use_device(device.index);
}

}  // namespace tessel::parallel
