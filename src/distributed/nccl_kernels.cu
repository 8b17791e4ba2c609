// The NCCL communicator's rank-order sum (nccl_kernels.hpp). Built with the
// backend's --fmad=false; only additions and one IEEE division per element,
// in the order the host loop of the MPI communicator uses.
#include "nccl_kernels.hpp"

namespace riftco_transformer::distributed_detail {
namespace {

__global__ void sum_rows_kernel(const float* __restrict__ rows, std::size_t m, int world, bool divide, float divisor,
                                float* __restrict__ out) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < m; i += stride) {
    float sum = rows[i];
    for (int r = 1; r < world; ++r) sum += rows[static_cast<std::size_t>(r) * m + i];
    if (divide) sum /= divisor;
    out[i] = sum;
  }
}

}  // namespace

cudaError_t launch_sum_rows(const float* rows, std::size_t m, int world, bool divide, float divisor, float* out,
                            cudaStream_t stream) {
  if (m == 0) return cudaSuccess;
  constexpr unsigned kThreads = 256;
  const std::size_t wanted = (m + kThreads - 1) / kThreads;
  const auto blocks = static_cast<unsigned>(wanted < 65536 ? wanted : 65536);
  sum_rows_kernel<<<blocks, kThreads, 0, stream>>>(rows, m, world, divide, divisor, out);
  return cudaGetLastError();
}

}  // namespace riftco_transformer::distributed_detail
