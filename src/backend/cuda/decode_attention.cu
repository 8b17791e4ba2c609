// One query position against the K/V cache on the device: one block per
// query head. Scores go to a device scratch row (H, length); the max and the
// sum are fixed-tree block reductions; each output element sums the cached
// values in position order, like the CPU kernel (backend/cpu/decode_attention.cpp).
#include <cmath>

#include "cuda_common.hpp"
#include "decode_attention.hpp"
#include "device_util.cuh"

namespace riftco_transformer::cuda {
namespace {

constexpr int kHeadThreads = 256;

__global__ void cached_attention_kernel(const float* q, const float* keys, const float* values, float* out,
                                        float* scores, std::int64_t d, std::int64_t cap, std::int64_t length,
                                        std::int64_t groups, float scale) {
  __shared__ float scratch[kHeadThreads];
  const std::int64_t h = blockIdx.x;
  const float* qh = q + h * d;
  const float* kh = keys + (h / groups) * cap * d;
  const float* vh = values + (h / groups) * cap * d;
  float* p = scores + h * length;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < length; j += blockDim.x) {
    float s = 0.0F;
    for (std::int64_t i = 0; i < d; ++i) s += qh[i] * kh[j * d + i];
    p[j] = s * scale;
    m = m < p[j] ? p[j] : m;
  }
  m = device::block_max(m, scratch);
  float total = 0.0F;
  for (std::int64_t j = threadIdx.x; j < length; j += blockDim.x) {
    p[j] = expf(p[j] - m);
    total += p[j];
  }
  total = device::block_sum(total, scratch);  // also orders the writes to p before the reads below
  for (std::int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0.0F;
    for (std::int64_t j = 0; j < length; ++j) acc += p[j] / total * vh[j * d + i];
    out[h * d + i] = acc;
  }
}

}  // namespace

Tensor cached_attention(const Tensor& q, const Tensor& keys, const Tensor& values, std::int64_t length) {
  constexpr const char* op = "cached_attention";
  detail::require_cuda(q, op, "q");
  detail::require_cuda(keys, op, "keys");
  detail::require_cuda(values, op, "values");
  const std::int64_t heads = q.size(0);
  const std::int64_t d = q.size(1);
  const std::int64_t cap = keys.size(1);
  const std::int64_t groups = heads / keys.size(0);  // query heads per cached key/value head
  const float scale = 1.0F / std::sqrt(static_cast<float>(d));
  Tensor out = Tensor::zeros({heads, d}, Backend::Cuda);
  if (heads == 0 || d == 0 || length == 0) return out;
  const detail::DeviceArray<float> scores(static_cast<std::size_t>(heads * length), op);  // (H, length)
  cached_attention_kernel<<<detail::checked_int(heads, op, "heads"), kHeadThreads>>>(
      q.device_data(), keys.device_data(), values.device_data(), out.device_data(), scores.get(), d, cap, length,
      groups, scale);
  detail::check_launch(op, "cached_attention_kernel");
  return out;
}

}  // namespace riftco_transformer::cuda
