#pragma once
// Argument checks shared by every communicator, so the single-process one
// rejects exactly what the MPI and NCCL ones reject; the time limits they
// read from the environment.
#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "riftco_transformer/errors.hpp"

namespace riftco_transformer::distributed_detail {

inline void check_reduce_scatter(std::size_t input, std::size_t output, int world) {
  if (input != output * static_cast<std::size_t>(world)) {
    throw ShapeError("[reduce_scatter_sum] input of " + std::to_string(input) + " elements and output of " +
                     std::to_string(output) + ": input must be world_size (" + std::to_string(world) +
                     ") x output elements");
  }
}

inline void check_all_gather(std::size_t input, std::size_t output, int world) {
  if (output != input * static_cast<std::size_t>(world)) {
    throw ShapeError("[all_gather] input of " + std::to_string(input) + " elements and output of " +
                     std::to_string(output) + ": output must be world_size (" + std::to_string(world) +
                     ") x input elements");
  }
}

inline void check_root(int root, int world) {
  if (root < 0 || root >= world) {
    throw ValueError("[broadcast] root " + std::to_string(root) + " is not a rank of a world of " +
                     std::to_string(world));
  }
}

/// A time limit in seconds from the environment, read before MPI (or NCCL) starts:
/// a number in (0, 1e7]. "nan" or "inf" would make a bounded wait unbounded
/// (a comparison with NaN is never true) and "abc" (atof's 0) would fail
/// every wait at once, so anything else is a ValueError naming the variable.
inline double seconds_from_environment(const char* name, double fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr) return fallback;
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || errno != 0 || !(value > 0.0 && value <= 1e7)) {
    std::string shown(text, std::min<std::size_t>(std::strlen(text), 40));
    for (char& c : shown) c = (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) ? '?' : c;
    throw ValueError(std::string("[communicator] ") + name + " is '" + shown +
                     "'; expected a number of seconds in (0, 1e7]");
  }
  return value;
}

}  // namespace riftco_transformer::distributed_detail
