// Rotary position embedding: a rotation per pair, so the backward is the
// inverse rotation of the gradient.
#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

Variable rope(const Variable& x, std::int64_t position_offset, float base) {
  const char* op = "rope";
  check_defined(op, "input", x);
  if (x.value().dim() < 2 || x.shape().back() % 2 != 0) {
    throw ShapeError(tag(op) + "input " + shape_string(x.shape()) + " must be (..., T, D) with D even");
  }
  // The model's context limit (transformer.cpp): past it a position's
  // table row, or offset + T itself, would overflow or exhaust memory.
  constexpr std::int64_t kPositions = std::int64_t{1} << 20;
  const std::int64_t t = x.shape()[x.shape().size() - 2];
  if (position_offset < 0 || position_offset > kPositions - t) {
    throw ValueError(tag(op) + "position_offset " + std::to_string(position_offset) + " with " + std::to_string(t) +
                     " positions of input " + shape_string(x.shape()) + " is outside [0, 2^20 = " +
                     std::to_string(kPositions) + "): the positions must be in [0, 2^20)");
  }
  if (!(base > 1.0F)) throw ValueError(tag(op) + "base must be > 1");
  const Tensor xv = x.value();
  return Variable::from_op(
      op, backend::kernels_for(op, xv).rope_apply(xv, position_offset, base, false), {x},
      [op, position_offset, base](const Tensor& g, const std::vector<bool>&) {
        return std::vector<Tensor>{backend::kernels_for(op, g).rope_apply(g, position_offset, base, true)};
      });
}

}  // namespace riftco_transformer
