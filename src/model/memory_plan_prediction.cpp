// The activation memory planner's prediction: a plan's peak from the
// profile's per-block terms, for the kept-graph and the Release backward
// (docs/checkpointing.md, "The prediction").
#include <algorithm>
#include <string>

#include "memory_plan_terms.hpp"
#include "transformer_core.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {

namespace memory_plan_detail {

bool any_offloaded(const ActivationMemoryProfile& p, std::span<const Run> runs) {
  return std::any_of(runs.begin(), runs.end(), [&](const Run& r) { return offloaded(p, r.group); });
}

/// predicted_activation_peak of the expanded runs, in O(runs): while group g
/// replays, every group's kept values are live, the groups after g (and g
/// itself) hold their gradients, and g's replay term sits on top:
/// peak = Σ kept + max_g (gradients of groups ≥ g + replay_g). Within a run
/// the first group has the largest suffix of gradients, so it sets the run's term.
std::int64_t runs_peak(const ActivationMemoryProfile& p, std::span<const Run> runs) {
  const bool any = any_offloaded(p, runs);
  std::int64_t kept = 0, gradients = 0, top = 0;
  for (const Run& r : runs) kept += r.count * group_kept(p, r.group);
  for (auto r = runs.rbegin(); r != runs.rend(); ++r) {
    gradients += r->count * r->group.blocks * p.block_gradient_bytes;
    top = std::max(top, gradients + group_replay(p, r->group, any));
  }
  return kept + top;
}

// ---- The GraphAfterBackward::Release model (docs/checkpointing.md, "The prediction").

/// The Release peak of the runs in this order (first run = first blocks):
/// max(each group's forward above the values the groups below it keep;
/// Σ kept + top term of the last group; for every other group g, the
/// kept values of the groups below g + the gradients of the groups above g
/// + g's replay term; all gradients + the tail). Within a run the terms
/// change by (kept - gradients) per group, so its first or last member sets
/// it. The group that holds block 0 is apart: it keeps later_block_extra
/// less, and its replay and forward are the base and forward read at block 0
/// (every other group's add later_block_extra).
std::int64_t release_runs_peak(const ActivationMemoryProfile& p, std::span<const Run> runs) {
  const bool any = any_offloaded(p, runs);
  const std::int64_t first_lighter = p.later_block_extra[index_of(runs.front().group.recompute)];
  std::int64_t kept_all = 0, gradients_all = 0, blocks = 0;
  for (const Run& r : runs) {
    kept_all += r.count * group_top_kept(p, r.group);
    gradients_all += r.count * r.group.blocks * p.block_gradient_bytes;
    blocks += r.count * r.group.blocks;
  }
  const CheckpointGroup& last = runs.back().group;
  const bool one_group = runs.size() == 1 && runs.front().count == 1;
  std::int64_t peak = std::max(kept_all + group_top(p, last, any), blocks * p.block_gradient_bytes + p.tail_bytes);
  if (last.recompute == BlockRecompute::Whole && last.blocks > 1) {  // a segment's replay as the last group
    std::int64_t below = one_group ? 0 : -group_kept(p, last) - first_lighter;
    for (const Run& r : runs) below += one_group ? 0 : r.count * group_kept(p, r.group);
    const std::int64_t inputs = !any ? 0 : offloaded(p, last) ? 2 : 1;
    peak = std::max(peak, below + p.top_segment_bytes + (last.blocks - 2) * p.top_segment_extra_per_block +
                              inputs * p.block_input_bytes);
  }
  std::int64_t below = 0, gradients_to = 0;  // kept below the members; gradients up to and including them
  // The runs' members in order, block 0's group apart: (count, group, whether it holds block 0).
  const auto members = [&](std::int64_t count, const CheckpointGroup& g, bool first, bool top) {
    const std::int64_t replayed = top ? count - 1 : count;  // the top group is apart
    const std::int64_t extra = first ? 0 : p.later_block_extra[index_of(g.recompute)];
    const std::int64_t kept = group_kept(p, g) - (first ? first_lighter : 0);
    const std::int64_t gradients = g.blocks * p.block_gradient_bytes;
    // A segment's forward holds all its blocks' traced activations at once.
    const std::int64_t segment_forward =
        g.recompute == BlockRecompute::Whole && g.blocks > 1
            ? p.segment_forward_bytes + (g.blocks - 2) * p.segment_forward_extra_per_block
            : 0;
    const std::int64_t forward = std::max(p.forward[index_of(g.recompute)], segment_forward) + extra;
    peak = std::max(peak, below + (count - 1) * kept + forward);  // the last member's forward
    if (replayed > 0) {
      const std::int64_t start = below + gradients_all - gradients_to - gradients + group_replay(p, g, any) + extra;
      peak = std::max(peak, start + std::max<std::int64_t>(0, (replayed - 1) * (kept - gradients)));
    }
    below += count * kept;
    gradients_to += count * gradients;
  };
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const bool top = i + 1 == runs.size();
    if (i > 0) {
      members(runs[i].count, runs[i].group, false, top);
      continue;
    }
    members(1, runs[0].group, true, top && runs[0].count == 1);
    if (runs[0].count > 1) members(runs[0].count - 1, runs[0].group, false, top);
  }
  return peak;
}

}  // namespace memory_plan_detail

using namespace memory_plan_detail;

std::int64_t ActivationMemoryProfile::kept_bytes(BlockRecompute option) const {
  return per_block[index_of(option)] - block_gradient_bytes;
}
std::int64_t predicted_activation_peak(const ActivationMemoryProfile& profile, const ActivationCheckpointingPlan& plan) {
  check_checkpointing_plan(plan, profile.layers, "predicted_activation_peak");
  std::vector<Run> runs;
  for (const CheckpointGroup& g : plan) runs.push_back({1, g});
  return profile.graph == GraphAfterBackward::Release ? release_runs_peak(profile, runs) : runs_peak(profile, runs);
}

std::int64_t predicted_pinned_host_bytes(const ActivationMemoryProfile& profile, const ActivationCheckpointingPlan& plan) {
  check_checkpointing_plan(plan, profile.layers, "predicted_pinned_host_bytes");
  std::int64_t bytes = 0;
  for (const CheckpointGroup& g : plan) bytes += offloaded(profile, g) ? profile.block_input_bytes : 0;
  return bytes;
}

double plan_recompute_flops(const ActivationMemoryProfile& profile, const ActivationCheckpointingPlan& plan) {
  check_checkpointing_plan(plan, profile.layers, "plan_recompute_flops");
  double flops = 0;
  for (const CheckpointGroup& g : plan) flops += static_cast<double>(g.blocks) * profile.recompute_flops[index_of(g.recompute)];
  return flops;
}

}  // namespace riftco_transformer
