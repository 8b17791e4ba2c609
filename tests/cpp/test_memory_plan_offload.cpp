// The activation memory planner with activation offload
// (docs/checkpointing.md, "Activation offload" and "Planning for a memory
// budget"): the prediction's arithmetic on a hand-made profile (offloaded
// inputs leave what groups keep; each replay has its own input and the
// prefetched one back; pinned host bytes predicted apart), the search using
// it, and a cpu model's profile (offload moves nothing there). The allocator
// check with offload on is tests/cuda/test_cuda_model.cpp's
// CudaMemoryPlan.OffloadPredictionBoundsTheAllocatorPeak.
#include <gtest/gtest.h>

#include "model_fixtures.hpp"
#include "riftco_transformer/memory_plan.hpp"

using namespace riftco_transformer;

namespace {

/// Four blocks; per option (keep, attention, mlp, block) the bytes one more
/// block adds (its kept values plus 20 gradient bytes) and the replay base.
ActivationMemoryProfile profile(bool offload, std::int64_t input_bytes = 10) {
  ActivationMemoryProfile p;
  p.layers = 4;
  p.batch = 1;
  p.sequence_length = 1;
  p.per_block = {100, 70, 60, 40};
  p.base = {50, 60, 70, 80};
  p.block_gradient_bytes = 20;
  p.block_input_bytes = input_bytes;
  p.segment_extra_per_block = 5;
  p.recompute_flops = {0, 1, 2, 3};
  p.forward_flops = 12;
  p.activation_offload = offload;
  return p;
}

ActivationCheckpointingPlan uniform(BlockRecompute r) { return ActivationCheckpointingPlan(4, CheckpointGroup{1, r}); }

}  // namespace

TEST(MemoryPlanOffload, BlockGroupsKeepNoInputAndReplayWithTwo) {
  const ActivationCheckpointingPlan blocks = uniform(BlockRecompute::Whole);
  // Off: each block keeps 40 - 20 = 20; the first block's replay term is
  // 4·20 gradients + base 80: 4·20 + 160 = 240.
  EXPECT_EQ(predicted_activation_peak(profile(false), blocks), 240);
  EXPECT_EQ(predicted_pinned_host_bytes(profile(false), blocks), 0);
  // On: each keeps 20 - 10 = 10 on the device; each replay has its input and
  // the prefetched one back: 4·10 + (80 + 80 + 2·10) = 220.
  EXPECT_EQ(predicted_activation_peak(profile(true), blocks), 220);
  EXPECT_EQ(predicted_pinned_host_bytes(profile(true), blocks), 40);
}

TEST(MemoryPlanOffload, MidBlockAndKeptGroupsAreNotOffloaded) {
  for (const BlockRecompute r : {BlockRecompute::Nothing, BlockRecompute::Mlp}) {
    EXPECT_EQ(predicted_activation_peak(profile(true), uniform(r)), predicted_activation_peak(profile(false), uniform(r)))
        << block_recompute_name(r);
    EXPECT_EQ(predicted_pinned_host_bytes(profile(true), uniform(r)), 0) << block_recompute_name(r);
  }
}

TEST(MemoryPlanOffload, MixedPlanArithmetic) {
  // attention, mlp, a segment of two blocks; input 8 bytes.
  const ActivationCheckpointingPlan plan = {
      {1, BlockRecompute::Attention}, {1, BlockRecompute::Mlp}, {2, BlockRecompute::Whole}};
  // Kept on the device: attention 70 - 20 - 8 = 42; mlp 60 - 20 = 40;
  // segment 2·40 - 8 (one input) - 40 - 8 = 24. Σ = 106.
  // Replay terms (gradients of groups >= g + base + inputs back):
  //   segment 40 + (80 + 5) + 2·8 = 141; mlp 60 + 70 + 8 = 138;
  //   attention 80 + 60 + 2·8 = 156. Peak 106 + 156 = 262.
  EXPECT_EQ(predicted_activation_peak(profile(true, 8), plan), 262);
  EXPECT_EQ(predicted_pinned_host_bytes(profile(true, 8), plan), 16);
  // Off: kept 50 + 40 + 32 = 122; terms 125, 130, 140: 262 as well (the
  // attention group's replay sets both).
  EXPECT_EQ(predicted_activation_peak(profile(false, 8), plan), 262);
}

TEST(MemoryPlanOffload, TheSearchUsesTheOffloadPrediction) {
  for (const bool offload : {false, true}) {
    const ActivationMemoryProfile p = profile(offload);
    const ActivationMemoryPlan smallest = plan_activation_memory(p, std::int64_t{1} << 40);
    const ActivationMemoryPlan plan = plan_activation_memory(p, smallest.smallest_feasible_bytes);
    EXPECT_EQ(plan.predicted_peak_bytes, predicted_activation_peak(p, plan.plan)) << offload;
    EXPECT_EQ(plan.predicted_peak_bytes, plan.smallest_feasible_bytes) << offload;
    EXPECT_EQ(plan.pinned_host_bytes, predicted_pinned_host_bytes(p, plan.plan)) << offload;
    EXPECT_EQ(plan.pinned_host_bytes > 0, offload) << describe_plan(plan.plan);
    const std::string text = describe_activation_memory_plan(p, plan);
    EXPECT_EQ(text.find("pinned host memory") != std::string::npos, offload) << text;
  }
}

TEST(MemoryPlanOffload, ACpuModelsProfileHasNoOffload) {
  Random r(3);
  DecoderOnlyTransformer model(rt_test::tiny_dims(2), r);
  model.set_activation_offload(true);
  EXPECT_FALSE(profile_activation_memory(model, 2, 8).activation_offload);  // nothing moves on the cpu
}
