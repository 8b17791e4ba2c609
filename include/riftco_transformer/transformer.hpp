#pragma once
// Decoder-only transformer: token embedding → L blocks of
//   [RMSNorm → causal multi-head self-attention with RoPE → residual;
//    RMSNorm → SwiGLU MLP → residual]
// → final RMSNorm → LM head (untied by default). No biases. Optional
// grouped-query attention (fewer key/value heads than query heads, query head
// h reads key/value head h / (heads / key_value_heads)), a configurable RoPE
// base and an LM head tied to the token embedding.
//
// Initialization: every weight matrix ~ N(0, 0.02²); the two residual
// projections of each block (attention output, MLP down) ~ N(0, (0.02/√(2L))²);
// RMSNorm weights = 1.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "riftco_transformer/attention.hpp"
#include "riftco_transformer/lora.hpp"
#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

struct TransformerDimensions {
  std::int64_t vocab_size = 256;
  std::int64_t context_length = 128;
  std::int64_t model_width = 128;
  std::int64_t heads = 4;
  std::int64_t layers = 4;
  std::int64_t feed_forward_width = 344;
  /// Key/value heads (grouped-query attention). 0 (the default) or `heads`
  /// is ordinary multi-head attention; otherwise heads % key_value_heads == 0.
  std::int64_t key_value_heads = 0;
  /// RoPE base: pair i of a head rotates by position · rope_base^(-2i/D).
  float rope_base = 10000.0F;
  /// The LM head is the token embedding (one parameter, both uses' gradients add).
  bool tie_embeddings = false;

  /// Throws ValueError naming the bad field: every size > 0, model_width
  /// divisible by heads, an even head width (RoPE rotates pairs), heads
  /// divisible by key_value_heads, a finite rope_base > 1.
  void validate() const;
  std::int64_t head_width() const { return model_width / heads; }
  /// The effective key/value head count (key_value_heads, 0 meaning heads).
  std::int64_t kv_heads() const { return key_value_heads == 0 ? heads : key_value_heads; }
  /// Rows of the key and value projections: kv_heads() · head_width().
  std::int64_t kv_width() const { return kv_heads() * head_width(); }
  /// Parameters a model of these dimensions has (no adapters).
  std::int64_t parameter_count() const {
    const std::int64_t c = model_width;
    const std::int64_t kv = heads > 0 ? kv_width() : 0;
    return (tie_embeddings ? 1 : 2) * vocab_size * c + c +
           layers * (2 * c + 2 * c * c + 2 * kv * c + 3 * c * feed_forward_width);
  }
  /// Field by field, key_value_heads compared by kv_heads() (0 == heads).
  bool operator==(const TransformerDimensions& o) const {
    return vocab_size == o.vocab_size && context_length == o.context_length && model_width == o.model_width &&
           heads == o.heads && layers == o.layers && feed_forward_width == o.feed_forward_width &&
           kv_heads() == o.kv_heads() && rope_base == o.rope_base && tie_embeddings == o.tie_embeddings;
  }
};

/// How a training forward retains activations. Not architecture: it is not in
/// TransformerDimensions, the C config struct or the model-state file.
enum class ActivationCheckpointingKind : std::uint8_t {
  Disabled = 0,          ///< ordinary graph (the compatibility default)
  TransformerBlock = 1,  ///< checkpoint every transformer block
  BlockSegments = 2,     ///< checkpoint every k consecutive blocks as one segment
  /// Checkpoint each block's attention sub-block (norm, q/k/v, attention,
  /// output projection, residual): its internals are replayed in backward;
  /// the block input and the MLP side's values are kept.
  AttentionSubBlock = 3,
  /// Checkpoint each block's MLP sub-block (norm, gate/up, SwiGLU, down,
  /// residual): the attention side's values are kept.
  MlpSubBlock = 4,
  /// A per-block plan (set_activation_checkpointing_plan, usually chosen by
  /// plan_activation_memory for a budget). Not a named policy: it is not in
  /// activation_checkpointing_kinds() and cannot be parsed from a name.
  Planned = 5,
};
/// Every policy, in enum order.
std::span<const ActivationCheckpointingKind> activation_checkpointing_kinds();
/// "disabled" / "block" / "segments" / "attention" / "mlp" ("planned" for Planned).
const char* activation_checkpointing_name(ActivationCheckpointingKind kind);
ActivationCheckpointingKind parse_activation_checkpointing(const std::string& name,
                                                           const char* op = "activation_checkpointing");

/// What one checkpoint group recomputes in backward.
enum class BlockRecompute : std::uint8_t {
  Nothing = 0,    ///< keep everything (no checkpoint)
  Attention = 1,  ///< recompute the attention sub-block (keep the MLP side)
  Mlp = 2,        ///< recompute the MLP sub-block (keep the attention side)
  Whole = 3,      ///< recompute the whole group of blocks (one checkpoint)
};
/// "keep" / "attention" / "mlp" / "block".
const char* block_recompute_name(BlockRecompute recompute);

/// `blocks` consecutive blocks treated alike. blocks > 1 is only allowed with
/// Whole (a segment: one checkpoint around all of them); otherwise each block
/// of the group gets its own checkpoint of the given kind.
struct CheckpointGroup {
  std::int64_t blocks = 1;
  BlockRecompute recompute = BlockRecompute::Nothing;
  bool operator==(const CheckpointGroup&) const = default;
};
/// Groups in block order covering every block exactly once.
using ActivationCheckpointingPlan = std::vector<CheckpointGroup>;
/// e.g. "segments of 3 ×2, block ×1, attention ×4, keep ×5" (runs of equal groups merged).
std::string describe_plan(const ActivationCheckpointingPlan& plan);

struct NamedParameter {
  std::string name;  // e.g. "blocks.3.attention.query.weight"
  Variable variable;
};

/// The parameters of one block, in a fixed order. Optional LoRA adapters
/// (added by the LoRA layer) sit beside the projection they adapt.
struct BlockWeights {
  Variable attention_norm;               // (C)
  Variable query, key, value, output;    // query, output (C, C); key, value (KVH·D, C)
  Variable mlp_norm;                     // (C)
  Variable gate, up;                     // (F, C)
  Variable down;                         // (C, F)
  std::vector<LoraAdapter> adapters;     // LoRA adapters on this block's projections (maybe none)
  /// The base weight a target adapts.
  const Variable& projection(LoraTarget target) const;
};

struct TransformerCore;

/// Whether `value` may be a model's RMSNorm epsilon: a number > 0 that is a
/// finite float once rounded to one. The one rule of the constructor, the
/// pipelines' configs, model-state files and Hugging Face config.json (the
/// importer, so every model the exporter writes reads back).
bool is_valid_norm_epsilon(double value);
/// Whether `value` may be a model's RoPE base: a number that is a finite
/// float above 1 once rounded to one. The one rule of TransformerDimensions,
/// model files (metadata "rope_base") and Hugging Face config.json
/// ("rope_theta"), so every model a run saves loads again.
bool is_valid_rope_base(double value);

class DecoderOnlyTransformer {
 public:
  DecoderOnlyTransformer(const TransformerDimensions& dimensions, Random& random, float norm_epsilon = 1.0e-5F,
                         FullSequenceAttentionKind attention = FullSequenceAttentionKind::Materialized,
                         ActivationCheckpointingKind activation_checkpointing = ActivationCheckpointingKind::Disabled);
  ~DecoderOnlyTransformer();
  // Not copyable or movable (a moved-from model would have no state to
  // answer with); hold it by std::unique_ptr to pass it around.
  DecoderOnlyTransformer(DecoderOnlyTransformer&&) = delete;
  DecoderOnlyTransformer& operator=(DecoderOnlyTransformer&&) = delete;
  DecoderOnlyTransformer(const DecoderOnlyTransformer&) = delete;
  DecoderOnlyTransformer& operator=(const DecoderOnlyTransformer&) = delete;

  const TransformerDimensions& dimensions() const;
  float norm_epsilon() const;

  FullSequenceAttentionKind attention_kind() const;
  void set_attention_kind(FullSequenceAttentionKind kind);

  ActivationCheckpointingKind activation_checkpointing_kind() const;
  /// Safe at any time, including while a DecodeSession exists (decode never
  /// checkpoints). Affects graphs built by later forward() calls only.
  void set_activation_checkpointing_kind(ActivationCheckpointingKind kind);
  /// Blocks per segment for BlockSegments; 0 (the default) picks
  /// round(√layers) as in Chen et al. 2016.
  void set_checkpoint_segment_blocks(std::int64_t blocks);
  /// The effective segment size (resolves 0 to round(√layers), at least 1).
  std::int64_t checkpoint_segment_blocks() const;
  /// Sets a per-block plan and the kind Planned. ValueError unless the groups
  /// cover exactly `layers` blocks with blocks >= 1 and segments (blocks > 1)
  /// only recomputing Whole. set_activation_checkpointing_kind() drops it.
  void set_activation_checkpointing_plan(const ActivationCheckpointingPlan& plan);
  /// The plan forward() follows: the explicit plan under Planned, else the
  /// uniform policy written as groups (segments of checkpoint_segment_blocks()).
  ActivationCheckpointingPlan activation_checkpointing_plan() const;
  /// Activation offload (PyTorch's save_on_cpu, DeepSpeed's
  /// cpu_checkpointing), off by default: the input of every checkpointed
  /// group that starts at a block boundary (recompute 'block', a segment, or
  /// 'attention') leaves the device for pinned host memory once the forward
  /// has used it, and is copied back asynchronously one group ahead of the
  /// backward's replays. Gradients are bit-identical to offload off. On a cpu
  /// model, without grad mode or with no checkpointed group it does nothing
  /// (docs/checkpointing.md, "Activation offload"). Affects later forward()
  /// calls only.
  void set_activation_offload(bool offload);
  bool activation_offload() const;

  /// Residual dropout after the attention output and MLP down projections
  /// of every block, active while training() is true. p = 0 (the default)
  /// disables it. `seed` restarts the dropout generator.
  void set_dropout(float p, std::uint64_t seed = 0);
  float dropout() const;
  void set_training(bool training);
  bool training() const;
  /// While one is alive, forwards on this thread run as in evaluation (no
  /// dropout) whatever training() says; the flag and other threads' forwards
  /// are untouched. evaluate() and the pipelines' validation use it: they
  /// used to flip the shared flag, so a training forward on another thread
  /// ran without dropout, and two evaluations left the model in eval mode.
  class EvaluationGuard {
   public:
    EvaluationGuard();
    ~EvaluationGuard();
    EvaluationGuard(const EvaluationGuard&) = delete;
    EvaluationGuard& operator=(const EvaluationGuard&) = delete;
    static bool active();

   private:
    bool previous_;
  };
  /// The dropout generator (for saving and restoring a training run).
  Random& dropout_random();

  /// Every parameter with its stable name, in a fixed order.
  std::vector<NamedParameter> parameters() const;
  /// ShapeError naming the first parameter (base or adapter) whose shape or
  /// backend no longer fits the dimensions (set_value can give a leaf any
  /// shape). forward(), decoding, merge_lora() and saving call it first.
  void validate_parameters() const;
  /// The named base parameter or LoRA adapter (a name parameters() or
  /// lora_parameters() gives); ValueError naming a missing one.
  Variable parameter(const std::string& name) const;
  std::int64_t parameter_count() const;
  /// The backend every parameter lives on (the token embedding's).
  Backend backend() const;
  /// Moves every parameter (base and adapters, with their gradients) to
  /// `backend`. Each move bumps the leaf's version, so graphs built before
  /// are rejected as stale (StaleGraphError), and so are decode sessions
  /// opened before (open a new one: its caches follow the model).
  /// BackendError for a backend this build lacks or cannot use (nothing moves).
  void to(Backend backend);

  const Variable& token_embedding() const;
  const Variable& final_norm() const;
  /// The LM head weight (the token embedding itself when tie_embeddings).
  const Variable& lm_head() const;
  const std::vector<BlockWeights>& blocks() const;
  /// The leaves block `index` uses, in a fixed order (its checkpoint
  /// dependencies): every base parameter and every active adapter parameter.
  std::vector<Variable> block_dependencies(std::size_t index) const;

  // ---- LoRA (src/model/lora.cpp) -----------------------------------------
  /// Threads: add_lora, remove_lora, set_lora_active, merge_lora,
  /// set_base_trainable and to() wait for forwards, replays and decode steps
  /// running in other threads (and those wait for them): one may add
  /// adapters while another generates. Called from inside the model's own
  /// forward on the same thread they are a ValueError. A reference from
  /// blocks() is not covered: hold none across such a change.
  /// Adds adapters to every block's target projections (ValueError when the
  /// model already has adapters). Adapters start active. Graphs built before
  /// are stale afterwards (the adapted weights' versions move).
  void add_lora(const LoraConfig& config, Random& random);
  /// Removes every adapter (graphs built before become stale).
  void remove_lora();
  bool has_lora() const;
  /// A copy: another thread may replace the adapters meanwhile.
  LoraConfig lora_config() const;
  /// Inactive adapters are not used by forward/decode, are not checkpoint
  /// dependencies and receive no gradient. Changing it makes graphs stale.
  void set_lora_active(bool active);
  bool lora_active() const;
  /// Adapter parameters ("blocks.0.attention.query.lora_a", ...).
  std::vector<NamedParameter> lora_parameters() const;
  /// Names and shapes add_lora(config) would create, in lora_parameters() order.
  std::vector<std::pair<std::string, Shape>> lora_parameter_layout(const LoraConfig& config) const;
  /// Freezes (false) or unfreezes every base parameter.
  void set_base_trainable(bool trainable);
  /// W += (alpha/r)·B A for every adapter, then removes the adapters: the
  /// merged model gives the logits base + active adapters gave.
  void merge_lora();

  /// tokens: batch × T ids (row-major), T = tokens.size() / batch ≤ context.
  /// Returns logits (B, T, V).
  Variable forward(std::span<const std::int32_t> tokens, std::int64_t batch) const;
  /// Mean cross-entropy of forward(tokens) against targets (same count);
  /// targets equal to ignore_index are skipped.
  Variable loss(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, std::int64_t batch,
                std::int32_t ignore_index = -100) const;

  /// Shared model state (parameters, configuration). Graphs and decode
  /// sessions hold it, so they outlive the model object.
  const std::shared_ptr<TransformerCore>& core() const { return core_; }

 private:
  std::shared_ptr<TransformerCore> core_;
};

}  // namespace riftco_transformer
