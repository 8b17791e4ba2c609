// Token embedding lookup; backward scatter-adds rows into dW.
#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

Variable embedding(const Variable& weight, std::span<const std::int32_t> ids, const Shape& ids_shape) {
  const char* op = "embedding";
  check_defined(op, "weight", weight);
  if (weight.value().dim() != 2) {
    throw ShapeError(tag(op) + "weight " + shape_string(weight.shape()) + " must be 2-D (vocab, width)");
  }
  if (shape_numel(ids_shape, op) != static_cast<std::int64_t>(ids.size())) {
    throw ShapeError(tag(op) + "ids shape " + shape_string(ids_shape) + " does not match " +
                     std::to_string(ids.size()) + " ids");
  }
  const std::int64_t vocab = weight.shape()[0];
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab) {
      throw ValueError(tag(op) + "id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                       " is outside the vocabulary [0, " + std::to_string(vocab) + ") of weight " +
                       shape_string(weight.shape()));
    }
  }
  Shape out_shape = ids_shape;
  out_shape.push_back(weight.shape()[1]);
  std::vector<std::int32_t> kept(ids.begin(), ids.end());
  const Shape wshape = weight.shape();
  const Tensor wv = weight.value();
  return Variable::from_op(
      op, backend::kernels_for(op, wv).embedding_forward(wv, ids, out_shape), {weight},
      [op, kept = std::move(kept), wshape](const Tensor& g, const std::vector<bool>&) {
        return std::vector<Tensor>{backend::kernels_for(op, g).embedding_backward(wshape, kept, g)};
      });
}

}  // namespace riftco_transformer
