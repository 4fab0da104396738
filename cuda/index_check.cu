#include "cuda/index_check.h"
#include "cuda/ops/loops.cuh"

namespace tessel::cuda {

namespace {

// The lowest position of a bad index, by atomicMin (~0: none).
template <typename I>
__global__ void first_bad_index_kernel(const I* index, int64_t count, IndexError check,
                                       unsigned long long* first_bad) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!index_is_valid(check, static_cast<int64_t>(index[i])))
      atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

// One thread, after the search in stream order: records the bad index unless an earlier check
// already did (that one is reported first).
template <typename I>
__global__ void record_bad_index_kernel(const I* index, const unsigned long long* first_bad,
                                        IndexError check, IndexError* record) {
  const unsigned long long position = *first_bad;
  if (position == ~0ull || record->op != IndexOp::kNone) return;
  check.position = static_cast<int64_t>(position);
  check.value = static_cast<int64_t>(index[position]);
  const IndexOp op = check.op;
  check.op = IndexOp::kNone;
  *record = check;
  __threadfence_system();  // the details reach host memory before the op that marks them
  record->op = op;
}

template <typename I>
void launch_check(const Tensor& index, const IndexError& check, unsigned long long* first_bad,
                  IndexError* record, cudaStream_t stream) {
  const int64_t count = index.numel();
  first_bad_index_kernel<I><<<grid_for(count), kThreads, 0, stream>>>(device_data<const I>(index),
                                                                      count, check, first_bad);
  check_launch();
  record_bad_index_kernel<I>
      <<<1, 1, 0, stream>>>(device_data<const I>(index), first_bad, check, record);
  check_launch();
}

}  // namespace

void check_indices(KernelContext& context, const Tensor& index, const IndexError& check) {
  if (index.numel() == 0) return;
  TESSEL_CHECK(index.is_contiguous(), "check_indices: expected a contiguous index tensor");
  KernelDevice device(index);
  IndexError* record = device_error_record(device.index());
  Tensor first_bad = context.workspace({1}, DType::kInt64);
  auto* position = device_data<unsigned long long>(first_bad);
  TESSEL_CUDA_CHECK(cudaMemsetAsync(position, 0xff, sizeof(unsigned long long), device.stream()));
  if (index.dtype() == DType::kInt64) {
    launch_check<int64_t>(index, check, position, record, device.stream());
  } else {
    TESSEL_CHECK(index.dtype() == DType::kInt32,
                 "check_indices: expected an i64 or i32 index, got ", dtype_name(index.dtype()));
    launch_check<int32_t>(index, check, position, record, device.stream());
  }
}

}  // namespace tessel::cuda
