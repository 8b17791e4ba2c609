// Inverted dropout. The mask is drawn serially from the caller's generator,
// so a checkpoint replay (which rewinds every generator the callable
// announced, by default) rebuilds the same mask. The mask is drawn on the
// host and moved to the input's backend.
#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

Variable dropout(const Variable& x, float p, Random& random) {
  check_defined("dropout", "input", x);
  if (!(p >= 0.0F && p < 1.0F)) throw ValueError("[dropout] probability must be in [0, 1), got " + std::to_string(p));
  if (p == 0.0F) return x;
  const float keep_scale = 1.0F / (1.0F - p);
  Tensor host_mask = Tensor::empty(x.shape());  // 0 or 1/(1-p), drawn on the host
  announce_random_use(random);                  // checkpoint replays rebuild the same mask
  float* pm = host_mask.data();
  for (std::int64_t i = 0; i < host_mask.numel(); ++i) pm[i] = random.uniform() < p ? 0.0F : keep_scale;
  const Tensor mask = host_mask.to(x.backend());
  Tensor out =
      backend::kernels_for("dropout", x.value(), mask).binary(backend::BinaryOp::Mul, x.value(), mask, x.shape());
  return Variable::from_op(
      "dropout", std::move(out), {x},
      [mask](const Tensor& g, const std::vector<bool>&) {
        return std::vector<Tensor>{
            backend::kernels_for("dropout", g, mask).binary(backend::BinaryOp::Mul, g, mask, g.shape())};
      },
      {mask});
}

}  // namespace riftco_transformer
