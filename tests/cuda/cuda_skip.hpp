#pragma once
// The CUDA tests' skip: every test starts with SKIP_WITHOUT_CUDA(), which
// skips it with the reason when no CUDA device can be used.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>

namespace rt_cuda_test {

/// "" when a CUDA device can be used, else why not.
inline std::string no_device_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(status);
  if (count == 0) return "cudaGetDeviceCount found 0 devices";
  return "";
}

}  // namespace rt_cuda_test

#define SKIP_WITHOUT_CUDA()                                                     \
  do {                                                                          \
    static const std::string why = rt_cuda_test::no_device_reason();           \
    if (!why.empty()) GTEST_SKIP() << "no CUDA device: " << why;                \
  } while (0)
