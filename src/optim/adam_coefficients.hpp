#pragma once
// What one Adam step computes besides the kernel, shared by Adam and ZeRO-1's
// ShardedAdam (src/distributed/zero_adam.cpp), whose parameters must match
// Adam's bit for bit: the clipping factor, the step's kernel coefficients
// and each parameter's decay factor, and the error for a non-finite norm.
// Private to the optim and distributed layers.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "../backend/kernel_types.hpp"
#include "../backend/kernels.hpp"
#include "riftco_transformer/adam.hpp"

namespace riftco_transformer::detail {

/// The gradient's scale for global-norm clipping: max_grad_norm / (norm +
/// 1e-6) when clipping is on and the norm exceeds it, else 1.
float adam_clip_factor(const AdamOptions& options, float norm);

/// The kernel's coefficients for step `step` (1-based: bias corrections
/// 1 - beta^step, computed in double).
backend::AdamCoefficients adam_coefficients(const AdamOptions& options, std::int64_t step, float clip);

/// A ValueError tagged `op`, before anything changes, when a checkpoint
/// replay runs on this thread (checkpoint_replaying()): a step from the
/// replayed function moves weights the replay reads, which the contract
/// reported only after they had moved. (A hook's step on a parameter whose
/// gradient is final is fine: backward_and_step does that.)
void refuse_inside_replay(std::string_view op);

/// The kernel over `updates`, updates[k] bias-corrected as step steps[k]
/// (1-based: its parameter's own count + 1, as PyTorch's per-parameter
/// state['step']): one adam_update call when every step is the same (the
/// usual case), else one per distinct step, in ascending order. Parameters
/// are elementwise-independent, so the grouping changes no value.
void run_adam_updates(const backend::Kernels& kernels, const AdamOptions& options, float clip,
                      std::span<const backend::AdamUpdate> updates, std::span<const std::int64_t> steps);

/// θ's factor for decoupled weight decay: 1 - learning_rate · weight_decay.
float adam_decay_factor(const AdamOptions& options, float weight_decay);

/// The kernel's work for one parameter: θ (its buffer's version bumped first
/// with `why`, so every graph that read it becomes stale), its moments, its
/// gradient and its decay factor.
backend::AdamUpdate adam_update_of(Variable& parameter, Tensor& m, Tensor& v, const float* gradient, float decay,
                                   const char* why);

/// The ValueError for a non-finite gradient norm: "[op] the gradient norm is
/// not finite ('name' has a non-finite gradient): no parameter was changed"
/// (an unnamed one is "parameter i"), or "(it overflowed)" when `culprit`
/// is null (every gradient finite).
[[noreturn]] void throw_non_finite_gradient_norm(std::string_view op, const std::vector<Variable>& parameters,
                                                 const std::size_t* culprit);

/// The values of a restored state that no step could have made, a
/// ValueError tagged `op` naming the first: a step count outside
/// [0, INT64_MAX) (the next step adds one), a first moment that is not
/// finite, a second moment that is NaN or below zero (+inf is reachable: a
/// finite gradient whose square overflows). The moments'
/// count and shapes are the caller's to check first.
void check_adam_state_values(std::string_view op, const Adam::State& state, const std::vector<Variable>& parameters);

/// What step() steps with: each parameter's committed gradient (a handle of
/// its own, read with its serial: Variable::grad_with_serial), or an
/// undefined Tensor (skipped) where its grad_serial() is `stepped[i]`, a
/// gradient already stepped with. `serials` receives every grad_serial(),
/// to become `stepped` once the step succeeds (Adam, ShardedAdam, and
/// GradientAccumulator with the serials it added).
std::vector<Tensor> fresh_gradients(const std::vector<Variable>& parameters,
                                    const std::vector<std::uint64_t>& stepped, std::vector<std::uint64_t>& serials);

}  // namespace riftco_transformer::detail
