#pragma once
// rt_test::probe: an identity op whose backward appends a label to a log
// (and throws when asked): where a node's backward ran among the engine's
// other events (test_backward_hooks, test_checkpoint_hooks).
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/variable.hpp"

namespace rt_test {

inline riftco_transformer::Variable probe(const riftco_transformer::Variable& x, std::string label,
                                          std::vector<std::string>& log, const bool* fail = nullptr) {
  using riftco_transformer::Tensor;
  return riftco_transformer::Variable::from_op(
      "probe", x.value(), {x}, [label, &log, fail](const Tensor& g, const std::vector<bool>&) -> std::vector<Tensor> {
        if (fail != nullptr && *fail) throw std::runtime_error("probe " + label + " failed");
        log.push_back(label);
        return {g};
      });
}

}  // namespace rt_test
