// The activation memory planner: byte sizes, per-block plans in the model,
// the predicted peak against the allocator, the search's optimality, and the
// budget in the pipelines (include/riftco_transformer/memory_plan.hpp).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "message_of.hpp"
#include "model_fixtures.hpp"
#include "scratch.hpp"
#include "tiny_pretraining.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/memory_plan.hpp"
#include "riftco_transformer/pipelines.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

struct Case {
  const char* name;
  TransformerDimensions dims;
  std::int64_t batch, seq;
  FullSequenceAttentionKind attention;
  bool lora = false;
  float dropout = 0.0F;
};

std::vector<Case> shapes() {
  TransformerDimensions gqa{96, 64, 48, 4, 5, 112};
  gqa.key_value_heads = 2;
  TransformerDimensions tied{80, 64, 32, 2, 4, 64};
  tied.tie_embeddings = true;
  return {{"flash", {64, 64, 32, 4, 4, 48}, 2, 16, FullSequenceAttentionKind::Flash},
          {"materialized", {256, 128, 64, 4, 5, 160}, 3, 64, FullSequenceAttentionKind::Materialized},
          {"gqa_dropout", gqa, 2, 32, FullSequenceAttentionKind::Flash, false, 0.1F},
          {"tied_lora", tied, 2, 24, FullSequenceAttentionKind::Materialized, true},
          {"lora_flash_dropout", {128, 64, 64, 4, 6, 128}, 2, 32, FullSequenceAttentionKind::Flash, true, 0.1F}};
}

std::unique_ptr<DecoderOnlyTransformer> build(const Case& s) {
  Random r(7);
  auto m = std::make_unique<DecoderOnlyTransformer>(s.dims, r, 1e-5F, s.attention);
  if (s.lora) {
    LoraConfig c;
    c.rank = 4;
    c.targets = {LoraTarget::Query, LoraTarget::Value, LoraTarget::Up};
    m->add_lora(c, r);
    m->set_base_trainable(false);
    for (NamedParameter& p : m->lora_parameters()) p.variable.set_requires_grad(true);
  }
  m->set_dropout(s.dropout, 3);
  return m;
}

/// The model's activation peak under `plan` (dropout stream and gradients restored).
std::int64_t measured(DecoderOnlyTransformer& m, const Case& s, const ActivationCheckpointingPlan& plan) {
  const rt_test::Batch b = rt_test::random_batch(s.batch, s.seq, s.dims.vocab_size, 5);
  m.set_activation_checkpointing_plan(plan);
  const Random::State state = m.dropout_random().state();
  const std::int64_t peak = measure_activation_peak(m, b.tokens, b.targets, b.batch);
  m.dropout_random().set_state(state);
  for (NamedParameter& p : m.parameters()) p.variable.clear_grad();
  return peak;
}

/// Every plan of `layers` blocks: each group one block with an option, or a segment.
void every_plan(std::int64_t left, ActivationCheckpointingPlan& prefix,
                const std::function<void(const ActivationCheckpointingPlan&)>& visit) {
  if (left == 0) return visit(prefix);
  for (int o = 0; o < 3; ++o) {
    prefix.push_back({1, static_cast<BlockRecompute>(o)});
    every_plan(left - 1, prefix, visit);
    prefix.pop_back();
  }
  for (std::int64_t k = 1; k <= left; ++k) {
    prefix.push_back({k, BlockRecompute::Whole});
    every_plan(left - k, prefix, visit);
    prefix.pop_back();
  }
}

}  // namespace

TEST(MemoryPlan, ParsesByteSizes) {
  EXPECT_EQ(parse_byte_size("256MiB", "t"), 256LL << 20);
  EXPECT_EQ(parse_byte_size("1.5 GiB", "t"), 3LL << 29);
  EXPECT_EQ(parse_byte_size("300MB", "t"), 300000000);
  EXPECT_EQ(parse_byte_size("2k", "t"), 2000);
  EXPECT_EQ(parse_byte_size("4096", "t"), 4096);
  EXPECT_EQ(parse_byte_size(" 8 kib ", "t"), 8192);
  for (const char* bad : {"", "MiB", "-5MiB", "0", "0.1", "12XB", "1e3", "nan", "1..2MiB", "99999999999TiB"}) {
    try {
      (void)parse_byte_size(bad, "--activation-memory-budget");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("--activation-memory-budget"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(format_bytes(256.0 * 1048576), "256.0 MiB");
}

TEST(MemoryPlan, ModelPlansAreValidatedAndUniformPoliciesAreGroups) {
  Random r(1);
  DecoderOnlyTransformer m(rt_test::tiny_dims(4), r);
  m.set_activation_checkpointing_kind(ActivationCheckpointingKind::BlockSegments);
  m.set_checkpoint_segment_blocks(3);
  EXPECT_EQ(m.activation_checkpointing_plan(),
            (ActivationCheckpointingPlan{{3, BlockRecompute::Whole}, {1, BlockRecompute::Whole}}));
  m.set_activation_checkpointing_kind(ActivationCheckpointingKind::MlpSubBlock);
  EXPECT_EQ(m.activation_checkpointing_plan(), ActivationCheckpointingPlan(4, {1, BlockRecompute::Mlp}));
  const ActivationCheckpointingPlan plan{{1, BlockRecompute::Attention}, {2, BlockRecompute::Whole}, {1, BlockRecompute::Nothing}};
  m.set_activation_checkpointing_plan(plan);
  EXPECT_EQ(m.activation_checkpointing_kind(), ActivationCheckpointingKind::Planned);
  EXPECT_EQ(m.activation_checkpointing_plan(), plan);
  EXPECT_EQ(describe_plan(plan), "attention x1, segment of 2 x1, keep x1");
  for (const ActivationCheckpointingPlan& bad :
       {ActivationCheckpointingPlan{{3, BlockRecompute::Whole}},                                  // 3 of 4 blocks
        ActivationCheckpointingPlan{{2, BlockRecompute::Mlp}, {2, BlockRecompute::Whole}},         // multi-block mlp
        ActivationCheckpointingPlan{{0, BlockRecompute::Whole}, {4, BlockRecompute::Whole}},       // empty group
        ActivationCheckpointingPlan{{4, static_cast<BlockRecompute>(9)}}}) {                       // bad enum
    EXPECT_THROW(m.set_activation_checkpointing_plan(bad), ValueError);
    EXPECT_EQ(m.activation_checkpointing_plan(), plan);  // unchanged
  }
  EXPECT_THROW(m.set_activation_checkpointing_kind(ActivationCheckpointingKind::Planned), ValueError);
  EXPECT_THROW(parse_activation_checkpointing("planned"), ValueError);
  m.set_activation_checkpointing_kind(ActivationCheckpointingKind::Disabled);  // drops the plan
  EXPECT_EQ(m.activation_checkpointing_plan(), ActivationCheckpointingPlan(4, {1, BlockRecompute::Nothing}));
}

// The planner's free functions check a plan as set_activation_checkpointing_plan
// does: a recompute of 7 read past the per-option arrays (garbage FLOPs), and
// groups of 0 or -1 blocks, or more blocks than the profile has, gave figures.
TEST(MemoryPlan, PlannerFunctionsRefuseAPlanNoModelCouldRun) {
  ActivationMemoryProfile profile;
  profile.layers = 3;
  profile.recompute_flops = {0.0, 1.0, 2.0, 3.0};
  const ActivationCheckpointingPlan bad[] = {
      {{3, static_cast<BlockRecompute>(7)}},                          // unknown recompute
      {{1, static_cast<BlockRecompute>(-1)}, {2, BlockRecompute::Whole}},
      {{0, BlockRecompute::Whole}, {3, BlockRecompute::Whole}},       // an empty group
      {{-1, BlockRecompute::Whole}, {4, BlockRecompute::Whole}},      // adds up to 3
      {{5, BlockRecompute::Whole}},                                   // 5 blocks of 3
      {{2, BlockRecompute::Mlp}, {1, BlockRecompute::Whole}},         // a multi-block mlp group
  };
  for (const ActivationCheckpointingPlan& plan : bad) {
    const std::string d = describe_plan(plan);
    EXPECT_THROW(predicted_activation_peak(profile, plan), ValueError) << d;
    EXPECT_THROW(predicted_pinned_host_bytes(profile, plan), ValueError) << d;
    EXPECT_THROW(plan_recompute_flops(profile, plan), ValueError) << d;
  }
  EXPECT_EQ(plan_recompute_flops(profile, {{1, BlockRecompute::Whole}, {1, BlockRecompute::Mlp}, {1, BlockRecompute::Mlp}}), 7.0);
  for (const std::int64_t layers : {std::int64_t{-3}, std::int64_t{0}, std::int64_t{5000}}) {
    ActivationMemoryProfile odd = profile;
    odd.layers = layers;
    EXPECT_THROW(plan_activation_memory(odd, 1 << 30), ValueError) << layers;
  }
}

TEST(MemoryPlan, MixedPlansGiveTheDisabledGradientsBitForBit) {
  for (const Case& s : shapes()) {
    auto m = build(s);
    const rt_test::Batch b = rt_test::random_batch(s.batch, s.seq, s.dims.vocab_size, 9);
    const auto gradients = [&](const ActivationCheckpointingPlan& plan) {
      m->set_activation_checkpointing_plan(plan);
      const Random::State state = m->dropout_random().state();
      m->loss(b.tokens, b.targets, b.batch).backward();
      m->dropout_random().set_state(state);
      std::vector<std::vector<float>> out;
      for (const NamedParameter& p : m->parameters()) {
        if (p.variable.requires_grad()) out.emplace_back(p.variable.grad().values().begin(), p.variable.grad().values().end());
      }
      return out;
    };
    const auto reference = gradients(ActivationCheckpointingPlan(static_cast<std::size_t>(s.dims.layers), CheckpointGroup{}));
    Random r(3);
    for (int trial = 0; trial < 3; ++trial) {
      const ActivationCheckpointingPlan plan = rt_test::random_plan(s.dims.layers, r);
      EXPECT_EQ(gradients(plan), reference) << s.name << ": " << describe_plan(plan);
    }
  }
}

TEST(MemoryPlan, PredictedPeakMatchesTheAllocatorForEveryPlanShape) {
  for (const Case& s : shapes()) {
    auto m = build(s);
    const ActivationMemoryProfile profile = profile_activation_memory(*m, s.batch, s.seq);
    EXPECT_EQ(profile.block_input_bytes, s.batch * s.seq * s.dims.model_width * 4) << s.name;
    // A whole-block checkpoint keeps its input alone (adapters add their own small values).
    if (!s.lora) EXPECT_EQ(profile.kept_bytes(BlockRecompute::Whole), profile.block_input_bytes) << s.name;
    const bool exact = !s.lora && s.dropout == 0.0F;
    Random r(11);
    for (int trial = 0; trial < 10; ++trial) {
      const ActivationCheckpointingPlan plan = rt_test::random_plan(s.dims.layers, r);
      const std::int64_t real = measured(*m, s, plan);
      const std::int64_t predicted = predicted_activation_peak(profile, plan);
      EXPECT_GE(predicted, real) << s.name << ": " << describe_plan(plan);  // never an under-estimate
      EXPECT_LE(static_cast<double>(predicted), (exact ? 1.0 : 1.08) * static_cast<double>(real)) << s.name << ": " << describe_plan(plan);
      // Exact to the byte without adapters and dropout; with them, segments
      // and adapters' values make it a slight over-estimate.
      if (exact) EXPECT_EQ(predicted, real) << s.name << ": " << describe_plan(plan);
    }
  }
}

TEST(MemoryPlan, BudgetsAreMetOnTheAllocatorAndCostFallsAsTheyGrow) {
  for (const Case& s : shapes()) {
    auto m = build(s);
    const ActivationMemoryProfile profile = profile_activation_memory(*m, s.batch, s.seq);
    const ActivationMemoryPlan loosest = plan_activation_memory(profile, std::int64_t{1} << 40);
    EXPECT_EQ(loosest.recompute_flops, 0.0) << s.name;
    EXPECT_EQ(loosest.plan, ActivationCheckpointingPlan(static_cast<std::size_t>(s.dims.layers), CheckpointGroup{}));
    const std::int64_t low = loosest.smallest_feasible_bytes;
    const std::int64_t high = loosest.disabled_peak_bytes;
    ASSERT_LT(low, high) << s.name;
    double previous_flops = 1e300;
    for (int i = 0; i <= 6; ++i) {
      const std::int64_t budget = low + (high - low) * i / 6;
      const ActivationMemoryPlan plan = plan_activation_memory(profile, budget);
      EXPECT_LE(plan.predicted_peak_bytes, budget) << s.name;
      EXPECT_LE(measured(*m, s, plan.plan), budget) << s.name << " budget " << budget << ": " << describe_plan(plan.plan);
      EXPECT_LE(plan.recompute_flops, previous_flops) << s.name;
      previous_flops = plan.recompute_flops;
    }
    try {
      (void)plan_activation_memory(profile, low - 1);
      ADD_FAILURE() << "a budget below the smallest plan was accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(low) + " bytes"), std::string::npos) << e.what();
    }
  }
}

TEST(MemoryPlan, SearchFindsTheCheapestFeasiblePlanOfAll) {
  // Brute force over every plan (any order, any segmentation) of a 4-block
  // model: no plan that fits is cheaper than the planner's.
  Case s{"materialized", {64, 32, 32, 4, 4, 96}, 2, 32, FullSequenceAttentionKind::Materialized};
  auto m = build(s);
  const ActivationMemoryProfile profile = profile_activation_memory(*m, s.batch, s.seq);
  const ActivationMemoryPlan loosest = plan_activation_memory(profile, std::int64_t{1} << 40);
  for (int i = 0; i <= 10; ++i) {
    const std::int64_t budget =
        loosest.smallest_feasible_bytes + (loosest.disabled_peak_bytes - loosest.smallest_feasible_bytes) * i / 10;
    const ActivationMemoryPlan plan = plan_activation_memory(profile, budget);
    double cheapest = 1e300;
    ActivationCheckpointingPlan prefix;
    every_plan(4, prefix, [&](const ActivationCheckpointingPlan& p) {
      if (predicted_activation_peak(profile, p) <= budget) cheapest = std::min(cheapest, plan_recompute_flops(profile, p));
    });
    EXPECT_EQ(plan.recompute_flops, cheapest) << "budget " << budget << ": " << describe_plan(plan.plan);
  }
}

TEST(MemoryPlan, DeepModelsArePlannedQuicklyAndConsistently) {
  // A 96-block profile (numbers of the shape real probes give): the search
  // is O(L^4/24) cheap candidates, and its peak is the general formula's.
  ActivationMemoryProfile p;
  p.layers = 96;
  p.batch = 8;
  p.sequence_length = 1024;
  p.per_block = {52'000'000, 30'000'000, 38'000'000, 6'000'000};
  p.base = {90'000'000, 120'000'000, 95'000'000, 140'000'000};
  p.block_gradient_bytes = 2'000'000;
  p.block_input_bytes = 4'000'000;
  p.segment_extra_per_block = 45'000'000;
  p.recompute_flops = {0.0, 3e9, 5e9, 8e9};
  p.forward_flops = 96 * 8e9;
  const ActivationMemoryPlan loosest = plan_activation_memory(p, std::int64_t{1} << 40);
  for (int i = 0; i <= 8; ++i) {
    const std::int64_t budget =
        loosest.smallest_feasible_bytes + (loosest.disabled_peak_bytes - loosest.smallest_feasible_bytes) * i / 8;
    const ActivationMemoryPlan plan = plan_activation_memory(p, budget);
    EXPECT_EQ(plan.predicted_peak_bytes, predicted_activation_peak(p, plan.plan)) << describe_plan(plan.plan);
    EXPECT_EQ(plan.recompute_flops, plan_recompute_flops(p, plan.plan));
    EXPECT_LE(plan.predicted_peak_bytes, budget);
  }
}

namespace {

PretrainingConfig small_run(const fs::path& dir) {
  PretrainingConfig c;
  c.dimensions = {256, 96, 32, 4, 4, 64};
  c.data = rt_test::write_corpus(dir);
  c.steps = 3;
  c.batch = 3;
  c.sequence_length = 48;
  c.eval_interval = 0;
  c.eval_batches = 1;
  c.checkpoint_interval = 0;
  c.output_dir = dir / "run";
  return c;
}

}  // namespace

TEST(MemoryPlan, PretrainingWithABudgetStaysUnderItAndRecordsThePlan) {
  const fs::path dir = rt_test::fresh_dir("memory_plan", "pretrain");
  PretrainingConfig c = small_run(dir);
  const RunResult unplanned = run_pretraining(c);
  c.output_dir = dir / "planned";
  c.activation_memory_budget = unplanned.activation_peak_bytes * 3 / 4;
  std::string notice;
  const RunResult r = run_pretraining(c, {}, [&](const std::string& text) { notice += text; });
  ASSERT_TRUE(r.completed);
  EXPECT_LE(r.activation_peak_bytes, c.activation_memory_budget);
  EXPECT_EQ(r.final_train_loss, unplanned.final_train_loss);  // checkpointing changes no number
  EXPECT_EQ(notice, r.activation_memory_plan);
  EXPECT_NE(notice.find("predicted activation peak"), std::string::npos) << notice;
  const nlohmann::json meta = nlohmann::json::parse(rt_test::read_file(c.output_dir / "metadata.json"));
  EXPECT_EQ(meta["config"]["activation_memory_budget"], c.activation_memory_budget);
  const nlohmann::json& plan = meta["facts"]["activation_memory_plan"];
  EXPECT_LE(plan["predicted_peak_bytes"].get<std::int64_t>(), c.activation_memory_budget);
  EXPECT_EQ(meta["results"]["activation_peak_bytes"], r.activation_peak_bytes);
  std::int64_t blocks = 0;
  for (const auto& g : plan["groups"]) blocks += g["blocks"].get<std::int64_t>();
  EXPECT_EQ(blocks, 4);

  // A budget no plan fits is refused before anything is written.
  c.output_dir = dir / "too_small";
  c.activation_memory_budget = plan["smallest_feasible_bytes"].get<std::int64_t>() - 1;
  EXPECT_THROW(run_pretraining(c), ValueError);
  EXPECT_FALSE(fs::exists(c.output_dir));
  // A budget plans the policy itself.
  c.activation_memory_budget = 1 << 30;
  c.activation_checkpointing = ActivationCheckpointingKind::TransformerBlock;
  EXPECT_THROW(run_pretraining(c), ValueError);
}

TEST(MemoryPlan, LoraPostTrainingWithABudgetStaysUnderIt) {
  const fs::path dir = rt_test::fresh_dir("memory_plan", "lora");
  PretrainingConfig base = small_run(dir);
  base.steps = 1;
  ASSERT_TRUE(run_pretraining(base).completed);
  PostTrainingConfig c = rt_test::tiny_chat_post_training(base.output_dir / "model.safetensors", 2);
  c.checkpoint_interval = 0;
  c.output_dir = dir / "unplanned";
  const RunResult unplanned = run_post_training(c);
  c.output_dir = dir / "planned";
  c.activation_memory_budget = unplanned.activation_peak_bytes * 2 / 3;
  const RunResult r = run_post_training(c);
  ASSERT_TRUE(r.completed);
  EXPECT_LE(r.activation_peak_bytes, c.activation_memory_budget);
  EXPECT_LT(r.activation_peak_bytes, unplanned.activation_peak_bytes);
  EXPECT_EQ(r.final_train_loss, unplanned.final_train_loss);
}

TEST(MemoryPlan, ProfilingABatchWhoseLogitsCannotFitIsRefusedBeforeAnyProbe) {
  // The probes run a step at the batch asked for: batch 2^20 ran until
  // std::bad_alloc (2.4 GiB under a 3 GB limit, about 240 GiB wanted).
  Random init(3);
  const TransformerDimensions d{256, 64, 16, 2, 1, 32};
  DecoderOnlyTransformer model(d, init);
  const double floor_bytes = 8.0 * static_cast<double>(1 << 20) * 64.0 * (256.0 + 16.0);  // ~146 GB
  if (available_host_memory_bytes() >= floor_bytes) GTEST_SKIP() << "this machine has room for the logits";
  const MemoryStats before = memory_stats();
  const std::string message = rt_test::message_of<ValueError>([&] { (void)profile_activation_memory(model, 1 << 20, 64); });
  EXPECT_NE(message.find("profiling at batch 1048576 and sequence length 64 needs at least"), std::string::npos) << message;
  EXPECT_NE(message.find("plan for a smaller batch"), std::string::npos) << message;
  EXPECT_EQ(memory_stats().allocation_count, before.allocation_count);  // refused before anything ran
  EXPECT_GT(available_host_memory_bytes(), 0.0);
}
