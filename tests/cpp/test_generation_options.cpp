// Sampling options of generate(): top-p, repetition penalty, stop strings,
// samples; the defaults keep the earlier results bit for bit.
#include <gtest/gtest.h>

#include <limits>

#include <cmath>
#include <string>
#include <vector>

#include "riftco_transformer/decode.hpp"

using namespace riftco_transformer;

namespace {

TransformerDimensions dims() {
  TransformerDimensions d;
  d.vocab_size = 32;
  d.context_length = 24;
  d.model_width = 16;
  d.heads = 2;
  d.layers = 2;
  d.feed_forward_width = 24;
  return d;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  return "(no error)";
}

/// Token i detokenizes as the letter 'a' + i: stop strings over letters.
std::string letters(std::span<const std::int32_t> tokens) {
  std::string s;
  for (const std::int32_t t : tokens) s.push_back(static_cast<char>('a' + t));
  return s;
}

}  // namespace

TEST(GenerationOptions, DefaultsGiveTheEarlierTokensBitForBit) {
  Random init(21);
  DecoderOnlyTransformer model(dims(), init);
  const std::vector<std::int32_t> prompt{1, 2, 3, 4};
  GenerationOptions o;
  o.max_new_tokens = 12;
  o.seed = 99;
  // Recorded with generate() before top_p, repetition_penalty and stop existed.
  EXPECT_EQ(generate(model, prompt, o).tokens, (std::vector<std::int32_t>{5, 2, 8, 21, 17, 12, 5, 10, 25, 20, 18, 20}));
  o.temperature = 0.0F;
  EXPECT_EQ(generate(model, prompt, o).tokens, (std::vector<std::int32_t>{23, 4, 23, 4, 23, 4, 23, 4, 23, 4, 23, 26}));
  o.temperature = 0.7F;
  o.top_k = 5;
  EXPECT_EQ(generate(model, prompt, o).tokens, (std::vector<std::int32_t>{14, 30, 27, 27, 17, 30, 23, 28, 7, 21, 30, 9}));
}

TEST(GenerationOptions, TopPKeepsTheSmallestSetReachingTheMass) {
  // Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (logits are their logs).
  const std::vector<float> logits{std::log(0.125F), std::log(0.5F), std::log(0.0625F), std::log(0.25F),
                                  std::log(0.0625F)};
  GenerationOptions o;
  const auto kept = [&](float p) {
    o.top_p = p;
    return sampling_candidates(logits, {}, o).tokens;
  };
  EXPECT_EQ(kept(0.5F), (std::vector<std::int32_t>{1}));           // 0.5 reaches 0.5 alone
  EXPECT_EQ(kept(0.51F), (std::vector<std::int32_t>{1, 3}));       // 0.75
  EXPECT_EQ(kept(0.8F), (std::vector<std::int32_t>{1, 3, 0}));     // 0.875
  EXPECT_EQ(kept(0.9F), (std::vector<std::int32_t>{1, 3, 0, 2}));  // 0.9375 (tie: lower id first)
  EXPECT_EQ(kept(1.0F).size(), 5U);
  EXPECT_EQ(kept(0.01F), (std::vector<std::int32_t>{1}));
  o.top_p = 0.8F;
  const SamplingCandidates c = sampling_candidates(logits, {}, o);
  EXPECT_NEAR(c.probabilities[0], 0.5 / 0.875, 1e-6);  // renormalized over the kept set
  // After top-k 2 the mass is over the two kept tokens: 0.5/0.75 >= 0.6.
  o.top_k = 2;
  o.top_p = 0.6F;
  EXPECT_EQ(sampling_candidates(logits, {}, o).tokens, (std::vector<std::int32_t>{1}));
  // Temperature first: at T = 2 the probabilities flatten and more tokens are needed.
  o.top_k = 0;
  o.top_p = 0.5F;
  o.temperature = 2.0F;
  EXPECT_EQ(sampling_candidates(logits, {}, o).tokens, (std::vector<std::int32_t>{1, 3}));
}

TEST(GenerationOptions, TopKKeepsEveryTokenTiedWithTheKthAsHuggingFaceDoes) {
  // transformers' TopKLogitsWarper removes only logits below the k-th
  // largest (`scores < topk(scores, k).values[..., -1]`): the values below
  // are what it gives (sampling_vs_hf.py of the 2026-12-02 attack).
  GenerationOptions o;
  o.top_k = 1;
  SamplingCandidates c = sampling_candidates(std::vector<float>{1, 1, 1, 0}, {}, o);
  EXPECT_EQ(c.tokens, (std::vector<std::int32_t>{0, 1, 2}));  // was {0}
  for (double p : c.probabilities) EXPECT_NEAR(p, 1.0 / 3.0, 1e-12);
  o.top_k = 2;
  c = sampling_candidates(std::vector<float>{2, 1, 1, 1, 0}, {}, o);
  EXPECT_EQ(c.tokens, (std::vector<std::int32_t>{0, 1, 2, 3}));  // was {0, 1}
  const double e = std::exp(1.0);
  EXPECT_NEAR(c.probabilities[0], e / (e + 3), 1e-12);  // 0.475
  EXPECT_NEAR(c.probabilities[3], 1 / (e + 3), 1e-12);  // 0.175
  // Ties beyond the k-th, out of id order in the logits: kept, lower id first.
  o.top_k = 2;
  c = sampling_candidates(std::vector<float>{0.5F, 3, 0.5F, -1, 0.5F}, {}, o);
  EXPECT_EQ(c.tokens, (std::vector<std::int32_t>{1, 0, 2, 4}));
  // No tie: exactly k. A masked (-inf) k-th never brings the masked ones in.
  c = sampling_candidates(std::vector<float>{3, 2, 1, 0}, {}, o);
  EXPECT_EQ(c.tokens, (std::vector<std::int32_t>{0, 1}));
  const float inf = std::numeric_limits<float>::infinity();
  o.top_k = 3;
  c = sampling_candidates(std::vector<float>{1, -inf, 2, -inf}, {}, o);
  EXPECT_EQ(c.tokens, (std::vector<std::int32_t>{2, 0}));
}

TEST(GenerationOptions, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  std::vector<float> logits{2.0F, -1.0F, 0.5F, 3.0F, 0.0F};
  apply_repetition_penalty(logits, std::vector<std::int32_t>{0, 1, 1, 4, 0}, 2.0F);  // repeats count once
  EXPECT_EQ(logits, (std::vector<float>{1.0F, -2.0F, 0.5F, 3.0F, 0.0F}));
  EXPECT_NE(error_of([&] { apply_repetition_penalty(logits, std::vector<std::int32_t>{5}, 2.0F); })
                .find("outside the vocabulary"),
            std::string::npos);
  // Greedy with a penalty avoids repeating itself where plain greedy loops.
  Random init(21);
  DecoderOnlyTransformer model(dims(), init);
  GenerationOptions o;
  o.temperature = 0.0F;
  o.max_new_tokens = 12;
  o.repetition_penalty = 1000.0F;
  const std::vector<std::int32_t> prompt{1, 2, 3, 4};
  const std::vector<std::int32_t> tokens = generate(model, prompt, o).tokens;
  // A huge penalty makes every already-used positive logit tiny: no token
  // follows itself, and the 23 4 loop of plain greedy is broken.
  for (std::size_t i = 1; i < tokens.size(); ++i) EXPECT_NE(tokens[i], tokens[i - 1]);
  EXPECT_NE(tokens, (std::vector<std::int32_t>{23, 4, 23, 4, 23, 4, 23, 4, 23, 4, 23, 26}));
}

// A penalty near 0 divides a repeated positive logit past the float range:
// saturated at the largest float, so the sampler keeps a distribution (it
// became +inf, exp(inf - inf) NaN, and the least likely token came out).
// Likewise a huge penalty on a negative logit.
TEST(GenerationOptions, ARepetitionPenaltyPastTheFloatRangeSaturatesAndStillSamples) {
  constexpr float kMax = std::numeric_limits<float>::max();
  std::vector<float> logits{2.0F, -1.0F, 0.5F, 3.0F};
  apply_repetition_penalty(logits, std::vector<std::int32_t>{0, 2}, 1e-45F);
  EXPECT_EQ(logits, (std::vector<float>{kMax, -1.0F, kMax, 3.0F}));
  std::vector<float> negative{-2.0F, 1.0F};
  apply_repetition_penalty(negative, std::vector<std::int32_t>{0}, 3e38F);
  EXPECT_EQ(negative[0], -kMax);
  GenerationOptions o;
  o.repetition_penalty = 1e-45F;
  o.temperature = 0.7F;
  const SamplingCandidates c =
      sampling_candidates(std::vector<float>{2.0F, -1.0F, 0.5F, 3.0F}, std::vector<std::int32_t>{0, 2}, o);
  ASSERT_EQ(c.tokens.size(), 4U);
  EXPECT_EQ(c.tokens[0], 0);  // the saturated ones lead, ties by id
  EXPECT_EQ(c.tokens[1], 2);
  EXPECT_EQ(c.probabilities[0], 0.5);
  EXPECT_EQ(c.probabilities[1], 0.5);
  EXPECT_EQ(c.probabilities[3], 0.0);
}

TEST(GenerationOptions, StopStringsCutTheTextIncludingOneSpanningTwoTokens) {
  Random init(21);
  DecoderOnlyTransformer model(dims(), init);
  const std::vector<std::int32_t> prompt{1, 2, 3, 4};
  GenerationOptions o;
  o.temperature = 0.0F;
  o.max_new_tokens = 12;
  o.detokenize = letters;  // greedy gives 23 4 23 4 ... = "xexe..."
  o.stop = {"ex"};         // spans token 2 ('e') and token 3 ('x')
  GenerationResult r = generate(model, prompt, o);
  EXPECT_EQ(r.tokens, (std::vector<std::int32_t>{23, 4, 23}));
  EXPECT_EQ(r.text, "x");
  EXPECT_EQ(r.stop_index, 0);
  EXPECT_FALSE(r.reached_context);
  // The earliest match wins, whichever stop string it is.
  o.stop = {"xex", "e"};
  r = generate(model, prompt, o);
  EXPECT_EQ(r.tokens, (std::vector<std::int32_t>{23, 4}));
  EXPECT_EQ(r.text, "x");
  EXPECT_EQ(r.stop_index, 1);
  // No match: the whole text.
  o.stop = {"zz"};
  r = generate(model, prompt, o);
  EXPECT_EQ(r.tokens.size(), 12U);
  EXPECT_EQ(r.text, letters(r.tokens));
  EXPECT_EQ(r.stop_index, -1);
  // The default detokenizer is bytes.
  o.detokenize = nullptr;
  o.stop = {std::string(1, static_cast<char>(4))};
  r = generate(model, prompt, o);
  EXPECT_EQ(r.tokens, (std::vector<std::int32_t>{23, 4}));
  EXPECT_EQ(r.text, std::string(1, static_cast<char>(23)));
}

TEST(GenerationOptions, SamplesAreDeterministicPerSeedAndSampleZeroIsGenerate) {
  Random init(21);
  DecoderOnlyTransformer model(dims(), init);
  const std::vector<std::int32_t> prompt{1, 2, 3, 4};
  GenerationOptions o;
  o.max_new_tokens = 10;
  o.seed = 5;
  o.top_p = 0.9F;
  o.repetition_penalty = 1.3F;
  o.num_samples = 3;
  const std::vector<GenerationResult> a = generate_samples(model, prompt, o);
  const std::vector<GenerationResult> b = generate_samples(model, prompt, o);
  ASSERT_EQ(a.size(), 3U);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].tokens, b[i].tokens);
  EXPECT_NE(a[0].tokens, a[1].tokens);
  EXPECT_NE(a[1].tokens, a[2].tokens);
  o.num_samples = 1;
  EXPECT_EQ(generate(model, prompt, o).tokens, a[0].tokens);
  o.seed = 5 + 0x9E3779B97F4A7C15ULL;
  EXPECT_EQ(generate(model, prompt, o).tokens, a[1].tokens);
}

TEST(GenerationOptions, BadOptionsAreValueErrorsNamingTheOption) {
  Random init(21);
  DecoderOnlyTransformer model(dims(), init);
  const std::vector<std::int32_t> prompt{1};
  const auto with = [&](const std::function<void(GenerationOptions&)>& change) {
    GenerationOptions o;
    change(o);
    return error_of([&] { generate(model, prompt, o); });
  };
  for (const float p : {0.0F, -0.5F, 1.5F, std::nanf("")}) {
    EXPECT_NE(with([p](GenerationOptions& o) { o.top_p = p; }).find("top_p must be in (0, 1]"), std::string::npos);
  }
  for (const float r : {0.0F, -1.0F, INFINITY, std::nanf("")}) {
    EXPECT_NE(with([r](GenerationOptions& o) { o.repetition_penalty = r; }).find("repetition_penalty"),
              std::string::npos);
  }
  EXPECT_NE(with([](GenerationOptions& o) { o.stop = {"ok", ""}; }).find("stop string 1 is empty"), std::string::npos);
  EXPECT_NE(with([](GenerationOptions& o) { o.num_samples = 0; }).find("num_samples must be"), std::string::npos);
  EXPECT_NE(with([](GenerationOptions& o) { o.num_samples = 2; }).find("use generate_samples()"), std::string::npos);
}

// Messages show the value as given: to_string's six decimals made top_p
// 1.0000001 read "must be in (0, 1], got 1.000000".
TEST(GenerationOptions, MessagesShowTheValueThatWasGiven) {
  Random init(22);
  DecoderOnlyTransformer model(dims(), init);
  const std::vector<std::int32_t> prompt{1};
  GenerationOptions o;
  o.top_p = 1.0000001F;
  EXPECT_NE(error_of([&] { generate(model, prompt, o); }).find("got 1.0000001"), std::string::npos);
  o = GenerationOptions{};
  o.temperature = -2.5F;
  EXPECT_NE(error_of([&] { generate(model, prompt, o); }).find("got -2.5"), std::string::npos);
  o = GenerationOptions{};
  o.repetition_penalty = -1e-45F;
  EXPECT_NE(error_of([&] { generate(model, prompt, o); }).find("got -1e-45"), std::string::npos);
}

// -inf masks a token, as in Hugging Face's logits processors; it was a
// ValueError asking whether the model's weights were finite.
TEST(GenerationOptions, MinusInfinityMasksATokenInSamplingCandidates) {
  const float inf = std::numeric_limits<float>::infinity();
  GenerationOptions o;
  const std::vector<float> logits{1.0F, -inf, 2.0F, -inf};
  const SamplingCandidates c = sampling_candidates(logits, {}, o);
  EXPECT_EQ(c.tokens, (std::vector<std::int32_t>{2, 0}));
  o.repetition_penalty = 1e-30F;  // a penalized masked token stays masked (token 0 now leads)
  const std::vector<std::int32_t> history{1, 3, 0};
  EXPECT_EQ(sampling_candidates(logits, history, o).tokens, (std::vector<std::int32_t>{0, 2}));
  o.repetition_penalty = 1.0F;
  for (const float bad : {inf, std::nanf("")}) {
    EXPECT_NE(error_of([&] { sampling_candidates(std::vector<float>{0.0F, bad}, {}, o); }).find("logit 1 is"),
              std::string::npos);
  }
  EXPECT_NE(error_of([&] { sampling_candidates(std::vector<float>{-inf, -inf}, {}, o); }).find("every logit is -inf"),
            std::string::npos);
  const std::vector<std::int32_t> outside{7};
  EXPECT_NE(error_of([&] { sampling_candidates(logits, outside, o); }).find("history token 7"), std::string::npos);
}

// GenerationOptions::interrupt runs before every token the model decodes
// (prompt and new, every sample); what it throws stops the generation and
// reaches the caller (Python's Ctrl-C goes through it).
TEST(GenerationOptions, InterruptRunsBeforeEveryDecodedTokenAndItsExceptionStopsGeneration) {
  Random init(21);
  DecoderOnlyTransformer model(dims(), init);
  const std::vector<std::int32_t> prompt{1, 2, 3, 4};
  GenerationOptions o;
  o.max_new_tokens = 6;
  o.num_samples = 2;
  int calls = 0;
  o.interrupt = [&] { ++calls; };
  const std::vector<GenerationResult> all = generate_samples(model, prompt, o);
  EXPECT_EQ(calls, 2 * (4 + 6 - 1));  // per sample: 4 prompt tokens, then 5 decodes (the 6th token is not fed back)
  o.interrupt = {};
  EXPECT_EQ(generate_samples(model, prompt, o)[1].tokens, all[1].tokens);  // the hook changes nothing else
  struct Stop {};
  calls = 0;
  o.interrupt = [&] {
    if (++calls == 7) throw Stop{};
  };
  EXPECT_THROW(generate_samples(model, prompt, o), Stop);
  EXPECT_EQ(calls, 7);
  // The prompt is checked before the hook runs.
  calls = 0;
  EXPECT_THROW(generate(model, std::vector<std::int32_t>{}, o), ValueError);
  EXPECT_EQ(calls, 0);
}

TEST(GenerationOptions, AStopTokenEndsGenerationAsHuggingFacesEosDoes) {
  Random init(21);
  DecoderOnlyTransformer model(dims(), init);
  const std::vector<std::int32_t> prompt{7, 10};
  GenerationOptions o;
  o.temperature = 0.0F;
  o.max_new_tokens = 12;
  const GenerationResult free_run = generate(model, prompt, o);
  ASSERT_GE(free_run.tokens.size(), 4U);
  const std::int32_t eos = free_run.tokens[2];
  const std::size_t first = static_cast<std::size_t>(
      std::find(free_run.tokens.begin(), free_run.tokens.end(), eos) - free_run.tokens.begin());
  std::int32_t unused = 0;  // a token the free run never makes: listing it changes nothing
  while (std::find(free_run.tokens.begin(), free_run.tokens.end(), unused) != free_run.tokens.end()) ++unused;
  o.stop_tokens = {unused, eos};  // any of them ends it
  const GenerationResult stopped = generate(model, prompt, o);
  EXPECT_EQ(stopped.tokens, std::vector<std::int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + first + 1));
  EXPECT_EQ(stopped.stop_token, eos);
  EXPECT_EQ(stopped.stop_index, -1);
  EXPECT_EQ(stopped.text, bytes_detokenizer(std::span(stopped.tokens).first(first)));  // the stop token's text is left out
  EXPECT_NE(stopped.message.find("at stop token " + std::to_string(eos)), std::string::npos) << stopped.message;
  EXPECT_EQ(free_run.stop_token, -1);
  o.num_samples = 2;  // greedy samples are alike: each stops at the same place
  for (const GenerationResult& r : generate_samples(model, prompt, o)) {
    EXPECT_EQ(r.stop_token, eos);
    EXPECT_EQ(r.tokens, stopped.tokens);
  }
  o.num_samples = 1;
  o.stop_tokens = {32};
  EXPECT_NE(error_of([&] { generate(model, prompt, o); }).find("stop token 0 (32) is outside the vocabulary [0, 32)"),
            std::string::npos);
  o.stop_tokens = {-1};
  EXPECT_THROW(generate_samples(model, prompt, o), ValueError);
}
