#pragma once
// Shared front-end checks for ops: every message starts with "[op]".
#include <string>

#include "riftco_transformer/variable.hpp"

namespace riftco_transformer::ops_detail {

inline std::string tag(const char* op) { return std::string("[") + op + "] "; }

/// Both defined, both on the same (built) backend.
void check_pair(const char* op, const char* a_name, const Variable& a, const char* b_name, const Variable& b);
void check_defined(const char* op, const char* name, const Variable& v);
/// Numpy broadcast of two shapes or ShapeError naming the op and shapes.
Shape broadcast_shape(const char* op, const Shape& a, const Shape& b);
/// Normalizes a possibly negative dim for a rank-`rank` tensor.
std::int64_t normalize_dim(const char* op, std::int64_t dim, std::int64_t rank, const Shape& shape);

}  // namespace riftco_transformer::ops_detail
