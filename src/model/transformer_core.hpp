#pragma once
// The model's shared state. A DecoderOnlyTransformer, every graph its forward
// built (through checkpoint closures) and every DecodeSession hold it, so
// destroying the model object never invalidates them.
#include <mutex>

#include "riftco_transformer/shared_mutex.hpp"
#include "riftco_transformer/transformer.hpp"

namespace riftco_transformer {

/// ValueError tagged `tag` unless `plan` is one a model of `layers` blocks
/// runs: each group's recompute one of the four, 1..layers blocks (more than
/// one only for a segment), covering every block once.
void check_checkpointing_plan(const ActivationCheckpointingPlan& plan, std::int64_t layers, const std::string& tag);

/// The nine base parameters of a block, in their fixed order.
std::vector<Variable> base_block_parameters(const BlockWeights& block);
/// The names of block `index`'s base_block_parameters, in their order: the
/// keys of saved files, fixed by the model's structure (a Variable's own
/// name is a label a user may change).
std::vector<std::string> base_block_parameter_names(std::size_t index);

struct TransformerCore {
  TransformerDimensions dims;
  float eps = 1.0e-5F;
  FullSequenceAttentionKind attention = FullSequenceAttentionKind::Materialized;
  // The checkpointing policy: set from any thread at any time (a Python
  // property while another thread trains), read once per forward as a plan
  // (DecoderOnlyTransformer::activation_checkpointing_plan). Under
  // policy_lock: the plan is a vector a setter replaces.
  mutable std::mutex policy_lock;
  ActivationCheckpointingKind checkpointing = ActivationCheckpointingKind::Disabled;
  std::int64_t segment_blocks = 0;  // 0 = round(sqrt(layers))
  ActivationCheckpointingPlan plan;  // under Planned
  bool activation_offload = false;   // checkpointed groups' inputs parked in host memory (cuda only)
  float dropout_probability = 0.0F;
  bool training = true;
  Random dropout_random{0};

  // The model's structure: the LoRA adapters (add, remove, merge, activate)
  // and the parameters' backend (to()) change under structure_lock held
  // exclusively (StructureWriteLock); forward, checkpoint replays, decoding
  // and the parameter listings read them under it shared
  // (StructureReadLock). A Python thread may add adapters while another
  // generates: each waits for the other's call instead of reading a vector
  // being replaced.
  mutable WriterFirstSharedMutex structure_lock;  // a waiting change goes before new reads

  LoraConfig lora;           // config of the current adapters (when any)
  bool has_lora = false;
  bool lora_active = true;

  Variable token_embedding;  // (V, C)
  std::vector<BlockWeights> blocks;
  Variable final_norm;  // (C)
  Variable lm_head;     // (V, C)

  /// One block, never checkpointed (what a checkpoint replays). Reads the
  /// block's weights as they are now. `drop` > 0 applies residual dropout
  /// drawing from dropout_random. `value_needed` false (a checkpoint replay's
  /// last block): the final fused projection's value is not computed;
  /// the graph and every gradient are the same (fused.hpp).
  Variable block_forward(std::size_t index, const Variable& h, FullSequenceAttentionKind kind, float drop,
                         bool value_needed = true);
  /// block_forward's two halves: h1 = h + attention(norm(h)), then
  /// h1 + mlp(norm(h1)). Each is what a sub-block checkpoint replays.
  Variable attention_sub_block(std::size_t index, const Variable& h, FullSequenceAttentionKind kind, float drop,
                               bool value_needed = true);
  Variable mlp_sub_block(std::size_t index, const Variable& h1, float drop, bool value_needed = true);
  std::vector<Variable> block_dependencies(std::size_t index) const;
  /// The leaves one half reads: its norm and projections, and the active
  /// adapters on those projections.
  std::vector<Variable> sub_block_dependencies(std::size_t index, bool attention) const;
  /// x Wᵀ for the block's `target` projection, plus its active adapter.
  Variable project(const BlockWeights& block, LoraTarget target, const Variable& x) const;
  /// Every leaf decode and forward read: base parameters and active adapters.
  std::vector<Variable> all_leaves() const;
  /// ShapeError (tagged `op`) naming a parameter whose shape or backend no
  /// longer fits dims: the kernels read parameters by the model's dimensions.
  void check_parameters(const char* op) const;
};

/// Holds core.structure_lock shared for this thread, re-entrantly: a
/// checkpoint's first evaluation runs inside forward(), which holds it.
class StructureReadLock {
 public:
  explicit StructureReadLock(const TransformerCore& core);
  ~StructureReadLock();
  StructureReadLock(const StructureReadLock&) = delete;
  StructureReadLock& operator=(const StructureReadLock&) = delete;

 private:
  const TransformerCore* held_ = nullptr;  // null: an outer StructureReadLock of this thread holds it
};

/// Holds core.structure_lock exclusively. ValueError tagged `op` when this
/// thread is inside a read of the same model (a structural change from
/// within its own forward would wait for itself). Reads on this thread
/// inside it (StructureReadLock) pass through.
class StructureWriteLock {
 public:
  StructureWriteLock(const TransformerCore& core, const char* op);
  ~StructureWriteLock();
  StructureWriteLock(const StructureWriteLock&) = delete;
  StructureWriteLock& operator=(const StructureWriteLock&) = delete;

 private:
  std::unique_lock<WriterFirstSharedMutex> guard_;
  const TransformerCore* core_ = nullptr;
};

}  // namespace riftco_transformer
