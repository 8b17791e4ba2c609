#pragma once
// Activation memory plans: what each block recomputes so that a training
// step's activation peak fits a budget at the least recompute cost
// (docs/checkpointing.md, "Planning for a memory budget").
//
// The training loops run backward(GraphAfterBackward::Release): a group's
// kept values go once its backward ran, and its parameter gradients come.
// So while group g replays, the groups below it still keep their values,
// the groups above it hold their gradients, and g's own working set sits on
// top; before any block runs backward the head's backward sits on every
// kept value; at the end all gradients and the embedding's backward are
// live. The predicted peak is the largest of these, each a sum of per-block
// terms read off the allocator, phase by phase, on 1-, 2- and 3-layer copies
// of the model (same widths, batch, sequence, attention, dropout and LoRA
// adapters): the measured peak of the same computation, not a formula fitted
// to it. Profiles made by hand default to the kept-graph backward's model
// (every value kept until the loss is released).
#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "riftco_transformer/transformer.hpp"
#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

/// "256MiB", "1.5 GiB", "300MB", "4096", "2k": bytes (KiB/MiB/GiB/TiB are
/// powers of 1024, kB/MB/GB/TB and k/M/G/T powers of 1000). ValueError naming
/// `op` for anything else, zero, a negative or non-finite value or an overflow.
std::int64_t parse_byte_size(const std::string& text, const char* op);
/// "231.4 MiB" (binary units, one decimal).
std::string format_bytes(double bytes);

/// The step's activation peak: the allocator's peak during forward + backward
/// above the bytes live before the forward (weights, optimizer state and
/// earlier gradients excluded; the gradients this backward creates included).
/// Backward runs with GraphAfterBackward::Release, as the training loops do.
std::int64_t measure_activation_peak(const DecoderOnlyTransformer& model, std::span<const std::int32_t> tokens,
                                     std::span<const std::int32_t> targets, std::int64_t batch);

/// What the probes measured, per BlockRecompute option (index = enum value).
struct ActivationMemoryProfile {
  std::int64_t layers = 0;
  std::int64_t batch = 0;
  std::int64_t sequence_length = 0;
  /// Which backward the prediction models. Keep: every value stays until
  /// the loss goes (the peak is every kept value plus the gradients of the
  /// groups at or above the one replaying plus its base). Release (what
  /// profile_activation_memory measures): the terms below.
  GraphAfterBackward graph = GraphAfterBackward::Keep;
  /// Bytes a block with this option keeps for backward plus its parameter
  /// gradients.
  std::array<std::int64_t, 4> per_block{};
  /// Keep: the rest of the peak when a block with this option is the one
  /// replayed (non-block part + that block's working set). Release: the peak
  /// of that block's backward above the values the blocks below it keep and
  /// the gradients of the blocks above it (the head's gradients included).
  std::array<std::int64_t, 4> base{};
  /// Release: the peak from the backward's start until the last block (with
  /// this option) has run its backward, above every block's kept values (the
  /// head's backward, or the last block's).
  std::array<std::int64_t, 4> top{};
  /// Release: what one more block with this option adds to the top window
  /// (per_block less the gradients without adapters; with them slightly less).
  std::array<std::int64_t, 4> top_kept{};
  /// Release: the top window of a segment of two blocks that is the last
  /// group (its replay), above what the groups below it keep, and what each
  /// block more adds to it.
  std::int64_t top_segment_bytes = 0;
  std::int64_t top_segment_extra_per_block = 0;
  /// Release: the forward's peak of a 1-block model with this option (the
  /// block's forward working set, or the head's); a group's forward adds it
  /// to the values the groups below it keep.
  std::array<std::int64_t, 4> forward{};
  /// Release: the forward's peak of a 2-block model that is one segment, and
  /// what each block more adds to it. A segment's forward traces its blocks'
  /// graph (the boundary check) and drops it only after its last block: its
  /// forward holds every block's activations at once, as its replay does
  /// (without gradients; a segment at block 0 below a frozen token embedding
  /// peaks there since gate/up are freed under their gradients in the
  /// replay). A segment's forward is the larger of forward[block] and these.
  std::int64_t segment_forward_bytes = 0;
  std::int64_t segment_forward_extra_per_block = 0;
  /// Release: the peak after the first block's backward (the embedding's
  /// backward) above all blocks' gradients.
  std::int64_t tail_bytes = 0;
  /// Parameter-gradient bytes of one block (trainable parameters only).
  std::int64_t block_gradient_bytes = 0;
  /// Release: what a block with this option needs when it is not block 0,
  /// beyond what the same block needs as block 0, measured against the keep
  /// option (0 for it). With a frozen token embedding block 0's input is a
  /// constant: block 0 keeps less and its backward makes no input gradient.
  /// The group that holds block 0 keeps its kept bytes less this; every
  /// other group adds it to its base and its forward (which are read at
  /// block 0). All 0 when block 0's input trains.
  std::array<std::int64_t, 4> later_block_extra{};
  /// One block's input (B·T·C floats): what a segment keeps once.
  std::int64_t block_input_bytes = 0;
  /// Extra working set per additional block of a segment while it replays.
  std::int64_t segment_extra_per_block = 0;
  /// Whether the block-boundary inputs of checkpointed groups (block,
  /// segment, attention) leave the device (activation offload on a cuda
  /// model; profile_activation_memory sets it). The probes run without
  /// offload; the prediction then counts those inputs as 0 in what groups
  /// keep, adds the (at most two) inputs back on the device to each replay's
  /// term, and predicts the pinned host bytes separately.
  bool activation_offload = false;
  /// Forward FLOPs each option recomputes for one block.
  std::array<double, 4> recompute_flops{};
  /// FLOPs of one whole forward (blocks + head), for scale.
  double forward_flops = 0;

  /// Bytes a block other than block 0 with this option keeps for backward
  /// (per_block minus its gradients; block 0 keeps later_block_extra less).
  std::int64_t kept_bytes(BlockRecompute option) const;
};

/// Probes 1-, 2- and 3-layer copies of `model` (41 forward + backward
/// passes at this batch and sequence length, without offload, each backward
/// with GraphAfterBackward::Release, its peak read per block).
/// The model itself is not touched. activation_offload is the model's
/// setting on a cuda model (on the CPU offload moves nothing).
ActivationMemoryProfile profile_activation_memory(const DecoderOnlyTransformer& model, std::int64_t batch,
                                                  std::int64_t sequence_length);

/// Predicted activation peak of a plan on the model's device (its blocks
/// must add up to profile.layers), for the backward profile.graph names. With profile.activation_offload, an
/// offloaded group's input is not kept on the device; while a group
/// replays, its own input and the prefetched input of the group before it
/// are (two inputs; one for a group that is not offloaded itself, once any
/// group is).
std::int64_t predicted_activation_peak(const ActivationMemoryProfile& profile, const ActivationCheckpointingPlan& plan);
/// Pinned host bytes activation offload holds for the plan during a step:
/// one block input (B·T·C floats) per offloaded group; 0 without offload.
std::int64_t predicted_pinned_host_bytes(const ActivationMemoryProfile& profile, const ActivationCheckpointingPlan& plan);
/// Forward FLOPs the plan's backward replays per step.
double plan_recompute_flops(const ActivationMemoryProfile& profile, const ActivationCheckpointingPlan& plan);

struct ActivationMemoryPlan {
  ActivationCheckpointingPlan plan;
  std::int64_t budget_bytes = 0;
  std::int64_t predicted_peak_bytes = 0;
  double recompute_flops = 0;             // per step
  std::int64_t smallest_feasible_bytes = 0;  // the least any plan needs
  std::int64_t disabled_peak_bytes = 0;      // what keeping everything needs
  std::int64_t pinned_host_bytes = 0;        // host memory activation offload holds (0 without offload)
};

/// The plan with the least recompute FLOPs whose predicted peak fits the
/// budget (ties: the smaller peak). Options per block: keep, attention, mlp,
/// block, and segments of any size. ValueError naming the smallest feasible
/// budget when none fits.
ActivationMemoryPlan plan_activation_memory(const ActivationMemoryProfile& profile, std::int64_t budget_bytes);

/// Several lines: budget, the plan, predicted peak, recompute FLOPs (and % of
/// the forward), and per group what it keeps.
std::string describe_activation_memory_plan(const ActivationMemoryProfile& profile, const ActivationMemoryPlan& plan);

}  // namespace riftco_transformer
