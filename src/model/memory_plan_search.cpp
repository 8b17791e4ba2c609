// The activation memory planner's search: the cheapest plan whose predicted
// peak fits a budget (docs/checkpointing.md, "The search").
#include <algorithm>
#include <array>
#include <cstddef>
#include <span>
#include <limits>
#include <string>
#include <vector>

#include "memory_plan_terms.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {

using namespace memory_plan_detail;

namespace {

/// A candidate plan: at most five runs (segments of k, one shorter segment,
/// mlp, attention, keep), six once its top group is split off its run;
/// kept without the heap.
struct Candidate {
  std::array<Run, 6> runs{};
  std::size_t size = 0;
  void add(std::int64_t count, const CheckpointGroup& group) { runs[size++] = {count, group}; }
  std::span<const Run> view() const { return {runs.data(), size}; }
};

/// The runs in the order that gives the lowest kept-graph peak: the group
/// replayed last holds only its own gradients beside its working set, so the
/// largest working sets go last (nearest the head). Stable: equal terms keep
/// the candidate's order. Returns the peak, or, when a bound below it (every
/// kept value, all gradients and the smallest replay) is above `cutoff`, that
/// bound (`c` then keeps its order).
std::int64_t order_runs(const ActivationMemoryProfile& p, Candidate& c, std::int64_t cutoff) {
  const bool any = any_offloaded(p, c.view());
  std::array<std::int64_t, 6> replay{};
  std::int64_t bound = 0, lowest = std::numeric_limits<std::int64_t>::max();
  for (std::size_t i = 0; i < c.size; ++i) {
    const Run& r = c.runs[i];
    replay[i] = group_replay(p, r.group, any);
    bound += r.count * (group_kept(p, r.group) + r.group.blocks * p.block_gradient_bytes);
    lowest = std::min(lowest, replay[i]);
  }
  if (bound + lowest > cutoff) return bound + lowest;
  for (std::size_t i = 1; i < c.size; ++i) {  // insertion sort: stable, at most six
    const Run x = c.runs[i];
    const std::int64_t key = replay[i];
    std::size_t j = i;
    for (; j > 0 && key < replay[j - 1]; --j) {
      c.runs[j] = c.runs[j - 1];
      replay[j] = replay[j - 1];
    }
    c.runs[j] = x;
    replay[j] = key;
  }
  return runs_peak(p, c.view());
}

/// The order of the runs with the lowest Release peak: each run in turn
/// gives the top group; the others go in the order that minimises a running
/// maximum (groups that keep less than their gradients first, by increasing
/// replay term; then the rest by decreasing replay term less what they keep).
/// That order does not depend on the counts, so it is sorted once (stably:
/// equal terms keep the candidate's order) and each top group is taken out
/// of it. A top group whose window (every group's top_kept and its top term)
/// or the tail is above `cutoff`, or not below the best peak so far, is not
/// tried: its peak could change nothing. Returns the peak, `c` left in that
/// order; or, when every order's is above `cutoff`, a value above it.
std::int64_t order_release_runs(const ActivationMemoryProfile& p, Candidate& c, std::int64_t cutoff) {
  const bool any = any_offloaded(p, c.view());
  std::array<std::int64_t, 6> rise{}, term{};
  std::array<std::size_t, 6> order{};
  std::int64_t kept_all = 0, blocks = 0;
  for (std::size_t i = 0; i < c.size; ++i) {
    const CheckpointGroup& g = c.runs[i].group;
    rise[i] = group_kept(p, g) - g.blocks * p.block_gradient_bytes;
    term[i] = group_replay(p, g, any) - g.blocks * p.block_gradient_bytes;
    order[i] = i;
    kept_all += c.runs[i].count * group_top_kept(p, g);
    blocks += c.runs[i].count * g.blocks;
  }
  const std::int64_t tail = blocks * p.block_gradient_bytes + p.tail_bytes;
  if (tail > cutoff) return tail;
  const auto before = [&](std::size_t x, std::size_t y) {
    const bool fx = rise[x] <= 0, fy = rise[y] <= 0;
    if (fx != fy) return fx;
    return fx ? term[x] < term[y] : term[x] - rise[x] > term[y] - rise[y];
  };
  bool sorted = false;
  Candidate best, trial;
  std::int64_t best_peak = std::numeric_limits<std::int64_t>::max();
  for (std::size_t t = 0; t < c.size; ++t) {
    if (t > 0 && c.runs[t].group == c.runs[t - 1].group) continue;
    const std::int64_t window = kept_all + group_top(p, c.runs[t].group, any);
    if (window > cutoff || window >= best_peak) continue;
    if (!sorted) {
      for (std::size_t i = 1; i < c.size; ++i) {  // insertion sort: stable, at most five
        const std::size_t x = order[i];
        std::size_t j = i;
        for (; j > 0 && before(x, order[j - 1]); --j) order[j] = order[j - 1];
        order[j] = x;
      }
      sorted = true;
    }
    trial.size = 0;
    for (std::size_t k = 0; k < c.size; ++k) {
      const std::size_t i = order[k];
      const std::int64_t count = i == t ? c.runs[i].count - 1 : c.runs[i].count;
      if (count > 0) trial.add(count, c.runs[i].group);
    }
    trial.add(1, c.runs[t].group);
    const std::int64_t peak = release_runs_peak(p, trial.view());
    if (peak < best_peak) {
      best_peak = peak;
      best = trial;
    }
  }
  if (best.size > 0) c = best;
  return best_peak;
}

/// The candidate's peak for the profile's backward, in the order with the
/// lowest one (`c` is reordered); a value above `cutoff` when it is above it.
std::int64_t arrange_runs(const ActivationMemoryProfile& p, Candidate& c, std::int64_t cutoff) {
  return p.graph == GraphAfterBackward::Release ? order_release_runs(p, c, cutoff) : order_runs(p, c, cutoff);
}

}  // namespace

ActivationMemoryPlan plan_activation_memory(const ActivationMemoryProfile& profile, std::int64_t budget_bytes) {
  const std::int64_t layers = profile.layers;
  if (layers < 1 || layers > 4096) {  // a profile no model has (its plans are checked as a model's)
    throw ValueError("[plan_activation_memory] the profile has " + std::to_string(layers) +
                     " layers (expected 1..4096)");
  }
  ActivationMemoryPlan best;
  best.budget_bytes = budget_bytes;
  best.disabled_peak_bytes = predicted_activation_peak(profile, uniform(layers, BlockRecompute::Nothing));
  std::int64_t smallest = std::numeric_limits<std::int64_t>::max();
  Candidate smallest_runs, best_runs, runs;
  std::int64_t best_groups = 0;
  bool found = false;
  const auto flops_of = [&](BlockRecompute r) { return profile.recompute_flops[index_of(r)]; };
  // Blocks are alike, so a plan is a count per option plus how the rest is
  // cut into segments (all of size k, the last one shorter), in the order
  // that gives the lowest peak: O(L⁴/24) candidates of at most five runs,
  // every one up to kExactLayers blocks (0.16 s at 96). Deeper, the counts go
  // in steps of ⌈L/kExactLayers⌉ (each range's end included, so keeping every
  // block and one segment of all are candidates) and the segment sizes are
  // 1..kExactLayers plus those steps: about as many candidates as at
  // kExactLayers, where 512 blocks took 71 s and 4096 would have taken days.
  constexpr std::int64_t kExactLayers = 96;
  const std::int64_t step = (layers + kExactLayers - 1) / kExactLayers;
  const auto next_count = [step](std::int64_t value, std::int64_t end) {
    return value < end && value + step > end ? end : value + step;  // ..., end
  };
  const auto next_size = [step](std::int64_t k, std::int64_t rest) {
    if (k < kExactLayers) return k + 1;
    return k < rest && k + step > rest ? rest : k + step;
  };
  for (std::int64_t keep = 0; keep <= layers; keep = next_count(keep, layers)) {
    for (std::int64_t att = 0; keep + att <= layers; att = next_count(att, layers - keep)) {
      for (std::int64_t mlp = 0; keep + att + mlp <= layers; mlp = next_count(mlp, layers - keep - att)) {
        const std::int64_t rest = layers - keep - att - mlp;
        for (std::int64_t k = rest == 0 ? 0 : 1; k <= rest; k = next_size(k, rest)) {
          runs.size = 0;
          if (k > 0 && rest / k > 0) runs.add(rest / k, {k, BlockRecompute::Whole});
          if (k > 0 && rest % k > 0) runs.add(1, {rest % k, BlockRecompute::Whole});
          if (mlp > 0) runs.add(mlp, {1, BlockRecompute::Mlp});
          if (att > 0) runs.add(att, {1, BlockRecompute::Attention});
          if (keep > 0) runs.add(keep, {1, BlockRecompute::Nothing});
          const double flops = static_cast<double>(att) * flops_of(BlockRecompute::Attention) +
                               static_cast<double>(mlp) * flops_of(BlockRecompute::Mlp) +
                               static_cast<double>(rest) * flops_of(BlockRecompute::Whole);
          // The largest peak that could change anything: below the smallest
          // so far, or within the budget for a plan that could be the best.
          std::int64_t cutoff = smallest - 1;
          if (!found || flops < best.recompute_flops) {
            cutoff = std::max(cutoff, budget_bytes);
          } else if (flops == best.recompute_flops) {
            cutoff = std::max(cutoff, std::min(budget_bytes, best.predicted_peak_bytes));
          }
          const std::int64_t peak = arrange_runs(profile, runs, cutoff);
          if (peak < smallest) {
            smallest = peak;
            smallest_runs = runs;
          }
          if (peak > budget_bytes) continue;
          std::int64_t groups = 0;
          for (const Run& r : runs.view()) groups += r.count;
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
    const ActivationCheckpointingPlan smallest_plan = expand(smallest_runs.view());
    throw ValueError("[plan_activation_memory] no plan fits an activation memory budget of " +
                     format_bytes(static_cast<double>(budget_bytes)) + " (" + std::to_string(budget_bytes) +
                     " bytes): the smallest plan (" + describe_plan(smallest_plan) + ") needs " +
                     format_bytes(static_cast<double>(smallest)) + " (" + std::to_string(smallest) +
                     " bytes) at batch " + std::to_string(profile.batch) + ", sequence length " +
                     std::to_string(profile.sequence_length) + "; ask for at least that, or a smaller batch");
  }
  best.plan = expand(best_runs.view());
  best.pinned_host_bytes = predicted_pinned_host_bytes(profile, best.plan);
  return best;
}

}  // namespace riftco_transformer
