#pragma once
// Small models and batches shared by the model, checkpoint and optimizer tests.
#include <vector>

#include "riftco_transformer/transformer.hpp"

namespace rt_test {

/// A seeded standard-normal tensor.
inline riftco_transformer::Tensor randn(const riftco_transformer::Shape& shape, std::uint64_t seed) {
  riftco_transformer::Random r(seed);
  return riftco_transformer::Tensor::normal(shape, r);
}

inline riftco_transformer::TransformerDimensions tiny_dims(std::int64_t layers = 2) {
  riftco_transformer::TransformerDimensions d;
  d.vocab_size = 32;
  d.context_length = 16;
  d.model_width = 16;
  d.heads = 2;
  d.layers = layers;
  d.feed_forward_width = 24;
  return d;
}

/// batch × t tokens and next-token targets from a seeded generator.
struct Batch {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
  std::int64_t batch;
};

inline Batch random_batch(std::int64_t batch, std::int64_t t, std::int64_t vocab, std::uint64_t seed) {
  riftco_transformer::Random r(seed);
  Batch b{{}, {}, batch};
  for (std::int64_t i = 0; i < batch * t; ++i) {
    b.tokens.push_back(static_cast<std::int32_t>(r.below(static_cast<std::uint32_t>(vocab))));
    b.targets.push_back(static_cast<std::int32_t>(r.below(static_cast<std::uint32_t>(vocab))));
  }
  return b;
}

/// A random plan of `layers` blocks: each group a block with one of the four
/// options or (one draw in five) a segment of a random length.
inline riftco_transformer::ActivationCheckpointingPlan random_plan(std::int64_t layers, riftco_transformer::Random& r) {
  using riftco_transformer::BlockRecompute;
  riftco_transformer::ActivationCheckpointingPlan plan;
  for (std::int64_t left = layers; left > 0;) {
    const std::uint32_t o = r.below(5);
    const std::int64_t blocks = o == 4 ? 1 + r.below(static_cast<std::uint32_t>(left)) : 1;
    plan.push_back({blocks, o == 4 ? BlockRecompute::Whole : static_cast<BlockRecompute>(o)});
    left -= blocks;
  }
  return plan;
}

}  // namespace rt_test
