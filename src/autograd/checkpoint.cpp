// checkpoint(): the mechanics. Contract checks live in checkpoint_contract.cpp.
#include "riftco_transformer/checkpoint.hpp"

#include <atomic>

#include "checkpoint_contract.hpp"
#include "gradient_context.hpp"

namespace riftco_transformer {
namespace {

std::atomic<std::int64_t> g_replays{0};

/// Restores a generator's state for the replay and puts the live stream back
/// afterwards, whatever happens.
class RandomReplayScope {
 public:
  RandomReplayScope(Random* random, const Random::State& forward_state) : random_(random) {
    if (random_ != nullptr) {
      live_ = random_->state();
      random_->set_state(forward_state);
    }
  }
  ~RandomReplayScope() {
    if (random_ != nullptr) random_->set_state(live_);
  }
  RandomReplayScope(const RandomReplayScope&) = delete;
  RandomReplayScope& operator=(const RandomReplayScope&) = delete;

 private:
  Random* random_;
  Random::State live_;
};

/// Runs the callable on a fresh leaf that shares `input_value`'s buffer,
/// recording every edge, and checks the boundary.
Variable traced_call(const std::function<Variable(const Variable&)>& recompute, const Tensor& input_value,
                     std::span<const Variable> dependencies, const std::string& where, Variable& fresh_out,
                     std::vector<Variable>* implicit = nullptr) {
  Variable fresh(input_value, true, where + " input");
  const std::uint64_t first_inside = next_node_id();
  Variable out;
  {
    TraceGuard trace;
    out = recompute(fresh);
  }
  if (!out.defined()) {
    throw CheckpointContractError(CheckpointContractError::Violation::OutputChanged,
                                  "[checkpoint] " + where + ": the callable returned an undefined variable");
  }
  std::vector<Variable> constants = checkpoint_contract::check_boundary(out, fresh, dependencies, first_inside, where);
  if (implicit != nullptr) *implicit = std::move(constants);
  fresh_out = fresh;
  return out;
}

}  // namespace

std::int64_t checkpoint_replay_count() { return g_replays.load(); }
void reset_checkpoint_replay_count() { g_replays.store(0); }

Variable checkpoint(const Variable& input, std::span<const Variable> dependencies,
                    std::function<Variable(const Variable&)> recompute, const CheckpointOptions& options) {
  const std::string where = options.name.empty() ? "checkpoint" : options.name;
  if (!input.defined()) throw ValueError("[checkpoint] " + where + ": the input is undefined");
  if (!recompute) throw ValueError("[checkpoint] " + where + ": no callable given");
  checkpoint_contract::check_dependencies(dependencies, where);

  // 1. Evaluate normally (on a fresh leaf), 2. check the boundary.
  const Random::State forward_state = options.random != nullptr ? options.random->state() : Random::State{};
  const Tensor saved_input = input.value();
  Tensor output_value;
  std::vector<Variable> constants;  // external constant leaves the callable reads
  {
    Variable fresh;
    const Variable out = traced_call(recompute, saved_input, dependencies, where, fresh, &constants);
    // 3. Keep the output value; the internal graph goes when `out` does.
    output_value = out.value();
  }
  const Shape out_shape = output_value.shape();
  const Backend out_backend = output_value.backend();

  // Parents: the input, the dependencies, then the constants (no gradient;
  // their versions are checked before any replay like a dependency's).
  std::vector<Variable> parents;
  parents.reserve(dependencies.size() + constants.size() + 1);
  parents.push_back(input);
  parents.insert(parents.end(), dependencies.begin(), dependencies.end());
  parents.insert(parents.end(), constants.begin(), constants.end());
  const std::size_t parent_count = parents.size();
  std::vector<Variable> deps(dependencies.begin(), dependencies.end());
  Random* random = options.random;

  BackwardFn backward = [recompute = std::move(recompute), saved_input, deps, where, out_shape, out_backend, random,
                         forward_state, parent_count](const Tensor& grad_output, const std::vector<bool>& needs) {
    g_replays.fetch_add(1);
    // Fresh leaf from the saved input; the same callable again, with the
    // forward's random state; the contract re-checked (structure may have
    // changed since the forward: an adapter added or removed).
    Variable fresh;
    Variable replayed;
    {
      RandomReplayScope scope(random, forward_state);
      replayed = traced_call(recompute, saved_input, deps, where + " replay", fresh);
    }
    checkpoint_contract::check_replay_output(replayed, out_shape, out_backend, where + " replay");
    // Local VJP in a nested, isolated context.
    PassResult pass = run_backward_pass(replayed, grad_output, "checkpoint replay");
    std::vector<Tensor> grads(parent_count);  // constants' slots stay undefined
    auto extract = [&](std::size_t slot, const Variable& leaf) {
      if (!needs[slot]) return;
      Tensor g = pass.context.take(leaf.node());
      grads[slot] = g.defined() ? std::move(g) : Tensor::zeros(leaf.value().shape(), leaf.value().backend());
    };
    extract(0, fresh);
    for (std::size_t i = 0; i < deps.size(); ++i) extract(i + 1, deps[i]);
    return grads;  // the outer pass adds these to its context; the replay graph is released here
  };
  return Variable::from_op("checkpoint", std::move(output_value), std::move(parents), std::move(backward),
                           {saved_input});
}

}  // namespace riftco_transformer
