#pragma once
// Gradient accumulation made explicit. backward() starts a fresh pass and
// replaces the public gradients (it never adds to them, unlike PyTorch's
// implicit +=), so summing gradients over micro-batches needs a buffer: this
// one. Typical use (what the stage pipelines do):
//
//   GradientAccumulator acc(adam.parameters());
//   for each micro-batch k:  loss_k.backward();  acc.add(weight_k);
//   adam.step(acc);  acc.clear();   // checks acc holds adam.parameters()
//
// With weight_k = (real targets in micro-batch k) / (real targets in all K),
// the sum is the gradient of the mean loss over the K-times-larger batch.
#include <cstdint>
#include <vector>

#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

class GradientAccumulator {
 public:
  /// One buffer per parameter, made lazily on the first add that reaches it.
  explicit GradientAccumulator(std::vector<Variable> parameters);

  /// buffer_i += weight · grad_i for every parameter with a committed
  /// gradient this accumulator has not added yet (Variable::grad_serial;
  /// others add nothing: a parameter the last pass did not reach, whose
  /// gradient is an earlier pass's, is not summed again, as PyTorch's
  /// .grad += counts each pass once), element by element in a fixed order, so
  /// the sums are deterministic (for any thread count). The first add into an
  /// empty buffer stores weight · grad (weight 1: an exact copy). Checks every gradient's shape
  /// and backend (ShapeError) and the weight (finite, ValueError) before any
  /// buffer changes.
  void add(float weight = 1.0F);
  /// The sums, one per parameter in constructor order; an undefined Tensor
  /// where no add reached that parameter. Pass to Adam::step(gradients).
  const std::vector<Tensor>& gradients() const { return sums_; }
  /// The parameters, in constructor order (Adam::step(accumulator) checks
  /// they are its own, in its order).
  const std::vector<Variable>& parameters() const { return params_; }
  /// add() calls since construction or the last clear().
  std::int64_t count() const { return count_; }
  /// Drops every buffer. A gradient added before stays added: a clear()
  /// starts a new sum of new passes' gradients.
  void clear();

 private:
  std::vector<Variable> params_;
  std::vector<Tensor> sums_;
  std::vector<std::uint64_t> added_serial_;  // per parameter: the grad_serial() last added (0: none)
  std::int64_t count_ = 0;
};

}  // namespace riftco_transformer
