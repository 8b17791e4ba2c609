#pragma once
// The residual MLP stack the data-parallel tests train (tests/mpi's
// bucketer tests on the CPU, tests/nccl's on CUDA): the parameters the same
// on every rank (seed 7), the input drawn from the caller's seed (each
// rank's own: its shard of the batch).
#include <cstdint>
#include <string>
#include <vector>

#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/random.hpp"

namespace rt_test {

struct BlockStack {
  std::vector<riftco_transformer::Variable> params;  // w0, g0, w1, g1, ...
  riftco_transformer::Variable x;

  BlockStack(int layers, std::int64_t width, std::uint64_t data_seed, riftco_transformer::Backend backend) {
    using namespace riftco_transformer;
    Random init(7);
    for (int k = 0; k < layers; ++k) {
      params.emplace_back(Tensor::normal({width, width}, init, 0.0F, 0.1F).to(backend), true, "w" + std::to_string(k));
      params.emplace_back(Tensor::normal({width}, init, 1.0F, 0.1F).to(backend), true, "g" + std::to_string(k));
    }
    Random data(data_seed);
    x = Variable(Tensor::normal({8, width}, data).to(backend), false, "x");
  }

  /// mean(h²) after every block h + silu(rms_norm(h, g) @ w), each one
  /// checkpointed (w and g its dependencies) when asked.
  riftco_transformer::Variable loss(bool checkpointed) const {
    using namespace riftco_transformer;
    Variable h = x;
    for (std::size_t k = 0; k + 1 < params.size(); k += 2) {
      const Variable w = params[k];
      const Variable g = params[k + 1];
      auto block = [w, g](const Variable& v) { return add(v, silu(matmul(rms_norm(v, g, 1e-5F), w))); };
      if (checkpointed) {
        const std::vector<Variable> deps{w, g};
        h = checkpoint(h, deps, block);
      } else {
        h = block(h);
      }
    }
    return mean(mul(h, h));
  }
};

}  // namespace rt_test
