// Whole-tensor reductions returned to the host: sum_all (Σ in double) and
// all_finite. Fixed chunks of kChunk floats, one block per chunk with a
// fixed tree; the host combines the chunk results in order (no atomics).
#include <algorithm>
#include <vector>

#include "cuda_common.hpp"
#include "device_util.cuh"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

constexpr std::int64_t kChunk = backend::kNormChunk;
constexpr int kChunkThreads = 256;

__global__ void sum_kernel(const float* x, std::int64_t n, double* partial) {
  __shared__ double scratch[kChunkThreads];
  const std::int64_t begin = blockIdx.x * kChunk;
  const std::int64_t end = begin + kChunk < n ? begin + kChunk : n;
  double acc = 0.0;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) acc += static_cast<double>(x[i]);
  acc = device::block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

/// flags[chunk] = 1 when the chunk holds a NaN or ±inf.
__global__ void nonfinite_kernel(const float* x, std::int64_t n, int* flags) {
  __shared__ int scratch[kChunkThreads];
  const std::int64_t begin = blockIdx.x * kChunk;
  const std::int64_t end = begin + kChunk < n ? begin + kChunk : n;
  int bad = 0;
  for (std::int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) bad |= isfinite(x[i]) ? 0 : 1;
  bad = device::block_sum(bad, scratch);
  if (threadIdx.x == 0) flags[blockIdx.x] = bad;
}

}  // namespace

double sum_all(const Tensor& x) {
  constexpr const char* op = "sum_all";
  detail::require_cuda(x, op, "x");
  const std::int64_t n = x.numel();
  if (n == 0) return 0.0;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  const detail::DeviceArray<double> partial(static_cast<std::size_t>(chunks), op);
  sum_kernel<<<detail::checked_int(chunks, op, "chunks"), kChunkThreads>>>(x.device_data(), n, partial.get());
  detail::check_launch(op, "sum_kernel");
  std::vector<double> host(static_cast<std::size_t>(chunks));
  partial.copy_to(host, op);
  double total = 0.0;
  for (const double p : host) total += p;
  return total;
}

bool all_finite(std::span<const float> values) {
  constexpr const char* op = "all_finite";
  const auto n = static_cast<std::int64_t>(values.size());
  if (n == 0) return true;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  const detail::DeviceArray<int> flags(static_cast<std::size_t>(chunks), op);
  nonfinite_kernel<<<detail::checked_int(chunks, op, "chunks"), kChunkThreads>>>(values.data(), n, flags.get());
  detail::check_launch(op, "nonfinite_kernel");
  std::vector<int> host(static_cast<std::size_t>(chunks));
  flags.copy_to(host, op);
  return std::all_of(host.begin(), host.end(), [](int f) { return f == 0; });
}

}  // namespace riftco_transformer::cuda
