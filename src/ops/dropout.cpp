// Inverted dropout with a counter-based mask. Each call announces the
// caller's generator and draws one 64-bit Philox key from it; the mask is
// then a pure function of (key, element index) (backend/philox.hpp), made on
// the input's backend: the CPU and CUDA masks are bit-identical and the
// device needs no host copy. A checkpoint replay rewinds the generator to
// its recorded state (RandomStreamReplay), so it draws the same key and
// rebuilds the same mask bit for bit.
#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

Variable dropout(const Variable& x, float p, Random& random) {
  check_defined("dropout", "input", x);
  if (!(p >= 0.0F && p < 1.0F)) throw ValueError("[dropout] probability must be in [0, 1), got " + float_text(p));
  if (p == 0.0F) return x;
  const backend::Kernels& kernels = backend::kernels_for("dropout", x.value());
  announce_random_use(random);  // checkpoint replays draw the same key
  const std::uint64_t high = random.next_u32();
  const std::uint64_t key = (high << 32U) | random.next_u32();
  const Tensor mask = kernels.dropout_mask(x.shape(), key, p, 1.0F / (1.0F - p));
  Tensor out = kernels.binary(backend::BinaryOp::Mul, x.value(), mask, x.shape());
  return Variable::from_op(
      "dropout", std::move(out), {x},
      [mask](const Tensor& g, const std::vector<bool>&) {
        return std::vector<Tensor>{
            backend::kernels_for("dropout", g, mask).binary(backend::BinaryOp::Mul, g, mask, g.shape())};
      },
      {mask});
}

}  // namespace riftco_transformer
