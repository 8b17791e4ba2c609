// The activation memory planner's search on hand-made Release and kept-graph
// profiles of random terms (docs/checkpointing.md, "The search"): it picks
// the same plans as the search before it was made faster (the expected lines
// below were printed by that search, commit c8b55e3), for 2 to 96 blocks,
// with and without offload and block 0 probed apart.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "riftco_transformer/memory_plan.hpp"

using namespace riftco_transformer;

namespace {

/// Terms of plausible sizes: what each option keeps falls from keep to
/// block, replays grow, and everything else is drawn around them.
ActivationMemoryProfile random_profile(std::int64_t layers, std::uint64_t seed, bool offload, bool keep_graph) {
  Random r(seed);
  const auto draw = [&](std::int64_t low, std::int64_t high) {
    return low + static_cast<std::int64_t>(r.below(static_cast<std::uint32_t>(high - low + 1)));
  };
  ActivationMemoryProfile p;
  p.layers = layers;
  p.batch = 4;
  p.sequence_length = 256;
  p.graph = keep_graph ? GraphAfterBackward::Keep : GraphAfterBackward::Release;
  p.block_gradient_bytes = draw(10'000, 400'000);
  p.block_input_bytes = draw(50'000, 300'000);
  const std::int64_t keep = draw(1'000'000, 3'000'000);
  p.per_block = {keep, draw(keep / 2, keep), draw(keep / 3, keep), p.block_input_bytes + p.block_gradient_bytes};
  for (std::size_t i = 0; i < 4; ++i) {
    p.base[i] = draw(500'000, 2'500'000);
    p.top[i] = draw(800'000, 4'000'000);
    p.top_kept[i] = p.per_block[i] - p.block_gradient_bytes - draw(0, 2'000);
    p.forward[i] = draw(600'000, 3'000'000);
    p.later_block_extra[i] = i == 0 || seed % 2 == 0 ? 0 : draw(0, 40'000) - 20'000;
  }
  p.top_segment_bytes = draw(1'000'000, 4'000'000);
  p.top_segment_extra_per_block = draw(0, 600'000);
  p.segment_extra_per_block = draw(0, 800'000);
  p.tail_bytes = draw(100'000, 2'000'000);
  p.activation_offload = offload;
  p.recompute_flops = {0.0, 3e9 + static_cast<double>(draw(0, 1000)) * 1e6, 5e9, 0};
  p.recompute_flops[3] = p.recompute_flops[1] + p.recompute_flops[2];
  p.forward_flops = static_cast<double>(layers) * p.recompute_flops[3];
  return p;
}

/// One line per budget (the smallest plan's bytes, then six budgets up to
/// keeping everything): the plan, its peak and its recompute FLOPs.
std::string plans(const ActivationMemoryProfile& p) {
  const ActivationMemoryPlan loosest = plan_activation_memory(p, std::int64_t{1} << 50);
  std::string out = std::to_string(loosest.smallest_feasible_bytes) + " " + std::to_string(loosest.disabled_peak_bytes) + "\n";
  for (int i = 0; i <= 6; ++i) {
    const std::int64_t budget =
        loosest.smallest_feasible_bytes + (loosest.disabled_peak_bytes - loosest.smallest_feasible_bytes) * i / 6;
    const ActivationMemoryPlan plan = plan_activation_memory(p, budget);
    char line[64];
    std::snprintf(line, sizeof line, " %lld %.6g\n", static_cast<long long>(plan.predicted_peak_bytes), plan.recompute_flops);
    out += describe_plan(plan.plan) + line;
  }
  return out;
}

}  // namespace

TEST(MemoryPlanSearch, PicksTheSamePlansAsBefore) {
  const struct {
    std::int64_t layers;
    std::uint64_t seed;
    bool offload, keep_graph;
  } cases[] = {{2, 1, false, false}, {5, 2, false, false}, {9, 3, true, false},  {13, 4, false, false},
               {24, 5, false, false}, {31, 6, true, false}, {48, 7, false, false}, {64, 8, false, false},
               {17, 9, false, true},  {40, 10, true, true}};
  std::string all;
  for (const auto& c : cases) {
    all += std::to_string(c.layers) + " blocks, seed " + std::to_string(c.seed) + ":\n" +
           plans(random_profile(c.layers, c.seed, c.offload, c.keep_graph));
  }
  EXPECT_EQ(all, R"(2 blocks, seed 1:
3435241 5986474
segment of 2 x1 3435241 1.737e+10
segment of 2 x1 3435241 1.737e+10
block x1, keep x1 4158664 8.685e+09
block x1, keep x1 4158664 8.685e+09
block x1, keep x1 4158664 8.685e+09
attention x1, keep x1 5468962 3.685e+09
keep x2 5986474 0
5 blocks, seed 2:
3119744 11983449
segment of 2 x2, mlp x1 3119744 3.8456e+10
segment of 4 x1, keep x1 3775081 3.3456e+10
segment of 2 x1, attention x2, keep x1 5803587 2.3456e+10
attention x4, mlp x1 6678684 1.8456e+10
attention x3, keep x2 8684088 1.0092e+10
attention x2, keep x3 9783875 6.728e+09
keep x5 11983449 0
9 blocks, seed 3:
3837810 24549545
block x7, keep x1, block x1 3837810 6.8368e+10
segment of 4 x1, attention x4, block x1 7111190 5.6914e+10
segment of 3 x1, attention x3, keep x2, block x1 10542817 4.4822e+10
segment of 2 x1, attention x2, keep x4, block x1 13974444 3.273e+10
block x1, attention x1, keep x6, block x1 17406071 2.0638e+10
keep x8, block x1 20837698 8.546e+09
keep x9 24549545 0
13 blocks, seed 4:
3723484 28196690
segment of 4 x1, segment of 8 x1, attention x1 3723484 9.9208e+10
segment of 8 x1, attention x5 7313514 7.9208e+10
segment of 4 x1, attention x9 11481586 5.9208e+10
attention x13 15413038 3.9208e+10
attention x9, keep x4 19261076 2.7144e+10
mlp x1, attention x3, keep x9 24092773 1.4048e+10
keep x13 28196690 0
24 blocks, seed 5:
7321550 31537756
block x1, segment of 2 x9, keep x3, segment of 2 x1 7321550 1.69218e+11
segment of 16 x1, attention x1, keep x7 11268082 1.31986e+11
segment of 13 x1, keep x11 15252677 1.04754e+11
segment of 10 x1, keep x14 19033997 8.058e+10
segment of 7 x1, keep x17 22815317 5.6406e+10
segment of 3 x1, attention x2, keep x19 27450527 3.029e+10
keep x24 31537756 0
31 blocks, seed 6:
5033530 33756550
block x25, attention x5, keep x1 5033530 2.4374e+11
segment of 7 x2, attention x16, keep x1 9713460 1.8874e+11
segment of 3 x1, attention x27, keep x1 14500638 1.3374e+11
attention x25, keep x6 18825462 9.895e+10
attention x17, keep x14 23656230 6.7286e+10
attention x9, keep x22 28486998 3.5622e+10
keep x31 33756550 0
48 blocks, seed 7:
7172289 80613577
segment of 6 x1, segment of 13 x3, mlp x1, keep x2 7172289 4.00415e+11
segment of 18 x1, mlp x23, keep x1, segment of 6 x1 19379403 3.25888e+11
mlp x41, keep x1, segment of 6 x1 31369681 2.57722e+11
mlp x35, keep x11, segment of 2 x1 43677635 1.92574e+11
mlp x24, keep x23, block x1 55877293 1.28787e+11
mlp x11, keep x36, block x1 68360946 6.3787e+10
keep x48 80613577 0
64 blocks, seed 8:
6468263 111833169
block x63, mlp x1 6468263 5.10575e+11
segment of 25 x1, segment of 26 x1, keep x13 23967366 4.09275e+11
segment of 41 x1, keep x23 41154475 3.29025e+11
segment of 30 x1, keep x33, mlp x1 59135459 2.4575e+11
segment of 20 x1, keep x43, mlp x1 76390809 1.655e+11
segment of 10 x1, attention x1, keep x53 94055576 8.3275e+10
keep x64 111833169 0
17 blocks, seed 9:
3897222 20765629
block x1, segment of 2 x8 3897222 1.37088e+11
attention x1, keep x2, segment of 2 x1, segment of 3 x4 6635862 1.1596e+11
mlp x1, keep x5, segment of 2 x1, segment of 3 x3 9174542 9.3704e+10
mlp x1, keep x8, segment of 2 x1, segment of 3 x2 12190178 6.9512e+10
mlp x3, block x4, keep x10 15049290 4.7256e+10
block x3, keep x14 17733409 2.4192e+10
keep x17 20765629 0
40 blocks, seed 10:
3407369 42184595
block x40 3407369 3.452e+11
attention x14, segment of 2 x1, segment of 3 x8 9762726 2.752e+11
attention x27, segment of 6 x1, segment of 7 x1 15919032 2.102e+11
attention x39, keep x1 22578337 1.4157e+11
attention x26, keep x14 29117324 9.438e+10
attention x13, keep x27 35656311 4.719e+10
keep x40 42184595 0
)");
}

// Past 96 blocks the search takes counts in steps of ceil(L/96) and segment
// sizes 1..96 plus those steps (512 blocks took 71 s, 4096 would have taken
// days). Its plans still cover every block, fit the budget by the same
// prediction, keep everything when that fits, and are never worse than the
// uniform policies that fit; the smallest plan is found in the grid.
TEST(MemoryPlanSearch, DeepModelsSearchAGridThatHoldsTheUniformPlans) {
  for (const std::int64_t layers : {97, 1000, 4096}) {
    const ActivationMemoryProfile p = random_profile(layers, 11 + static_cast<std::uint64_t>(layers), false, false);
    const ActivationMemoryPlan loosest = plan_activation_memory(p, std::int64_t{1} << 50);
    EXPECT_EQ(loosest.recompute_flops, 0.0) << layers;  // keeping everything fits: it is the plan
    EXPECT_EQ(loosest.predicted_peak_bytes, loosest.disabled_peak_bytes) << layers;
    const std::int64_t whole_segment = predicted_activation_peak(p, {{layers, BlockRecompute::Whole}});
    EXPECT_LE(loosest.smallest_feasible_bytes, whole_segment) << layers;
    for (int i = 0; i <= 4; i += layers == 4096 ? 8 : 2) {  // the smallest plan's budget, two more
      const std::int64_t budget =
          loosest.smallest_feasible_bytes + (loosest.disabled_peak_bytes - loosest.smallest_feasible_bytes) * i / 4;
      const ActivationMemoryPlan plan = plan_activation_memory(p, budget);
      std::int64_t blocks = 0;
      for (const CheckpointGroup& g : plan.plan) blocks += g.blocks;
      EXPECT_EQ(blocks, layers);
      EXPECT_LE(plan.predicted_peak_bytes, budget) << layers << " blocks, budget " << budget;
      EXPECT_EQ(plan.predicted_peak_bytes, predicted_activation_peak(p, plan.plan)) << layers;
      for (const BlockRecompute r : {BlockRecompute::Whole, BlockRecompute::Mlp, BlockRecompute::Attention}) {
        const ActivationCheckpointingPlan uniform_plan(static_cast<std::size_t>(layers), CheckpointGroup{1, r});
        if (predicted_activation_peak(p, uniform_plan) <= budget) {
          EXPECT_LE(plan.recompute_flops, static_cast<double>(layers) * p.recompute_flops[static_cast<std::size_t>(r)])
              << layers << " blocks, budget " << budget;
        }
      }
    }
  }
}
