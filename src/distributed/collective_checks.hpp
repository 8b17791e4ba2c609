#pragma once
// Argument checks shared by every communicator, so the single-process one
// rejects exactly what the MPI one rejects.
#include <cstddef>
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

}  // namespace riftco_transformer::distributed_detail
