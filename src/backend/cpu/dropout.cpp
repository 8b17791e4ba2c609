// The dropout mask on the CPU: backend/philox.hpp's pure function of
// (seed, element index), one Philox block per four elements. Any thread
// count gives the same bits (no state is carried between elements).
#include "../philox.hpp"
#include "kernels.hpp"

namespace riftco_transformer::cpu {

Tensor dropout_mask(const Shape& shape, std::uint64_t seed, float p, float keep_scale) {
  Tensor mask = Tensor::empty(shape);
  const std::int64_t n = mask.numel();
  const std::int64_t groups = (n + 3) / 4;
  float* out = mask.data();
#pragma omp parallel for schedule(static) if (groups > 8192)
  for (std::int64_t g = 0; g < groups; ++g) backend::dropout_mask_group(seed, g, n, p, keep_scale, out);
  return mask;
}

}  // namespace riftco_transformer::cpu
