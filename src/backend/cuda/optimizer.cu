// Optimizer kernels: the global gradient norm (Σ x² in double) and the fused
// Adam(W) update. Both cut the parameters into fixed chunks of kChunk floats
// (a chunk table copied to the device) and run one block per chunk, so small
// parameters share one launch. A chunk's sum is a fixed tree over fixed
// per-thread strides; the host adds the chunk sums in order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cuda_common.hpp"
#include "device_util.cuh"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

constexpr std::int64_t kChunk = backend::kNormChunk;
constexpr int kChunkThreads = 256;

struct SquaresChunk {
  const float* x;
  std::int64_t n;
};

__global__ void squares_kernel(const SquaresChunk* chunks, double* partial) {
  __shared__ double scratch[kChunkThreads];
  const SquaresChunk ch = chunks[blockIdx.x];
  double acc = 0.0;
  for (std::int64_t i = threadIdx.x; i < ch.n; i += blockDim.x) {
    const auto xi = static_cast<double>(ch.x[i]);
    acc += xi * xi;
  }
  acc = device::block_sum(acc, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

struct AdamChunk {
  float* theta;
  float* m;
  float* v;
  const float* grad;
  std::int64_t n;
  float decay;
};

__global__ void adam_kernel(const AdamChunk* chunks, AdamCoefficients c) {
  const AdamChunk ch = chunks[blockIdx.x];
  const float one_minus_b1 = 1.0F - c.beta1;
  const float one_minus_b2 = 1.0F - c.beta2;
  for (std::int64_t j = threadIdx.x; j < ch.n; j += blockDim.x) {
    const float g = ch.grad[j] * c.clip;
    const float mj = c.beta1 * ch.m[j] + one_minus_b1 * g;
    const float vj = c.beta2 * ch.v[j] + one_minus_b2 * g * g;
    ch.m[j] = mj;
    ch.v[j] = vj;
    const float m_hat = mj / c.bias1;
    const float v_hat = vj / c.bias2;
    ch.theta[j] = ch.theta[j] * ch.decay - c.learning_rate * m_hat / (sqrtf(v_hat) + c.epsilon);
  }
}

}  // namespace

std::vector<double> sum_of_squares_partials(std::span<const std::span<const float>> spans) {
  constexpr const char* op = "sum_of_squares";
  std::vector<SquaresChunk> chunks;
  for (const std::span<const float> s : spans) {
    const auto n = static_cast<std::int64_t>(s.size());
    for (std::int64_t b = 0; b < n; b += kChunk) chunks.push_back({s.data() + b, std::min(kChunk, n - b)});
  }
  if (chunks.empty()) return {};
  const auto count = static_cast<std::int64_t>(chunks.size());
  const detail::DeviceArray<SquaresChunk> device_chunks(std::span<const SquaresChunk>(chunks), op);
  const detail::DeviceArray<double> device_partial(chunks.size(), op);
  squares_kernel<<<detail::checked_int(count, op, "chunks"), kChunkThreads>>>(device_chunks.get(),
                                                                             device_partial.get());
  detail::check_launch(op, "squares_kernel");
  std::vector<double> partial(chunks.size());
  device_partial.copy_to(partial, op);
  return partial;
}

double sum_of_squares(std::span<const std::span<const float>> spans) {
  double total = 0.0;
  for (const double p : sum_of_squares_partials(spans)) total += p;
  return total;
}

void adam_update(std::span<const AdamUpdate> params, const AdamCoefficients& c) {
  constexpr const char* op = "adam_update";
  std::vector<AdamChunk> chunks;
  for (const AdamUpdate& p : params) {
    for (std::int64_t b = 0; b < p.n; b += kChunk) {
      chunks.push_back({p.theta + b, p.m + b, p.v + b, p.grad + b, std::min(kChunk, p.n - b), p.decay});
    }
  }
  if (chunks.empty()) return;
  const auto count = static_cast<std::int64_t>(chunks.size());
  const detail::DeviceArray<AdamChunk> device_chunks(std::span<const AdamChunk>(chunks), op);
  adam_kernel<<<detail::checked_int(count, op, "chunks"), kChunkThreads>>>(device_chunks.get(), c);
  detail::check_launch(op, "adam_kernel");
}

}  // namespace riftco_transformer::cuda
