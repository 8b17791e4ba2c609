#include "riftco_transformer/adam.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <span>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../backend/kernels.hpp"
#include "adam_coefficients.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/gradient_accumulator.hpp"

namespace riftco_transformer {

void AdamOptions::validate() const {
  auto bad = [](const char* field, float value, const char* rule) {
    throw ValueError(std::string("[Adam] ") + field + " must be " + rule + ", got " + float_text(value));
  };
  if (!(learning_rate >= 0.0F) || !std::isfinite(learning_rate)) bad("learning_rate", learning_rate, "finite and >= 0");
  if (!(beta1 >= 0.0F && beta1 < 1.0F)) bad("beta1", beta1, "in [0, 1)");
  if (!(beta2 >= 0.0F && beta2 < 1.0F)) bad("beta2", beta2, "in [0, 1)");
  if (!(epsilon > 0.0F) || !std::isfinite(epsilon)) bad("epsilon", epsilon, "finite and > 0");
  if (!(weight_decay >= 0.0F) || !std::isfinite(weight_decay)) bad("weight_decay", weight_decay, "finite and >= 0");
  if (!(max_grad_norm >= 0.0F) || !std::isfinite(max_grad_norm)) {
    bad("max_grad_norm", max_grad_norm, "finite and >= 0 (0 disables clipping)");
  }
}

void Adam::add_parameters(std::vector<Variable> parameters) {
  for (Variable& p : parameters) {
    const std::size_t i = params_.size();
    if (!p.defined() || !p.is_leaf() || !p.requires_grad()) {
      throw ValueError("[Adam] parameter " + std::to_string(i) + (p.defined() ? " '" + p.name() + "'" : "") +
                       " must be a leaf that requires grad");
    }
    m_.push_back(Tensor::zeros(p.value().shape(), p.value().backend()));
    stepped_serial_.push_back(0);
    parameter_steps_.push_back(0);
    v_.push_back(Tensor::zeros(p.value().shape(), p.value().backend()));
    params_.push_back(std::move(p));
  }
}

Adam::Adam(std::vector<Variable> parameters, AdamOptions options) : options_(options) {
  options_.validate();
  add_parameters(std::move(parameters));
  groups_.push_back({"all", options_.weight_decay, 0, params_.size()});
  weight_decay_.assign(params_.size(), options_.weight_decay);
  check_unique();
}

Adam::Adam(std::vector<ParameterGroup> groups, AdamOptions options) : options_(options) {
  options_.validate();
  for (ParameterGroup& g : groups) {
    const float wd = g.weight_decay.value_or(options_.weight_decay);
    if (!(wd >= 0.0F) || !std::isfinite(wd)) {
      throw ValueError("[Adam] parameter group '" + g.name + "': weight_decay must be finite and >= 0, got " +
                       float_text(wd));
    }
    const std::size_t begin = params_.size();
    add_parameters(std::move(g.parameters));
    groups_.push_back({g.name, wd, begin, params_.size()});
    weight_decay_.resize(params_.size(), wd);
  }
  check_unique();
}

void Adam::check_unique() const {
  // A parameter listed twice would be updated twice per step (and its
  // moments would advance twice): refused in one list as across groups.
  std::unordered_set<const Node*> seen;
  for (const GroupInfo& info : groups_) {
    for (std::size_t i = info.begin; i < info.end; ++i) {
      if (!seen.insert(params_[i].node()).second) {
        throw ValueError("[Adam] parameter " + std::to_string(i) + " '" + params_[i].name() +
                         "' appears twice (again in group '" + info.name + "')");
      }
    }
  }
}

float Adam::weight_decay_of(std::size_t index) const {
  if (index >= params_.size()) {
    throw ValueError("[Adam] parameter index " + std::to_string(index) + " out of range (" +
                     std::to_string(params_.size()) + " parameters)");
  }
  return weight_decay_[index];
}

std::int64_t Adam::parameter_step_count(std::size_t index) const {
  if (index >= params_.size()) {
    throw ValueError("[Adam] parameter index " + std::to_string(index) + " out of range (" +
                     std::to_string(params_.size()) + " parameters)");
  }
  return parameter_steps_[index];
}

void Adam::set_learning_rate(float lr) {
  AdamOptions next = options_;
  next.learning_rate = lr;
  next.validate();
  options_ = next;
}

float Adam::step() {
  std::vector<std::uint64_t> serials;
  const std::vector<Tensor> gradients = detail::fresh_gradients(params_, stepped_serial_, serials);
  std::vector<const Tensor*> pointers;
  pointers.reserve(gradients.size());
  for (const Tensor& g : gradients) pointers.push_back(&g);
  const float norm = update(pointers);
  stepped_serial_ = std::move(serials);  // only once the step succeeded
  return norm;
}

float Adam::step(std::span<const Tensor> gradients) {
  if (gradients.size() != params_.size()) {
    throw ValueError("[Adam] step got " + std::to_string(gradients.size()) + " gradients for " +
                     std::to_string(params_.size()) + " parameters");
  }
  std::vector<const Tensor*> pointers;
  pointers.reserve(gradients.size());
  for (const Tensor& g : gradients) pointers.push_back(&g);
  return update(pointers);
}

float Adam::step(const GradientAccumulator& accumulator) {
  const std::vector<Variable>& theirs = accumulator.parameters();
  if (theirs.size() != params_.size()) {
    throw ValueError("[Adam] step: the GradientAccumulator holds " + std::to_string(theirs.size()) +
                     " parameters, this Adam " + std::to_string(params_.size()) +
                     " (build the accumulator from this Adam's parameters)");
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (theirs[i].node() != params_[i].node()) {
      throw ValueError("[Adam] step: the GradientAccumulator's parameter " + std::to_string(i) + " is '" +
                       theirs[i].name() + "', this Adam's is '" + params_[i].name() +
                       "' (build the accumulator from this Adam's parameters, in their order)");
    }
  }
  return step(accumulator.gradients());
}

void Adam::check_gradient(std::size_t i, const Tensor& g, const std::size_t* first) const {
  const Tensor& value = params_[i].value();
  if (g.shape() != value.shape()) {
    throw ShapeError("[Adam] gradient " + shape_string(g.shape()) + " of '" + params_[i].name() +
                     "' does not match its value " + shape_string(value.shape()));
  }
  if (m_[i].shape() != value.shape() || m_[i].backend() != value.backend() || g.backend() != value.backend()) {
    throw ShapeError("[Adam] parameter '" + params_[i].name() + "' is now " + shape_string(value.shape()) + " on " +
                     backend_name(value.backend()) + " but its moments were made for " + shape_string(m_[i].shape()) +
                     " on " + backend_name(m_[i].backend()) +
                     " (set_value or to() changed it after this Adam was built): build a new Adam for it");
  }
  if (first != nullptr && value.backend() != params_[*first].value().backend()) {
    throw BackendError("[Adam] parameter '" + params_[i].name() + "' " + shape_string(value.shape()) + " is on " +
                       backend_name(value.backend()) + " but '" + params_[*first].name() + "' is on " +
                       backend_name(params_[*first].value().backend()) +
                       ": one Adam steps parameters on one backend");
  }
}

float Adam::update(std::span<const Tensor* const> gradients) {
  detail::refuse_inside_replay("Adam");
  // Validate everything first: a bad gradient changes nothing.
  std::vector<std::size_t> with_grad;
  std::vector<std::span<const float>> grads;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Tensor& g = *gradients[i];
    if (!g.defined()) continue;
    check_gradient(i, g, with_grad.empty() ? nullptr : with_grad.data());
    with_grad.push_back(i);
    grads.emplace_back(g.device_data(), static_cast<std::size_t>(g.numel()));  // the backend's memory
  }
  const backend::Kernels& kernels =
      backend::kernels(with_grad.empty() ? Backend::Cpu : params_[with_grad[0]].value().backend(), "Adam");
  const double squares = kernels.sum_of_squares(grads);
  if (!std::isfinite(static_cast<float>(std::sqrt(squares)))) {
    // One pass to name the culprit; only on this failure path.
    std::optional<std::size_t> culprit;
    for (std::size_t k = 0; k < with_grad.size() && !culprit; ++k) {
      if (!kernels.all_finite(grads[k])) culprit = with_grad[k];
    }
    detail::throw_non_finite_gradient_norm("Adam", params_, culprit ? &*culprit : nullptr);
  }
  const auto norm = static_cast<float>(std::sqrt(squares));
  // No gradient at all (as PyTorch's step() with every .grad None): nothing
  // to update, and the step count stays, so the next real step's bias
  // correction is a first step's.
  if (with_grad.empty()) return norm;
  const float clip = detail::adam_clip_factor(options_, norm);
  std::vector<backend::AdamUpdate> updates;
  std::vector<std::int64_t> steps;  // each update's step: its parameter's count + 1
  updates.reserve(with_grad.size());
  steps.reserve(with_grad.size());
  for (std::size_t k = 0; k < with_grad.size(); ++k) {
    const std::size_t i = with_grad[k];
    updates.push_back(detail::adam_update_of(params_[i], m_[i], v_[i], grads[k].data(),
                                             detail::adam_decay_factor(options_, weight_decay_[i]),
                                             "updated in place by Adam::step"));
    steps.push_back(parameter_steps_[i] + 1);
  }
  detail::run_adam_updates(kernels, options_, clip, updates, steps);
  ++steps_;
  for (const std::size_t i : with_grad) ++parameter_steps_[i];
  return norm;
}

void Adam::zero_grad() {
  for (Variable& p : params_) p.clear_grad();
}

Adam::State Adam::state() const {
  State s;
  s.steps = steps_;
  s.parameter_steps = parameter_steps_;
  for (const Tensor& t : m_) s.first_moment.push_back(t.clone());
  for (const Tensor& t : v_) s.second_moment.push_back(t.clone());
  return s;
}

void Adam::set_state(const State& state) {
  if (state.first_moment.size() != params_.size() || state.second_moment.size() != params_.size()) {
    throw ValueError("[Adam] state has " + std::to_string(state.first_moment.size()) + " first and " +
                     std::to_string(state.second_moment.size()) + " second moments for " +
                     std::to_string(params_.size()) + " parameters");
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Shape& shape = params_[i].value().shape();
    for (const auto& [which, t] : {std::pair{"first", &state.first_moment[i]}, {"second", &state.second_moment[i]}}) {
      if (!t->defined() || t->shape() != shape) {
        throw ShapeError("[Adam] state for '" + params_[i].name() + "': its " + which + " moment has shape " +
                         (t->defined() ? shape_string(t->shape()) : std::string("(undefined)")) +
                         ", the parameter " + shape_string(shape));
      }
    }
  }
  detail::check_adam_state_values("Adam", state, params_);
  std::vector<Tensor> m;
  std::vector<Tensor> v;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    m.push_back(state.first_moment[i].clone());
    v.push_back(state.second_moment[i].clone());
  }
  m_ = std::move(m);
  v_ = std::move(v);
  steps_ = state.steps;
  parameter_steps_ = state.parameter_steps.empty() ? std::vector<std::int64_t>(params_.size(), state.steps)
                                                   : state.parameter_steps;
}

void Adam::check_state_values(std::string_view op, const State& state, const std::vector<Variable>& parameters) {
  detail::check_adam_state_values(op, state, parameters);
}

namespace detail {

std::vector<Tensor> fresh_gradients(const std::vector<Variable>& parameters,
                                    const std::vector<std::uint64_t>& stepped, std::vector<std::uint64_t>& serials) {
  std::vector<Tensor> gradients;
  gradients.reserve(parameters.size());
  serials.clear();
  serials.reserve(parameters.size());
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    auto [gradient, serial] = parameters[i].grad_with_serial();  // one read: a concurrent commit cannot free it
    serials.push_back(serial);
    gradients.push_back(serial == stepped[i] ? Tensor() : std::move(gradient));  // already used: skipped
  }
  return gradients;
}

void check_adam_state_values(std::string_view op, const Adam::State& state, const std::vector<Variable>& parameters) {
  const std::string tag = std::string("[").append(op).append("] ");  // (GCC 12 warns falsely on "[" + string&&)
  if (state.steps < 0 || state.steps == std::numeric_limits<std::int64_t>::max()) {
    throw ValueError(tag + "state's step count " + std::to_string(state.steps) + " is outside [0, 2^63 - 1)");
  }
  if (!state.parameter_steps.empty() && state.parameter_steps.size() != parameters.size()) {
    throw ValueError(tag + "state has " + std::to_string(state.parameter_steps.size()) +
                     " per-parameter step counts for " + std::to_string(parameters.size()) +
                     " parameters (give one per parameter, or none: every parameter at the step count)");
  }
  for (std::size_t i = 0; i < state.parameter_steps.size(); ++i) {
    if (state.parameter_steps[i] < 0 || state.parameter_steps[i] > state.steps) {
      throw ValueError(tag + "state for '" + parameters[i].name() + "': its step count " +
                       std::to_string(state.parameter_steps[i]) + " is outside [0, " + std::to_string(state.steps) +
                       "] (a parameter is updated at most once per step)");
    }
  }
  // Before its first update a parameter's moments are zero: a count of 0
  // with other moments would correct them as a first step's.
  const auto never_updated = [&](std::size_t i) {
    return state.parameter_steps.empty() ? state.steps == 0 : state.parameter_steps[i] == 0;
  };
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    for (const bool second : {false, true}) {
      const std::vector<float> values = (second ? state.second_moment : state.first_moment)[i].to_vector();
      for (std::size_t k = 0; k < values.size(); ++k) {
        // A step keeps m a mix of finite gradients; v can reach +inf (a
        // finite gradient whose square overflows), never NaN or below 0.
        if (never_updated(i) && values[k] != 0.0F) {
          throw ValueError(tag + "state for '" + parameters[i].name() + "': its step count is 0 but its " +
                           (second ? "second" : "first") + " moment holds " + float_text(values[k]) +
                           " at element " + std::to_string(k) + " (moments are zero before the first update)");
        }
        if (second ? values[k] >= 0.0F : std::isfinite(values[k])) continue;
        throw ValueError(tag + "state for '" + parameters[i].name() + "': its " + (second ? "second" : "first") +
                         " moment holds " + float_text(values[k]) + " at element " + std::to_string(k) +
                         (second ? " (a second moment is >= 0)" : " (a first moment is finite)"));
      }
    }
  }
}

void refuse_inside_replay(std::string_view op) {
  if (!checkpoint_replaying()) return;
  throw ValueError("[" + std::string(op) +
                   "] step() called from a checkpoint function while backward replays it: the replay must "
                   "compute what the forward did, and a step moves the weights it reads; no parameter was "
                   "changed (step after backward() returns)");
}

void run_adam_updates(const backend::Kernels& kernels, const AdamOptions& options, float clip,
                      std::span<const backend::AdamUpdate> updates, std::span<const std::int64_t> steps) {
  if (updates.empty()) return;
  if (std::all_of(steps.begin(), steps.end(), [&](std::int64_t s) { return s == steps.front(); })) {
    kernels.adam_update(updates, adam_coefficients(options, steps.front(), clip));  // the usual case: one call
    return;
  }
  std::vector<std::int64_t> distinct(steps.begin(), steps.end());
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  for (const std::int64_t step : distinct) {
    std::vector<backend::AdamUpdate> group;
    for (std::size_t k = 0; k < updates.size(); ++k) {
      if (steps[k] == step) group.push_back(updates[k]);
    }
    kernels.adam_update(group, adam_coefficients(options, step, clip));
  }
}

float adam_clip_factor(const AdamOptions& options, float norm) {
  if (options.max_grad_norm > 0.0F && norm > options.max_grad_norm) return options.max_grad_norm / (norm + 1e-6F);
  return 1.0F;
}

backend::AdamCoefficients adam_coefficients(const AdamOptions& options, std::int64_t step, float clip) {
  const auto t = static_cast<double>(step);
  backend::AdamCoefficients c{};
  c.beta1 = options.beta1;
  c.beta2 = options.beta2;
  c.bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(options.beta1), t));
  c.bias2 = static_cast<float>(1.0 - std::pow(static_cast<double>(options.beta2), t));
  c.learning_rate = options.learning_rate;
  c.epsilon = options.epsilon;
  c.clip = clip;
  return c;
}

float adam_decay_factor(const AdamOptions& options, float weight_decay) {
  return 1.0F - options.learning_rate * weight_decay;
}

backend::AdamUpdate adam_update_of(Variable& parameter, Tensor& m, Tensor& v, const float* gradient, float decay,
                                   const char* why) {
  // Bumps the buffer's version (every graph that read it becomes stale); the
  // pointer is then taken without a second bump.
  Tensor theta_handle = parameter.mutable_value(why);
  auto* theta = const_cast<float*>(std::as_const(theta_handle).device_data());
  return {theta, m.device_data(), v.device_data(), gradient, parameter.value().numel(), decay};
}

void throw_non_finite_gradient_norm(std::string_view op, const std::vector<Variable>& parameters,
                                    const std::size_t* culprit) {
  std::string why = " (it overflowed)";
  if (culprit != nullptr) {
    const std::string& name = parameters[*culprit].name();
    why = " (" + (name.empty() ? "parameter " + std::to_string(*culprit) : "'" + name + "'") +
          " has a non-finite gradient)";
  }
  throw ValueError("[" + std::string(op) + "] the gradient norm is not finite" + why + ": no parameter was changed");
}

}  // namespace detail

}  // namespace riftco_transformer
