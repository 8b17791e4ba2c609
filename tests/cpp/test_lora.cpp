#include <gtest/gtest.h>

#include "message_of.hpp"
#include "model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/decode.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
using rt_test::random_batch;
using rt_test::tiny_dims;

namespace {

LoraConfig all_targets(std::int64_t rank = 4) {
  LoraConfig c;
  c.rank = rank;
  c.alpha = 8.0F;
  c.targets = parse_lora_targets("all");
  return c;
}

/// Gives every adapter B a non-zero value so adapters change the output.
void perturb_adapters(DecoderOnlyTransformer& model, std::uint64_t seed) {
  Random r(seed);
  for (NamedParameter& p : model.lora_parameters()) {
    if (p.name.ends_with("lora_b")) p.variable.set_value(Tensor::normal(p.variable.shape(), r, 0.0F, 0.05F));
  }
}

}  // namespace

TEST(Lora, TargetsParseAndValidate) {
  EXPECT_EQ(parse_lora_targets("query,value").size(), 2U);
  EXPECT_EQ(parse_lora_targets("attention").size(), 4U);
  EXPECT_EQ(parse_lora_targets("mlp,query").size(), 4U);
  EXPECT_EQ(lora_targets_string(parse_lora_targets("all")), "query,key,value,output,gate,up,down");
  EXPECT_THROW(parse_lora_targets("query,bogus"), ValueError);
  // An empty list says so (was "unknown LoRA target ''"), for the CLI's --lora-targets "" and Python's targets=[].
  EXPECT_NE(rt_test::message_of<ValueError>([] { parse_lora_targets("", "--lora-targets"); })
                .find("[--lora-targets] targets must not be empty"),
            std::string::npos);
  LoraConfig c;
  c.rank = 0;
  EXPECT_THROW(c.validate(), ValueError);
}

TEST(Lora, AddingAdaptersKeepsOutputsAndNamesParameters) {
  Random random(1);
  DecoderOnlyTransformer model(tiny_dims(), random);
  const auto b = random_batch(1, 8, 32, 1);
  const Tensor before = model.forward(b.tokens, 1).value().clone();
  Random lr(2);
  model.add_lora(all_targets(), lr);
  EXPECT_TRUE(bit_equal(before, model.forward(b.tokens, 1).value()));  // B = 0
  const auto params = model.lora_parameters();
  ASSERT_EQ(params.size(), 2U * 7U * 2U);
  EXPECT_EQ(params[0].name, "blocks.0.attention.query.lora_a");
  EXPECT_EQ(params[0].variable.shape(), (Shape{4, 16}));
  EXPECT_EQ(params[13].name, "blocks.0.mlp.down.lora_b");
  EXPECT_EQ(params[13].variable.shape(), (Shape{16, 4}));
  EXPECT_EQ(model.parameters().size(), 3U + 9U * 2U);  // base parameters only
  EXPECT_THROW(model.add_lora(all_targets(), lr), ValueError);
  // parameter(name) finds adapters as well as base weights (it refused them).
  for (const auto& list : {model.parameters(), model.lora_parameters()}) {
    for (const NamedParameter& p : list) EXPECT_TRUE(model.parameter(p.name).same_node(p.variable)) << p.name;
  }
  EXPECT_THROW(model.parameter("blocks.9.attention.query.lora_a"), ValueError);
  model.remove_lora();
  EXPECT_THROW(model.parameter("blocks.0.attention.query.lora_a"), ValueError);
}

TEST(Lora, BlockCheckpointingGivesTheSameBaseAndAdapterGradients) {
  auto run = [](ActivationCheckpointingKind policy, bool freeze_base) {
    Random random(3);
    DecoderOnlyTransformer model(tiny_dims(), random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
    Random lr(4);
    model.add_lora(all_targets(), lr);
    perturb_adapters(model, 5);
    if (freeze_base) model.set_base_trainable(false);
    const auto b = random_batch(2, 8, 32, 6);
    model.loss(b.tokens, b.targets, 2).backward();
    std::vector<Tensor> grads;
    for (const NamedParameter& p : model.parameters()) grads.push_back(p.variable.grad());
    for (const NamedParameter& p : model.lora_parameters()) grads.push_back(p.variable.grad().clone());
    return grads;
  };
  for (const bool freeze : {false, true}) {
    const auto plain = run(ActivationCheckpointingKind::Disabled, freeze);
    const auto block = run(ActivationCheckpointingKind::TransformerBlock, freeze);
    ASSERT_EQ(plain.size(), block.size());
    for (std::size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(plain[i].defined(), block[i].defined()) << i;
      if (plain[i].defined()) EXPECT_TRUE(bit_equal(plain[i], block[i])) << "gradient " << i << " freeze " << freeze;
    }
    // Frozen base weights get no gradient; every adapter does.
    if (freeze) EXPECT_FALSE(plain[1].defined());
    EXPECT_TRUE(plain.back().defined());
  }
}

TEST(Lora, InactiveAdaptersChangeNothingAndGetNoGradient) {
  Random random(7);
  DecoderOnlyTransformer model(tiny_dims(), random, 1e-5F, FullSequenceAttentionKind::Materialized,
                               ActivationCheckpointingKind::TransformerBlock);
  const auto b = random_batch(1, 8, 32, 8);
  const Tensor base = model.forward(b.tokens, 1).value().clone();
  Random lr(9);
  model.add_lora(all_targets(), lr);
  perturb_adapters(model, 10);
  EXPECT_FALSE(bit_equal(base, model.forward(b.tokens, 1).value()));
  model.set_lora_active(false);
  EXPECT_TRUE(bit_equal(base, model.forward(b.tokens, 1).value()));
  EXPECT_EQ(model.block_dependencies(0).size(), 9U);  // base only while inactive
  model.loss(b.tokens, b.targets, 1).backward();
  for (const NamedParameter& p : model.lora_parameters()) EXPECT_FALSE(p.variable.has_grad()) << p.name;
  model.set_lora_active(true);
  EXPECT_EQ(model.block_dependencies(0).size(), 9U + 14U);
}

TEST(Lora, TrainingChangesOnlyAdapters) {
  Random random(11);
  DecoderOnlyTransformer model(tiny_dims(), random, 1e-5F, FullSequenceAttentionKind::Flash,
                               ActivationCheckpointingKind::TransformerBlock);
  Random lr(12);
  LoraConfig config;
  config.rank = 4;
  model.add_lora(config, lr);
  model.set_base_trainable(false);
  std::vector<Tensor> base_before;
  for (const NamedParameter& p : model.parameters()) base_before.push_back(p.variable.value().clone());
  std::vector<Variable> adapters;
  for (const NamedParameter& p : model.lora_parameters()) adapters.push_back(p.variable);
  std::vector<Tensor> adapters_before;
  for (const Variable& a : adapters) adapters_before.push_back(a.value().clone());
  AdamOptions o;
  o.learning_rate = 1e-2F;
  Adam adam(adapters, o);
  const auto b = random_batch(2, 8, 32, 13);
  float first = 0;
  float last = 0;
  for (int i = 0; i < 30; ++i) {
    Variable loss = model.loss(b.tokens, b.targets, 2);
    (i == 0 ? first : last) = loss.value().item();
    loss.backward();
    adam.step();
  }
  EXPECT_LT(last, first);
  const auto params = model.parameters();
  for (std::size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(bit_equal(base_before[i], params[i].variable.value()));
  for (std::size_t i = 0; i < adapters.size(); ++i) {
    EXPECT_FALSE(bit_equal(adapters_before[i], adapters[i].value())) << adapters[i].name();
  }
}

TEST(Lora, MergedExportMatchesBasePlusAdapters) {
  Random random(14);
  DecoderOnlyTransformer model(tiny_dims(), random);
  Random lr(15);
  model.add_lora(all_targets(), lr);
  perturb_adapters(model, 16);
  const auto b = random_batch(1, 10, 32, 17);
  const Tensor adapted = model.forward(b.tokens, 1).value().clone();
  DecodeSession with_adapters(model);
  const Tensor decoded = with_adapters.decode_token(b.tokens[0]);
  for (std::int64_t v = 0; v < 32; ++v) EXPECT_NEAR(decoded.at({v}), adapted.at({0, 0, v}), 2e-5);
  model.merge_lora();
  EXPECT_FALSE(model.has_lora());
  EXPECT_TRUE(model.lora_parameters().empty());
  EXPECT_LT(max_abs_diff(adapted, model.forward(b.tokens, 1).value()), 1e-5);
  EXPECT_THROW(with_adapters.decode_token(1), StaleGraphError);  // merged weights: cache is stale
}

TEST(Lora, StructuralChangesBetweenForwardAndBackwardAreRejected) {
  for (auto policy : {ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock}) {
    Random random(18);
    DecoderOnlyTransformer model(tiny_dims(), random, 1e-5F, FullSequenceAttentionKind::Materialized, policy);
    const auto b = random_batch(1, 6, 32, 19);
    Random lr(20);
    Variable before_add = model.loss(b.tokens, b.targets, 1);
    model.add_lora(all_targets(), lr);
    try {
      before_add.backward();
      ADD_FAILURE() << "adding adapters must make the graph stale";
    } catch (const StaleGraphError& e) {
      EXPECT_NE(std::string(e.what()).find("LoRA adapter added"), std::string::npos) << e.what();
    }
    Variable before_off = model.loss(b.tokens, b.targets, 1);
    model.set_lora_active(false);
    EXPECT_THROW(before_off.backward(), StaleGraphError);
    Variable before_on = model.loss(b.tokens, b.targets, 1);
    model.set_lora_active(true);
    EXPECT_THROW(before_on.backward(), StaleGraphError);
    Variable before_merge = model.loss(b.tokens, b.targets, 1);
    model.merge_lora();
    EXPECT_THROW(before_merge.backward(), StaleGraphError);
    model.add_lora(all_targets(), lr);
    Variable before_remove = model.loss(b.tokens, b.targets, 1);
    model.remove_lora();
    EXPECT_THROW(before_remove.backward(), StaleGraphError);
    for (const NamedParameter& p : model.parameters()) EXPECT_FALSE(p.variable.has_grad()) << p.name;
    EXPECT_NO_THROW(model.loss(b.tokens, b.targets, 1).backward());
  }
}
