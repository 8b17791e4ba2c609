#include "cuda_common.hpp"

#include <limits>

namespace riftco_transformer::cuda::detail {

void check(cudaError_t status, const char* op, const char* call) {
  if (status == cudaSuccess) {
    profile_mark(op, call);
    return;
  }
  cudaGetLastError();  // clear a non-sticky error so the next call does not report it again
  throw BackendError(std::string("[") + op + "] " + call + " failed on cuda: " + cudaGetErrorName(status) + ": " +
                     cudaGetErrorString(status));
}

void check_launch(const char* op, const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status == cudaSuccess) {
    profile_mark(op, kernel);
    return;
  }
  throw BackendError(std::string("[") + op + "] launching " + kernel + " failed on cuda: " + cudaGetErrorName(status) +
                     ": " + cudaGetErrorString(status));
}

void require_cuda(const Tensor& t, const char* op, const char* name) {
  if (!t.defined()) throw ValueError(std::string("[") + op + "] " + name + " is undefined");
  if (t.backend() != Backend::Cuda) {
    throw BackendError(std::string("[") + op + "] " + name + " " + shape_string(t.shape()) + " is on " +
                       backend_name(t.backend()) + ", the cuda kernel needs a cuda tensor");
  }
}

int checked_int(std::int64_t value, const char* op, const char* what) {
  if (value < 0 || value > std::numeric_limits<int>::max()) {
    throw BackendError(std::string("[") + op + "] " + what + " = " + std::to_string(value) +
                       " does not fit the 32-bit size the cuda call takes");
  }
  return static_cast<int>(value);
}

}  // namespace riftco_transformer::cuda::detail
