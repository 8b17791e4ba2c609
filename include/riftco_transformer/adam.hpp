#pragma once
// Adam with bias correction and decoupled weight decay (AdamW, Loshchilov &
// Hutter 2019):
//   g  ← g · min(1, max_grad_norm / ‖g‖)          (global norm, if enabled)
//   m  ← β1 m + (1-β1) g ;  v ← β2 v + (1-β2) g²
//   m̂ = m / (1-β1ᵗ) ;  v̂ = v / (1-β2ᵗ)
//   θ  ← θ - lr·wd·θ - lr · m̂ / (√v̂ + ε)
// Each step changes parameter values in place and bumps their versions, so a
// graph built before the step is rejected as stale by backward().
#include <cstdint>
#include <vector>

#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

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

class Adam {
 public:
  /// Parameters must be leaves that require grad (ValueError otherwise).
  Adam(std::vector<Variable> parameters, AdamOptions options = {});

  /// One update of every parameter that has a gradient. Parameters without a
  /// gradient are skipped (their moments do not move). Returns the global
  /// gradient norm before clipping. Throws ShapeError (and changes nothing)
  /// when a gradient's shape differs from its parameter's, or when a
  /// parameter's shape or backend changed (set_value, to()) since this Adam
  /// made its moments: build a new Adam for the new shape. A non-finite
  /// gradient (NaN/inf anywhere, or a norm that overflows) is a ValueError
  /// naming the parameter, and nothing changes either.
  float step();
  /// Drops every parameter's gradient.
  void zero_grad();

  const AdamOptions& options() const { return options_; }
  void set_learning_rate(float lr);
  std::int64_t step_count() const { return steps_; }
  const std::vector<Variable>& parameters() const { return params_; }

  /// Moments, for saving and restoring a training run.
  struct State {
    std::int64_t steps = 0;
    std::vector<Tensor> first_moment;   // one per parameter, same shape
    std::vector<Tensor> second_moment;  // one per parameter, same shape
  };
  State state() const;
  /// Validates shapes against the parameters before changing anything.
  void set_state(const State& state);

 private:
  std::vector<Variable> params_;
  AdamOptions options_;
  std::int64_t steps_ = 0;
  std::vector<Tensor> m_;
  std::vector<Tensor> v_;
};

}  // namespace riftco_transformer
