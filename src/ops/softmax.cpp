// softmax over the last axis (keeps its output) and causal masking.
#include <limits>

#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

Variable softmax(const Variable& x) {
  check_defined("softmax", "input", x);
  if (x.value().dim() < 1) throw ShapeError("[softmax] input " + shape_string(x.shape()) + " needs a last axis");
  Tensor y = backend::kernels_for("softmax", x.value()).softmax_forward(x.value());
  const Tensor yv = y;
  return Variable::from_op("softmax", std::move(y), {x}, [yv](const Tensor& g, const std::vector<bool>&) {
    return std::vector<Tensor>{backend::kernels_for("softmax", yv, g).softmax_backward(yv, g)};
  });
}

Variable causal_mask(const Variable& scores, std::int64_t offset) {
  const char* op = "causal_mask";
  check_defined(op, "scores", scores);
  if (scores.value().dim() < 2) {
    throw ShapeError(tag(op) + "scores " + shape_string(scores.shape()) + " need at least 2 dimensions (Tq, Tk)");
  }
  if (offset < 0) throw ValueError(tag(op) + "offset must be >= 0, got " + std::to_string(offset));
  const Tensor sv = scores.value();
  Tensor out = backend::kernels_for(op, sv).causal_fill(sv, offset, -std::numeric_limits<float>::infinity());
  return Variable::from_op(op, std::move(out), {scores}, [op, offset](const Tensor& g, const std::vector<bool>&) {
    return std::vector<Tensor>{backend::kernels_for(op, g).causal_fill(g, offset, 0.0F)};
  });
}

}  // namespace riftco_transformer
