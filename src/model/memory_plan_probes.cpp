// The activation memory planner's probes: 1-, 2- and 3-layer copies of the
// model, their allocator peaks read phase by phase (docs/checkpointing.md,
// "The prediction").
#include <algorithm>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "memory_plan_terms.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/memory.hpp"

namespace riftco_transformer {

using namespace memory_plan_detail;

namespace {

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

/// One probe's peaks: the forward's; then per block, window i runs from the
/// previous block's last gradient (from the backward's start for the last
/// block) to block i's last gradient; the tail after block 0's. Measured by
/// a meter of this thread's allocations (from the probe's start), so another
/// thread training meanwhile changes nothing (it did: the process's peak,
/// reset here, was theirs too).
struct BlockWindows : BackwardHooks {
  ThreadMemoryMeter* meter = nullptr;  // the probe's, while it runs
  std::vector<std::pair<Variable, std::size_t>> leaves;  // trainable block parameters, their block
  std::vector<std::int64_t> left;                         // per block, its parameters not yet final
  std::vector<std::int64_t> peaks;                        // per block, its window's peak
  std::int64_t forward = 0;                               // the forward's peak (the loss computed)
  std::int64_t read() {
    const std::int64_t peak = meter->peak_bytes();
    meter->reset_peak();
    return peak;
  }
  void gradient_final(const Variable& leaf, const Tensor&) override {
    for (const auto& [v, block] : leaves) {
      if (v.same_node(leaf) && --left[block] == 0) peaks[block] = read();
    }
  }
  std::vector<std::pair<Variable, Tensor>> finish() override { return {}; }
};

}  // namespace

std::int64_t measure_activation_peak(const DecoderOnlyTransformer& model, std::span<const std::int32_t> tokens,
                                     std::span<const std::int32_t> targets, std::int64_t batch) {
  const ThreadMemoryMeter meter(model.backend());  // the activations live with the parameters
  {
    Variable loss = model.loss(tokens, targets, batch);
    loss.backward(GraphAfterBackward::Release);  // as the training loops step
  }
  return meter.peak_bytes();
}
ActivationMemoryProfile profile_activation_memory(const DecoderOnlyTransformer& model, std::int64_t batch,
                                                  std::int64_t sequence_length) {
  const TransformerDimensions& d = model.dimensions();
  // batch at most 2^20, as the pipelines' (stage_settings.cpp): with the
  // context's 2^20 the token count cannot overflow (2^62 wrapped to 0).
  constexpr std::int64_t kMaxBatch = std::int64_t{1} << 20;
  if (batch <= 0 || batch > kMaxBatch || sequence_length <= 0 || sequence_length > d.context_length) {
    throw ValueError("[profile_activation_memory] batch " + std::to_string(batch) + " and sequence length " +
                     std::to_string(sequence_length) + " must be positive (batch <= " + std::to_string(kMaxBatch) +
                     ", sequence length <= context length " + std::to_string(d.context_length) + ")");
  }
  const std::vector<NamedParameter> trained = trainable(model);
  if (std::none_of(trained.begin(), trained.end(), [](const NamedParameter& q) { return q.name.rfind("blocks.", 0) == 0; })) {
    throw ValueError("[profile_activation_memory] no block of the model has a trainable parameter or an active trainable "
                     "LoRA adapter (trainable parameters: " + std::to_string(trained.size()) + ", none of them in the " +
                     std::to_string(d.layers) + " blocks): the planner plans a step that trains the blocks (the probes "
                     "split the peak where a block's last gradient is final); unfreeze a block parameter or add LoRA adapters");
  }
  // The probes run a step at this batch: its logits and their gradient
  // alone are 2·B·T·V floats. Refused up front when that cannot fit (batch
  // 2^20 ran until std::bad_alloc at 2.4 GiB under a 3 GB limit, and would
  // have needed about 240 GiB), as the runs refuse an allocation bomb.
  const double probe_floor = 4.0 * 2.0 * static_cast<double>(batch) * static_cast<double>(sequence_length) *
                             static_cast<double>(d.vocab_size + d.model_width);
  const double available = model.backend() == Backend::Cpu ? available_host_memory_bytes() : 0.0;
  if (available > 0 && probe_floor > available) {
    throw ValueError("[profile_activation_memory] profiling at batch " + std::to_string(batch) +
                     " and sequence length " + std::to_string(sequence_length) + " needs at least " +
                     format_bytes(probe_floor) + " (the logits and their gradient) but this machine has " +
                     format_bytes(available) + "; plan for a smaller batch");
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
    {
      ThreadMemoryMeter meter(m.backend());
      w.meter = &meter;
      {
        Variable loss = m.loss(tokens, targets, batch);
        w.forward = w.read();
        loss.backward(w, GraphAfterBackward::Release);
      }
      w.peaks.push_back(w.read());  // the tail
      w.meter = nullptr;
    }
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
  const BlockWindows segment2 = measure(*two, {{2, BlockRecompute::Whole}});
  const BlockWindows segment3 = measure(*three, {{3, BlockRecompute::Whole}});
  const std::vector<std::int64_t>& s2 = segment2.peaks;
  const std::vector<std::int64_t>& s3 = segment3.peaks;
  // Its forward holds all its blocks' traced activations at once.
  p.segment_forward_bytes = segment2.forward;
  p.segment_forward_extra_per_block = std::max<std::int64_t>(0, segment3.forward - segment2.forward);
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

}  // namespace riftco_transformer
