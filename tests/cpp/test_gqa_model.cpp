// Grouped-query attention, the RoPE base and tied embeddings in the model:
// repeat_heads gradients, decode == forward, checkpointed == ordinary
// gradients, parameter lists, LoRA shapes and model-state files.
#include <gtest/gtest.h>

#include <limits>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "gradcheck.hpp"
#include "model_fixtures.hpp"
#include "riftco_transformer/decode.hpp"
#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

TransformerDimensions gqa_dims(bool tie = false, float rope_base = 10000.0F) {
  TransformerDimensions d = rt_test::tiny_dims(2);
  d.model_width = 32;
  d.heads = 4;
  d.key_value_heads = 2;
  d.rope_base = rope_base;
  d.tie_embeddings = tie;
  return d;
}

}  // namespace
namespace rt_test {
inline Tensor scale_tensor(Tensor t, float s) {
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data()[i] *= s;
  return t;
}
}  // namespace rt_test
namespace {

}  // namespace

TEST(RepeatHeads, ForwardCopiesEachHeadAndBackwardSumsGroups) {
  const Tensor x = rt_test::randn({2, 2, 3, 4}, 7);
  const Variable y = repeat_heads(Variable(x, false), 3);
  ASSERT_EQ(y.shape(), (Shape{2, 6, 3, 4}));
  for (std::int64_t b = 0; b < 2; ++b) {
    for (std::int64_t h = 0; h < 6; ++h) {
      for (std::int64_t i = 0; i < 12; ++i) {
        EXPECT_EQ(y.value().data()[(b * 6 + h) * 12 + i], x.data()[(b * 2 + h / 3) * 12 + i]);
      }
    }
  }
  EXPECT_EQ(rt_test::gradcheck([](const std::vector<Variable>& v) { return repeat_heads(v[0], 2); },
                               {rt_test::randn({1, 3, 2, 4}, 3)}),
            0);
  EXPECT_THROW(repeat_heads(Variable(x, false), 0), ValueError);
  EXPECT_THROW(repeat_heads(Variable(rt_test::randn({2, 3}, 1), false), 0), ShapeError);
}

TEST(RepeatHeads, AGroupCountWhoseHeadCountWrapsIsRefused) {
  // 4 heads · 2^62 wrapped to 0: an empty output the copy loop then wrote
  // past (segfault). Refused before anything is allocated.
  const Variable x(rt_test::randn({1, 4, 1, 1}, 2), false);
  for (const std::int64_t groups : {std::int64_t{1} << 62, (std::int64_t{1} << 61) + 1,
                                    std::numeric_limits<std::int64_t>::max()}) {
    try {
      repeat_heads(x, groups);
      FAIL() << "groups " << groups << " was accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("[repeat_heads] groups " + std::to_string(groups)), std::string::npos)
          << e.what();
    }
  }
  // Large but representable: a typed error for the size, not a crash.
  EXPECT_THROW(repeat_heads(x, std::int64_t{1} << 60), ShapeError);
}

TEST(GqaDimensions, ValidateNamesTheFieldAndCountsParameters) {
  TransformerDimensions d = gqa_dims();
  d.validate();
  const std::int64_t c = 32, kv = 16, f = 24, v = 32;
  EXPECT_EQ(d.parameter_count(), 2 * v * c + c + 2 * (2 * c + 2 * c * c + 2 * kv * c + 3 * c * f));
  d.tie_embeddings = true;
  EXPECT_EQ(d.parameter_count(), v * c + c + 2 * (2 * c + 2 * c * c + 2 * kv * c + 3 * c * f));
  d.key_value_heads = 3;
  try {
    d.validate();
    FAIL() << "heads 4 with 3 key/value heads was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("key_value_heads 3"), std::string::npos) << e.what();
  }
  d.key_value_heads = 2;
  d.rope_base = 0.5F;
  EXPECT_THROW(d.validate(), ValueError);
  // 0 and heads both mean ordinary attention and compare equal.
  TransformerDimensions a = rt_test::tiny_dims(), b = a;
  b.key_value_heads = b.heads;
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.parameter_count(), b.parameter_count());
  EXPECT_EQ(TransformerDimensions({256, 128, 128, 4, 4, 344}).parameter_count(), TransformerDimensions{}.parameter_count());
}

TEST(GqaModel, ShapesParametersAndTiedHead) {
  Random random(1);
  DecoderOnlyTransformer model(gqa_dims(true), random);
  EXPECT_EQ(model.blocks()[0].key.shape(), (Shape{16, 32}));
  EXPECT_EQ(model.blocks()[0].value.shape(), (Shape{16, 32}));
  EXPECT_EQ(model.blocks()[0].query.shape(), (Shape{32, 32}));
  for (const NamedParameter& p : model.parameters()) EXPECT_NE(p.name, "lm_head.weight");
  EXPECT_EQ(model.parameter_count(), model.dimensions().parameter_count());
  EXPECT_TRUE(model.lm_head().same_node(model.token_embedding()));
}

TEST(GqaModel, TiedGradientIsTheSumOfBothUses) {
  // The tied model's embedding gradient equals the untied model's embedding
  // plus LM-head gradients when both hold the same weights.
  Random r1(3), r2(3);
  DecoderOnlyTransformer tied(gqa_dims(true), r1);
  DecoderOnlyTransformer untied(gqa_dims(false), r2);
  for (const NamedParameter& p : tied.parameters()) untied.parameter(p.name).set_value(p.variable.value().clone());
  Variable head = untied.lm_head();
  head.set_value(tied.token_embedding().value().clone());
  const rt_test::Batch b = rt_test::random_batch(2, 8, 32, 9);
  Variable lt = tied.loss(b.tokens, b.targets, 2);
  Variable lu = untied.loss(b.tokens, b.targets, 2);
  EXPECT_TRUE(bit_equal(lt.value(), lu.value()));
  lt.backward();
  lu.backward();
  const Tensor sum = add(Variable(untied.token_embedding().grad(), false), Variable(untied.lm_head().grad(), false)).value();
  EXPECT_LT(max_abs_diff(tied.token_embedding().grad(), sum), 1e-6F);
}

TEST(GqaModel, DecodeMatchesForwardForGqaTiedAndRopeBase) {
  for (const bool tie : {false, true}) {
    Random random(5);
    DecoderOnlyTransformer model(gqa_dims(tie, 500.0F), random);
    const rt_test::Batch b = rt_test::random_batch(1, 12, 32, 11);
    Tensor full;
    {
      NoGradGuard guard;
      full = model.forward(b.tokens, 1).value();
    }
    DecodeSession session(model);
    for (std::int64_t t = 0; t < 12; ++t) {
      const Tensor step = session.decode_token(b.tokens[static_cast<std::size_t>(t)]);
      for (std::int64_t i = 0; i < 32; ++i) EXPECT_NEAR(step.data()[i], full.data()[t * 32 + i], 1e-5F) << tie;
    }
  }
}

TEST(GqaModel, RopeBaseChangesTheModel) {
  Random r1(5), r2(5);
  DecoderOnlyTransformer a(gqa_dims(false, 10000.0F), r1);
  DecoderOnlyTransformer b(gqa_dims(false, 500.0F), r2);
  const rt_test::Batch batch = rt_test::random_batch(1, 12, 32, 11);
  EXPECT_GT(max_abs_diff(a.forward(batch.tokens, 1).value(), b.forward(batch.tokens, 1).value()), 1e-6F);
}

TEST(GqaModel, FlashMatchesMaterializedAndCheckpointedGradientsAreBitIdentical) {
  const rt_test::Batch b = rt_test::random_batch(2, 8, 32, 4);
  auto grads = [&](FullSequenceAttentionKind kind, ActivationCheckpointingKind policy, bool lora) {
    Random random(8);
    DecoderOnlyTransformer model(gqa_dims(true, 20000.0F), random, 1e-5F, kind, policy);
    if (lora) {
      LoraConfig config;
      config.rank = 2;
      config.targets = {LoraTarget::Query, LoraTarget::Key, LoraTarget::Value, LoraTarget::Down};
      Random lr(2);
      model.add_lora(config, lr);
      for (const NamedParameter& p : model.lora_parameters()) {  // nonzero B so adapters matter
        Variable v = p.variable;
        v.set_value(rt_test::scale_tensor(rt_test::randn(v.shape(), p.name.size()), 0.1F));
      }
    }
    Variable loss = model.loss(b.tokens, b.targets, 2);
    loss.backward();
    std::vector<Tensor> out{loss.value()};
    for (const NamedParameter& p : model.parameters()) out.push_back(p.variable.grad());
    for (const NamedParameter& p : model.lora_parameters()) out.push_back(p.variable.grad());
    return out;
  };
  for (const bool lora : {false, true}) {
    const auto plain = grads(FullSequenceAttentionKind::Materialized, ActivationCheckpointingKind::Disabled, lora);
    const auto flash = grads(FullSequenceAttentionKind::Flash, ActivationCheckpointingKind::Disabled, lora);
    for (const auto policy : {ActivationCheckpointingKind::TransformerBlock, ActivationCheckpointingKind::BlockSegments,
                              ActivationCheckpointingKind::AttentionSubBlock, ActivationCheckpointingKind::MlpSubBlock}) {
      const auto checkpointed = grads(FullSequenceAttentionKind::Materialized, policy, lora);
      ASSERT_EQ(plain.size(), checkpointed.size());
      for (std::size_t i = 0; i < plain.size(); ++i) {
        EXPECT_TRUE(bit_equal(plain[i], checkpointed[i])) << activation_checkpointing_name(policy) << " " << i;
      }
    }
    for (std::size_t i = 0; i < plain.size(); ++i) EXPECT_LT(max_abs_diff(plain[i], flash[i]), 1e-5F) << i;
  }
}

TEST(GqaModel, LoraOnKeyAndValueUsesTheNarrowShapes) {
  Random random(1);
  DecoderOnlyTransformer model(gqa_dims(), random);
  LoraConfig config;
  config.rank = 3;
  config.targets = {LoraTarget::Key, LoraTarget::Value};
  Random lr(2);
  model.add_lora(config, lr);
  std::map<std::string, Shape> shapes;
  for (const NamedParameter& p : model.lora_parameters()) shapes[p.name] = p.variable.shape();
  EXPECT_EQ(shapes.at("blocks.0.attention.key.lora_b"), (Shape{16, 3}));
  EXPECT_EQ(shapes.at("blocks.0.attention.value.lora_a"), (Shape{3, 32}));
  // A forward/backward through the narrow adapters works and reaches them.
  const rt_test::Batch b = rt_test::random_batch(1, 6, 32, 3);
  Variable loss = model.loss(b.tokens, b.targets, 1);
  loss.backward();
  EXPECT_EQ(model.lora_parameters()[0].variable.grad().shape(), model.lora_parameters()[0].variable.shape());
  model.validate_parameters();
}

TEST(GqaModelState, NewFieldsRoundTripAndOldFilesLoadWithDefaults) {
  const fs::path dir = fs::temp_directory_path() / ("riftco_gqa_state_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  Random random(1);
  DecoderOnlyTransformer model(gqa_dims(true, 500000.0F), random, 1e-6F);
  save_model_state(model, dir / "gqa.safetensors");
  const TensorFile file = read_safetensors(dir / "gqa.safetensors");
  const auto dims = nlohmann::json::parse(file.metadata.at("dimensions"));
  EXPECT_EQ(dims.at("key_value_heads"), 2);
  EXPECT_EQ(dims.at("rope_base").get<double>(), 500000.0);
  EXPECT_EQ(dims.at("tie_embeddings"), true);
  const auto loaded = load_model(dir / "gqa.safetensors");
  EXPECT_EQ(loaded->dimensions(), model.dimensions());
  EXPECT_EQ(model_fingerprint(*loaded), model_fingerprint(model));

  // A file written before these fields existed: the six sizes only.
  Random r2(1);
  DecoderOnlyTransformer plain(rt_test::tiny_dims(), r2);
  save_model_state(plain, dir / "plain.safetensors");
  const TensorFile old = read_safetensors(dir / "plain.safetensors");
  EXPECT_EQ(nlohmann::json::parse(old.metadata.at("dimensions")).size(), 6U);
  const TransformerDimensions read = read_model_dimensions(dir / "plain.safetensors");
  EXPECT_EQ(read.key_value_heads, 0);
  EXPECT_EQ(read.rope_base, 10000.0F);
  EXPECT_FALSE(read.tie_embeddings);

  // Hostile values of the new fields are ModelStateErrors.
  for (const char* bad : {R"("key_value_heads":3)", R"("rope_base":-1)", R"("tie_embeddings":"yes")",
                          R"("key_value_heads":0)"}) {
    auto metadata = old.metadata;
    std::string text = metadata.at("dimensions");
    text.insert(text.size() - 1, std::string(",") + bad);
    metadata["dimensions"] = text;
    write_safetensors(dir / "bad.safetensors", old.tensors, metadata);
    EXPECT_THROW(read_model_dimensions(dir / "bad.safetensors"), ModelStateError) << bad;
  }
  fs::remove_all(dir);
}
