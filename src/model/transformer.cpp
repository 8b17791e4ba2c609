#include "riftco_transformer/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "../backend/kernels.hpp"
#include "transformer_core.hpp"

namespace riftco_transformer {
namespace {

void require_positive(std::int64_t value, const char* field) {
  if (value <= 0) {
    throw ValueError(std::string("[TransformerDimensions] ") + field + " must be > 0, got " + std::to_string(value));
  }
}

Variable parameter_leaf(Tensor value, const std::string& name) { return Variable(std::move(value), true, name); }

}  // namespace

void TransformerDimensions::validate() const {
  require_positive(vocab_size, "vocab_size");
  require_positive(context_length, "context_length");
  require_positive(model_width, "model_width");
  require_positive(heads, "heads");
  require_positive(layers, "layers");
  require_positive(feed_forward_width, "feed_forward_width");
  if (model_width % heads != 0) {
    throw ValueError("[TransformerDimensions] model_width " + std::to_string(model_width) +
                     " is not divisible by heads " + std::to_string(heads));
  }
  if (head_width() % 2 != 0) {
    throw ValueError("[TransformerDimensions] head width model_width/heads = " + std::to_string(head_width()) +
                     " must be even (RoPE rotates pairs)");
  }
  // Sanity bounds: far above anything a CPU trains, low enough that sizes
  // cannot overflow and a bad file cannot ask for absurd allocations.
  for (const auto& [value, name] : {std::pair{vocab_size, "vocab_size"}, std::pair{model_width, "model_width"},
                                    std::pair{feed_forward_width, "feed_forward_width"}}) {
    if (value > (std::int64_t{1} << 20)) {
      throw ValueError(std::string("[TransformerDimensions] ") + name + " " + std::to_string(value) +
                       " is above the limit 1048576");
    }
  }
  if (key_value_heads < 0 || key_value_heads > heads || heads % kv_heads() != 0) {
    throw ValueError("[TransformerDimensions] key_value_heads " + std::to_string(key_value_heads) +
                     " must divide heads " + std::to_string(heads) + " (0 = heads: ordinary multi-head attention)");
  }
  if (!is_valid_rope_base(rope_base)) {
    throw ValueError("[TransformerDimensions] rope_base must be a finite number > 1, got " + float_text(rope_base));
  }
  for (const auto& [value, limit, name] :
       {std::tuple{context_length, std::int64_t{1} << 20, "context_length"},
        std::tuple{layers, std::int64_t{4096}, "layers"}, std::tuple{heads, model_width, "heads (at most model_width)"}}) {
    if (value > limit) {
      throw ValueError(std::string("[TransformerDimensions] ") + name + " " + std::to_string(value) +
                       " is above the limit " + std::to_string(limit));
    }
  }
  if (vocab_size > (std::int64_t{1} << 31) - 1) {
    throw ValueError("[TransformerDimensions] vocab_size " + std::to_string(vocab_size) + " does not fit int32 ids");
  }
}

std::span<const ActivationCheckpointingKind> activation_checkpointing_kinds() {
  static constexpr ActivationCheckpointingKind kinds[] = {
      ActivationCheckpointingKind::Disabled, ActivationCheckpointingKind::TransformerBlock,
      ActivationCheckpointingKind::BlockSegments, ActivationCheckpointingKind::AttentionSubBlock,
      ActivationCheckpointingKind::MlpSubBlock};
  return kinds;
}

const char* activation_checkpointing_name(ActivationCheckpointingKind kind) {
  switch (kind) {
    case ActivationCheckpointingKind::Disabled:
      return "disabled";
    case ActivationCheckpointingKind::TransformerBlock:
      return "block";
    case ActivationCheckpointingKind::BlockSegments:
      return "segments";
    case ActivationCheckpointingKind::AttentionSubBlock:
      return "attention";
    case ActivationCheckpointingKind::MlpSubBlock:
      return "mlp";
    case ActivationCheckpointingKind::Planned:
      return "planned";
  }
  return "unknown";
}

const char* block_recompute_name(BlockRecompute recompute) {
  switch (recompute) {
    case BlockRecompute::Nothing:
      return "keep";
    case BlockRecompute::Attention:
      return "attention";
    case BlockRecompute::Mlp:
      return "mlp";
    case BlockRecompute::Whole:
      return "block";
  }
  return "unknown";
}

std::string describe_plan(const ActivationCheckpointingPlan& plan) {
  std::string out;
  for (std::size_t i = 0; i < plan.size();) {
    std::size_t j = i;
    while (j < plan.size() && plan[j] == plan[i]) ++j;
    const CheckpointGroup& g = plan[i];
    if (!out.empty()) out += ", ";
    out += g.blocks > 1 ? "segment of " + std::to_string(g.blocks) : std::string(block_recompute_name(g.recompute));
    out += " x" + std::to_string(j - i);
    i = j;
  }
  return out.empty() ? "(no blocks)" : out;
}

ActivationCheckpointingKind parse_activation_checkpointing(const std::string& name, const char* op) {
  std::string expected;
  for (const ActivationCheckpointingKind k : activation_checkpointing_kinds()) {
    if (name == activation_checkpointing_name(k)) return k;
    expected += std::string(expected.empty() ? "'" : ", '") + activation_checkpointing_name(k) + "'";
  }
  if (name == "planned") {
    throw ValueError(std::string("[") + op +
                     "] 'planned' is not a policy to name: a plan comes from an activation memory budget "
                     "(--activation-memory-budget, plan_activation_memory) or set_activation_checkpointing_plan");
  }
  throw ValueError(std::string("[") + op + "] unknown activation checkpointing policy '" + name + "' (expected " +
                   expected + ")");
}

bool is_valid_norm_epsilon(double value) {
  if (!(value > 0.0) || !(value < 1.0e39)) return false;  // NaN too; 1e39 is past float's range
  const auto rounded = static_cast<float>(value);
  return rounded > 0.0F && std::isfinite(rounded);
}

bool is_valid_rope_base(double value) {
  if (!(value > 1.0) || !(value < 1.0e39)) return false;  // NaN too; 1e39 is past float's range
  const auto rounded = static_cast<float>(value);
  return rounded > 1.0F && std::isfinite(rounded);
}

DecoderOnlyTransformer::DecoderOnlyTransformer(const TransformerDimensions& dimensions, Random& random,
                                               float norm_epsilon, FullSequenceAttentionKind attention,
                                               ActivationCheckpointingKind activation_checkpointing)
    : core_(std::make_shared<TransformerCore>()) {
  TransformerCore& m = *core_;
  dimensions.validate();
  m.dims = dimensions;
  if (!is_valid_norm_epsilon(norm_epsilon)) {
    throw ValueError("[DecoderOnlyTransformer] norm_epsilon must be a finite number > 0, got " + float_text(norm_epsilon));
  }
  m.eps = norm_epsilon;
  set_attention_kind(attention);
  set_activation_checkpointing_kind(activation_checkpointing);
  const std::int64_t v = m.dims.vocab_size;
  const std::int64_t c = m.dims.model_width;
  const std::int64_t f = m.dims.feed_forward_width;
  const std::int64_t kv = m.dims.kv_width();
  constexpr float kStd = 0.02F;
  const float residual_std = kStd / std::sqrt(2.0F * static_cast<float>(m.dims.layers));
  m.token_embedding = parameter_leaf(Tensor::normal({v, c}, random, 0.0F, kStd), "token_embedding.weight");
  for (std::int64_t i = 0; i < m.dims.layers; ++i) {
    // In base_block_parameters' order, which names them.
    const std::vector<std::string> n = base_block_parameter_names(static_cast<std::size_t>(i));
    BlockWeights b;
    b.attention_norm = parameter_leaf(Tensor::ones({c}), n[0]);
    b.query = parameter_leaf(Tensor::normal({c, c}, random, 0.0F, kStd), n[1]);
    b.key = parameter_leaf(Tensor::normal({kv, c}, random, 0.0F, kStd), n[2]);
    b.value = parameter_leaf(Tensor::normal({kv, c}, random, 0.0F, kStd), n[3]);
    b.output = parameter_leaf(Tensor::normal({c, c}, random, 0.0F, residual_std), n[4]);
    b.mlp_norm = parameter_leaf(Tensor::ones({c}), n[5]);
    b.gate = parameter_leaf(Tensor::normal({f, c}, random, 0.0F, kStd), n[6]);
    b.up = parameter_leaf(Tensor::normal({f, c}, random, 0.0F, kStd), n[7]);
    b.down = parameter_leaf(Tensor::normal({c, f}, random, 0.0F, residual_std), n[8]);
    m.blocks.push_back(std::move(b));
  }
  m.final_norm = parameter_leaf(Tensor::ones({c}), "final_norm.weight");
  m.lm_head = m.dims.tie_embeddings ? m.token_embedding
                                    : parameter_leaf(Tensor::normal({v, c}, random, 0.0F, kStd), "lm_head.weight");
}

DecoderOnlyTransformer::~DecoderOnlyTransformer() = default;

const TransformerDimensions& DecoderOnlyTransformer::dimensions() const { return core_->dims; }
float DecoderOnlyTransformer::norm_epsilon() const { return core_->eps; }
FullSequenceAttentionKind DecoderOnlyTransformer::attention_kind() const { return core_->attention; }
ActivationCheckpointingKind DecoderOnlyTransformer::activation_checkpointing_kind() const {
  const std::lock_guard<std::mutex> guard(core_->policy_lock);
  return core_->checkpointing;
}

void DecoderOnlyTransformer::set_attention_kind(FullSequenceAttentionKind kind) {
  if (kind != FullSequenceAttentionKind::Materialized && kind != FullSequenceAttentionKind::Flash) {
    throw ValueError("[set_attention_kind] unknown attention kind " + std::to_string(static_cast<int>(kind)));
  }
  core_->attention = kind;
}

void DecoderOnlyTransformer::set_activation_checkpointing_kind(ActivationCheckpointingKind kind) {
  const auto kinds = activation_checkpointing_kinds();
  if (std::find(kinds.begin(), kinds.end(), kind) == kinds.end()) {
    if (kind == ActivationCheckpointingKind::Planned) {
      throw ValueError("[set_activation_checkpointing_kind] Planned needs the plan: call set_activation_checkpointing_plan");
    }
    throw ValueError("[set_activation_checkpointing_kind] unknown policy " + std::to_string(static_cast<int>(kind)));
  }
  const std::lock_guard<std::mutex> guard(core_->policy_lock);
  core_->checkpointing = kind;
  core_->plan.clear();
}

void check_checkpointing_plan(const ActivationCheckpointingPlan& plan, std::int64_t layers, const std::string& tag) {
  const std::string op = "[" + tag + "] ";
  if (layers < 1 || layers > 4096) {
    throw ValueError(op + "the model or profile has " + std::to_string(layers) + " layers (expected 1..4096)");
  }
  std::int64_t covered = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const CheckpointGroup& g = plan[i];
    const auto r = static_cast<int>(g.recompute);
    if (r < 0 || r > static_cast<int>(BlockRecompute::Whole)) {
      throw ValueError(op + "group " + std::to_string(i) + " has unknown recompute " + std::to_string(r));
    }
    if (g.blocks < 1 || g.blocks > layers) {
      throw ValueError(op + "group " + std::to_string(i) + " covers " + std::to_string(g.blocks) +
                       " blocks (expected 1.." + std::to_string(layers) + ")");
    }
    if (g.blocks > 1 && g.recompute != BlockRecompute::Whole) {
      throw ValueError(op + "group " + std::to_string(i) + " covers " + std::to_string(g.blocks) +
                       " blocks with recompute '" + block_recompute_name(g.recompute) +
                       "': only 'block' (a segment) may span several blocks");
    }
    covered += g.blocks;
  }
  if (covered != layers) {
    throw ValueError(op + std::string("the groups cover ") + std::to_string(covered) + " blocks but the model has " +
                     std::to_string(layers));
  }
}

void DecoderOnlyTransformer::set_activation_checkpointing_plan(const ActivationCheckpointingPlan& plan) {
  check_checkpointing_plan(plan, core_->dims.layers, "set_activation_checkpointing_plan");
  ActivationCheckpointingPlan copy = plan;  // allocated before the lock
  const std::lock_guard<std::mutex> guard(core_->policy_lock);
  core_->plan.swap(copy);
  core_->checkpointing = ActivationCheckpointingKind::Planned;
}

void DecoderOnlyTransformer::set_activation_offload(bool offload) { core_->activation_offload = offload; }
bool DecoderOnlyTransformer::activation_offload() const { return core_->activation_offload; }

ActivationCheckpointingPlan DecoderOnlyTransformer::activation_checkpointing_plan() const {
  const TransformerCore& m = *core_;
  std::unique_lock<std::mutex> guard(m.policy_lock);  // one consistent policy
  if (m.checkpointing == ActivationCheckpointingKind::Planned) return m.plan;
  const ActivationCheckpointingKind kind = m.checkpointing;
  const std::int64_t segment_blocks = m.segment_blocks;
  guard.unlock();
  const std::int64_t layers = m.dims.layers;
  ActivationCheckpointingPlan plan;
  if (kind == ActivationCheckpointingKind::BlockSegments) {
    const std::int64_t k = segment_blocks > 0 ? std::min(segment_blocks, layers) : checkpoint_segment_blocks();
    for (std::int64_t i = 0; i < layers; i += k) plan.push_back({std::min(k, layers - i), BlockRecompute::Whole});
    return plan;
  }
  BlockRecompute r = BlockRecompute::Nothing;
  if (kind == ActivationCheckpointingKind::TransformerBlock) r = BlockRecompute::Whole;
  if (kind == ActivationCheckpointingKind::AttentionSubBlock) r = BlockRecompute::Attention;
  if (kind == ActivationCheckpointingKind::MlpSubBlock) r = BlockRecompute::Mlp;
  plan.assign(static_cast<std::size_t>(layers), CheckpointGroup{1, r});
  return plan;
}

void DecoderOnlyTransformer::set_checkpoint_segment_blocks(std::int64_t blocks) {
  if (blocks < 0) {
    throw ValueError("[set_checkpoint_segment_blocks] blocks must be >= 0 (0 = round(sqrt(layers))), got " +
                     std::to_string(blocks));
  }
  const std::lock_guard<std::mutex> guard(core_->policy_lock);
  core_->segment_blocks = blocks;
}

std::int64_t DecoderOnlyTransformer::checkpoint_segment_blocks() const {
  const std::int64_t layers = core_->dims.layers;
  std::int64_t segment_blocks = 0;
  {
    const std::lock_guard<std::mutex> guard(core_->policy_lock);
    segment_blocks = core_->segment_blocks;
  }
  if (segment_blocks > 0) return std::min(segment_blocks, layers);
  const auto k = static_cast<std::int64_t>(std::lround(std::sqrt(static_cast<double>(layers))));
  return std::max<std::int64_t>(1, k);
}

void DecoderOnlyTransformer::set_dropout(float p, std::uint64_t seed) {
  if (!(p >= 0.0F && p < 1.0F)) {
    throw ValueError("[set_dropout] probability must be in [0, 1), got " + float_text(p));
  }
  core_->dropout_probability = p;
  core_->dropout_random = Random(seed);
}

float DecoderOnlyTransformer::dropout() const { return core_->dropout_probability; }
void DecoderOnlyTransformer::set_training(bool training) { core_->training = training; }

namespace {
thread_local bool t_evaluating = false;
}  // namespace
DecoderOnlyTransformer::EvaluationGuard::EvaluationGuard() : previous_(t_evaluating) { t_evaluating = true; }
DecoderOnlyTransformer::EvaluationGuard::~EvaluationGuard() { t_evaluating = previous_; }
bool DecoderOnlyTransformer::EvaluationGuard::active() { return t_evaluating; }
bool DecoderOnlyTransformer::training() const { return core_->training; }
Random& DecoderOnlyTransformer::dropout_random() { return core_->dropout_random; }

const Variable& DecoderOnlyTransformer::token_embedding() const { return core_->token_embedding; }
const Variable& DecoderOnlyTransformer::final_norm() const { return core_->final_norm; }
const Variable& DecoderOnlyTransformer::lm_head() const { return core_->lm_head; }
const std::vector<BlockWeights>& DecoderOnlyTransformer::blocks() const { return core_->blocks; }

std::vector<Variable> DecoderOnlyTransformer::block_dependencies(std::size_t index) const {
  const StructureReadLock structure(*core_);
  return core_->block_dependencies(index);
}

std::vector<NamedParameter> DecoderOnlyTransformer::parameters() const {
  const StructureReadLock structure(*core_);
  // Names from the structure, not Variable::name(): a renamed Variable
  // (riftco's Variable.name setter) keeps its key in saved files.
  std::vector<NamedParameter> out;
  out.push_back({"token_embedding.weight", core_->token_embedding});
  for (std::size_t i = 0; i < core_->blocks.size(); ++i) {
    const std::vector<Variable> block = base_block_parameters(core_->blocks[i]);
    const std::vector<std::string> names = base_block_parameter_names(i);
    for (std::size_t k = 0; k < block.size(); ++k) out.push_back({names[k], block[k]});
  }
  out.push_back({"final_norm.weight", core_->final_norm});
  if (!core_->dims.tie_embeddings) out.push_back({"lm_head.weight", core_->lm_head});
  return out;
}

Variable DecoderOnlyTransformer::parameter(const std::string& name) const {
  for (const auto& list : {parameters(), lora_parameters()}) {
    for (const NamedParameter& p : list) {
      if (p.name == name) return p.variable;
    }
  }
  const std::string shown = name.size() > 120 ? name.substr(0, 120) + "... (" + std::to_string(name.size()) + " bytes)" : name;
  throw ValueError("[parameter] the model has no parameter named '" + shown + "'");
}

void TransformerCore::check_parameters(const char* op) const {
  const std::int64_t v = dims.vocab_size;
  const std::int64_t c = dims.model_width;
  const std::int64_t f = dims.feed_forward_width;
  const std::int64_t kv = dims.kv_width();
  // Every parameter lives on the token embedding's backend (to() moves them together).
  const Backend backend = token_embedding.backend();
  auto check = [op, backend](const Variable& p, const Shape& expected) {
    if (p.shape() != expected || p.backend() != backend) {
      throw ShapeError(std::string("[") + op + "] parameter '" + p.name() + "' is " + shape_string(p.shape()) +
                       " on " + backend_name(p.backend()) + " but the model's dimensions need " +
                       shape_string(expected) + " on " + backend_name(backend) +
                       " (set_value gave it another shape, or it was moved alone?)");
    }
  };
  check(token_embedding, {v, c});
  for (const BlockWeights& b : blocks) {
    for (const Variable& w : {b.attention_norm, b.mlp_norm}) check(w, {c});
    for (const Variable& w : {b.query, b.output}) check(w, {c, c});
    for (const Variable& w : {b.key, b.value}) check(w, {kv, c});
    for (const Variable& w : {b.gate, b.up}) check(w, {f, c});
    check(b.down, {c, f});
    for (const LoraAdapter& adapter : b.adapters) {
      const Shape& w = b.projection(adapter.target).shape();  // (out, in), checked above
      check(adapter.a, {lora.rank, w[1]});
      check(adapter.b, {w[0], lora.rank});
    }
  }
  check(final_norm, {c});
  check(lm_head, {v, c});
}

void DecoderOnlyTransformer::validate_parameters() const {
  const StructureReadLock structure(*core_);  // it walks the adapters
  core_->check_parameters("validate_parameters");
}

Backend DecoderOnlyTransformer::backend() const { return core_->token_embedding.backend(); }

void DecoderOnlyTransformer::to(Backend backend) {
  (void)backend::kernels(backend, "to");  // "not built" before anything moves
  const StructureWriteLock structure(*core_, "to");
  std::vector<NamedParameter> all = parameters();
  for (NamedParameter& p : lora_parameters()) all.push_back(std::move(p));
  // All or nothing (every copy before any change); each moved leaf's version
  // moves, so graphs and decode sessions built before are stale.
  std::vector<Variable> leaves;
  leaves.reserve(all.size());
  for (const NamedParameter& p : all) leaves.push_back(p.variable);
  Variable::to(leaves, backend);
}

std::int64_t DecoderOnlyTransformer::parameter_count() const {
  std::int64_t n = 0;
  for (const NamedParameter& p : parameters()) n += p.variable.value().numel();
  return n;
}

}  // namespace riftco_transformer
