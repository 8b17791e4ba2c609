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

/// What the group keeps on the device between its forward and its backward.
std::int64_t group_kept(const ActivationMemoryProfile& p, const CheckpointGroup& g);
/// The group's replay term beside the gradients: its base, plus the offloaded
/// inputs on the device while it runs (its own, back for the replay, and the
/// previous group's, prefetched; only the prefetched one for a group that is
/// not offloaded) once `any` group is offloaded.
std::int64_t group_replay(const ActivationMemoryProfile& p, const CheckpointGroup& g, bool any);

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
