// The activation memory planner's search: the cheapest plan whose predicted
// peak fits a budget (docs/checkpointing.md, "The search").
#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "memory_plan_terms.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {

using namespace memory_plan_detail;

namespace {

/// The runs in the order that gives the lowest peak: the group replayed last
/// holds only its own gradients beside its working set, so the largest
/// working sets go last (nearest the head). Stable: equal terms keep the
/// candidate's order.
void order_runs(const ActivationMemoryProfile& p, std::vector<Run>& runs) {
  const bool any = any_offloaded(p, runs);
  std::stable_sort(runs.begin(), runs.end(), [&](const Run& x, const Run& y) {
    return group_replay(p, x.group, any) < group_replay(p, y.group, any);
  });
}

/// The order of the runs with the lowest Release peak: each run in turn
/// gives the top group; the others go in the order that minimises a running
/// maximum (groups that keep less than their gradients first, by increasing
/// replay term; then the rest by decreasing replay term less what they keep).
/// Returns the peak; `runs` is left in that order.
std::int64_t order_release_runs(const ActivationMemoryProfile& p, std::vector<Run>& runs) {
  const bool any = any_offloaded(p, runs);
  const auto rise = [&](const Run& r) { return group_kept(p, r.group) - r.group.blocks * p.block_gradient_bytes; };
  const auto term = [&](const Run& r) { return group_replay(p, r.group, any) - r.group.blocks * p.block_gradient_bytes; };
  std::vector<Run> best, trial;
  std::int64_t best_peak = std::numeric_limits<std::int64_t>::max();
  for (std::size_t t = 0; t < runs.size(); ++t) {
    if (t > 0 && runs[t].group == runs[t - 1].group) continue;
    trial.clear();
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const std::int64_t count = i == t ? runs[i].count - 1 : runs[i].count;
      if (count > 0) trial.push_back({count, runs[i].group});
    }
    std::stable_sort(trial.begin(), trial.end(), [&](const Run& x, const Run& y) {
      const bool fx = rise(x) <= 0, fy = rise(y) <= 0;
      if (fx != fy) return fx;
      return fx ? term(x) < term(y) : term(x) - rise(x) > term(y) - rise(y);
    });
    trial.push_back({1, runs[t].group});
    const std::int64_t peak = release_runs_peak(p, trial);
    if (peak < best_peak) {
      best_peak = peak;
      best = trial;
    }
  }
  runs = best;
  return best_peak;
}

/// The runs' peak for the profile's backward, in the order with the lowest
/// one (`runs` is reordered).
std::int64_t arrange_runs(const ActivationMemoryProfile& p, std::vector<Run>& runs) {
  if (p.graph == GraphAfterBackward::Release) return order_release_runs(p, runs);
  order_runs(p, runs);
  return runs_peak(p, runs);
}

}  // namespace

ActivationMemoryPlan plan_activation_memory(const ActivationMemoryProfile& profile, std::int64_t budget_bytes) {
  const std::int64_t layers = profile.layers;
  ActivationMemoryPlan best;
  best.budget_bytes = budget_bytes;
  best.disabled_peak_bytes = predicted_activation_peak(profile, uniform(layers, BlockRecompute::Nothing));
  std::int64_t smallest = std::numeric_limits<std::int64_t>::max();
  std::vector<Run> smallest_runs, best_runs, runs;
  std::int64_t best_groups = 0;
  bool found = false;
  const auto flops_of = [&](BlockRecompute r) { return profile.recompute_flops[index_of(r)]; };
  // Blocks are alike, so a plan is a count per option plus how the rest is
  // cut into segments (all of size k, the last one shorter), in the order
  // that gives the lowest peak: O(L⁴/24) candidates of at most five runs.
  for (std::int64_t keep = 0; keep <= layers; ++keep) {
    for (std::int64_t att = 0; keep + att <= layers; ++att) {
      for (std::int64_t mlp = 0; keep + att + mlp <= layers; ++mlp) {
        const std::int64_t rest = layers - keep - att - mlp;
        for (std::int64_t k = rest == 0 ? 0 : 1; k <= rest; ++k) {
          runs.clear();
          if (k > 0 && rest / k > 0) runs.push_back({rest / k, {k, BlockRecompute::Whole}});
          if (k > 0 && rest % k > 0) runs.push_back({1, {rest % k, BlockRecompute::Whole}});
          if (mlp > 0) runs.push_back({mlp, {1, BlockRecompute::Mlp}});
          if (att > 0) runs.push_back({att, {1, BlockRecompute::Attention}});
          if (keep > 0) runs.push_back({keep, {1, BlockRecompute::Nothing}});
          const std::int64_t peak = arrange_runs(profile, runs);
          if (peak < smallest) {
            smallest = peak;
            smallest_runs = runs;
          }
          if (peak > budget_bytes) continue;
          const double flops = static_cast<double>(att) * flops_of(BlockRecompute::Attention) +
                               static_cast<double>(mlp) * flops_of(BlockRecompute::Mlp) +
                               static_cast<double>(rest) * flops_of(BlockRecompute::Whole);
          std::int64_t groups = 0;
          for (const Run& r : runs) groups += r.count;
          const bool better = !found || flops < best.recompute_flops ||
                              (flops == best.recompute_flops &&
                               (peak < best.predicted_peak_bytes ||
                                (peak == best.predicted_peak_bytes && groups < best_groups)));
          if (better) {
            found = true;
            best_runs = runs;
            best_groups = groups;
            best.predicted_peak_bytes = peak;
            best.recompute_flops = flops;
          }
        }
      }
    }
  }
  best.smallest_feasible_bytes = smallest;
  if (!found) {
    const ActivationCheckpointingPlan smallest_plan = expand(smallest_runs);
    throw ValueError("[plan_activation_memory] no plan fits an activation memory budget of " +
                     format_bytes(static_cast<double>(budget_bytes)) + " (" + std::to_string(budget_bytes) +
                     " bytes): the smallest plan (" + describe_plan(smallest_plan) + ") needs " +
                     format_bytes(static_cast<double>(smallest)) + " (" + std::to_string(smallest) +
                     " bytes) at batch " + std::to_string(profile.batch) + ", sequence length " +
                     std::to_string(profile.sequence_length) + "; ask for at least that, or a smaller batch");
  }
  best.plan = expand(best_runs);
  best.pinned_host_bytes = predicted_pinned_host_bytes(profile, best.plan);
  return best;
}

}  // namespace riftco_transformer
