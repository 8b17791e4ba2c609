// The forward pass and how the activation-checkpointing policy is applied.
// The trainer never sees checkpoint mechanics: it calls forward()/loss().
#include <algorithm>

#include "riftco_transformer/checkpoint.hpp"
#include "../ops/fused.hpp"
#include "riftco_transformer/ops.hpp"
#include "activation_offload.hpp"
#include "transformer_core.hpp"

namespace riftco_transformer {

std::vector<Variable> base_block_parameters(const BlockWeights& b) {
  return {b.attention_norm, b.query, b.key, b.value, b.output, b.mlp_norm, b.gate, b.up, b.down};
}

std::vector<std::string> base_block_parameter_names(std::size_t index) {
  const std::string p = "blocks." + std::to_string(index) + ".";
  return {p + "attention_norm.weight", p + "attention.query.weight", p + "attention.key.weight",
          p + "attention.value.weight", p + "attention.output.weight", p + "mlp_norm.weight",
          p + "mlp.gate.weight", p + "mlp.up.weight", p + "mlp.down.weight"};
}

const Variable& BlockWeights::projection(LoraTarget target) const {
  switch (target) {
    case LoraTarget::Query:
      return query;
    case LoraTarget::Key:
      return key;
    case LoraTarget::Value:
      return value;
    case LoraTarget::Output:
      return output;
    case LoraTarget::Gate:
      return gate;
    case LoraTarget::Up:
      return up;
    case LoraTarget::Down:
      return down;
  }
  throw ValueError("[projection] unknown LoRA target " + std::to_string(static_cast<int>(target)));
}

std::vector<Variable> TransformerCore::block_dependencies(std::size_t index) const {
  if (index >= blocks.size()) {
    throw ValueError("[block_dependencies] block " + std::to_string(index) + " of " + std::to_string(blocks.size()));
  }
  std::vector<Variable> deps = base_block_parameters(blocks[index]);
  if (lora_active) {
    for (const LoraAdapter& adapter : blocks[index].adapters) {
      deps.push_back(adapter.a);
      deps.push_back(adapter.b);
    }
  }
  return deps;
}

std::vector<Variable> TransformerCore::sub_block_dependencies(std::size_t index, bool attention) const {
  if (index >= blocks.size()) {
    throw ValueError("[sub_block_dependencies] block " + std::to_string(index) + " of " +
                     std::to_string(blocks.size()));
  }
  const BlockWeights& b = blocks[index];
  std::vector<Variable> deps = attention ? std::vector<Variable>{b.attention_norm, b.query, b.key, b.value, b.output}
                                         : std::vector<Variable>{b.mlp_norm, b.gate, b.up, b.down};
  if (lora_active) {
    for (const LoraAdapter& adapter : b.adapters) {
      const bool attention_target = adapter.target == LoraTarget::Query || adapter.target == LoraTarget::Key ||
                                    adapter.target == LoraTarget::Value || adapter.target == LoraTarget::Output;
      if (attention_target != attention) continue;
      deps.push_back(adapter.a);
      deps.push_back(adapter.b);
    }
  }
  return deps;
}

std::vector<Variable> TransformerCore::all_leaves() const {
  std::vector<Variable> out{token_embedding, final_norm, lm_head};
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    for (Variable& v : block_dependencies(i)) out.push_back(std::move(v));
  }
  return out;
}

Variable TransformerCore::project(const BlockWeights& block, LoraTarget target, const Variable& x) const {
  Variable y = linear(x, block.projection(target));
  if (!lora_active) return y;
  for (const LoraAdapter& adapter : block.adapters) {
    if (adapter.target == target) y = add(y, scale(linear(linear(x, adapter.a), adapter.b), adapter.scale));
  }
  return y;
}

namespace {

/// True when the block has an active adapter on `target`.
bool adapted(const TransformerCore& core, const BlockWeights& block, LoraTarget target) {
  if (!core.lora_active) return false;
  for (const LoraAdapter& adapter : block.adapters) {
    if (adapter.target == target) return true;
  }
  return false;
}

/// y plus the block's active adapters for `target`, added to columns
/// [offset, offset + their width) of y (y holds several projections side by
/// side).
Variable with_adapters(const TransformerCore& core, const BlockWeights& block, LoraTarget target, const Variable& x,
                       Variable y, std::int64_t offset) {
  if (!core.lora_active) return y;
  for (const LoraAdapter& adapter : block.adapters) {
    if (adapter.target == target) {
      y = fused::add_columns(y, scale(linear(linear(x, adapter.a), adapter.b), adapter.scale), offset);
    }
  }
  return y;
}

/// rms_norm(h) projected by the stacked weights of `targets` (side by side),
/// plus their adapters. Without adapters the normalized input is not kept
/// (norm_linear_packed recomputes it); the values are the same either way.
Variable normed_projections(const TransformerCore& core, const BlockWeights& block, const Variable& h,
                            const Variable& norm, std::vector<LoraTarget> targets) {
  std::vector<Variable> weights;
  bool any_adapter = false;
  for (const LoraTarget t : targets) {
    weights.push_back(block.projection(t));
    any_adapter = any_adapter || adapted(core, block, t);
  }
  if (!any_adapter) return fused::norm_linear_packed(h, norm, core.eps, weights);
  const Variable x = rms_norm(h, norm, core.eps);
  Variable y = fused::linear_packed(x, weights);
  std::int64_t offset = 0;
  for (const LoraTarget t : targets) {
    y = with_adapters(core, block, t, x, y, offset);
    offset += block.projection(t).shape()[0];
  }
  return y;
}

}  // namespace

Variable TransformerCore::attention_sub_block(std::size_t index, const Variable& h, FullSequenceAttentionKind kind,
                                              float drop, bool value_needed) {
  const BlockWeights& w = blocks.at(index);
  const std::int64_t b = h.shape()[0];
  const std::int64_t t = h.shape()[1];
  const std::int64_t heads = dims.heads;
  const std::int64_t d = dims.head_width();
  const std::int64_t c = dims.model_width;
  // Without dropout the residual add fuses with the projection before it
  // (the projection is then a temporary, not a graph value).
  const bool fuse_residual = drop == 0.0F;
  Variable merged;  // (B, T, C)
  const std::int64_t kv_heads = dims.kv_heads();
  const float base = dims.rope_base;
  if (kind == FullSequenceAttentionKind::Flash && kv_heads == heads) {
    // q, k, v side by side in one tensor; rope and the flash kernel read them
    // where they are (no head split/merge copies).
    const Variable qkv = normed_projections(*this, w, h, w.attention_norm,
                                            {LoraTarget::Query, LoraTarget::Key, LoraTarget::Value});  // (B, T, 3C)
    merged = fused::rope_attention_packed(qkv, heads, base);
  } else {
    const Variable x = rms_norm(h, w.attention_norm, eps);  // (B, T, C)
    auto split_heads = [&](const Variable& y, std::int64_t n) {  // (B, T, n·D) → (B, n, T, D)
      return permute(reshape(y, {b, t, n, d}), {0, 2, 1, 3});
    };
    // Grouped-query attention: each key/value head serves heads/kv_heads query heads.
    auto shared = [&](const Variable& y) { return kv_heads == heads ? y : repeat_heads(y, heads / kv_heads); };
    const Variable q = rope(split_heads(project(w, LoraTarget::Query, x), heads), 0, base);              // (B, H, T, D)
    const Variable k = shared(rope(split_heads(project(w, LoraTarget::Key, x), kv_heads), 0, base));     // (B, H, T, D)
    const Variable v = shared(split_heads(project(w, LoraTarget::Value, x), kv_heads));                  // (B, H, T, D)
    const Variable a = causal_attention(q, k, v, kind);                    // (B, H, T, D)
    merged = reshape(permute(a, {0, 2, 1, 3}), {b, t, c});
  }
  return fuse_residual && !adapted(*this, w, LoraTarget::Output)
             ? fused::linear_residual(h, merged, w.output, value_needed)
             : add(h, dropout(project(w, LoraTarget::Output, merged), drop, dropout_random));  // (B, T, C)
}

Variable TransformerCore::mlp_sub_block(std::size_t index, const Variable& h1, float drop, bool value_needed) {
  const BlockWeights& w = blocks.at(index);
  const bool fuse_residual = drop == 0.0F;
  // Gate and up side by side, SwiGLU reads both halves.
  const Variable gate_up =
      normed_projections(*this, w, h1, w.mlp_norm, {LoraTarget::Gate, LoraTarget::Up});  // (B, T, 2F)
  if (fuse_residual && !adapted(*this, w, LoraTarget::Down)) {
    return fused::swiglu_linear_residual(h1, gate_up, w.down, value_needed);  // (B, T, C)
  }
  const Variable m = fused::swiglu_packed(gate_up);                                  // (B, T, F)
  return add(h1, dropout(project(w, LoraTarget::Down, m), drop, dropout_random));  // (B, T, C)
}

Variable TransformerCore::block_forward(std::size_t index, const Variable& h, FullSequenceAttentionKind kind,
                                        float drop, bool value_needed) {
  return mlp_sub_block(index, attention_sub_block(index, h, kind, drop), drop, value_needed);
}

namespace {

/// Parks a checkpointed group's input after its checkpoint ran (offload on).
Variable parked_after(const std::shared_ptr<ActivationOffload>& offload, const Variable& input, Variable output) {
  if (offload) offload->park(input.value());
  return output;
}

/// Runs blocks [first, last) on h as one checkpoint whose dependencies are
/// every leaf those blocks use. The callable holds the shared core (not the
/// model object) and the execution policy of this forward; with `offload`,
/// it brings its parked input back first when it runs as a replay. In a
/// replay the last block's final projection is not computed: the replay's
/// output value is never read (checkpoint_replaying()).
Variable checkpointed_blocks(const std::shared_ptr<TransformerCore>& core, std::size_t first, std::size_t last,
                             const Variable& h, FullSequenceAttentionKind kind, float drop,
                             const std::shared_ptr<ActivationOffload>& offload) {
  std::vector<Variable> deps;
  for (std::size_t i = first; i < last; ++i) {
    for (Variable& v : core->block_dependencies(i)) deps.push_back(std::move(v));
  }
  const std::size_t slot = offload ? offload->next_index() : 0;
  auto recompute = [core, first, last, kind, drop, offload, slot](const Variable& input) {
    const StructureReadLock structure(*core);
    if (offload) offload->before_call(slot);
    const bool replaying = checkpoint_replaying();
    Variable x = input;
    for (std::size_t i = first; i < last; ++i) x = core->block_forward(i, x, kind, drop, !replaying || i + 1 < last);
    return x;
  };
  CheckpointOptions options;  // dropout masks replay by default (preserve_random_state)
  options.name = last - first == 1 ? "block " + std::to_string(first)
                                   : "blocks " + std::to_string(first) + "-" + std::to_string(last - 1);
  return parked_after(offload, h, checkpoint(h, deps, recompute, options));
}

/// Block `index`'s attention (attention = true) or MLP sub-block as one
/// checkpoint whose dependencies are the leaves that sub-block reads. With
/// `offload` (the attention sub-block only: its input is the block boundary)
/// the input is parked like a block's. A replay skips the half's final
/// projection, as checkpointed_blocks does.
Variable checkpointed_sub_block(const std::shared_ptr<TransformerCore>& core, std::size_t index, bool attention,
                                const Variable& h, FullSequenceAttentionKind kind, float drop,
                                const std::shared_ptr<ActivationOffload>& offload = nullptr) {
  const std::size_t slot = offload ? offload->next_index() : 0;
  auto recompute = [core, index, attention, kind, drop, offload, slot](const Variable& input) {
    const StructureReadLock structure(*core);
    if (offload) offload->before_call(slot);
    const bool value_needed = !checkpoint_replaying();
    return attention ? core->attention_sub_block(index, input, kind, drop, value_needed)
                     : core->mlp_sub_block(index, input, drop, value_needed);
  };
  CheckpointOptions options;  // dropout masks replay by default (preserve_random_state)
  options.name = "block " + std::to_string(index) + (attention ? " attention" : " mlp");
  return parked_after(offload, h, checkpoint(h, core->sub_block_dependencies(index, attention), recompute, options));
}

/// The sequence length of `count` ids in `batch` rows; ShapeError when they
/// do not split evenly or a row is longer than the context. Reads no id, so a
/// caller (the C ABI) whose buffers are too short is refused before it reads.
std::int64_t sequence_length(const TransformerDimensions& dims, std::size_t count, std::int64_t batch) {
  if (batch <= 0 || count == 0 || static_cast<std::int64_t>(count) % batch != 0) {
    throw ShapeError("[forward] " + std::to_string(count) + " tokens cannot be split into batch " +
                     std::to_string(batch));
  }
  const std::int64_t t = static_cast<std::int64_t>(count) / batch;
  if (t > dims.context_length) {
    throw ShapeError("[forward] sequence length " + std::to_string(t) + " exceeds the context length " +
                     std::to_string(dims.context_length));
  }
  return t;
}

}  // namespace

Variable DecoderOnlyTransformer::forward(std::span<const std::int32_t> tokens, std::int64_t batch) const {
  TransformerCore& m = *core_;
  const StructureReadLock structure(m);
  const std::int64_t t = sequence_length(m.dims, tokens.size(), batch);
  m.check_parameters("forward");
  const float drop = m.training && !EvaluationGuard::active() ? m.dropout_probability : 0.0F;
  const bool grad = !NoGradGuard::active();
  Variable h = embedding(m.token_embedding, tokens, {batch, t});  // (B, T, C)
  // Activation offload: the block-boundary inputs of checkpointed groups
  // (block, segment, attention) go to host memory; cuda models only.
  std::shared_ptr<ActivationOffload> offload;
  if (grad && m.activation_offload && h.backend() == Backend::Cuda) offload = std::make_shared<ActivationOffload>();
  std::size_t i = 0;
  for (const CheckpointGroup& g : activation_checkpointing_plan()) {
    const auto n = static_cast<std::size_t>(g.blocks);
    if (!grad || g.recompute == BlockRecompute::Nothing) {
      for (std::size_t j = i; j < i + n; ++j) h = m.block_forward(j, h, m.attention, drop);
    } else if (g.recompute == BlockRecompute::Attention) {
      h = m.mlp_sub_block(i, checkpointed_sub_block(core_, i, true, h, m.attention, drop, offload), drop);
    } else if (g.recompute == BlockRecompute::Mlp) {
      h = checkpointed_sub_block(core_, i, false, m.attention_sub_block(i, h, m.attention, drop), m.attention, drop);
    } else {
      h = checkpointed_blocks(core_, i, i + n, h, m.attention, drop, offload);
    }
    i += n;
  }
  if (offload) offload->finish_forward();
  h = rms_norm(h, m.final_norm, m.eps);  // (B, T, C)
  return linear(h, m.lm_head);          // (B, T, V)
}

Variable DecoderOnlyTransformer::loss(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets,
                                      std::int64_t batch, std::int32_t ignore_index) const {
  if (targets.size() != tokens.size()) {
    throw ShapeError("[loss] " + std::to_string(tokens.size()) + " tokens but " + std::to_string(targets.size()) +
                     " targets");
  }
  // Before the forward, which draws dropout masks: a refused call leaves the
  // dropout stream (saved in training checkpoints) where it was. The shape
  // first: a sequence longer than the context is refused before any id is
  // read (ASan: the C ABI's test passes 17 ids over 16-id buffers).
  (void)sequence_length(dimensions(), tokens.size(), batch);
  check_cross_entropy_targets("loss", targets, dimensions().vocab_size, ignore_index);
  return cross_entropy(forward(tokens, batch), targets, ignore_index);
}

}  // namespace riftco_transformer
