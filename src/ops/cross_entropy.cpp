// Fused log-softmax + negative log-likelihood, mean over non-ignored rows.
#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

void check_cross_entropy_targets(const char* op, std::span<const std::int32_t> targets, std::int64_t classes,
                                 std::int32_t ignore_index) {
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (targets[i] != ignore_index && (targets[i] < 0 || targets[i] >= classes)) {
      throw ValueError(tag(op) + "target " + std::to_string(targets[i]) + " at row " + std::to_string(i) +
                       " is outside [0, " + std::to_string(classes) + ") (" + std::to_string(classes) +
                       " classes; ignore_index " + std::to_string(ignore_index) + ")");
    }
  }
}

Variable cross_entropy(const Variable& logits, std::span<const std::int32_t> targets, std::int32_t ignore_index) {
  const char* op = "cross_entropy";
  check_defined(op, "logits", logits);
  if (logits.value().dim() < 1 || logits.shape().back() == 0) {
    throw ShapeError(tag(op) + "logits " + shape_string(logits.shape()) + " need a non-empty class dimension");
  }
  const std::int64_t v = logits.shape().back();
  const std::int64_t rows = logits.value().numel() / v;
  if (rows != static_cast<std::int64_t>(targets.size())) {
    throw ShapeError(tag(op) + "logits " + shape_string(logits.shape()) + " have " + std::to_string(rows) +
                     " rows but " + std::to_string(targets.size()) + " targets were given");
  }
  check_cross_entropy_targets(op, targets, v, ignore_index);
  Tensor probs;
  std::int64_t count = 0;
  const Tensor flat = logits.value().reshape({rows, v});
  const float loss = backend::kernels_for(op, flat).cross_entropy_forward(flat, targets, ignore_index, probs, count);
  std::vector<std::int32_t> kept(targets.begin(), targets.end());
  const Shape shape = logits.shape();
  return Variable::from_op(
      op, Tensor::full({}, loss, flat.backend()), {logits},
      [op, probs, kept = std::move(kept), ignore_index, count, shape](const Tensor& g, const std::vector<bool>&) {
        const float seed = g.item();  // the upstream scalar, read on the host
        return std::vector<Tensor>{backend::kernels_for(op, probs, g)
                                       .cross_entropy_backward(probs, kept, ignore_index, count, seed)
                                       .reshape(shape)};
      },
      {probs});
}

}  // namespace riftco_transformer
