// The activation memory planner: probes, prediction and the search over
// per-block options (include/riftco_transformer/memory_plan.hpp).
#include "riftco_transformer/memory_plan.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <set>
#include <vector>

#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/memory.hpp"

namespace riftco_transformer {

namespace {

constexpr std::size_t kOptions = 4;
constexpr BlockRecompute kAll[kOptions] = {BlockRecompute::Nothing, BlockRecompute::Attention, BlockRecompute::Mlp,
                                           BlockRecompute::Whole};
std::size_t index_of(BlockRecompute r) { return static_cast<std::size_t>(r); }

/// "blocks.7.mlp.up.weight" -> "blocks.0.mlp.up.weight".
std::string as_first_block(const std::string& name) {
  if (name.rfind("blocks.", 0) != 0) return name;
  const std::size_t dot = name.find('.', 7);
  return dot == std::string::npos ? name : "blocks.0" + name.substr(dot);
}

/// The parameters and LoRA adapters a step trains: those that require grad
/// (adapters only while active: inactive ones are not in the graph).
std::vector<NamedParameter> trainable(const DecoderOnlyTransformer& m) {
  std::vector<NamedParameter> out;
  std::vector<NamedParameter> lists[] = {m.parameters(), m.lora_active() ? m.lora_parameters() : std::vector<NamedParameter>{}};
  for (std::vector<NamedParameter>& list : lists) {
    for (NamedParameter& q : list) {
      if (q.variable.requires_grad()) out.push_back(std::move(q));
    }
  }
  return out;
}

/// The model with `layers` blocks: same widths, attention, dropout and
/// adapters (weights are random: memory does not depend on them). Blocks
/// are alike in the replica, so each replica block trains a parameter or
/// adapter when any block of the model trains it (frozen blocks, or one
/// block's adapters frozen: the most any block trains, never less; a
/// frozen parameter's weight gradient is neither made nor kept).
std::unique_ptr<DecoderOnlyTransformer> replica(const DecoderOnlyTransformer& model, std::int64_t layers) {
  TransformerDimensions dims = model.dimensions();
  dims.layers = layers;
  Random random(1);
  auto copy = std::make_unique<DecoderOnlyTransformer>(dims, random, model.norm_epsilon(), model.attention_kind());
  if (model.has_lora()) {
    copy->add_lora(model.lora_config(), random);
    copy->set_lora_active(model.lora_active());
  }
  copy->set_dropout(model.dropout(), 0);
  copy->set_training(model.training());
  std::set<std::string> trained;
  for (const NamedParameter& p : trainable(model)) trained.insert(as_first_block(p.name));
  for (std::vector<NamedParameter> list : {copy->parameters(), copy->lora_parameters()}) {
    for (NamedParameter& p : list) p.variable.set_requires_grad(trained.contains(as_first_block(p.name)));
  }
  copy->to(model.backend());  // probed where the model runs (that backend's allocator)
  return copy;
}

ActivationCheckpointingPlan uniform(std::int64_t layers, BlockRecompute r) {
  return ActivationCheckpointingPlan(static_cast<std::size_t>(layers), CheckpointGroup{1, r});
}

std::int64_t group_bytes(const ActivationMemoryProfile& p, const CheckpointGroup& g) {
  if (g.recompute != BlockRecompute::Whole) return p.per_block[index_of(g.recompute)];
  return g.blocks * p.per_block[index_of(BlockRecompute::Whole)] - (g.blocks - 1) * p.block_input_bytes;
}

std::int64_t group_base(const ActivationMemoryProfile& p, const CheckpointGroup& g) {
  const std::int64_t base = p.base[index_of(g.recompute)];
  return g.recompute == BlockRecompute::Whole ? base + (g.blocks - 1) * p.segment_extra_per_block : base;
}

/// Whether offload parks this group's input: it starts at a block boundary
/// and is checkpointed (a block, a segment, an attention group).
bool offloaded(const ActivationMemoryProfile& p, const CheckpointGroup& g) {
  return p.activation_offload && (g.recompute == BlockRecompute::Whole || g.recompute == BlockRecompute::Attention);
}

/// What the group keeps on the device between its forward and its backward.
std::int64_t group_kept(const ActivationMemoryProfile& p, const CheckpointGroup& g) {
  const std::int64_t kept = group_bytes(p, g) - g.blocks * p.block_gradient_bytes;
  return offloaded(p, g) ? kept - p.block_input_bytes : kept;
}

/// The group's replay term beside the gradients: its base, plus the offloaded
/// inputs on the device while it runs (its own, back for the replay, and the
/// previous group's, prefetched; only the prefetched one for a group that is
/// not offloaded) once `any` group is offloaded.
std::int64_t group_replay(const ActivationMemoryProfile& p, const CheckpointGroup& g, bool any) {
  const std::int64_t inputs = !any ? 0 : offloaded(p, g) ? 2 : 1;
  return group_base(p, g) + inputs * p.block_input_bytes;
}

/// `count` equal groups side by side: a candidate plan is at most five runs
/// (segments of k, one shorter segment, mlp, attention, keep).
struct Run {
  std::int64_t count;
  CheckpointGroup group;
};

bool any_offloaded(const ActivationMemoryProfile& p, const std::vector<Run>& runs) {
  return std::any_of(runs.begin(), runs.end(), [&](const Run& r) { return offloaded(p, r.group); });
}

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

/// predicted_activation_peak of the expanded runs, in O(runs): while group g
/// replays, every group's kept values are live, the groups after g (and g
/// itself) hold their gradients, and g's replay term sits on top:
/// peak = Σ kept + max_g (gradients of groups ≥ g + replay_g). Within a run
/// the first group has the largest suffix of gradients, so it sets the run's term.
std::int64_t runs_peak(const ActivationMemoryProfile& p, const std::vector<Run>& runs) {
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

/// What group g adds to the top window: profile.top_kept per
/// block, a segment's input once; offload as group_kept.
std::int64_t group_top_kept_without_offload(const ActivationMemoryProfile& p, const CheckpointGroup& g) {
  const std::int64_t per = p.top_kept[index_of(g.recompute)];
  return g.recompute == BlockRecompute::Whole ? g.blocks * per - (g.blocks - 1) * p.block_input_bytes : per;
}
std::int64_t group_top_kept(const ActivationMemoryProfile& p, const CheckpointGroup& g) {
  const std::int64_t kept = group_top_kept_without_offload(p, g);
  return offloaded(p, g) ? kept - p.block_input_bytes : kept;
}

/// The top group's term above every group's top_kept: the head's backward
/// or its own (a segment's replay: release_runs_peak).
std::int64_t group_top(const ActivationMemoryProfile& p, const CheckpointGroup& g, bool any) {
  const std::int64_t inputs = !any ? 0 : offloaded(p, g) ? 2 : 1;
  return p.top[index_of(g.recompute)] + inputs * p.block_input_bytes;
}

/// The Release peak of the runs in this order (first run = first blocks):
/// max(each group's forward above the values the groups below it keep;
/// Σ kept + top term of the last group; for every other group g, the
/// kept values of the groups below g + the gradients of the groups above g
/// + g's replay term; all gradients + the tail). Within a run the terms
/// change by (kept - gradients) per group, so its first or last member sets
/// it. The group that holds block 0 is apart: it keeps later_block_extra
/// less, and its replay and forward are the base and forward read at block 0
/// (every other group's add later_block_extra).
std::int64_t release_runs_peak(const ActivationMemoryProfile& p, const std::vector<Run>& runs) {
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
    const std::int64_t forward = p.forward[index_of(g.recompute)] + extra;  // a segment forwards one block at a time
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

/// One probe's peaks: the forward's; then per block, window i runs from the
/// previous block's last gradient (from the backward's start for the last
/// block) to block i's last gradient; the tail after block 0's.
struct BlockWindows : BackwardHooks {
  Backend backend = Backend::Cpu;
  std::int64_t before = 0;
  std::vector<std::pair<Variable, std::size_t>> leaves;  // trainable block parameters, their block
  std::vector<std::int64_t> left;                         // per block, its parameters not yet final
  std::vector<std::int64_t> peaks;                        // per block, its window's peak
  std::int64_t forward = 0;                               // the forward's peak (the loss computed)
  std::int64_t read() {
    const std::int64_t peak = memory_stats(backend).peak_bytes - before;
    reset_peak_memory(backend);
    return peak;
  }
  void gradient_final(const Variable& leaf, const Tensor&) override {
    for (const auto& [v, block] : leaves) {
      if (v.same_node(leaf) && --left[block] == 0) peaks[block] = read();
    }
  }
  std::vector<std::pair<Variable, Tensor>> finish() override { return {}; }
};

ActivationCheckpointingPlan expand(const std::vector<Run>& runs) {
  ActivationCheckpointingPlan plan;
  for (const Run& r : runs) plan.insert(plan.end(), static_cast<std::size_t>(r.count), r.group);
  return plan;
}

}  // namespace

std::int64_t parse_byte_size(const std::string& text, const char* op) {
  const auto bad = [&](const std::string& why) {
    return ValueError(std::string("[") + op + "] '" + text + "' is not a byte size (" + why +
                      "; e.g. 256MiB, 1.5GiB, 300MB or a number of bytes)");
  };
  std::size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  std::size_t j = i;
  while (j < text.size() && (std::isdigit(static_cast<unsigned char>(text[j])) || text[j] == '.')) ++j;
  if (j == i) throw bad("it does not start with a number");
  const std::string number = text.substr(i, j - i);
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value)) throw bad("the number is malformed");
  std::string unit;
  for (std::size_t k = j; k < text.size(); ++k) {
    if (!std::isspace(static_cast<unsigned char>(text[k]))) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[k])));
  }
  double scale = 0;
  const struct { const char* name; double scale; } units[] = {
      {"", 1},       {"b", 1},         {"k", 1e3},        {"kb", 1e3},          {"kib", 1024.0},
      {"m", 1e6},    {"mb", 1e6},      {"mib", 1048576.0}, {"g", 1e9},           {"gb", 1e9},
      {"gib", 1073741824.0}, {"t", 1e12}, {"tb", 1e12},   {"tib", 1099511627776.0}};
  for (const auto& u : units) {
    if (unit == u.name) scale = u.scale;
  }
  if (scale == 0) throw bad("unknown unit '" + unit + "'");
  const double bytes = std::floor(value * scale);
  if (!(bytes >= 1)) throw bad("it must be at least one byte");
  if (bytes > 9.0e18) throw bad("it is too large");
  return static_cast<std::int64_t>(bytes);
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  std::size_t u = 0;
  while (std::fabs(bytes) >= 1024.0 && u + 1 < std::size(units)) {
    bytes /= 1024.0;
    ++u;
  }
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, u == 0 ? "%.0f %s" : "%.1f %s", bytes, units[u]);
  return buffer;
}

std::int64_t measure_activation_peak(const DecoderOnlyTransformer& model, std::span<const std::int32_t> tokens,
                                     std::span<const std::int32_t> targets, std::int64_t batch) {
  const Backend backend = model.backend();  // the activations live with the parameters
  const std::int64_t before = memory_stats(backend).live_bytes;
  reset_peak_memory(backend);
  {
    Variable loss = model.loss(tokens, targets, batch);
    loss.backward(GraphAfterBackward::Release);  // as the training loops step
  }
  return memory_stats(backend).peak_bytes - before;
}

std::int64_t ActivationMemoryProfile::kept_bytes(BlockRecompute option) const {
  return per_block[index_of(option)] - block_gradient_bytes;
}

ActivationMemoryProfile profile_activation_memory(const DecoderOnlyTransformer& model, std::int64_t batch,
                                                  std::int64_t sequence_length) {
  const TransformerDimensions& d = model.dimensions();
  if (batch <= 0 || sequence_length <= 0 || sequence_length > d.context_length) {
    throw ValueError("[profile_activation_memory] batch " + std::to_string(batch) + " and sequence length " +
                     std::to_string(sequence_length) + " must be positive (sequence length <= context length " +
                     std::to_string(d.context_length) + ")");
  }
  const std::vector<NamedParameter> trained = trainable(model);
  if (std::none_of(trained.begin(), trained.end(), [](const NamedParameter& q) { return q.name.rfind("blocks.", 0) == 0; })) {
    throw ValueError("[profile_activation_memory] no block of the model has a trainable parameter or an active trainable "
                     "LoRA adapter (trainable parameters: " + std::to_string(trained.size()) + ", none of them in the " +
                     std::to_string(d.layers) + " blocks): the planner plans a step that trains the blocks (the probes "
                     "split the peak where a block's last gradient is final); unfreeze a block parameter or add LoRA adapters");
  }
  ActivationMemoryProfile p;
  p.layers = d.layers;
  p.batch = batch;
  p.sequence_length = sequence_length;
  const std::int64_t n = batch * sequence_length;
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(n));
  std::vector<std::int32_t> targets(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<std::int32_t>((i * 7919 + 3) % static_cast<std::size_t>(d.vocab_size));
    targets[i] = static_cast<std::int32_t>((i * 31 + 1) % static_cast<std::size_t>(d.vocab_size));
  }
  auto one = replica(model, 1);
  auto two = replica(model, 2);
  auto three = replica(model, 3);
  // A probe's forward, per block window and tail peaks (GraphAfterBackward::Release, as the trainer).
  const auto measure = [&](DecoderOnlyTransformer& m, const ActivationCheckpointingPlan& plan) {
    m.set_activation_checkpointing_plan(plan);
    BlockWindows w;
    w.backend = m.backend();
    const std::size_t layers = static_cast<std::size_t>(m.dimensions().layers);
    w.left.assign(layers, 0);
    w.peaks.assign(layers, 0);
    for (const NamedParameter& q : trainable(m)) {
      if (q.name.rfind("blocks.", 0) != 0) continue;
      const std::size_t block = std::stoul(q.name.substr(7));
      w.leaves.emplace_back(q.variable, block);
      ++w.left[block];
    }
    // Saving the dropout stream keeps every probe's masks alike (memory does not depend on them).
    const Random::State state = m.dropout_random().state();
    w.before = memory_stats(w.backend).live_bytes;
    reset_peak_memory(w.backend);
    {
      Variable loss = m.loss(tokens, targets, batch);
      w.forward = w.read();
      loss.backward(w, GraphAfterBackward::Release);
    }
    w.peaks.push_back(w.read());  // the tail
    m.dropout_random().set_state(state);
    for (NamedParameter& q : m.parameters()) q.variable.clear_grad();
    return w;
  };
  measure(*one, uniform(1, BlockRecompute::Nothing));  // warm-up: caches (e.g. rotary tables) filled once
  measure(*two, uniform(2, BlockRecompute::Nothing));
  measure(*three, uniform(3, BlockRecompute::Nothing));
  std::int64_t gradients = 0;  // a block's parameter and adapter gradients
  for (const NamedParameter& q : trainable(*one)) {
    if (q.name.rfind("blocks.0.", 0) == 0) {
      gradients += q.variable.value().numel() * static_cast<std::int64_t>(sizeof(float));
    }
  }
  p.graph = GraphAfterBackward::Release;
  p.block_gradient_bytes = gradients;
  p.tail_bytes = 0;
  // Per option on 1-3 uniform blocks: what a block keeps, what it adds to
  // the top window, its forward and the tail. Then every pair (a block with
  // option `below` under one with `above`): the top term above every kept
  // value, the lower block's backward beside the upper one's gradients (its
  // window starts with the end of the upper block's backward) and the tail,
  // each the largest over the neighbours (LoRA adapters make them differ
  // slightly; without them they are equal).
  std::array<std::int64_t, kOptions> first_base{};  // block 0's base below a block with the same option
  for (const BlockRecompute r : kAll) {
    const BlockWindows w1 = measure(*one, uniform(1, r));
    const BlockWindows w2 = measure(*two, uniform(2, r));
    const BlockWindows w3 = measure(*three, uniform(3, r));
    first_base[index_of(r)] = w2.peaks[0] - gradients;
    // What a block keeps while a block above it runs backward (its window
    // beside the same gradients with one block more below it), and what it
    // adds to the top window (with adapters the two differ slightly).
    p.per_block[index_of(r)] = w3.peaks[1] - w2.peaks[0] + gradients;
    p.top_kept[index_of(r)] = w3.peaks[2] - w2.peaks[1];
    p.forward[index_of(r)] = w1.forward;
    p.tail_bytes = std::max({p.tail_bytes, w1.peaks[1] - gradients, w2.peaks[2] - 2 * gradients, w3.peaks[3] - 3 * gradients});
  }
  p.top.fill(std::numeric_limits<std::int64_t>::min());
  p.base.fill(std::numeric_limits<std::int64_t>::min());
  for (const BlockRecompute below : kAll) {
    for (const BlockRecompute above : kAll) {
      const BlockWindows w = measure(*two, {{1, below}, {1, above}});
      p.top[index_of(above)] = std::max(p.top[index_of(above)], w.peaks[1] - p.top_kept[index_of(below)] - p.top_kept[index_of(above)]);
      p.base[index_of(below)] = std::max(p.base[index_of(below)], w.peaks[0] - gradients);
      p.tail_bytes = std::max(p.tail_bytes, w.peaks[2] - 2 * gradients);
    }
  }
  // Block 1 with each option between a keep block 0 and a block like it:
  // what it needs beyond the same block as block 0 (base and kept read at
  // block 0 differ from the other blocks' when block 0's input is a constant).
  for (const BlockRecompute r : {BlockRecompute::Attention, BlockRecompute::Mlp, BlockRecompute::Whole}) {
    const BlockWindows w = measure(*three, {{1, BlockRecompute::Nothing}, {1, r}, {1, r}});
    p.later_block_extra[index_of(r)] =
        w.peaks[1] - gradients - p.kept_bytes(BlockRecompute::Nothing) - first_base[index_of(r)];
  }
  p.block_input_bytes = n * d.model_width * static_cast<std::int64_t>(sizeof(float));
  p.activation_offload = model.activation_offload() && model.backend() == Backend::Cuda;
  // A segment of two below a block: its windows beside one block's gradients.
  const BlockWindows w3 = measure(*three, {{2, BlockRecompute::Whole}, {1, BlockRecompute::Whole}});
  p.segment_extra_per_block = std::max<std::int64_t>(
      0, std::max(w3.peaks[0], w3.peaks[1]) - gradients - p.base[index_of(BlockRecompute::Whole)]);
  // A segment as the last group: of two blocks, and one block more.
  // (A segment's blocks' gradients are final together, in any order: its
  // window is the largest of its blocks'.)
  const std::vector<std::int64_t> s2 = measure(*two, {{2, BlockRecompute::Whole}}).peaks;
  const std::vector<std::int64_t> s3 = measure(*three, {{3, BlockRecompute::Whole}}).peaks;
  const std::int64_t top2 = *std::max_element(s2.begin(), s2.end() - 1);
  const std::int64_t top3 = *std::max_element(s3.begin(), s3.end() - 1);
  p.top_segment_bytes = top2;
  for (const BlockRecompute below : kAll) {  // and above a block with each option
    const std::vector<std::int64_t> w = measure(*three, {{1, below}, {2, BlockRecompute::Whole}}).peaks;
    const std::int64_t first_kept = p.kept_bytes(below) - p.later_block_extra[index_of(below)];
    p.top_segment_bytes = std::max(p.top_segment_bytes, std::max(w[1], w[2]) - first_kept);
  }
  p.top_segment_extra_per_block = std::max<std::int64_t>(0, top3 - top2);

  const double c = static_cast<double>(d.model_width);
  const double rows = static_cast<double>(n);
  const double t = static_cast<double>(sequence_length);
  const double attention = 2.0 * rows * c * (2.0 * c + 2.0 * static_cast<double>(d.kv_width())) +
                           2.0 * static_cast<double>(batch) * static_cast<double>(d.heads) *
                               static_cast<double>(d.head_width()) * t * (t + 1.0);
  const double mlp = 6.0 * rows * c * static_cast<double>(d.feed_forward_width);
  p.recompute_flops = {0.0, attention, mlp, attention + mlp};
  p.forward_flops = static_cast<double>(d.layers) * (attention + mlp) + 2.0 * rows * c * static_cast<double>(d.vocab_size);
  return p;
}

std::int64_t predicted_activation_peak(const ActivationMemoryProfile& profile, const ActivationCheckpointingPlan& plan) {
  std::int64_t blocks = 0;
  std::vector<Run> runs;
  for (const CheckpointGroup& g : plan) {
    blocks += g.blocks;
    runs.push_back({1, g});
  }
  if (blocks != profile.layers) {
    throw ValueError("[predicted_activation_peak] the plan covers " + std::to_string(blocks) + " blocks, the profile " +
                     std::to_string(profile.layers));
  }
  return profile.graph == GraphAfterBackward::Release ? release_runs_peak(profile, runs) : runs_peak(profile, runs);
}

std::int64_t predicted_pinned_host_bytes(const ActivationMemoryProfile& profile, const ActivationCheckpointingPlan& plan) {
  std::int64_t bytes = 0;
  for (const CheckpointGroup& g : plan) bytes += offloaded(profile, g) ? profile.block_input_bytes : 0;
  return bytes;
}

double plan_recompute_flops(const ActivationMemoryProfile& profile, const ActivationCheckpointingPlan& plan) {
  double flops = 0;
  for (const CheckpointGroup& g : plan) flops += static_cast<double>(g.blocks) * profile.recompute_flops[index_of(g.recompute)];
  return flops;
}

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

std::string describe_activation_memory_plan(const ActivationMemoryProfile& profile, const ActivationMemoryPlan& plan) {
  char line[256];
  std::string out;
  std::snprintf(line, sizeof line, "activation memory budget %s: %s\n", format_bytes(static_cast<double>(plan.budget_bytes)).c_str(),
                describe_plan(plan.plan).c_str());
  out += line;
  std::snprintf(line, sizeof line,
                "  predicted activation peak %s (keeping everything: %s; the smallest plan: %s)\n",
                format_bytes(static_cast<double>(plan.predicted_peak_bytes)).c_str(),
                format_bytes(static_cast<double>(plan.disabled_peak_bytes)).c_str(),
                format_bytes(static_cast<double>(plan.smallest_feasible_bytes)).c_str());
  out += line;
  if (profile.activation_offload) {
    std::snprintf(line, sizeof line, "  activation offload: %s of block inputs in pinned host memory\n",
                  format_bytes(static_cast<double>(plan.pinned_host_bytes)).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line, "  recompute %.3g GFLOP per step (%.1f%% of the forward)\n", plan.recompute_flops / 1e9,
                profile.forward_flops > 0 ? 100.0 * plan.recompute_flops / profile.forward_flops : 0.0);
  out += line;
  std::int64_t first = 0;
  for (std::size_t i = 0; i < plan.plan.size();) {
    const CheckpointGroup& g = plan.plan[i];
    std::size_t j = i;
    while (j < plan.plan.size() && plan.plan[j] == g) ++j;  // a run of equal groups: one line
    const std::int64_t blocks = static_cast<std::int64_t>(j - i) * g.blocks;
    const std::int64_t saved = g.recompute == BlockRecompute::Whole ? profile.block_input_bytes
                                                                    : profile.kept_bytes(g.recompute);
    const std::int64_t kept = offloaded(profile, g) ? saved - profile.block_input_bytes : saved;  // on the device
    const std::string which = blocks == 1 ? "block " + std::to_string(first)
                                          : "blocks " + std::to_string(first) + "-" + std::to_string(first + blocks - 1);
    const std::string what = g.blocks > 1 ? "segments of " + std::to_string(g.blocks) + " blocks"
                             : g.recompute == BlockRecompute::Nothing ? std::string("keep everything")
                                                                      : std::string("recompute ") + block_recompute_name(g.recompute);
    std::snprintf(line, sizeof line, "  %-14s %-28s keeps %s per %s\n", which.c_str(), what.c_str(),
                  format_bytes(static_cast<double>(kept)).c_str(), g.blocks > 1 ? "segment" : "block");
    out += line;
    first += blocks;
    i = j;
  }
  return out;
}

}  // namespace riftco_transformer
