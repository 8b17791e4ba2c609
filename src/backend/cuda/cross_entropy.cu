// Cross-entropy over logits (N, V): one block per row computes the softmax
// probabilities and the row's loss (in double); the host adds the counted
// rows' losses in row order, like the CPU kernel. The targets are host memory.
#include <cmath>
#include <vector>

#include "cuda_common.hpp"
#include "device_util.cuh"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

constexpr int kRowThreads = 256;

__global__ void cross_entropy_forward_kernel(const float* logits, const std::int32_t* targets, std::int32_t ignore,
                                             float* probs, double* row_loss, std::int64_t v) {
  __shared__ float scratch[kRowThreads];
  const std::int64_t r = blockIdx.x;
  const float* lr = logits + r * v;
  float* pr = probs + r * v;
  float m = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < v; j += blockDim.x) m = m < lr[j] ? lr[j] : m;
  m = device::block_max(m, scratch);
  float total = 0.0F;
  for (std::int64_t j = threadIdx.x; j < v; j += blockDim.x) {
    const float e = expf(lr[j] - m);
    pr[j] = e;
    total += e;
  }
  total = device::block_sum(total, scratch);
  const float inv = 1.0F / total;
  for (std::int64_t j = threadIdx.x; j < v; j += blockDim.x) pr[j] *= inv;
  if (threadIdx.x == 0) {
    const std::int32_t t = targets[r];
    double loss = 0.0;
    if (t != ignore) loss = (t >= 0 && t < v) ? static_cast<double>(m + logf(total) - lr[t]) : NAN;
    row_loss[r] = loss;
  }
}

__global__ void cross_entropy_backward_kernel(const float* probs, const std::int32_t* targets, std::int32_t ignore,
                                              float k, float* out, std::int64_t rows, std::int64_t v) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < rows * v;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = e / v;
    const std::int64_t j = e % v;
    const std::int32_t t = targets[r];
    if (t == ignore) {
      out[e] = 0.0F;
    } else {
      const float scaled = probs[e] * k;
      out[e] = j == t ? scaled - k : scaled;
    }
  }
}

}  // namespace

float cross_entropy_forward(const Tensor& logits, std::span<const std::int32_t> targets, std::int32_t ignore,
                            Tensor& probs, std::int64_t& count) {
  constexpr const char* op = "cross_entropy_forward";
  detail::require_cuda(logits, op, "logits");
  const std::int64_t v = logits.size(-1);
  const auto rows = static_cast<std::int64_t>(targets.size());
  probs = detail::empty({rows, v});
  count = 0;
  if (rows == 0) return 0.0F;
  const detail::DeviceArray<std::int32_t> device_targets(targets, op);
  const detail::DeviceArray<double> device_loss(static_cast<std::size_t>(rows), op);
  cross_entropy_forward_kernel<<<detail::checked_int(rows, op, "rows"), kRowThreads>>>(
      logits.device_data(), device_targets.get(), ignore, probs.device_data(), device_loss.get(), v);
  detail::check_launch(op, "cross_entropy_forward_kernel");
  std::vector<double> row_loss(static_cast<std::size_t>(rows));
  device_loss.copy_to(row_loss, op);
  double loss = 0.0;  // rows summed in order
  for (std::int64_t r = 0; r < rows; ++r) {
    if (targets[static_cast<std::size_t>(r)] == ignore) continue;
    loss += row_loss[static_cast<std::size_t>(r)];
    ++count;
  }
  return count == 0 ? 0.0F : static_cast<float>(loss / static_cast<double>(count));
}

Tensor cross_entropy_backward(const Tensor& probs, std::span<const std::int32_t> targets, std::int32_t ignore,
                              std::int64_t count, float g) {
  constexpr const char* op = "cross_entropy_backward";
  detail::require_cuda(probs, op, "probs");
  const std::int64_t v = probs.size(-1);
  const auto rows = static_cast<std::int64_t>(targets.size());
  Tensor out = detail::empty(probs.shape());
  if (rows * v == 0) return out;
  const float k = count == 0 ? 0.0F : g / static_cast<float>(count);
  const detail::DeviceArray<std::int32_t> device_targets(targets, op);
  cross_entropy_backward_kernel<<<detail::grid_for(rows * v), detail::kThreads>>>(
      probs.device_data(), device_targets.get(), ignore, k, out.device_data(), rows, v);
  detail::check_launch(op, "cross_entropy_backward_kernel");
  return out;
}

}  // namespace riftco_transformer::cuda
