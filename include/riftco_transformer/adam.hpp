#pragma once
// Adam with bias correction and decoupled weight decay (AdamW, Loshchilov &
// Hutter 2019):
//   g  ← g · min(1, max_grad_norm / ‖g‖)          (global norm, if enabled)
//   m  ← β1 m + (1-β1) g ;  v ← β2 v + (1-β2) g²
//   m̂ = m / (1-β1ᵗ) ;  v̂ = v / (1-β2ᵗ)
//   θ  ← θ - lr·wd·θ - lr · m̂ / (√v̂ + ε)
// wd is per parameter group (ParameterGroup): e.g. 0 for norm weights.
// Each step changes parameter values in place and bumps their versions, so a
// graph built before the step is rejected as stale by backward().
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

class GradientAccumulator;

struct AdamOptions {
  float learning_rate = 1.0e-3F;
  float beta1 = 0.9F;
  float beta2 = 0.999F;
  float epsilon = 1.0e-8F;
  float weight_decay = 0.0F;
  /// Global gradient-norm clipping threshold; 0 disables clipping.
  float max_grad_norm = 0.0F;
  void validate() const;  // ValueError naming the field
};

/// A parameter group (PyTorch's param_groups): parameters that share a
/// weight decay. `weight_decay` unset: AdamOptions::weight_decay. The usual
/// split (nanoGPT, Hugging Face) puts norm weights in a group with no decay;
/// default_parameter_groups() in pipelines.hpp builds it from names.
struct ParameterGroup {
  std::string name;  // for metadata and error messages ("decay", "no_decay")
  std::vector<Variable> parameters;
  std::optional<float> weight_decay;
};

class Adam {
 public:
  /// Parameters must be leaves that require grad, each listed once
  /// (ValueError otherwise). One group, "all": every parameter decays by
  /// options.weight_decay.
  Adam(std::vector<Variable> parameters, AdamOptions options = {});
  /// Several groups, each with its own weight decay (ValueError naming the
  /// group for a bad decay or a parameter listed twice). parameters(),
  /// state() and step(gradients) use the groups' order, concatenated.
  Adam(std::vector<ParameterGroup> groups, AdamOptions options);

  /// One update of every parameter that has a gradient. Parameters without a
  /// gradient are skipped (their moments and their step count do not move:
  /// each parameter's bias correction uses the number of updates it has had,
  /// PyTorch's per-parameter state['step'], so one that joins late is
  /// corrected as a first step, not as the optimizer's n-th). Returns the global
  /// gradient norm before clipping. Throws ShapeError (and changes nothing)
  /// when a gradient's shape differs from its parameter's, or when a
  /// parameter's shape or backend changed (set_value, to()) since this Adam
  /// made its moments: build a new Adam for the new shape. A non-finite
  /// gradient (NaN/inf anywhere, or a norm that overflows) is a ValueError
  /// naming the parameter, and nothing changes either. With no gradient at
  /// all nothing changes and step_count() stays (PyTorch's step() with every
  /// .grad None): the next real step is bias-corrected as this one would be.
  /// A gradient this Adam already stepped with is not used again
  /// (Variable::grad_serial): a parameter the passes since the last step did
  /// not reach — frozen since, an inactive adapter, an unused branch — keeps
  /// still, as in PyTorch's loop whose zero_grad() leaves its .grad None; a
  /// second step() with no backward() between changes nothing.
  float step();
  /// The same update with explicit gradients, one per parameter in
  /// parameters() order (an undefined Tensor skips that parameter), instead
  /// of the parameters' committed gradients. Gradient accumulation hands
  /// GradientAccumulator::gradients() here. Same checks and guarantees.
  float step(std::span<const Tensor> gradients);
  /// step(accumulator.gradients()) after checking that the accumulator holds
  /// exactly this Adam's parameters in parameters() order (ValueError naming
  /// the first one that differs; nothing changes): sums of other parameters
  /// of the same shapes would otherwise train the wrong weights silently.
  float step(const GradientAccumulator& accumulator);
  /// The optimizer step fused into the backward pass (PyTorch's "optimizer
  /// step in backward" via post-accumulate-grad hooks, torchtune's
  /// optimizer_in_bwd): runs loss.backward(graph) and updates each of this
  /// Adam's parameters as soon as its gradient is final, then frees that
  /// gradient, so the pass never holds every gradient at once. The updates
  /// are bit-identical to backward() followed by step(). `loss` must be a
  /// scalar. Refused before anything runs (ValueError): max_grad_norm > 0
  /// (clipping needs every gradient first), and a loss that reaches none of
  /// this Adam's parameters (another model's). Parameters of this Adam are left
  /// without a gradient (grad() undefined); other leaves the pass reaches get
  /// theirs as backward() gives them. As after backward(), a parameter
  /// reached without a contribution is stepped with zeros, and one never
  /// reached with the gradient it holds when step() would use it (skipped
  /// when it holds none, or one this Adam already stepped with).
  /// Returns the global gradient norm, bit-equal to step()'s. A failure
  /// before the first update (a stale graph, a non-finite first gradient, a
  /// closure or allocation failing) changes no parameter, moment, gradient
  /// or step count and throws its own type (with Release, the loss's graph
  /// is gone as after any Release pass that threw: run the forward again);
  /// one after it throws PartialStepError (errors.hpp) naming how many
  /// parameters were updated and the cause, with step_count() advanced (a
  /// global norm that overflows with every gradient finite, too).
  /// docs/transformer.md, "The optimizer step in the backward pass".
  float backward_and_step(const Variable& loss, GraphAfterBackward graph = GraphAfterBackward::Release);
  /// Drops every parameter's gradient.
  void zero_grad();

  const AdamOptions& options() const { return options_; }
  void set_learning_rate(float lr);
  /// How many step()s updated at least one parameter.
  std::int64_t step_count() const { return steps_; }
  /// How many updates parameters()[index] has had (PyTorch's
  /// state[p]['step']): its next update is bias-corrected as step
  /// parameter_step_count(index) + 1. Equal to step_count() for a parameter
  /// that had a gradient at every step. ValueError for an index out of range.
  std::int64_t parameter_step_count(std::size_t index) const;
  const std::vector<Variable>& parameters() const { return params_; }
  /// The weight decay Adam applies to parameters()[index].
  float weight_decay_of(std::size_t index) const;
  /// Group names and sizes, in order (one group "all" for the first constructor).
  struct GroupInfo {
    std::string name;
    float weight_decay = 0.0F;
    std::size_t begin = 0;  // index range into parameters()
    std::size_t end = 0;
  };
  const std::vector<GroupInfo>& groups() const { return groups_; }

  /// Moments, for saving and restoring a training run.
  struct State {
    std::int64_t steps = 0;
    std::vector<Tensor> first_moment;   // one per parameter, same shape
    std::vector<Tensor> second_moment;  // one per parameter, same shape
    /// One per parameter: the updates it has had (parameter_step_count), each
    /// in [0, steps], 0 only with both moments zero. Empty: every parameter
    /// at `steps` (the form of states saved before per-parameter counts).
    /// Last, so a State{steps, m, v} built by position still compiles.
    std::vector<std::int64_t> parameter_steps;
  };
  State state() const;
  /// Validates before changing anything: the moments' count and shapes
  /// (ValueError / ShapeError), then values no step could have made
  /// (ValueError naming the parameter and element): a step count outside
  /// [0, 2^63 - 1), a parameter's count outside [0, steps] or 0 with a
  /// moment that is not zero, a first moment not finite, a second moment NaN
  /// or < 0.
  void set_state(const State& state);
  /// set_state's checks of the values (not the shapes) of `state` for
  /// `parameters`, without a set_state: what a writer of saved states
  /// checks first (save_training_checkpoint). ValueError tagged `op`.
  static void check_state_values(std::string_view op, const State& state, const std::vector<Variable>& parameters);

 private:
  void add_parameters(std::vector<Variable> parameters);
  void check_unique() const;  // ValueError naming a parameter listed twice
  float update(std::span<const Tensor* const> gradients);
  /// The checks update() makes on parameters()[i]'s gradient `g` (ShapeError
  /// for a shape or moments that no longer fit, BackendError when it is not
  /// on the backend of parameters()[*first], the first one stepped).
  void check_gradient(std::size_t i, const Tensor& g, const std::size_t* first) const;
  class StepInBackward;  // backward_and_step's hooks (src/optim/adam_in_backward.cpp)

  std::vector<Variable> params_;
  AdamOptions options_;
  std::vector<GroupInfo> groups_;
  std::vector<float> weight_decay_;  // per parameter
  std::int64_t steps_ = 0;
  std::vector<std::int64_t> parameter_steps_;  // per parameter (parameter_step_count)
  std::vector<Tensor> m_;
  std::vector<Tensor> v_;
  /// Per parameter, the grad_serial() of the committed gradient step()
  /// last used: such a gradient is not applied again.
  std::vector<std::uint64_t> stepped_serial_;
};

}  // namespace riftco_transformer
