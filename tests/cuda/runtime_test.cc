// The CUDA runtime layer: checked calls turn into tessel::Error with file, line and the
// library's message; streams and handles per device; device guards; a kernel end to end.
// Tests that need a GPU skip themselves when device_count() == 0.
#include "cuda/runtime.h"

#include "core/error.h"
#include "cuda/selftest.h"
#include "gtest/gtest.h"
#include "tests/gpu_skip.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::throws_error;

TEST(CudaCheck, ErrorNamesFileLineExpressionAndMessage) {
  EXPECT_TRUE(throws_error([] { TESSEL_CUDA_CHECK(cudaErrorInvalidValue); }, "runtime_test.cc:"));
  EXPECT_TRUE(throws_error([] { TESSEL_CUDA_CHECK(cudaErrorInvalidValue); },
                           "cudaErrorInvalidValue: invalid argument (cudaErrorInvalidValue)"));
  EXPECT_NO_THROW(TESSEL_CUDA_CHECK(cudaSuccess));
}

TEST(CudaCheck, LibraryErrorsCarryTheLibraryMessage) {
  EXPECT_TRUE(throws_error([] { TESSEL_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE); },
                           "CUBLAS_STATUS_INVALID_VALUE"));
  EXPECT_TRUE(
      throws_error([] { TESSEL_CUDNN_CHECK(CUDNN_STATUS_BAD_PARAM); }, "CUDNN_STATUS_BAD_PARAM"));
  EXPECT_TRUE(throws_error([] { TESSEL_NCCL_CHECK(ncclInvalidArgument); }, "NCCL error 4"));
}

TEST(CudaDevices, CountNeverThrows) { EXPECT_GE(cuda::device_count(), 0); }

TEST(CudaDevices, NoGpuIsAClearError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present";
  EXPECT_TRUE(throws_error([] { cuda::compute_stream(0); }, "device_count() == 0"));
  EXPECT_TRUE(throws_error([] { cuda::DeviceGuard guard(0); }, "no CUDA device available"));
}

TEST(CudaDevices, OutOfRangeDeviceIsAClearError) {
  TESSEL_SKIP_IF_NO_GPU();
  int count = cuda::device_count();
  EXPECT_TRUE(throws_error([count] { cuda::compute_stream(count); }, "no device cuda:"));
  EXPECT_TRUE(throws_error([] { cuda::check_device(-1); }, "no device cuda:-1"));
}

TEST(CudaStreams, OneComputeAndOneCopyStreamPerDeviceBothNonBlocking) {
  TESSEL_SKIP_IF_NO_GPU();
  cudaStream_t compute = cuda::compute_stream(0);
  cudaStream_t copy = cuda::copy_stream(0);
  EXPECT_NE(compute, copy);
  EXPECT_EQ(compute, cuda::compute_stream(0));
  EXPECT_EQ(copy, cuda::copy_stream(0));
  EXPECT_EQ(cuda::stream_for(0, cuda::kComputeStreamId), compute);
  EXPECT_EQ(cuda::stream_for(0, cuda::kCopyStreamId), copy);
  unsigned flags = 0;
  TESSEL_CUDA_CHECK(cudaStreamGetFlags(compute, &flags));
  EXPECT_EQ(flags & cudaStreamNonBlocking, cudaStreamNonBlocking);
  TESSEL_CUDA_CHECK(cudaStreamGetFlags(copy, &flags));
  EXPECT_EQ(flags & cudaStreamNonBlocking, cudaStreamNonBlocking);
}

TEST(CudaStreams, LibraryHandlesAreBoundToTheComputeStream) {
  TESSEL_SKIP_IF_NO_GPU();
  cudaStream_t bound = nullptr;
  TESSEL_CUBLAS_CHECK(cublasGetStream(cuda::cublas_handle(0), &bound));
  EXPECT_EQ(bound, cuda::compute_stream(0));
  TESSEL_CUDNN_CHECK(cudnnGetStream(cuda::cudnn_handle(0), &bound));
  EXPECT_EQ(bound, cuda::compute_stream(0));
}

TEST(CudaStreams, Tf32IsOffByDefaultAndFollowsTheFlag) {
  TESSEL_SKIP_IF_NO_GPU();
  cublasMath_t mode;
  TESSEL_CUBLAS_CHECK(cublasGetMathMode(cuda::cublas_handle(0), &mode));
  EXPECT_EQ(mode, CUBLAS_DEFAULT_MATH);
  cuda::set_allow_tf32(true);
  TESSEL_CUBLAS_CHECK(cublasGetMathMode(cuda::cublas_handle(0), &mode));
  EXPECT_EQ(mode, CUBLAS_TF32_TENSOR_OP_MATH);
  cuda::set_allow_tf32(false);
}

TEST(CudaStreams, EventsOrderWorkAcrossStreams) {
  TESSEL_SKIP_IF_NO_GPU();
  cuda::Event event;
  event.record(cuda::copy_stream(0));
  event.synchronize();
  EXPECT_TRUE(event.query());
  cuda::stream_wait(cuda::compute_stream(0), cuda::copy_stream(0));
  cuda::synchronize(0);
}

TEST(CudaDevices, GuardRestoresThePreviousDevice) {
  TESSEL_SKIP_IF_NO_GPU();
  int before = cuda::current_device();
  {
    cuda::DeviceGuard guard(cuda::device_count() - 1);
    EXPECT_EQ(cuda::current_device(), cuda::device_count() - 1);
  }
  EXPECT_EQ(cuda::current_device(), before);
}

TEST(CudaKernels, AKernelRunsOnTheComputeStream) {
  TESSEL_SKIP_IF_NO_GPU();
  EXPECT_TRUE(cuda::selftest_fill(0, 100003, 3.5f));
}

TEST(CudaKernels, AnInvalidLaunchIsReportedWithItsMessage) {
  TESSEL_SKIP_IF_NO_GPU();
  EXPECT_TRUE(throws_error([] { TESSEL_CUDA_CHECK(cudaMalloc(nullptr, 16)); }, "cudaMalloc"));
}

}  // namespace
}  // namespace tessel
