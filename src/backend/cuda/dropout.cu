// The dropout mask on the device: backend/philox.hpp's function of (seed,
// element index), one thread per four elements, so the mask is born on the
// device (no host draw, no copy) with the CPU kernel's bits.
#include "../philox.hpp"
#include "cuda_common.hpp"
#include "kernels.hpp"

namespace riftco_transformer::cuda {
namespace {

__global__ void dropout_mask_kernel(float* out, std::int64_t n, std::int64_t groups, std::uint64_t seed, float p,
                                    float keep_scale) {
  for (std::int64_t g = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; g < groups;
       g += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    backend::dropout_mask_group(seed, g, n, p, keep_scale, out);
  }
}

}  // namespace

Tensor dropout_mask(const Shape& shape, std::uint64_t seed, float p, float keep_scale) {
  Tensor mask = detail::empty(shape);
  const std::int64_t n = mask.numel();
  if (n == 0) return mask;
  const std::int64_t groups = (n + 3) / 4;
  dropout_mask_kernel<<<detail::grid_for(groups), detail::kThreads>>>(mask.device_data(), n, groups, seed, p,
                                                                       keep_scale);
  detail::check_launch("dropout", "dropout_mask_kernel");
  return mask;
}

}  // namespace riftco_transformer::cuda
