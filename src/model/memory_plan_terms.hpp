#pragma once
// The activation memory planner's private terms, shared by the prediction
// (memory_plan_prediction.cpp), the search (memory_plan_search.cpp), the
// probes (memory_plan_probes.cpp) and the description (memory_plan_text.cpp).
#include <cstdint>
#include <span>
#include <vector>

#include "riftco_transformer/memory_plan.hpp"

namespace riftco_transformer::memory_plan_detail {

constexpr std::size_t kOptions = 4;
constexpr BlockRecompute kAll[kOptions] = {BlockRecompute::Nothing, BlockRecompute::Attention, BlockRecompute::Mlp,
                                           BlockRecompute::Whole};
inline std::size_t index_of(BlockRecompute r) { return static_cast<std::size_t>(r); }

inline ActivationCheckpointingPlan uniform(std::int64_t layers, BlockRecompute r) {
  return ActivationCheckpointingPlan(static_cast<std::size_t>(layers), CheckpointGroup{1, r});
}

/// Whether offload parks this group's input: it starts at a block boundary
/// and is checkpointed (a block, a segment, an attention group).
inline bool offloaded(const ActivationMemoryProfile& p, const CheckpointGroup& g) {
  return p.activation_offload && (g.recompute == BlockRecompute::Whole || g.recompute == BlockRecompute::Attention);
}

/// Bytes the group keeps for backward plus its parameter gradients (a
/// segment keeps one input).
inline std::int64_t group_bytes(const ActivationMemoryProfile& p, const CheckpointGroup& g) {
  if (g.recompute != BlockRecompute::Whole) return p.per_block[index_of(g.recompute)];
  return g.blocks * p.per_block[index_of(BlockRecompute::Whole)] - (g.blocks - 1) * p.block_input_bytes;
}

/// The group's backward working set (a segment's grows per block).
inline std::int64_t group_base(const ActivationMemoryProfile& p, const CheckpointGroup& g) {
  const std::int64_t base = p.base[index_of(g.recompute)];
  return g.recompute == BlockRecompute::Whole ? base + (g.blocks - 1) * p.segment_extra_per_block : base;
}

/// What the group keeps on the device between its forward and its backward.
inline std::int64_t group_kept(const ActivationMemoryProfile& p, const CheckpointGroup& g) {
  const std::int64_t kept = group_bytes(p, g) - g.blocks * p.block_gradient_bytes;
  return offloaded(p, g) ? kept - p.block_input_bytes : kept;
}

/// The group's replay term beside the gradients: its base, plus the offloaded
/// inputs on the device while it runs (its own, back for the replay, and the
/// previous group's, prefetched; only the prefetched one for a group that is
/// not offloaded) once `any` group is offloaded.
inline std::int64_t group_replay(const ActivationMemoryProfile& p, const CheckpointGroup& g, bool any) {
  const std::int64_t inputs = !any ? 0 : offloaded(p, g) ? 2 : 1;
  return group_base(p, g) + inputs * p.block_input_bytes;
}

/// Release: what group g adds to the top window: profile.top_kept per
/// block, a segment's input once; offload as group_kept.
inline std::int64_t group_top_kept(const ActivationMemoryProfile& p, const CheckpointGroup& g) {
  const std::int64_t per = p.top_kept[index_of(g.recompute)];
  const std::int64_t kept = g.recompute == BlockRecompute::Whole ? g.blocks * per - (g.blocks - 1) * p.block_input_bytes : per;
  return offloaded(p, g) ? kept - p.block_input_bytes : kept;
}

/// Release: the top group's term above every group's top_kept: the head's
/// backward or its own (a segment's replay: release_runs_peak).
inline std::int64_t group_top(const ActivationMemoryProfile& p, const CheckpointGroup& g, bool any) {
  const std::int64_t inputs = !any ? 0 : offloaded(p, g) ? 2 : 1;
  return p.top[index_of(g.recompute)] + inputs * p.block_input_bytes;
}

/// `count` equal groups side by side: a candidate plan is at most five runs
/// (segments of k, one shorter segment, mlp, attention, keep).
struct Run {
  std::int64_t count;
  CheckpointGroup group;
};

bool any_offloaded(const ActivationMemoryProfile& p, std::span<const Run> runs);
/// The kept-graph peak of the runs in this order (memory_plan_prediction.cpp).
std::int64_t runs_peak(const ActivationMemoryProfile& p, std::span<const Run> runs);
/// The Release peak of the runs in this order (memory_plan_prediction.cpp).
std::int64_t release_runs_peak(const ActivationMemoryProfile& p, std::span<const Run> runs);

inline ActivationCheckpointingPlan expand(std::span<const Run> runs) {
  ActivationCheckpointingPlan plan;
  for (const Run& r : runs) plan.insert(plan.end(), static_cast<std::size_t>(r.count), r.group);
  return plan;
}

}  // namespace riftco_transformer::memory_plan_detail
