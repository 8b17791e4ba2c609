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

}  // namespace rt_test
