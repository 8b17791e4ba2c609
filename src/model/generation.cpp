// Text generation over a DecodeSession: repetition penalty, temperature,
// top-k, top-p (Hugging Face's processor order), stop strings, samples.
#include <algorithm>
#include <limits>
#include <cmath>
#include <numeric>
#include <utility>

#include "riftco_transformer/decode.hpp"

namespace riftco_transformer {
namespace {

constexpr std::uint64_t kSampleSeedStep = 0x9E3779B97F4A7C15ULL;

/// Fills order[0, keep) and their unnormalized probabilities; returns keep
/// and their total. With top_p = 1 the arithmetic is exactly the one
/// generate() always used (results stay bit-identical).
std::pair<std::int64_t, double> distribution(const float* l, std::int64_t vocab, const GenerationOptions& o,
                                             std::vector<std::int32_t>& order, std::vector<double>& probs) {
  std::iota(order.begin(), order.end(), 0);
  const auto before = [l](std::int32_t a, std::int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); };
  std::int64_t keep = o.top_k == 0 ? vocab : std::min(o.top_k, vocab);
  std::partial_sort(order.begin(), order.begin() + keep, order.end(), before);
  if (keep < vocab) {
    // Hugging Face's top-k keeps every token whose (temperature-scaled) logit
    // is at least the k-th largest: tokens tied with the k-th stay too.
    const float kth = l[order[static_cast<std::size_t>(keep - 1)]];
    if (kth != -std::numeric_limits<float>::infinity()) {
      const float scaled = kth / o.temperature;
      const auto tied = std::partition(order.begin() + keep, order.end(),
                                       [&](std::int32_t i) { return l[i] / o.temperature >= scaled; });
      std::sort(order.begin() + keep, tied, before);
      keep = tied - order.begin();
    }
  }
  const double top = l[order[0]];
  double total = 0.0;
  for (std::int64_t i = 0; i < keep; ++i) {
    probs[static_cast<std::size_t>(i)] = std::exp((l[order[static_cast<std::size_t>(i)]] - top) / o.temperature);
    total += probs[static_cast<std::size_t>(i)];
  }
  if (o.top_p < 1.0F) {
    const double threshold = static_cast<double>(o.top_p) * total;
    double mass = 0.0;
    for (std::int64_t i = 0; i < keep; ++i) {
      mass += probs[static_cast<std::size_t>(i)];
      if (mass >= threshold) {
        keep = i + 1;
        break;
      }
    }
    total = mass;
  }
  return {keep, total};
}

void check_finite(const float* l, std::int64_t vocab, std::int64_t position) {
  for (std::int64_t i = 0; i < vocab; ++i) {
    if (!std::isfinite(l[i])) {
      throw ValueError("[generate] the logits after " + std::to_string(position) + " tokens are not finite (token " +
                       std::to_string(i) + ": " + float_text(l[i]) + "): are the model's weights finite?");
    }
  }
}

/// The earliest stop string in `text`: {position, index} or {npos, -1}.
std::pair<std::size_t, std::int64_t> find_stop(const std::string& text, const std::vector<std::string>& stops) {
  std::pair<std::size_t, std::int64_t> best{std::string::npos, -1};
  for (std::size_t i = 0; i < stops.size(); ++i) {
    const std::size_t at = text.find(stops[i]);
    if (at < best.first) best = {at, static_cast<std::int64_t>(i)};
  }
  return best;
}

GenerationResult generate_one(const DecoderOnlyTransformer& model, std::span<const std::int32_t> prompt,
                              const GenerationOptions& options) {
  const std::int64_t context = model.dimensions().context_length;
  const std::int64_t vocab = model.dimensions().vocab_size;
  const Detokenizer& detokenize = options.detokenize ? options.detokenize : Detokenizer(bytes_detokenizer);
  DecodeSession session(model);
  Tensor logits;
  // Sampling runs on the host: the logits (V) are read there (a no-op copy on cpu).
  const auto check_interrupt = [&] {
    if (options.interrupt) options.interrupt();
  };
  for (const std::int32_t t : prompt) {
    check_interrupt();
    logits = session.decode_token(t).to(Backend::Cpu);
  }
  Random random(options.seed);
  GenerationResult result;
  std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
  std::vector<double> probs(static_cast<std::size_t>(vocab));
  const bool penalize = options.repetition_penalty != 1.0F;
  std::vector<char> seen(penalize ? static_cast<std::size_t>(vocab) : 0, 0);
  std::vector<std::int32_t> distinct;  // tokens seen so far, each once
  std::vector<float> penalized(penalize ? static_cast<std::size_t>(vocab) : 0);
  const auto remember = [&](std::int32_t t) {
    if (penalize && seen[static_cast<std::size_t>(t)] == 0) {
      seen[static_cast<std::size_t>(t)] = 1;
      distinct.push_back(t);
    }
  };
  for (const std::int32_t t : prompt) remember(t);
  for (std::int64_t n = 0; n < options.max_new_tokens; ++n) {
    const float* l = std::as_const(logits).data();
    check_finite(l, vocab, session.position());
    if (penalize) {
      std::copy(l, l + vocab, penalized.begin());
      apply_repetition_penalty(penalized, distinct, options.repetition_penalty);
      l = penalized.data();
    }
    std::int32_t next = 0;
    if (options.temperature == 0.0F) {
      next = static_cast<std::int32_t>(std::max_element(l, l + vocab) - l);
    } else {
      const auto [keep, total] = distribution(l, vocab, options, order, probs);
      double u = static_cast<double>(random.uniform()) * total;
      next = order[static_cast<std::size_t>(keep - 1)];
      for (std::int64_t i = 0; i < keep; ++i) {
        u -= probs[static_cast<std::size_t>(i)];
        if (u < 0.0) {
          next = order[static_cast<std::size_t>(i)];
          break;
        }
      }
    }
    result.tokens.push_back(next);
    remember(next);
    if (std::find(options.stop_tokens.begin(), options.stop_tokens.end(), next) != options.stop_tokens.end()) {
      result.stop_token = next;
      result.text = detokenize(std::span<const std::int32_t>(result.tokens).first(result.tokens.size() - 1));
      result.message = "stopped after " + std::to_string(result.tokens.size()) + " new tokens at stop token " +
                       std::to_string(next);
      return result;
    }
    if (!options.stop.empty()) {
      std::string text = detokenize(result.tokens);
      const auto [at, index] = find_stop(text, options.stop);
      if (index >= 0) {
        result.text = text.substr(0, at);
        result.stop_index = index;
        result.message = "stopped after " + std::to_string(result.tokens.size()) + " new tokens at stop string " +
                         std::to_string(index);
        return result;
      }
    }
    if (session.position() >= context) {
      result.reached_context = n + 1 < options.max_new_tokens;
      if (result.reached_context) {
        result.message = "stopped after " + std::to_string(result.tokens.size()) +
                         " new tokens: the context length " + std::to_string(context) + " is full";
      }
      break;
    }
    if (n + 1 < options.max_new_tokens) {
      check_interrupt();
      logits = session.decode_token(next).to(Backend::Cpu);
    }
  }
  if (result.message.empty()) result.message = "generated " + std::to_string(result.tokens.size()) + " tokens";
  result.text = detokenize(result.tokens);
  return result;
}

}  // namespace

void check_prompt_length(const DecoderOnlyTransformer& model, std::size_t length) {
  if (length == 0) throw ValueError("[generate] the prompt is empty: give at least one token");
  const std::int64_t context = model.dimensions().context_length;
  if (length > static_cast<std::uint64_t>(context)) {  // unsigned: a size of 2^63 or more is not negative
    throw ValueError("[generate] the prompt has " + std::to_string(length) + " tokens, more than the context length " +
                     std::to_string(context));
  }
}

void check_stop_tokens(const DecoderOnlyTransformer& model, std::span<const std::int32_t> stop_tokens) {
  const std::int64_t vocab = model.dimensions().vocab_size;
  for (std::size_t i = 0; i < stop_tokens.size(); ++i) {
    if (stop_tokens[i] < 0 || stop_tokens[i] >= vocab) {
      throw ValueError("[generate] stop token " + std::to_string(i) + " (" + std::to_string(stop_tokens[i]) +
                       ") is outside the vocabulary [0, " + std::to_string(vocab) + ")");
    }
  }
}

std::string bytes_detokenizer(std::span<const std::int32_t> tokens) {
  std::string text;
  text.reserve(tokens.size());
  for (const std::int32_t t : tokens) {
    if (t >= 0 && t < 256) {
      text.push_back(static_cast<char>(static_cast<unsigned char>(t)));
    } else {
      text += "\xEF\xBF\xBD";
    }
  }
  return text;
}

void GenerationOptions::validate() const {
  if (max_new_tokens < 0) throw ValueError("[generate] max_new_tokens must be >= 0");
  if (!(temperature >= 0.0F) || !std::isfinite(temperature)) {
    throw ValueError("[generate] temperature must be a finite number >= 0, got " + float_text(temperature));
  }
  if (top_k < 0) throw ValueError("[generate] top_k must be >= 0");
  if (!(top_p > 0.0F && top_p <= 1.0F)) {
    throw ValueError("[generate] top_p must be in (0, 1] (1 = off), got " + float_text(top_p));
  }
  if (!(repetition_penalty > 0.0F) || !std::isfinite(repetition_penalty)) {
    throw ValueError("[generate] repetition_penalty must be a finite number > 0 (1 = off), got " +
                     float_text(repetition_penalty));
  }
  for (std::size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) throw ValueError("[generate] stop string " + std::to_string(i) + " is empty");
  }
  if (num_samples < 1 || num_samples > 65536) {
    throw ValueError("[generate] num_samples must be in [1, 65536], got " + std::to_string(num_samples));
  }
}

void apply_repetition_penalty(std::span<float> logits, std::span<const std::int32_t> history, float penalty) {
  if (!(penalty > 0.0F) || !std::isfinite(penalty)) {
    throw ValueError("[generate] repetition_penalty must be a finite number > 0, got " + float_text(penalty));
  }
  std::vector<char> done(logits.size(), 0);
  for (const std::int32_t t : history) {
    if (t < 0 || static_cast<std::size_t>(t) >= logits.size()) {
      throw ValueError("[generate] token " + std::to_string(t) + " is outside the vocabulary of " +
                       std::to_string(logits.size()));
    }
  }
  for (const std::int32_t t : history) {
    const auto i = static_cast<std::size_t>(t);
    if (done[i] != 0) continue;
    done[i] = 1;
    if (logits[i] == -std::numeric_limits<float>::infinity()) continue;  // a masked token stays masked
    // Saturated at the largest float: a penalty near 0 (1e-45) made a
    // repeated token's logit +inf, then the sampler's exp(inf - inf) NaN
    // and the least likely token came out.
    constexpr float kMax = std::numeric_limits<float>::max();
    logits[i] = std::clamp(logits[i] < 0.0F ? logits[i] * penalty : logits[i] / penalty, -kMax, kMax);
  }
}

SamplingCandidates sampling_candidates(std::span<const float> logits, std::span<const std::int32_t> history,
                                       const GenerationOptions& options) {
  options.validate();
  if (!(options.temperature > 0.0F)) throw ValueError("[sampling_candidates] temperature must be > 0 (0 is greedy)");
  if (logits.empty()) throw ValueError("[sampling_candidates] the logits are empty");
  const auto vocab = static_cast<std::int64_t>(logits.size());
  std::vector<float> work(logits.begin(), logits.end());
  // -inf masks a token (Hugging Face's convention): probability 0, never a
  // candidate. NaN, +inf and a row masked entirely are refused.
  std::int64_t masked = 0;
  for (std::int64_t i = 0; i < vocab; ++i) {
    const float l = work[static_cast<std::size_t>(i)];
    if (l == -std::numeric_limits<float>::infinity()) {
      ++masked;
    } else if (!std::isfinite(l)) {
      throw ValueError("[sampling_candidates] logit " + std::to_string(i) + " is " + float_text(l) +
                       " (finite values, or -inf to mask a token)");
    }
  }
  if (masked == vocab) throw ValueError("[sampling_candidates] every logit is -inf: no token can be drawn");
  for (const std::int32_t t : history) {  // checked whatever the penalty
    if (t < 0 || t >= vocab) {
      throw ValueError("[sampling_candidates] history token " + std::to_string(t) + " is outside the vocabulary of " +
                       std::to_string(vocab));
    }
  }
  if (options.repetition_penalty != 1.0F) apply_repetition_penalty(work, history, options.repetition_penalty);
  std::vector<std::int32_t> order(logits.size());
  std::vector<double> probs(logits.size());
  const auto [keep, total] = distribution(work.data(), vocab, options, order, probs);
  SamplingCandidates out;
  for (std::int64_t i = 0; i < keep; ++i) {
    if (work[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] == -std::numeric_limits<float>::infinity()) {
      continue;  // a masked token
    }
    out.tokens.push_back(order[static_cast<std::size_t>(i)]);
    out.probabilities.push_back(probs[static_cast<std::size_t>(i)] / total);
  }
  return out;
}

GenerationResult generate(const DecoderOnlyTransformer& model, std::span<const std::int32_t> prompt,
                          const GenerationOptions& options) {
  check_prompt_length(model, prompt.size());
  options.validate();
  check_stop_tokens(model, options.stop_tokens);
  if (options.num_samples != 1) {
    throw ValueError("[generate] num_samples is " + std::to_string(options.num_samples) +
                     ": generate() makes one sample; use generate_samples()");
  }
  return generate_one(model, prompt, options);
}

std::vector<GenerationResult> generate_samples(const DecoderOnlyTransformer& model,
                                               std::span<const std::int32_t> prompt, const GenerationOptions& options) {
  check_prompt_length(model, prompt.size());
  options.validate();
  check_stop_tokens(model, options.stop_tokens);
  std::vector<GenerationResult> samples;
  for (std::int64_t i = 0; i < options.num_samples; ++i) {
    GenerationOptions one = options;
    one.num_samples = 1;
    one.seed = options.seed + static_cast<std::uint64_t>(i) * kSampleSeedStep;
    samples.push_back(generate_one(model, prompt, one));
  }
  return samples;
}

}  // namespace riftco_transformer
