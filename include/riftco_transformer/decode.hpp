#pragma once
// Incremental decoding with a K/V cache, and text generation on top of it.
// decode_token() builds no graph and never checkpoints: it mutates the cache,
// so it is not replay-safe (spec "Replay contract").
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
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
  /// One session serves one call at a time: calls from several threads
  /// wait for each other (each token still goes to one position).
  Tensor decode_token(std::int32_t token);
  std::int64_t position() const;
  /// The most tokens the session holds (the context length). Its K/V caches
  /// grow to it as tokens come (128 positions first, then twice as many each
  /// time they fill); host memory for a growth that cannot be had is an
  /// OutOfMemoryError naming the size (device memory: the CUDA allocator's
  /// BackendError), the session as it was.
  std::int64_t capacity() const;
  /// Logits per decode_token() call.
  std::int64_t vocab_size() const;
  /// Empties the cache and accepts the model's current parameter values.
  void reset();

 private:
  std::shared_ptr<TransformerCore> core_;
  std::vector<Tensor> keys_;    // per layer (G, rows, D): rows double as positions fill them, up to the context
  std::vector<Tensor> values_;  // per layer (G, rows, D)
  std::vector<std::uint64_t> versions_;
  std::int64_t position_ = 0;
  std::unique_ptr<std::mutex> lock_ = std::make_unique<std::mutex>();  // movable session
};

/// Turns generated token ids into text, for stop strings and
/// GenerationResult::text. A subword tokenizer plugs its decoder in here.
using Detokenizer = std::function<std::string(std::span<const std::int32_t>)>;
/// The default: id i < 256 is the byte i (the byte tokenizer); larger ids
/// become U+FFFD.
std::string bytes_detokenizer(std::span<const std::int32_t> tokens);

/// Sampling follows Hugging Face's order of logits processors: repetition
/// penalty, then temperature, top-k, top-p; then one draw.
struct GenerationOptions {
  std::int64_t max_new_tokens = 64;
  /// 0 = greedy (argmax); otherwise logits are divided by it before sampling.
  float temperature = 1.0F;
  /// Keep only the k most likely tokens when sampling, and every token tied
  /// with the k-th (as Hugging Face's top-k: a logit at least the k-th
  /// largest stays); 0 = all.
  std::int64_t top_k = 0;
  std::uint64_t seed = 0;
  /// Nucleus sampling: keep the smallest set of the most likely tokens whose
  /// probability (after temperature and top-k) adds up to at least top_p.
  /// In (0, 1]; 1 = off.
  float top_p = 1.0F;
  /// CTRL / Hugging Face: the logit of every token already in the prompt or
  /// generated (each once) is divided by it when positive, multiplied by it
  /// when negative, before anything else (greedy too). > 0 and finite; 1 = off.
  float repetition_penalty = 1.0F;
  /// Text-level stop strings (non-empty): generation stops as soon as the
  /// detokenized new text contains one; GenerationResult::text ends before
  /// it. A stop string may span several tokens.
  std::vector<std::string> stop;
  /// Token ids that end generation, as Hugging Face's eos_token_id: when a
  /// new token is one of them generation stops; the token is the last of
  /// GenerationResult::tokens, not part of its text, and stop_token says
  /// which. Typically the tokenizer's end-of-sequence id (Tokenizer::eos_id).
  /// Each must lie in the model's vocabulary (ValueError otherwise).
  std::vector<std::int32_t> stop_tokens;
  /// Independent samples for generate_samples(): sample i draws from
  /// Random(seed + i · 0x9E3779B97F4A7C15) (mod 2^64), so sample 0 is what
  /// generate() gives with the same seed. generate() needs 1.
  std::int64_t num_samples = 1;
  /// Empty: bytes_detokenizer.
  Detokenizer detokenize;
  /// Called before each token the model decodes (the prompt's and the new
  /// ones, in every sample): what it throws stops the generation and reaches
  /// the caller (the model is only read, so nothing is left half-done).
  /// Empty: never called. Python's bindings check for Ctrl-C here.
  std::function<void()> interrupt;
  /// ValueError naming the option.
  void validate() const;
};

struct GenerationResult {
  /// The new tokens only. With a stop string: up to and including the token
  /// that completed it (text excludes the stop string itself).
  std::vector<std::int32_t> tokens;
  bool reached_context = false;      // stopped early: the context is full
  std::string message;               // why it stopped, for a person
  std::string text;                  // detokenize(tokens), cut before a matched stop string
  std::int64_t stop_index = -1;      // which of options.stop matched; -1: none
  std::int32_t stop_token = -1;      // the id of options.stop_tokens that ended it; -1: none
};

/// What generate() and generate_samples() check of the prompt first: a
/// ValueError for an empty prompt or one longer than the model's context
/// length. Takes the length alone, so a caller can check it before it makes
/// a view over the prompt's buffer (the C ABI).
void check_prompt_length(const DecoderOnlyTransformer& model, std::size_t length);
/// What generate() checks of options.stop_tokens against the model: each id
/// in [0, vocab_size) (ValueError naming it otherwise).
void check_stop_tokens(const DecoderOnlyTransformer& model, std::span<const std::int32_t> stop_tokens);

/// Feeds `prompt` (non-empty) through a DecodeSession, then samples.
/// options.num_samples must be 1 (see generate_samples).
GenerationResult generate(const DecoderOnlyTransformer& model, std::span<const std::int32_t> prompt,
                          const GenerationOptions& options);
/// options.num_samples independent continuations of `prompt`, in order.
std::vector<GenerationResult> generate_samples(const DecoderOnlyTransformer& model,
                                               std::span<const std::int32_t> prompt, const GenerationOptions& options);

/// The distribution one sampling step draws from, for inspection and tests:
/// `logits` after the repetition penalty over `history`, temperature (> 0),
/// top-k and top-p; candidates in descending probability order (ties: lower
/// id first), probabilities normalized to sum to 1. A logit of -inf masks
/// its token (never a candidate, whatever the penalty); NaN, +inf, a row of
/// -inf only and history ids outside the vocabulary are ValueErrors.
struct SamplingCandidates {
  std::vector<std::int32_t> tokens;
  std::vector<double> probabilities;
};
SamplingCandidates sampling_candidates(std::span<const float> logits, std::span<const std::int32_t> history,
                                       const GenerationOptions& options);
/// The repetition penalty in place (each token of `history` once; ids
/// outside `logits` are a ValueError); a result past the float range is
/// the largest finite float of its sign.
void apply_repetition_penalty(std::span<float> logits, std::span<const std::int32_t> history, float penalty);

}  // namespace riftco_transformer
