#pragma once
// Evaluation of a model on a text: loss, perplexity and bits per byte, so
// models with different tokenizers compare (docs/pipelines.md, rt-eval).
#include <cstdint>
#include <functional>
#include <string_view>

#include "riftco_transformer/tokenizer.hpp"
#include "riftco_transformer/transformer.hpp"

namespace riftco_transformer {

struct EvaluationOptions {
  /// Rows per forward pass.
  std::int64_t batch = 8;
  /// Window length; 0: the model's context length.
  std::int64_t sequence_length = 0;
  /// Called before each batch's forward pass: what it throws stops the
  /// evaluation and reaches the caller (the model's training mode was never
  /// changed). Empty: never called. Python's bindings check for Ctrl-C here.
  std::function<void()> interrupt;
};

struct EvaluationResult {
  std::int64_t tokens = 0;  // targets scored: every id of the text but the first
  std::int64_t bytes = 0;   // bytes of text those targets stand for (Tokenizer::byte_length)
  double loss = 0.0;        // mean cross-entropy per scored token, nats
  double perplexity = 0.0;  // exp(loss)
  double bits_per_byte = 0.0;  // loss · tokens / (bytes · ln 2); loss / ln 2 exactly for bytes
};

/// The text is encoded whole, then cut into non-overlapping windows of
/// sequence_length ids: window k feeds ids [kW, kW + W) and scores ids
/// [kW + 1, kW + W + 1), so every id but the first is scored exactly once,
/// with between 0 and W - 1 ids of context (the cheap, deterministic choice;
/// a sliding window would score with more context at W times the cost).
/// Dropout is off on this thread and no graph is built; the model's training
/// mode is not changed (DecoderOnlyTransformer::EvaluationGuard), so a
/// training forward on another thread keeps its dropout. ValueError for bad options or a tokenizer whose vocabulary is
/// not the model's; DataError when the text gives fewer than 2 ids or the
/// tokenizer does not reproduce it byte for byte (bits per byte would lie).
EvaluationResult evaluate(DecoderOnlyTransformer& model, std::string_view text, const Tokenizer& tokenizer,
                          const EvaluationOptions& options = {});

}  // namespace riftco_transformer
