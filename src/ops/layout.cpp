// reshape (shares storage), transpose, permute and repeat_heads (copy into
// the new layout).
#include <algorithm>
#include <limits>

#include "../backend/kernels.hpp"
#include "op_util.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_transformer {
using namespace ops_detail;

Variable reshape(const Variable& x, const Shape& shape) {
  check_defined("reshape", "input", x);
  Tensor out = x.value().reshape(shape);  // throws "[reshape] ..." with both shapes
  const Shape in_shape = x.shape();
  return Variable::from_op("reshape", std::move(out), {x}, [in_shape](const Tensor& g, const std::vector<bool>&) {
    return std::vector<Tensor>{g.reshape(in_shape)};
  });
}

Variable permute(const Variable& x, const std::vector<std::int64_t>& dims) {
  const char* op = "permute";
  check_defined(op, "input", x);
  const std::int64_t rank = x.value().dim();
  if (static_cast<std::int64_t>(dims.size()) != rank) {
    throw ShapeError(tag(op) + std::to_string(dims.size()) + " dims given for shape " + shape_string(x.shape()));
  }
  std::vector<std::int64_t> perm(dims.size());
  std::vector<bool> used(dims.size(), false);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const std::int64_t d = normalize_dim(op, dims[i], rank, x.shape());
    if (used[static_cast<std::size_t>(d)]) {
      throw ShapeError(tag(op) + "dimension " + std::to_string(d) + " repeated for shape " + shape_string(x.shape()));
    }
    used[static_cast<std::size_t>(d)] = true;
    perm[i] = d;
  }
  std::vector<std::int64_t> inverse(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inverse[static_cast<std::size_t>(perm[i])] = static_cast<std::int64_t>(i);
  return Variable::from_op(op, backend::kernels_for(op, x.value()).permute(x.value(), perm), {x},
                           [op, inverse](const Tensor& g, const std::vector<bool>&) {
                             return std::vector<Tensor>{backend::kernels_for(op, g).permute(g, inverse)};
                           });
}

Variable transpose(const Variable& x, std::int64_t dim0, std::int64_t dim1) {
  check_defined("transpose", "input", x);
  const std::int64_t rank = x.value().dim();
  const std::int64_t a = normalize_dim("transpose", dim0, rank, x.shape());
  const std::int64_t b = normalize_dim("transpose", dim1, rank, x.shape());
  std::vector<std::int64_t> perm(static_cast<std::size_t>(rank));
  for (std::int64_t i = 0; i < rank; ++i) perm[static_cast<std::size_t>(i)] = i;
  std::swap(perm[static_cast<std::size_t>(a)], perm[static_cast<std::size_t>(b)]);
  return permute(x, perm);
}

Variable repeat_heads(const Variable& x, std::int64_t groups) {
  const char* op = "repeat_heads";
  check_defined(op, "input", x);
  if (x.value().dim() != 4) throw ShapeError(tag(op) + "input " + shape_string(x.shape()) + " must be (B, G, T, D)");
  if (groups < 1) throw ValueError(tag(op) + "groups must be >= 1, got " + std::to_string(groups));
  const std::int64_t g = x.shape()[1];
  if (g > 0 && groups > std::numeric_limits<std::int64_t>::max() / g) {  // g · groups would wrap (and write out of bounds)
    throw ValueError(tag(op) + "groups " + std::to_string(groups) + " times " + std::to_string(g) +
                     " heads overflows a dimension");
  }
  Tensor out = backend::kernels_for(op, x.value()).repeat_heads(x.value(), groups);  // (B, G·groups, T, D)
  return Variable::from_op(op, std::move(out), {x}, [op, groups](const Tensor& grad, const std::vector<bool>&) {
    return std::vector<Tensor>{backend::kernels_for(op, grad).repeat_heads_backward(grad, groups)};  // (B, G, T, D)
  });
}

}  // namespace riftco_transformer
