#include "memory_budget.hpp"

#include "riftco_transformer/memory.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

namespace riftco_transformer::stage {
namespace {

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace

MemoryEstimate estimate_training_memory(const TransformerDimensions& d, std::int64_t trainable_parameters,
                                        std::int64_t lora_parameters, const StageSettings& s) {
  // Doubles: the products below can exceed int64 for hostile settings.
  const double f = 4.0;  // bytes per float
  const auto dd = [](std::int64_t v) { return static_cast<double>(v); };
  const double rows = dd(s.batch) * dd(s.sequence_length);  // B·T
  MemoryEstimate e;
  e.parameters = f * (dd(d.parameter_count()) + dd(lora_parameters));
  // gradients + two Adam moments, and the accumulation sums when K > 1
  e.training = f * (s.gradient_accumulation_steps > 1 ? 4.0 : 3.0) * dd(trainable_parameters);
  const double boundaries = rows * dd(d.model_width) * dd(d.layers + 1);  // h_i of every block, any policy
  // What one block keeps for its backward: at least the packed q/k/v and the
  // attention output (4C per row), the gate/up pair (2F), and with
  // materialized attention the four (B, H, T, T) values of its graph:
  // q·kᵀ, scaled, masked, softmax (src/ops/attention.cpp).
  const double scores = s.attention == FullSequenceAttentionKind::Materialized
                            ? 4.0 * dd(s.batch) * dd(d.heads) * dd(s.sequence_length) * dd(s.sequence_length)
                            : 0.0;
  const double one_block = rows * (4.0 * dd(d.model_width) + 2.0 * dd(d.feed_forward_width)) + scores;
  // Blocks whose graphs are alive at once: all of them without
  // checkpointing; one (being replayed) per block checkpoint; a segment's
  // blocks for segments.
  double live_blocks = dd(d.layers);
  if (s.activation_checkpointing == ActivationCheckpointingKind::TransformerBlock) live_blocks = 1.0;
  if (s.activation_memory_budget > 0) live_blocks = 1.0;  // a plan may checkpoint every block
  if (s.activation_checkpointing == ActivationCheckpointingKind::BlockSegments) {
    const std::int64_t k = s.checkpoint_segment_blocks > 0
                               ? std::min(s.checkpoint_segment_blocks, d.layers)
                               : std::max<std::int64_t>(1, std::llround(std::sqrt(dd(d.layers))));
    live_blocks = dd(k);
  }
  double kept = live_blocks * one_block;
  // Sub-block policies keep every block's other half, and replay one half.
  if (s.activation_checkpointing == ActivationCheckpointingKind::AttentionSubBlock) {
    kept = dd(d.layers) * rows * 2.0 * dd(d.feed_forward_width) + one_block;
  }
  if (s.activation_checkpointing == ActivationCheckpointingKind::MlpSubBlock) {
    kept = dd(d.layers) * (rows * 4.0 * dd(d.model_width) + scores) + one_block;
  }
  const double logits = 2.0 * rows * dd(d.vocab_size);  // logits and their softmax
  e.activations = f * (boundaries + kept + logits);
  return e;
}

double available_memory_bytes() { return available_host_memory_bytes(); }

void check_memory_budget(const MemoryEstimate& e, const char* op) {
  const double available = available_memory_bytes();
  if (available <= 0 || e.total() <= available) return;
  throw ValueError(std::string("[") + op + "] this run needs at least " + gib(e.total()) + " (weights " +
                   gib(e.parameters) + ", gradients and Adam moments " + gib(e.training) + ", activations " +
                   gib(e.activations) + ") but this machine has " + gib(available) +
                   "; use a smaller model, batch or sequence length, or LoRA rank");
}

}  // namespace riftco_transformer::stage
