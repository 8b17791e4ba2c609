// The model's activation-checkpointing policy: parity with the ordinary
// graph (bit for bit on the CPU: no parameter is shared between blocks),
// replay counts, retained graph, allocator peak bytes, lifetime, dropout.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "model_fixtures.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;
using rt_test::random_batch;
using rt_test::tiny_dims;

namespace {

struct StepResult {
  float loss = 0;
  Tensor logits;
  std::vector<Tensor> grads;
  std::vector<Tensor> after_adam;
};

StepResult train_step(ActivationCheckpointingKind policy, FullSequenceAttentionKind attention, std::int64_t layers = 3,
                      float drop = 0.0F, std::int64_t segment = 0, bool offload = false) {
  Random random(21);
  DecoderOnlyTransformer model(tiny_dims(layers), random, 1e-5F, attention, policy);
  model.set_checkpoint_segment_blocks(segment);
  model.set_activation_offload(offload);
  EXPECT_EQ(model.activation_offload(), offload);
  if (drop > 0.0F) model.set_dropout(drop, 5);
  const auto b = random_batch(2, 12, 32, 22);
  StepResult r;
  r.logits = model.forward(b.tokens, 2).value().clone();
  Variable loss = model.loss(b.tokens, b.targets, 2);
  r.loss = loss.value().item();
  loss.backward();
  std::vector<Variable> params;
  for (const NamedParameter& p : model.parameters()) {
    params.push_back(p.variable);
    r.grads.push_back(p.variable.grad().clone());
  }
  Adam adam(params, AdamOptions{});
  adam.step();
  for (const Variable& p : params) r.after_adam.push_back(p.value().clone());
  return r;
}

void expect_bit_identical(const StepResult& a, const StepResult& b, const char* what) {
  EXPECT_EQ(a.loss, b.loss) << what;
  EXPECT_TRUE(bit_equal(a.logits, b.logits)) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    EXPECT_TRUE(bit_equal(a.grads[i], b.grads[i])) << what << " gradient " << i;
    EXPECT_TRUE(bit_equal(a.after_adam[i], b.after_adam[i])) << what << " Adam step " << i;
  }
}

}  // namespace

class PolicyParity : public ::testing::TestWithParam<FullSequenceAttentionKind> {};

TEST_P(PolicyParity, BlockAndSegmentsEqualDisabledBitForBit) {
  const FullSequenceAttentionKind attention = GetParam();
  const StepResult disabled = train_step(ActivationCheckpointingKind::Disabled, attention);
  expect_bit_identical(disabled, train_step(ActivationCheckpointingKind::TransformerBlock, attention), "block");
  expect_bit_identical(disabled, train_step(ActivationCheckpointingKind::BlockSegments, attention, 3, 0.0F, 2),
                       "segments of 2");
  expect_bit_identical(disabled, train_step(ActivationCheckpointingKind::BlockSegments, attention), "sqrt segments");
}

TEST_P(PolicyParity, DropoutReplaysTheSameMasks) {
  const FullSequenceAttentionKind attention = GetParam();
  const StepResult disabled = train_step(ActivationCheckpointingKind::Disabled, attention, 3, 0.3F);
  const StepResult no_dropout = train_step(ActivationCheckpointingKind::Disabled, attention, 3, 0.0F);
  EXPECT_NE(disabled.loss, no_dropout.loss);  // dropout is really on
  expect_bit_identical(disabled, train_step(ActivationCheckpointingKind::TransformerBlock, attention, 3, 0.3F),
                       "block + dropout");
  expect_bit_identical(disabled, train_step(ActivationCheckpointingKind::BlockSegments, attention, 3, 0.3F, 2),
                       "segments + dropout");
}

TEST_P(PolicyParity, SubBlockPoliciesEqualDisabledBitForBit) {
  const FullSequenceAttentionKind attention = GetParam();
  const StepResult disabled = train_step(ActivationCheckpointingKind::Disabled, attention);
  expect_bit_identical(disabled, train_step(ActivationCheckpointingKind::AttentionSubBlock, attention), "attention");
  expect_bit_identical(disabled, train_step(ActivationCheckpointingKind::MlpSubBlock, attention), "mlp");
  // With dropout both halves draw masks; each replay draws the same ones.
  const StepResult dropped = train_step(ActivationCheckpointingKind::Disabled, attention, 3, 0.3F);
  expect_bit_identical(dropped, train_step(ActivationCheckpointingKind::AttentionSubBlock, attention, 3, 0.3F),
                       "attention + dropout");
  expect_bit_identical(dropped, train_step(ActivationCheckpointingKind::MlpSubBlock, attention, 3, 0.3F),
                       "mlp + dropout");
}

// Activation offload parks cuda tensors only: on a cpu model nothing moves
// (no pinned host bytes) and the step is the same, bit for bit.
TEST_P(PolicyParity, ActivationOffloadOnACpuModelChangesNothing) {
  const FullSequenceAttentionKind attention = GetParam();
  const StepResult disabled = train_step(ActivationCheckpointingKind::Disabled, attention, 3, 0.3F);
  expect_bit_identical(disabled,
                       train_step(ActivationCheckpointingKind::TransformerBlock, attention, 3, 0.3F, 0, true),
                       "block + offload");
  expect_bit_identical(disabled,
                       train_step(ActivationCheckpointingKind::BlockSegments, attention, 3, 0.3F, 2, true),
                       "segments + offload");
  expect_bit_identical(disabled,
                       train_step(ActivationCheckpointingKind::AttentionSubBlock, attention, 3, 0.3F, 0, true),
                       "attention + offload");
}

INSTANTIATE_TEST_SUITE_P(Attention, PolicyParity,
                         ::testing::Values(FullSequenceAttentionKind::Materialized, FullSequenceAttentionKind::Flash),
                         [](const auto& info) { return std::string(attention_kind_name(info.param)); });

TEST(ModelCheckpointing, OneReplayPerCheckpointPerBackward) {
  Random random(23);
  DecoderOnlyTransformer model(tiny_dims(4), random, 1e-5F, FullSequenceAttentionKind::Materialized,
                               ActivationCheckpointingKind::TransformerBlock);
  const auto b = random_batch(1, 8, 32, 24);
  Variable loss = model.loss(b.tokens, b.targets, 1);
  reset_checkpoint_replay_count();
  loss.backward();
  EXPECT_EQ(checkpoint_replay_count(), 4);
  loss.backward();
  EXPECT_EQ(checkpoint_replay_count(), 8);
  model.set_activation_checkpointing_kind(ActivationCheckpointingKind::BlockSegments);
  EXPECT_EQ(model.checkpoint_segment_blocks(), 2);  // round(sqrt(4))
  reset_checkpoint_replay_count();
  model.loss(b.tokens, b.targets, 1).backward();
  EXPECT_EQ(checkpoint_replay_count(), 2);
  model.set_activation_checkpointing_kind(ActivationCheckpointingKind::Disabled);
  reset_checkpoint_replay_count();
  model.loss(b.tokens, b.targets, 1).backward();
  EXPECT_EQ(checkpoint_replay_count(), 0);
}

TEST(ModelCheckpointing, RetainedGraphShrinks) {
  Random random(25);
  DecoderOnlyTransformer model(tiny_dims(4), random);
  const auto b = random_batch(2, 16, 32, 26);
  const GraphStatistics disabled = model.loss(b.tokens, b.targets, 2).graph_statistics();
  model.set_activation_checkpointing_kind(ActivationCheckpointingKind::TransformerBlock);
  const Variable block_loss = model.loss(b.tokens, b.targets, 2);
  const GraphStatistics block = block_loss.graph_statistics();
  // embedding, 4 checkpoints, final norm, lm head, cross-entropy + 39 leaves.
  EXPECT_EQ(block.node_count, 1 + 4 + 1 + 1 + 1 + 39);
  EXPECT_LT(block.element_count * 2, disabled.element_count);
  const std::string report = block_loss.retained_report();
  EXPECT_NE(report.find("checkpoint"), std::string::npos);
  std::int64_t checkpoint_rows = 0;
  for (const RetainedNode& row : block_loss.retained_nodes()) checkpoint_rows += row.kind == "checkpoint";
  EXPECT_EQ(checkpoint_rows, 4);
}

TEST(ModelCheckpointing, PeakTrainingBytesDropOnADeepModel) {
  TransformerDimensions d = tiny_dims(16);
  d.model_width = 32;
  d.context_length = 64;
  d.feed_forward_width = 64;
  const auto b = random_batch(4, 64, 32, 27);
  auto peak = [&](ActivationCheckpointingKind policy) {
    Random random(28);
    DecoderOnlyTransformer model(d, random, 1e-5F, FullSequenceAttentionKind::Materialized, policy);
    const std::int64_t base = memory_stats().live_bytes;
    reset_peak_memory();
    model.loss(b.tokens, b.targets, 4).backward();
    return memory_stats().peak_bytes - base;
  };
  const std::int64_t disabled = peak(ActivationCheckpointingKind::Disabled);
  const std::int64_t block = peak(ActivationCheckpointingKind::TransformerBlock);
  const std::int64_t segments = peak(ActivationCheckpointingKind::BlockSegments);
  RecordProperty("peak_disabled", std::to_string(disabled));
  RecordProperty("peak_block", std::to_string(block));
  RecordProperty("peak_segments", std::to_string(segments));
  EXPECT_LT(block * 2, disabled) << "block " << block << " vs disabled " << disabled;
  EXPECT_LT(segments, disabled);
}

TEST(ModelCheckpointing, ModelDestroyedBeforeBackward) {
  for (auto policy : {ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock}) {
    Variable loss;
    std::vector<Variable> params;
    {
      Random random(29);
      DecoderOnlyTransformer model(tiny_dims(), random, 1e-5F, FullSequenceAttentionKind::Materialized, policy);
      for (const NamedParameter& p : model.parameters()) params.push_back(p.variable);
      const auto b = random_batch(1, 6, 32, 30);
      loss = model.loss(b.tokens, b.targets, 1);
    }
    loss.backward();
    for (const Variable& p : params) EXPECT_TRUE(p.has_grad()) << p.name();
  }
}

TEST(ModelCheckpointing, StaleAfterValueChangeAdamOrReshapedParameter) {
  Random random(31);
  DecoderOnlyTransformer model(tiny_dims(), random, 1e-5F, FullSequenceAttentionKind::Materialized,
                               ActivationCheckpointingKind::TransformerBlock);
  const auto b = random_batch(1, 6, 32, 32);
  std::vector<Variable> params;
  for (const NamedParameter& p : model.parameters()) params.push_back(p.variable);
  Variable loss = model.loss(b.tokens, b.targets, 1);
  loss.backward();
  const Tensor before = params[4].grad().clone();
  Variable stale = model.loss(b.tokens, b.targets, 1);
  Adam(params).step();
  EXPECT_THROW(stale.backward(), StaleGraphError);
  EXPECT_TRUE(bit_equal(before, params[4].grad()));
  Variable stale2 = model.loss(b.tokens, b.targets, 1);
  model.parameter("blocks.1.mlp.up.weight").set_value(Tensor::zeros({30, 16}));
  reset_checkpoint_replay_count();
  EXPECT_THROW(stale2.backward(), StaleGraphError);
  EXPECT_EQ(checkpoint_replay_count(), 0);
}

TEST(ModelCheckpointing, SubBlockPoliciesReplayOneHalfPerBlock) {
  Random random(31);
  DecoderOnlyTransformer model(tiny_dims(3), random, 1e-5F, FullSequenceAttentionKind::Flash,
                               ActivationCheckpointingKind::AttentionSubBlock);
  const auto b = random_batch(2, 16, 32, 32);
  for (auto policy : {ActivationCheckpointingKind::AttentionSubBlock, ActivationCheckpointingKind::MlpSubBlock}) {
    model.set_activation_checkpointing_kind(policy);
    const Variable loss = model.loss(b.tokens, b.targets, 2);
    std::int64_t checkpoints = 0;
    for (const RetainedNode& row : loss.retained_nodes()) checkpoints += row.kind == "checkpoint";
    EXPECT_EQ(checkpoints, 3) << activation_checkpointing_name(policy);
    reset_checkpoint_replay_count();
    loss.backward();
    EXPECT_EQ(checkpoint_replay_count(), 3) << activation_checkpointing_name(policy);
  }
}

TEST(ModelCheckpointing, SubBlockPoliciesKeepLessThanDisabledAndMoreThanBlock) {
  // Retained elements of the graph (what backward keeps alive): each
  // sub-block policy drops one half's internals, block drops both.
  TransformerDimensions d = tiny_dims(4);
  d.model_width = 32;
  d.feed_forward_width = 96;
  d.context_length = 64;
  const auto b = random_batch(2, 64, 32, 33);
  auto retained = [&](ActivationCheckpointingKind policy, FullSequenceAttentionKind attention) {
    Random random(34);
    DecoderOnlyTransformer model(d, random, 1e-5F, attention, policy);
    return model.loss(b.tokens, b.targets, 2).graph_statistics().element_count;
  };
  for (auto attention : {FullSequenceAttentionKind::Materialized, FullSequenceAttentionKind::Flash}) {
    const std::int64_t disabled = retained(ActivationCheckpointingKind::Disabled, attention);
    const std::int64_t block = retained(ActivationCheckpointingKind::TransformerBlock, attention);
    const std::int64_t att = retained(ActivationCheckpointingKind::AttentionSubBlock, attention);
    const std::int64_t mlp = retained(ActivationCheckpointingKind::MlpSubBlock, attention);
    EXPECT_LT(att, disabled) << attention_kind_name(attention);
    EXPECT_LT(mlp, disabled) << attention_kind_name(attention);
    EXPECT_GT(att, block) << attention_kind_name(attention);
    EXPECT_GT(mlp, block) << attention_kind_name(attention);
  }
}

TEST(ModelCheckpointing, SubBlockPoliciesWithLoraEqualDisabled) {
  auto run = [](ActivationCheckpointingKind policy) {
    Random random(35);
    DecoderOnlyTransformer model(tiny_dims(2), random, 1e-5F, FullSequenceAttentionKind::Flash, policy);
    LoraConfig lora;
    lora.rank = 2;
    lora.targets = parse_lora_targets("all");
    Random lora_random(36);
    model.add_lora(lora, lora_random);
    for (NamedParameter& p : model.lora_parameters()) {  // B starts at zero: make the adapters matter
      Tensor v = p.variable.value().clone();
      for (std::int64_t i = 0; i < v.numel(); ++i) v.data()[i] = 0.01F * static_cast<float>((i * 7) % 13 - 6);
      p.variable.mutable_value("test").copy_from(v);
    }
    model.set_base_trainable(false);
    const auto b = random_batch(2, 12, 32, 37);
    model.loss(b.tokens, b.targets, 2).backward();
    std::vector<Tensor> grads;
    for (const NamedParameter& p : model.lora_parameters()) grads.push_back(p.variable.grad().clone());
    return grads;
  };
  const auto disabled = run(ActivationCheckpointingKind::Disabled);
  for (auto policy : {ActivationCheckpointingKind::AttentionSubBlock, ActivationCheckpointingKind::MlpSubBlock}) {
    const auto other = run(policy);
    ASSERT_EQ(other.size(), disabled.size());
    for (std::size_t i = 0; i < other.size(); ++i) {
      EXPECT_TRUE(bit_equal(other[i], disabled[i])) << activation_checkpointing_name(policy) << " adapter " << i;
    }
  }
}

TEST(ModelCheckpointing, PolicyNamesRoundTripAndUnknownNamesListEveryPolicy) {
  for (const ActivationCheckpointingKind k : activation_checkpointing_kinds()) {
    EXPECT_EQ(parse_activation_checkpointing(activation_checkpointing_name(k)), k);
  }
  EXPECT_EQ(activation_checkpointing_kinds().size(), 5U);
  try {
    parse_activation_checkpointing("selective");
    FAIL() << "no error";
  } catch (const ValueError& e) {
    const std::string what = e.what();
    for (const char* name : {"disabled", "block", "segments", "attention", "mlp"}) {
      EXPECT_NE(what.find(std::string("'") + name + "'"), std::string::npos) << what;
    }
  }
  Random random(38);
  DecoderOnlyTransformer model(tiny_dims(1), random);
  EXPECT_THROW(model.set_activation_checkpointing_kind(static_cast<ActivationCheckpointingKind>(5)), ValueError);
}

// The policy may be changed from another thread while this one trains (the
// Python property, the GIL released in the forward): each forward reads one
// consistent policy. A plan replaced under a running forward was a heap
// corruption (the vector read while reassigned). Every policy gives the same
// loss and gradients, so each step must match the reference bit for bit.
TEST(ModelCheckpointing, ChangingThePolicyFromAnotherThreadWhileTrainingIsSafe) {
  Random random(21);
  DecoderOnlyTransformer model(tiny_dims(8), random, 1e-5F, FullSequenceAttentionKind::Flash,
                               ActivationCheckpointingKind::Disabled);
  const auto b = random_batch(2, 12, 32, 22);
  Variable reference = model.loss(b.tokens, b.targets, 2);
  reference.backward();
  const float expected = reference.value().item();
  const Tensor expected_grad = model.parameters().front().variable.grad().clone();
  std::atomic<bool> done{false};
  std::thread setter([&] {
    const ActivationCheckpointingPlan segments{{3, BlockRecompute::Whole}, {5, BlockRecompute::Whole}};
    ActivationCheckpointingPlan mixed;
    for (int i = 0; i < 8; ++i) mixed.push_back({1, i % 2 == 0 ? BlockRecompute::Attention : BlockRecompute::Mlp});
    for (int i = 0; !done.load(); ++i) {
      model.set_activation_checkpointing_plan(i % 2 == 0 ? segments : mixed);
      if (i % 5 == 0) model.set_activation_checkpointing_kind(ActivationCheckpointingKind::TransformerBlock);
      if (i % 5 == 1) model.set_activation_checkpointing_kind(ActivationCheckpointingKind::BlockSegments);
      if (i % 5 == 2) model.set_checkpoint_segment_blocks(i % 4);
    }
  });
  for (int step = 0; step < 10; ++step) {
    Variable loss = model.loss(b.tokens, b.targets, 2);
    loss.backward();
    EXPECT_EQ(loss.value().item(), expected) << step;
    EXPECT_TRUE(bit_equal(model.parameters().front().variable.grad(), expected_grad)) << step;
  }
  // What each forward reads, many times over: always a whole plan of the 8
  // blocks (without the lock a read was torn within ~300,000 here).
  for (std::int64_t read = 0; read < 2000000; ++read) {
    std::int64_t covered = 0;
    for (const CheckpointGroup& g : model.activation_checkpointing_plan()) covered += g.blocks;
    if (covered != 8) {
      ADD_FAILURE() << "a plan covering " << covered << " blocks at read " << read;
      break;
    }
  }
  done.store(true);
  setter.join();
}
