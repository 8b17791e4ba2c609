#pragma once
// Incremental decoding with a K/V cache, and text generation on top of it.
// decode_token() builds no graph and never checkpoints: it mutates the cache,
// so it is not replay-safe (spec "Replay contract").
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "riftco_transformer/transformer.hpp"

namespace riftco_transformer {

class DecodeSession {
 public:
  /// Holds the model's shared state: the session stays valid after the model
  /// object is destroyed. The model's checkpointing policy may change at any
  /// time; decode does not use it.
  explicit DecodeSession(const DecoderOnlyTransformer& model);

  /// Appends `token` at position() and returns the next-token logits (V).
  /// Errors: a token outside the vocabulary (ValueError), a full context
  /// (ValueError saying so), parameters changed since the session started
  /// (StaleGraphError: the cache was computed with the old values).
  Tensor decode_token(std::int32_t token);
  std::int64_t position() const { return position_; }
  std::int64_t capacity() const;
  /// Logits per decode_token() call.
  std::int64_t vocab_size() const;
  /// Empties the cache and accepts the model's current parameter values.
  void reset();

 private:
  std::shared_ptr<TransformerCore> core_;
  std::vector<Tensor> keys_;    // per layer (H, context, D)
  std::vector<Tensor> values_;  // per layer (H, context, D)
  std::vector<std::uint64_t> versions_;
  std::int64_t position_ = 0;
};

struct GenerationOptions {
  std::int64_t max_new_tokens = 64;
  /// 0 = greedy (argmax); otherwise logits are divided by it before sampling.
  float temperature = 1.0F;
  /// Keep only the k most likely tokens when sampling; 0 = all.
  std::int64_t top_k = 0;
  std::uint64_t seed = 0;
};

struct GenerationResult {
  std::vector<std::int32_t> tokens;  // the new tokens only
  bool reached_context = false;      // stopped early: the context is full
  std::string message;               // why it stopped, for a person
};

/// Feeds `prompt` (non-empty) through a DecodeSession, then samples.
GenerationResult generate(const DecoderOnlyTransformer& model, std::span<const std::int32_t> prompt,
                          const GenerationOptions& options);

}  // namespace riftco_transformer
