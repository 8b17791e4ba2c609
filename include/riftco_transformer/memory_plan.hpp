#pragma once
// Activation memory plans: what each block recomputes so that a training
// step's activation peak fits a budget at the least recompute cost
// (docs/checkpointing.md, "Planning for a memory budget").
//
// The prediction is per block: every block adds the bytes its option keeps
// plus its parameter gradients (exact: the graph keeps a block's values until
// the loss is released), and on top sits the step's non-block part (embedding,
// head, loss) and the working set of the block being replayed. Both are read
// off the allocator on a 1- and a 2-layer copy of the model (same widths,
// batch, sequence, attention, dropout and LoRA adapters), so the prediction
// is the measured peak of the same computation, not a formula fitted to it.
#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "riftco_transformer/transformer.hpp"

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
/// The graph is released before returning.
std::int64_t measure_activation_peak(const DecoderOnlyTransformer& model, std::span<const std::int32_t> tokens,
                                     std::span<const std::int32_t> targets, std::int64_t batch);

/// What the probes measured, per BlockRecompute option (index = enum value).
struct ActivationMemoryProfile {
  std::int64_t layers = 0;
  std::int64_t batch = 0;
  std::int64_t sequence_length = 0;
  /// Bytes one more block with this option adds to the peak: what it keeps
  /// plus its parameter gradients.
  std::array<std::int64_t, 4> per_block{};
  /// The rest of the peak when a block with this option is the one replayed
  /// (non-block part + that block's working set).
  std::array<std::int64_t, 4> base{};
  /// Parameter-gradient bytes of one block (trainable parameters only).
  std::int64_t block_gradient_bytes = 0;
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

  /// Bytes a block with this option keeps for backward (per_block minus its gradients).
  std::int64_t kept_bytes(BlockRecompute option) const;
};

/// Probes 1- and 2-layer copies of `model` (nine forward + backward passes of
/// one or two blocks at this batch and sequence length, without offload).
/// The model itself is not touched. activation_offload is the model's
/// setting on a cuda model (on the CPU offload moves nothing).
ActivationMemoryProfile profile_activation_memory(const DecoderOnlyTransformer& model, std::int64_t batch,
                                                  std::int64_t sequence_length);

/// Predicted activation peak of a plan on the model's device (its blocks
/// must add up to profile.layers). With profile.activation_offload, an
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
