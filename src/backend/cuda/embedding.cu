// Embedding lookup and its gradient. The ids are host memory: the forward
// copies them to the device; the backward groups the positions of each id on
// the host (a stable counting sort, so each id keeps its positions in order)
// and one thread per (id, column) sums its rows in that order, the CPU
// kernel's order, with no atomics.
#include <vector>

#include "cuda_common.hpp"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

/// An id outside [0, rows) would make the kernel read or write outside the table.
void check_ids(std::span<const std::int32_t> ids, std::int64_t rows, const char* op) {
  for (const std::int32_t id : ids) {
    if (id < 0 || id >= rows) {
      throw ValueError(std::string("[") + op + "] id " + std::to_string(id) + " out of range for " +
                       std::to_string(rows) + " rows");
    }
  }
}

__global__ void embedding_forward_kernel(const float* w, const std::int32_t* ids, float* out, std::int64_t n,
                                         std::int64_t c) {
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < n * c;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = e / c;
    const std::int64_t j = e % c;
    out[e] = w[static_cast<std::int64_t>(ids[i]) * c + j];
  }
}

/// Block (u, column tile) (grid x: distinct ids, y: column tiles): row rows[u] of dW gets Σ g[positions[k]] over
/// k in [start[u], start[u+1]), in order. `plan` = rows, start, positions.
__global__ void embedding_backward_kernel(const std::int32_t* plan, std::int64_t unique, const float* g, float* dw,
                                          std::int64_t c) {
  const std::int64_t u = blockIdx.x;
  const std::int64_t j = blockIdx.y * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (u >= unique || j >= c) return;
  const std::int32_t* rows = plan;
  const std::int32_t* start = plan + unique;
  const std::int32_t* positions = plan + 2 * unique + 1;
  float acc = 0.0F;
  for (std::int32_t k = start[u]; k < start[u + 1]; ++k) acc += g[static_cast<std::int64_t>(positions[k]) * c + j];
  dw[static_cast<std::int64_t>(rows[u]) * c + j] = acc;
}

}  // namespace

Tensor embedding_forward(const Tensor& weight, std::span<const std::int32_t> ids, const Shape& out_shape) {
  constexpr const char* op = "embedding_forward";
  detail::require_cuda(weight, op, "weight");
  const std::int64_t c = weight.size(1);
  Tensor out = detail::empty(out_shape);
  const auto n = static_cast<std::int64_t>(ids.size());
  if (n * c == 0) return out;
  check_ids(ids, weight.size(0), op);
  const detail::DeviceArray<std::int32_t> device_ids(ids, op);
  embedding_forward_kernel<<<detail::grid_for(n * c), detail::kThreads>>>(weight.device_data(), device_ids.get(),
                                                                          out.device_data(), n, c);
  detail::check_launch(op, "embedding_forward_kernel");
  return out;
}

Tensor embedding_backward(const Shape& weight_shape, std::span<const std::int32_t> ids, const Tensor& g) {
  constexpr const char* op = "embedding_backward";
  detail::require_cuda(g, op, "g");
  const std::int64_t vocab = weight_shape[0];
  const std::int64_t c = weight_shape[1];
  Tensor dw = Tensor::zeros(weight_shape, Backend::Cuda);
  const auto n = static_cast<std::int64_t>(ids.size());
  if (n == 0 || c == 0) return dw;
  detail::checked_int(n, op, "ids");
  // plan = rows (unique ids, increasing), start (unique + 1), positions (n).
  check_ids(ids, vocab, op);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(vocab), 0);
  for (const std::int32_t id : ids) ++counts[static_cast<std::size_t>(id)];
  std::vector<std::int32_t> row_of;  // unique ids
  std::vector<std::int32_t> slot(static_cast<std::size_t>(vocab), -1);
  for (std::int64_t v = 0; v < vocab; ++v) {
    if (counts[static_cast<std::size_t>(v)] > 0) {
      slot[static_cast<std::size_t>(v)] = static_cast<std::int32_t>(row_of.size());
      row_of.push_back(static_cast<std::int32_t>(v));
    }
  }
  const auto unique = static_cast<std::int64_t>(row_of.size());
  std::vector<std::int32_t> plan(static_cast<std::size_t>(2 * unique + 1 + n));
  std::int32_t* start = plan.data() + unique;
  std::int32_t* positions = start + unique + 1;
  std::copy(row_of.begin(), row_of.end(), plan.begin());
  start[0] = 0;
  for (std::int64_t u = 0; u < unique; ++u) start[u + 1] = start[u] + counts[static_cast<std::size_t>(row_of[u])];
  std::vector<std::int32_t> fill(start, start + unique);
  for (std::int64_t i = 0; i < n; ++i) {  // positions of each id in increasing order
    const std::int32_t u = slot[static_cast<std::size_t>(ids[static_cast<std::size_t>(i)])];
    positions[fill[static_cast<std::size_t>(u)]++] = static_cast<std::int32_t>(i);
  }
  const detail::DeviceArray<std::int32_t> device_plan(std::span<const std::int32_t>(plan), op);
  const dim3 grid(static_cast<unsigned>(detail::checked_int(unique, op, "distinct ids")),
                  static_cast<unsigned>(detail::checked_int((c + detail::kThreads - 1) / detail::kThreads, op, "columns")));
  embedding_backward_kernel<<<grid, detail::kThreads>>>(device_plan.get(), unique, g.device_data(), dw.device_data(),
                                                        c);
  detail::check_launch(op, "embedding_backward_kernel");
  return dw;
}

}  // namespace riftco_transformer::cuda
