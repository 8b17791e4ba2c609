#pragma once
// The small pretraining run several pipeline tests start from: a 2-layer,
// width-16 model on the test corpus, 6 steps of batch 2 × 16 tokens, one
// evaluation batch. Each test sets what it is about on top.
#include <cstdint>
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

/// Post-training of `base_model` (made with a context of at least 96) on the
/// shipped chat data: batch 2 × 96 tokens, one evaluation batch at the end,
/// LoRA rank 2 where the method is LoRA (the default).
inline riftco_transformer::PostTrainingConfig tiny_chat_post_training(const std::filesystem::path& base_model,
                                                                      std::int64_t steps) {
  riftco_transformer::PostTrainingConfig c;
  c.base_model = base_model;
  c.data = std::filesystem::path(RIFTCO_SOURCE_DIR) / "data" / "chat_example.jsonl";
  c.steps = steps;
  c.batch = 2;
  c.sequence_length = 96;
  c.eval_interval = 0;
  c.eval_batches = 1;
  c.lora.rank = 2;
  return c;
}

/// The same with a warm-up, no evaluation until the end and a training
/// checkpoint every 3 steps (the resume and device tests).
inline riftco_transformer::PretrainingConfig tiny_pretraining_checkpointed(const std::filesystem::path& dir) {
  riftco_transformer::PretrainingConfig c = tiny_pretraining(dir);
  c.warmup_steps = 2;
  c.eval_interval = 0;
  c.checkpoint_interval = 3;
  return c;
}

}  // namespace rt_test
