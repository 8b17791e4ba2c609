#include "op_util.hpp"

namespace riftco_transformer::ops_detail {

void check_defined(const char* op, const char* name, const Variable& v) {
  if (!v.defined()) throw ValueError(tag(op) + name + " is an undefined variable");
}

void check_pair(const char* op, const char* a_name, const Variable& a, const char* b_name, const Variable& b) {
  check_defined(op, a_name, a);
  check_defined(op, b_name, b);
  if (a.backend() != b.backend()) {
    throw BackendError(tag(op) + a_name + " " + shape_string(a.shape()) + " is on " + backend_name(a.backend()) +
                       " but " + b_name + " " + shape_string(b.shape()) + " is on " + backend_name(b.backend()));
  }
}

Shape broadcast_shape(const char* op, const Shape& a, const Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw ShapeError(tag(op) + "lhs " + shape_string(a) + " and rhs " + shape_string(b) +
                       ": shapes cannot be broadcast (dimension " + std::to_string(i) + ": " + std::to_string(da) +
                       " vs " + std::to_string(db) + ")");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::int64_t normalize_dim(const char* op, std::int64_t dim, std::int64_t rank, const Shape& shape) {
  const std::int64_t d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank) {
    throw ShapeError(tag(op) + "dimension " + std::to_string(dim) + " out of range for shape " + shape_string(shape));
  }
  return d;
}

}  // namespace riftco_transformer::ops_detail
