#include <gtest/gtest.h>

#include <cmath>

#include "model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/decode.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
using rt_test::random_batch;
using rt_test::tiny_dims;

TEST(Dimensions, ValidationNamesTheField) {
  TransformerDimensions d = tiny_dims();
  d.heads = 3;
  try {
    d.validate();
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by heads 3"), std::string::npos) << e.what();
  }
  d = tiny_dims();
  d.layers = 0;
  EXPECT_THROW(d.validate(), ValueError);
  d = tiny_dims();
  d.context_length = std::int64_t{1} << 40;  // absurd sizes are refused before anything is allocated
  EXPECT_THROW(d.validate(), ValueError);
  // Each limit names its field and the value given (it once listed all three).
  const auto message = [](const TransformerDimensions& bad) {
    try {
      bad.validate();
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message(d).find("context_length 1099511627776 is above the limit 1048576"), std::string::npos)
      << message(d);
  d = tiny_dims();
  d.layers = std::int64_t{1} << 40;
  EXPECT_NE(message(d).find("layers 1099511627776 is above the limit 4096"), std::string::npos) << message(d);
  d = tiny_dims();
  d.model_width = 18;
  d.heads = 2;  // head width 9: odd
  EXPECT_THROW(d.validate(), ValueError);
  Random r(0);
  d.layers = -1;
  EXPECT_THROW(DecoderOnlyTransformer(d, r), ValueError);
}

TEST(Transformer, SpecConstructorAndPolicyAccessors) {
  Random random(1);
  DecoderOnlyTransformer model(tiny_dims(), random, 1.0e-5F, FullSequenceAttentionKind::Flash,
                               ActivationCheckpointingKind::TransformerBlock);
  EXPECT_EQ(model.attention_kind(), FullSequenceAttentionKind::Flash);
  EXPECT_EQ(model.activation_checkpointing_kind(), ActivationCheckpointingKind::TransformerBlock);
  model.set_activation_checkpointing_kind(ActivationCheckpointingKind::Disabled);
  EXPECT_EQ(model.activation_checkpointing_kind(), ActivationCheckpointingKind::Disabled);
  Random r2(1);
  DecoderOnlyTransformer defaults(tiny_dims(), r2);
  EXPECT_EQ(defaults.activation_checkpointing_kind(), ActivationCheckpointingKind::Disabled);
  EXPECT_EQ(parse_activation_checkpointing("block"), ActivationCheckpointingKind::TransformerBlock);
  EXPECT_STREQ(activation_checkpointing_name(ActivationCheckpointingKind::Disabled), "disabled");
  EXPECT_THROW(parse_activation_checkpointing("blocks"), ValueError);
  EXPECT_THROW(model.set_activation_checkpointing_kind(static_cast<ActivationCheckpointingKind>(9)), ValueError);
}

TEST(Transformer, ParameterNamesShapesAndInitialization) {
  Random random(2);
  TransformerDimensions d = tiny_dims(3);
  DecoderOnlyTransformer model(d, random);
  const std::vector<NamedParameter> params = model.parameters();
  ASSERT_EQ(params.size(), 3U + 9U * 3U);
  EXPECT_EQ(params.front().name, "token_embedding.weight");
  EXPECT_EQ(params.back().name, "lm_head.weight");
  EXPECT_EQ(model.parameter("blocks.2.attention.query.weight").shape(), (Shape{16, 16}));
  EXPECT_EQ(model.parameter("blocks.1.mlp.gate.weight").shape(), (Shape{24, 16}));
  EXPECT_EQ(model.parameter("blocks.1.mlp.down.weight").shape(), (Shape{16, 24}));
  EXPECT_THROW(model.parameter("blocks.9.mlp.up.weight"), ValueError);
  const std::int64_t expected = 2 * 32 * 16 + 16 + 3 * (2 * 16 + 4 * 16 * 16 + 3 * 16 * 24);
  EXPECT_EQ(model.parameter_count(), expected);
  EXPECT_EQ(d.parameter_count(), expected);
  // Norm weights are 1; residual projections have a smaller spread.
  for (float v : model.parameter("final_norm.weight").value().values()) EXPECT_EQ(v, 1.0F);
  auto stddev = [](const Tensor& t) {
    double s = 0;
    for (float v : t.values()) s += static_cast<double>(v) * v;
    return std::sqrt(s / static_cast<double>(t.numel()));
  };
  EXPECT_NEAR(stddev(model.parameter("token_embedding.weight").value()), 0.02, 0.004);
  EXPECT_NEAR(stddev(model.parameter("blocks.0.mlp.down.weight").value()), 0.02 / std::sqrt(6.0), 0.002);
}

TEST(Transformer, ForwardShapesAndBadInput) {
  Random random(3);
  DecoderOnlyTransformer model(tiny_dims(), random);
  const auto b = random_batch(2, 5, 32, 1);
  const Variable logits = model.forward(b.tokens, 2);
  EXPECT_EQ(logits.shape(), (Shape{2, 5, 32}));
  const Variable loss = model.loss(b.tokens, b.targets, 2);
  EXPECT_NEAR(loss.value().item(), std::log(32.0), 0.1);  // small init: near uniform
  EXPECT_THROW(model.forward(b.tokens, 3), ShapeError);
  std::vector<std::int32_t> too_long(17, 1);
  EXPECT_THROW(model.forward(too_long, 1), ShapeError);
  std::vector<std::int32_t> bad = {1, 2, 99};
  EXPECT_THROW(model.forward(bad, 1), ValueError);
  EXPECT_THROW(model.loss(b.tokens, std::vector<std::int32_t>{1}, 2), ShapeError);
}

TEST(Transformer, SameSeedSameModelSameLossBits) {
  const auto b = random_batch(2, 8, 32, 4);
  auto run = [&] {
    Random random(5);
    DecoderOnlyTransformer model(tiny_dims(), random);
    Variable loss = model.loss(b.tokens, b.targets, 2);
    loss.backward();
    return std::make_pair(loss.value().item(), model.parameter("blocks.1.attention.key.weight").grad().clone());
  };
  const auto a = run();
  const auto c = run();
  EXPECT_EQ(a.first, c.first);
  EXPECT_TRUE(bit_equal(a.second, c.second));
}

TEST(Transformer, GradientsReachEveryParameter) {
  Random random(6);
  DecoderOnlyTransformer model(tiny_dims(), random);
  const auto b = random_batch(2, 6, 32, 2);
  model.loss(b.tokens, b.targets, 2).backward();
  for (const NamedParameter& p : model.parameters()) {
    ASSERT_TRUE(p.variable.has_grad()) << p.name;
    double norm = 0;
    for (float v : p.variable.grad().values()) norm += static_cast<double>(v) * v;
    EXPECT_GT(norm, 0.0) << p.name;
  }
}

TEST(Transformer, OverfitsAFixedSequence) {
  // Learning works end to end: a 2-layer model memorizes one 16-token
  // sequence; loss falls from ~ln(32) = 3.47 to below 0.1 within 150 steps.
  Random random(7);
  DecoderOnlyTransformer model(tiny_dims(), random);
  std::vector<std::int32_t> seq;
  for (int i = 0; i < 17; ++i) seq.push_back((i * 7 + 3) % 32);
  const std::vector<std::int32_t> tokens(seq.begin(), seq.end() - 1);
  const std::vector<std::int32_t> targets(seq.begin() + 1, seq.end());
  std::vector<Variable> params;
  for (const NamedParameter& p : model.parameters()) params.push_back(p.variable);
  AdamOptions options;
  options.learning_rate = 1e-2F;
  Adam adam(params, options);
  float loss = 0;
  int steps = 0;
  for (; steps < 150; ++steps) {
    Variable l = model.loss(tokens, targets, 1);
    loss = l.value().item();
    if (loss < 0.1F) break;
    l.backward();
    adam.step();
  }
  EXPECT_LT(loss, 0.1F) << "after " << steps << " steps";
}

TEST(Decode, LogitsMatchFullForwardAtEveryPosition) {
  for (auto kind : {FullSequenceAttentionKind::Materialized, FullSequenceAttentionKind::Flash}) {
    Random random(8);
    DecoderOnlyTransformer model(tiny_dims(), random, 1e-5F, kind);
    const auto b = random_batch(1, 16, 32, 3);
    const Tensor full = model.forward(b.tokens, 1).value();  // (1, 16, 32)
    DecodeSession session(model);
    for (std::int64_t t = 0; t < 16; ++t) {
      const Tensor step = session.decode_token(b.tokens[static_cast<std::size_t>(t)]);
      for (std::int64_t v = 0; v < 32; ++v) EXPECT_NEAR(step.at({v}), full.at({0, t, v}), 2e-5) << t << "," << v;
    }
    EXPECT_THROW(session.decode_token(1), ValueError);  // context full
  }
}

TEST(Decode, UnaffectedByPolicyChangesMidSession) {
  Random random(9);
  DecoderOnlyTransformer model(tiny_dims(), random, 1e-5F, FullSequenceAttentionKind::Materialized,
                               ActivationCheckpointingKind::TransformerBlock);
  const auto b = random_batch(1, 8, 32, 4);
  DecodeSession session(model);
  DecodeSession reference(model);
  for (std::size_t t = 0; t < 8; ++t) {
    if (t == 3) model.set_activation_checkpointing_kind(ActivationCheckpointingKind::Disabled);
    if (t == 5) model.set_activation_checkpointing_kind(ActivationCheckpointingKind::BlockSegments);
    const Tensor a = session.decode_token(b.tokens[t]);
    const Tensor r = reference.decode_token(b.tokens[t]);
    EXPECT_TRUE(bit_equal(a, r));
  }
  EXPECT_EQ(session.position(), 8);
  EXPECT_THROW(session.decode_token(32), ValueError);
  // Decode never checkpoints: no replays, no graph on the parameters.
  model.set_activation_checkpointing_kind(ActivationCheckpointingKind::TransformerBlock);
  DecodeSession third(model);
  reset_checkpoint_replay_count();
  const std::int64_t live = memory_stats().live_bytes;
  for (std::size_t t = 0; t < 8; ++t) third.decode_token(b.tokens[t]);
  EXPECT_EQ(checkpoint_replay_count(), 0);
  EXPECT_EQ(memory_stats().live_bytes, live);  // nothing retained beyond the preallocated cache
  for (const NamedParameter& p : model.parameters()) EXPECT_FALSE(p.variable.has_grad());
}

TEST(Decode, SessionOutlivesModelAndRejectsChangedParameters) {
  auto b = random_batch(1, 4, 32, 5);
  std::unique_ptr<DecodeSession> session;
  Tensor expected;
  {
    Random random(10);
    auto model = std::make_unique<DecoderOnlyTransformer>(tiny_dims(), random);
    expected = model->forward(b.tokens, 1).value();
    session = std::make_unique<DecodeSession>(*model);
    session->decode_token(b.tokens[0]);
    Random random2(10);
    DecoderOnlyTransformer other(tiny_dims(), random2);
    DecodeSession stale(other);
    stale.decode_token(1);
    other.parameter("lm_head.weight").mutable_value();
    EXPECT_THROW(stale.decode_token(2), StaleGraphError);
    stale.reset();
    EXPECT_NO_THROW(stale.decode_token(2));
  }
  const Tensor step = session->decode_token(b.tokens[1]);
  EXPECT_NEAR(step.at({0}), expected.at({0, 1, 0}), 2e-5);
}

TEST(Generate, GreedyIsDeterministicAndStopsAtContext) {
  Random random(11);
  DecoderOnlyTransformer model(tiny_dims(), random);
  const std::vector<std::int32_t> prompt = {1, 2, 3};
  GenerationOptions greedy;
  greedy.temperature = 0.0F;
  greedy.max_new_tokens = 5;
  const GenerationResult a = generate(model, prompt, greedy);
  EXPECT_EQ(a.tokens.size(), 5U);
  EXPECT_EQ(generate(model, prompt, greedy).tokens, a.tokens);
  // Greedy picks the argmax of the full forward.
  const Tensor logits = model.forward(prompt, 1).value();
  std::int32_t best = 0;
  for (std::int32_t v = 1; v < 32; ++v)
    if (logits.at({0, 2, v}) > logits.at({0, 2, best})) best = v;
  EXPECT_EQ(a.tokens[0], best);
  GenerationOptions sample;
  sample.top_k = 4;
  sample.seed = 3;
  sample.max_new_tokens = 100;
  const GenerationResult s = generate(model, prompt, sample);
  EXPECT_TRUE(s.reached_context);
  EXPECT_EQ(s.tokens.size(), 16U - 3U + 1U);
  EXPECT_NE(s.message.find("context length 16 is full"), std::string::npos) << s.message;
  EXPECT_EQ(generate(model, prompt, sample).tokens, s.tokens);  // same seed, same text
  EXPECT_THROW(generate(model, std::vector<std::int32_t>{}, sample), ValueError);
}

TEST(Adam, OneStepMatchesHandComputedUpdate) {
  Variable w(Tensor::from_data({2}, {1.0F, -2.0F}), true, "w");
  Variable x(Tensor::from_data({2}, {3.0F, 0.5F}), false, "x");
  AdamOptions o;
  o.learning_rate = 0.1F;
  o.weight_decay = 0.01F;
  Adam adam({w}, o);
  sum(mul(w, x)).backward();  // g = x
  adam.step();
  // t = 1: m̂ = g, v̂ = g², update = lr * g / (|g| + eps) ≈ lr * sign(g)
  for (int i = 0; i < 2; ++i) {
    const double theta = i == 0 ? 1.0 : -2.0;
    const double g = i == 0 ? 3.0 : 0.5;
    const double expected = theta - 0.1 * 0.01 * theta - 0.1 * g / (std::sqrt(g * g) + 1e-8);
    EXPECT_NEAR(w.value().at({i}), expected, 1e-6);
  }
  // Second step by hand.
  const double m1 = 0.9 * 0.1 * 3.0 + 0.1 * 3.0;
  const double v1 = 0.999 * 0.001 * 9.0 + 0.001 * 9.0;
  const double m_hat = m1 / (1 - 0.81);
  const double v_hat = v1 / (1 - 0.999 * 0.999);
  const double before = w.value().at({0});
  sum(mul(w, x)).backward();
  adam.step();
  EXPECT_NEAR(w.value().at({0}), before - 0.1 * 0.01 * before - 0.1 * m_hat / (std::sqrt(v_hat) + 1e-8), 1e-6);
  EXPECT_EQ(adam.step_count(), 2);
}

TEST(Adam, StepMakesEarlierGraphsStale) {
  Random random(12);
  DecoderOnlyTransformer model(tiny_dims(), random);
  const auto b = random_batch(1, 4, 32, 6);
  std::vector<Variable> params;
  for (const NamedParameter& p : model.parameters()) params.push_back(p.variable);
  Adam adam(params);
  Variable first = model.loss(b.tokens, b.targets, 1);
  first.backward();
  Variable second = model.loss(b.tokens, b.targets, 1);
  const Tensor grad_before = params[3].grad().clone();
  adam.step();
  EXPECT_THROW(second.backward(), StaleGraphError);
  EXPECT_TRUE(bit_equal(grad_before, params[3].grad()));
}

TEST(Adam, ClippingAndValidation) {
  Variable w(Tensor::from_data({2}, {0.0F, 0.0F}), true, "w");
  AdamOptions o;
  o.max_grad_norm = 1.0F;
  Adam adam({w}, o);
  sum(scale(w, 30.0F)).backward();  // g = (30, 30), norm 42.4
  EXPECT_NEAR(adam.step(), 42.426, 1e-3);
  AdamOptions bad;
  bad.beta1 = 1.0F;
  EXPECT_THROW(Adam({w}, bad), ValueError);
  Variable c(Tensor::ones({1}), false, "c");
  EXPECT_THROW(Adam({c}), ValueError);
  Adam::State s = adam.state();
  s.first_moment[0] = Tensor::zeros({3});
  EXPECT_THROW(adam.set_state(s), ShapeError);
  EXPECT_EQ(adam.step_count(), 1);
}

TEST(Transformer, FlashAndMaterializedAgreeOnLogitsLossAndEveryGradient) {
  // Tolerance: 1e-5 absolute on logits and loss, and 1e-4 of each
  // gradient's largest magnitude (float32 summation-order differences).
  auto run = [](FullSequenceAttentionKind kind) {
    Random random(13);
    TransformerDimensions d = tiny_dims(3);
    d.context_length = 80;
    DecoderOnlyTransformer model(d, random, 1e-5F, kind);
    const auto b = random_batch(2, 70, 32, 14);  // T = 70: more than one 64-row flash tile
    const Tensor logits = model.forward(b.tokens, 2).value().clone();
    Variable loss = model.loss(b.tokens, b.targets, 2);
    loss.backward();
    std::vector<Tensor> grads;
    for (const NamedParameter& p : model.parameters()) grads.push_back(p.variable.grad());
    return std::make_tuple(logits, loss.value().item(), grads);
  };
  const auto [lm, loss_m, gm] = run(FullSequenceAttentionKind::Materialized);
  const auto [lf, loss_f, gf] = run(FullSequenceAttentionKind::Flash);
  EXPECT_LT(max_abs_diff(lm, lf), 1e-5);
  EXPECT_NEAR(loss_m, loss_f, 1e-5);
  for (std::size_t i = 0; i < gm.size(); ++i) {
    float scale = 0;
    for (float v : gm[i].values()) scale = std::max(scale, std::fabs(v));
    EXPECT_LE(max_abs_diff(gm[i], gf[i]), 1e-4F * scale + 1e-9F) << "gradient " << i;
  }
}
