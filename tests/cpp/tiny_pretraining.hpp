#pragma once
// The small pretraining run several pipeline tests start from: a 2-layer,
// width-16 model on the test corpus, 6 steps of batch 2 × 16 tokens, one
// evaluation batch. Each test sets what it is about on top.
#include <filesystem>

#include "riftco_transformer/pipelines.hpp"
#include "scratch.hpp"

namespace rt_test {

inline riftco_transformer::PretrainingConfig tiny_pretraining(const std::filesystem::path& dir) {
  riftco_transformer::PretrainingConfig c;
  c.dimensions = {256, 32, 16, 2, 2, 32};
  c.data = write_corpus(dir);
  c.steps = 6;
  c.batch = 2;
  c.sequence_length = 16;
  c.eval_batches = 1;
  return c;
}

}  // namespace rt_test
