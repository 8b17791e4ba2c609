// LoRA adapters on the model: add, remove, (de)activate, freeze, merge.
// Every structural change marks the adapted weights changed, so any graph
// built before it (checkpointed or not) is rejected as stale.
#include <algorithm>
#include <cmath>

#include "../backend/kernels.hpp"
#include "transformer_core.hpp"

namespace riftco_transformer {
namespace {

constexpr LoraTarget kAllTargets[] = {LoraTarget::Query, LoraTarget::Key, LoraTarget::Value, LoraTarget::Output,
                                      LoraTarget::Gate,  LoraTarget::Up,  LoraTarget::Down};

std::string adapter_prefix(std::size_t block, LoraTarget target) {
  const bool attention = target == LoraTarget::Query || target == LoraTarget::Key || target == LoraTarget::Value ||
                         target == LoraTarget::Output;
  std::string prefix = "blocks.";
  prefix.append(std::to_string(block)).append(attention ? ".attention." : ".mlp.").append(lora_target_name(target));
  return prefix;
}

void mark_adapters_changed(TransformerCore& m, const std::string& why) {
  for (BlockWeights& b : m.blocks) {
    for (LoraAdapter& adapter : b.adapters) {
      Variable w = b.projection(adapter.target);
      w.mark_changed(why);
      adapter.a.mark_changed(why);
      adapter.b.mark_changed(why);
    }
  }
}

}  // namespace

const char* lora_target_name(LoraTarget target) {
  switch (target) {
    case LoraTarget::Query:
      return "query";
    case LoraTarget::Key:
      return "key";
    case LoraTarget::Value:
      return "value";
    case LoraTarget::Output:
      return "output";
    case LoraTarget::Gate:
      return "gate";
    case LoraTarget::Up:
      return "up";
    case LoraTarget::Down:
      return "down";
  }
  return "unknown";
}

std::vector<LoraTarget> parse_lora_targets(const std::string& list, const char* op) {
  if (list.empty()) {  // was "unknown LoRA target ''": a LoRA config adapts at least one projection
    throw ValueError(std::string("[") + op +
                     "] targets must not be empty (expected query, key, value, output, gate, up, down, attention, "
                     "mlp or all)");
  }
  std::vector<LoraTarget> out;
  auto add = [&out](LoraTarget t) {
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  };
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = list.find(',', start);
    const std::string name = list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    bool known = false;
    for (const LoraTarget t : kAllTargets) {
      if (name == lora_target_name(t)) {
        add(t);
        known = true;
      }
    }
    if (name == "attention" || name == "all") {
      for (LoraTarget t : {LoraTarget::Query, LoraTarget::Key, LoraTarget::Value, LoraTarget::Output}) add(t);
      known = true;
    }
    if (name == "mlp" || name == "all") {
      for (LoraTarget t : {LoraTarget::Gate, LoraTarget::Up, LoraTarget::Down}) add(t);
      known = true;
    }
    if (!known) {
      throw ValueError(std::string("[") + op + "] unknown LoRA target '" + name +
                       "' (expected query, key, value, output, gate, up, down, attention, mlp or all)");
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::string lora_targets_string(const std::vector<LoraTarget>& targets) {
  std::string out;
  for (const LoraTarget t : targets) {
    if (!out.empty()) out.push_back(',');
    out.append(lora_target_name(t));
  }
  return out;
}

void LoraConfig::validate() const {
  if (rank <= 0) throw ValueError("[LoraConfig] rank must be > 0, got " + std::to_string(rank));
  if (!(alpha > 0.0F) || !std::isfinite(alpha)) {
    throw ValueError("[LoraConfig] alpha must be finite and > 0, got " + float_text(alpha));
  }
  if (targets.empty()) throw ValueError("[LoraConfig] targets must not be empty");
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (std::find(targets.begin(), targets.begin() + static_cast<std::ptrdiff_t>(i), targets[i]) !=
        targets.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw ValueError(std::string("[LoraConfig] target '") + lora_target_name(targets[i]) + "' given twice");
    }
  }
}

namespace {

/// (out, in) of a target projection for `d`.
std::pair<std::int64_t, std::int64_t> projection_shape(const TransformerDimensions& d, LoraTarget target) {
  switch (target) {
    case LoraTarget::Gate:
    case LoraTarget::Up:
      return {d.feed_forward_width, d.model_width};
    case LoraTarget::Down:
      return {d.model_width, d.feed_forward_width};
    case LoraTarget::Key:
    case LoraTarget::Value:
      return {d.kv_width(), d.model_width};
    default:
      return {d.model_width, d.model_width};
  }
}

}  // namespace

void LoraConfig::validate_for(const TransformerDimensions& dimensions, const char* op) const {
  validate();
  for (const LoraTarget target : targets) {
    const auto [out, in] = projection_shape(dimensions, target);
    if (rank > std::min(out, in)) {
      throw ValueError(std::string("[") + op + "] LoRA rank " + std::to_string(rank) + " is larger than min(out, in) = " +
                       std::to_string(std::min(out, in)) + " of the " + lora_target_name(target) +
                       " projection; a full-rank update needs no more");
    }
  }
}

std::int64_t LoraConfig::parameter_count(const TransformerDimensions& dimensions) const {
  std::int64_t per_block = 0;
  for (const LoraTarget target : targets) {
    const auto [out, in] = projection_shape(dimensions, target);
    per_block += rank * (out + in);
  }
  return per_block * dimensions.layers;
}

std::vector<std::pair<std::string, Shape>> DecoderOnlyTransformer::lora_parameter_layout(
    const LoraConfig& config) const {
  config.validate_for(core_->dims, "lora_parameter_layout");
  std::vector<std::pair<std::string, Shape>> out;
  for (std::size_t i = 0; i < core_->blocks.size(); ++i) {
    for (const LoraTarget target : config.targets) {
      const Shape& w = core_->blocks[i].projection(target).shape();  // (out, in)
      const std::string prefix = adapter_prefix(i, target);
      out.emplace_back(prefix + ".lora_a", Shape{config.rank, w[1]});
      out.emplace_back(prefix + ".lora_b", Shape{w[0], config.rank});
    }
  }
  return out;
}

void DecoderOnlyTransformer::add_lora(const LoraConfig& config, Random& random) {
  config.validate_for(core_->dims, "add_lora");
  TransformerCore& m = *core_;
  const StructureWriteLock structure(m, "add_lora");
  m.check_parameters("add_lora");
  if (m.has_lora) throw ValueError("[add_lora] the model already has LoRA adapters; remove_lora() or merge_lora() first");
  // Build everything first; publish only when nothing can throw.
  std::vector<std::vector<LoraAdapter>> built(m.blocks.size());
  for (std::size_t i = 0; i < m.blocks.size(); ++i) {
    for (const LoraTarget target : config.targets) {
      const Variable& w = m.blocks[i].projection(target);
      const std::int64_t out = w.shape()[0];
      const std::int64_t in = w.shape()[1];
      const float bound = 1.0F / std::sqrt(static_cast<float>(in));
      const std::string prefix = adapter_prefix(i, target);
      LoraAdapter adapter;
      adapter.target = target;
      // Drawn on the host, then placed with the weight they adapt.
      const Backend backend = w.value().backend();
      adapter.a = Variable(Tensor::uniform({config.rank, in}, random, -bound, bound).to(backend), true,
                           prefix + ".lora_a");
      adapter.b = Variable(Tensor::zeros({out, config.rank}, backend), true, prefix + ".lora_b");
      adapter.scale = config.scale();
      built[i].push_back(std::move(adapter));
    }
  }
  for (std::size_t i = 0; i < m.blocks.size(); ++i) m.blocks[i].adapters = std::move(built[i]);
  m.lora = config;
  m.has_lora = true;
  m.lora_active = true;
  mark_adapters_changed(m, "LoRA adapter added");
}

void DecoderOnlyTransformer::remove_lora() {
  TransformerCore& m = *core_;
  const StructureWriteLock structure(m, "remove_lora");
  if (!m.has_lora) return;
  mark_adapters_changed(m, "LoRA adapter removed");
  for (BlockWeights& b : m.blocks) b.adapters.clear();
  m.has_lora = false;
  m.lora_active = true;
}

bool DecoderOnlyTransformer::has_lora() const { return core_->has_lora; }
LoraConfig DecoderOnlyTransformer::lora_config() const {
  const StructureReadLock structure(*core_);
  return core_->lora;
}
bool DecoderOnlyTransformer::lora_active() const { return core_->lora_active; }

void DecoderOnlyTransformer::set_lora_active(bool active) {
  TransformerCore& m = *core_;
  const StructureWriteLock structure(m, "set_lora_active");
  if (!m.has_lora) throw ValueError("[set_lora_active] the model has no LoRA adapters");
  if (m.lora_active == active) return;
  m.lora_active = active;
  mark_adapters_changed(m, active ? "LoRA adapter activated" : "LoRA adapter deactivated");
}

std::vector<NamedParameter> DecoderOnlyTransformer::lora_parameters() const {
  const StructureReadLock structure(*core_);
  std::vector<NamedParameter> out;
  for (std::size_t i = 0; i < core_->blocks.size(); ++i) {
    for (const LoraAdapter& adapter : core_->blocks[i].adapters) {
      // From the structure, as parameters(): not the Variables' labels.
      const std::string prefix = adapter_prefix(i, adapter.target);
      out.push_back({prefix + ".lora_a", adapter.a});
      out.push_back({prefix + ".lora_b", adapter.b});
    }
  }
  return out;
}

void DecoderOnlyTransformer::set_base_trainable(bool trainable) {
  const StructureWriteLock structure(*core_, "set_base_trainable");
  for (NamedParameter& p : parameters()) p.variable.set_requires_grad(trainable);
}

void DecoderOnlyTransformer::merge_lora() {
  TransformerCore& m = *core_;
  const StructureWriteLock structure(m, "merge_lora");
  if (!m.has_lora) throw ValueError("[merge_lora] the model has no LoRA adapters");
  if (!m.lora_active) {
    throw ValueError("[merge_lora] the adapters are inactive: activate them to merge, or remove_lora()");
  }
  m.check_parameters("merge_lora");  // the product below reads raw buffers by these shapes
  // Compute every merged weight first, then publish.
  std::vector<std::pair<Variable, Tensor>> merged;
  for (BlockWeights& b : m.blocks) {
    for (const LoraAdapter& adapter : b.adapters) {
      const Variable& w = b.projection(adapter.target);
      Tensor base = w.value().clone();  // each (block, target) has one adapter
      const Tensor& av = adapter.a.value();  // (r, in)
      const Tensor& bv = adapter.b.value();  // (out, r)
      // base (out, in) += scale · B A
      backend::kernels_for("merge_lora", base, av, bv)
          .gemm(false, false, bv.size(0), av.size(1), av.size(0), adapter.scale, bv.device_data(), bv.size(1),
                av.device_data(), av.size(1), 1.0F, base.device_data(), base.size(1));
      merged.emplace_back(w, std::move(base));
    }
  }
  mark_adapters_changed(m, "LoRA adapters merged");
  for (auto& [w, value] : merged) {
    Variable target = w;
    target.set_value(std::move(value));
  }
  for (BlockWeights& b : m.blocks) b.adapters.clear();
  m.has_lora = false;
  m.lora_active = true;
}

}  // namespace riftco_transformer
