// Adam::backward_and_step: the optimizer step fused into the backward pass
// (PyTorch's post-accumulate-grad hooks, torchtune's optimizer_in_bwd). A
// BackwardHooks steps each of this Adam's parameters as soon as the engine
// reports its gradient final and consumes it, so the engine frees that
// gradient during the pass: the pass never holds every gradient at once.
//
// Bit-identity with backward() + step(): the same checks (check_gradient),
// the same kernel (adam_update, elementwise, cut per parameter from its
// start) with the same coefficients (each parameter's own step, its
// parameter_step_count() + 1; clip factor 1: no clipping here), and the norm summed from each parameter's
// sum_of_squares_partials in parameters() order once the pass is over,
// exactly the terms and order step()'s sum_of_squares adds.
#include <algorithm>
#include <cmath>
#include <exception>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../backend/kernels.hpp"
#include "adam_coefficients.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {

class Adam::StepInBackward final : public BackwardHooks {
 public:
  explicit StepInBackward(Adam& adam)
      : adam_(adam),
        partials_(adam.params_.size()),
        stepped_(adam.params_.size(), false),
        reached_(adam.params_.size(), false) {
    for (std::size_t i = 0; i < adam.params_.size(); ++i) index_.emplace(adam.params_[i].node(), i);
  }

  /// What check_gradient would refuse in the pass, refused before it runs
  /// (the cause's own type, nothing changed): the moments and backends of
  /// the parameters `loss` reaches (the pass gives each a gradient of its
  /// value's shape and backend), and the gradients the others hold.
  void check_before(const Variable& loss) const {
    if (!loss.defined()) return;  // backward() names it
    std::vector<Variable> leaves;
    try {
      leaves = loss.leaves();
    } catch (const BackwardError&) {
      return;  // a released graph: backward() refuses it before anything runs, naming the node
    }
    std::vector<bool> reached(adam_.params_.size(), false);
    for (const Variable& leaf : leaves) {
      if (const auto it = index_.find(leaf.node()); it != index_.end()) reached[it->second] = true;
    }
    if (!adam_.params_.empty() && std::none_of(reached.begin(), reached.end(), [](bool r) { return r; })) {
      // Another model's loss (or one of parameters this Adam was not built
      // with): the pass would commit its leaves' gradients and step nothing.
      throw ValueError("[Adam::backward_and_step] the loss reaches none of this Adam's " +
                       std::to_string(adam_.params_.size()) + " parameters (the first is '" +
                       adam_.params_.front().name() +
                       "'): a loss of another model? Nothing ran; build the Adam over the loss's parameters");
    }
    std::size_t first = 0;
    bool any = false;
    for (std::size_t i = 0; i < adam_.params_.size(); ++i) {
      const Tensor& held = adam_.params_[i].grad();
      if (!reached[i] && !holds_unused_gradient(i)) continue;
      adam_.check_gradient(i, reached[i] ? adam_.params_[i].value() : held, any ? &first : nullptr);
      if (!any) first = i;
      any = true;
    }
  }

  void gradient_final(const Variable& leaf, const Tensor& gradient) override {
    const auto it = index_.find(leaf.node());
    if (it == index_.end()) return;  // not this Adam's: committed as backward() does
    reached_[it->second] = true;
    // A reached parameter with no contribution: the zeros the commit would give it.
    step(it->second, gradient.defined() ? gradient : Tensor::zeros(leaf.value().shape(), leaf.value().backend()));
  }

  bool consumes(const Variable& leaf) const override { return index_.contains(leaf.node()); }

  /// Parameters the pass did not reach keep their gradient after backward()
  /// (none, or one from an earlier pass), and step() would use it: so here.
  std::vector<std::pair<Variable, Tensor>> finish() override {
    for (std::size_t i = 0; i < adam_.params_.size(); ++i) {
      if (reached_[i] || !holds_unused_gradient(i)) continue;
      step(i, adam_.params_[i].grad());
    }
    return {};
  }

  std::size_t updated() const { return updated_; }
  bool stepped(std::size_t i) const { return stepped_[i]; }

  /// What step() would use for a parameter the pass does not reach: a
  /// committed gradient this Adam has not stepped with yet.
  bool holds_unused_gradient(std::size_t i) const {
    return adam_.params_[i].grad().defined() && adam_.params_[i].grad_serial() != adam_.stepped_serial_[i];
  }

  /// The global norm: every stepped parameter's partial sums, in
  /// parameters() order (step()'s sum_of_squares adds the same terms in the
  /// same order).
  double sum_of_squares() const {
    double total = 0.0;
    for (std::size_t i = 0; i < partials_.size(); ++i) {
      for (const double p : partials_[i]) total += p;
    }
    return total;
  }

 private:
  void step(std::size_t i, const Tensor& gradient) {
    adam_.check_gradient(i, gradient, first_stepped_ ? &first_ : nullptr);
    Variable& parameter = adam_.params_[i];
    const backend::Kernels& kernels = backend::kernels(parameter.value().backend(), "Adam::backward_and_step");
    const std::span<const float> values(gradient.device_data(), static_cast<std::size_t>(gradient.numel()));
    std::vector<double> partials = kernels.sum_of_squares_partials(std::span(&values, 1));
    double squares = 0.0;
    for (const double p : partials) squares += p;
    if (!std::isfinite(squares)) {  // squares of finite floats never overflow a double: NaN or inf in it
      throw ValueError("[Adam::backward_and_step] the gradient of '" + parameter.name() + "' " +
                       shape_string(gradient.shape()) + " is not finite (NaN or inf)");
    }
    const backend::AdamUpdate update =
        detail::adam_update_of(parameter, adam_.m_[i], adam_.v_[i], values.data(),
                               detail::adam_decay_factor(adam_.options_, adam_.weight_decay_[i]),
                               "updated in place by Adam::backward_and_step");
    kernels.adam_update(std::span(&update, 1),
                        detail::adam_coefficients(adam_.options_, adam_.parameter_steps_[i] + 1, 1.0F));
    ++adam_.parameter_steps_[i];
    partials_[i] = std::move(partials);
    stepped_[i] = true;
    if (!first_stepped_) first_ = i;
    first_stepped_ = true;
    ++updated_;
  }

  Adam& adam_;
  std::unordered_map<const Node*, std::size_t> index_;
  std::vector<std::vector<double>> partials_;
  std::vector<bool> stepped_;
  std::vector<bool> reached_;
  std::size_t first_ = 0;
  bool first_stepped_ = false;
  std::size_t updated_ = 0;
};

namespace {

std::string message_of(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const OutOfMemoryError& e) {  // says what wanted how much
    return e.what();
  } catch (const std::bad_alloc&) {
    return "out of memory (std::bad_alloc)";
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

}  // namespace

float Adam::backward_and_step(const Variable& loss, GraphAfterBackward graph) {
  detail::refuse_inside_replay("Adam::backward_and_step");  // as step(): no weight moves under a replay
  if (options_.max_grad_norm > 0.0F) {
    throw ValueError("[Adam::backward_and_step] max_grad_norm is " + float_text(options_.max_grad_norm) +
                     ": clipping scales every gradient by the global norm, known only once every gradient is; "
                     "use backward() and step(), or max_grad_norm 0");
  }
  StepInBackward hooks(*this);
  const std::int64_t steps_before = steps_;
  try {
    steps_ = steps_before + 1;  // restored when nothing was updated
    hooks.check_before(loss);
    loss.backward(hooks, graph);  // BackwardError for a non-scalar loss, before anything runs
    const auto norm = static_cast<float>(std::sqrt(hooks.sum_of_squares()));
    if (!std::isfinite(norm)) {
      throw ValueError("[Adam::backward_and_step] the gradient norm is not finite (it overflowed; every gradient "
                       "was finite)");
    }
    // Parameters not reached were stepped with the gradient they held (see
    // finish()); like the reached ones, they are left without one.
    for (std::size_t i = 0; i < params_.size(); ++i) {
      if (hooks.stepped(i)) params_[i].clear_grad();
    }
    if (hooks.updated() == 0) steps_ = steps_before;  // nothing stepped (no parameters): as step() with no gradient
    return norm;
  } catch (...) {
    if (hooks.updated() == 0) {
      steps_ = steps_before;
      throw;  // nothing changed: the cause's own type
    }
    throw PartialStepError("[Adam::backward_and_step] failed after updating " + std::to_string(hooks.updated()) +
                           " of " + std::to_string(params_.size()) +
                           " parameters (the model and the moments are part-way between two steps: restore both "
                           "from a checkpoint before training on): " +
                           message_of(std::current_exception()));
  }
}

}  // namespace riftco_transformer
