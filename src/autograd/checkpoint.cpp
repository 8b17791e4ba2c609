// checkpoint(): the mechanics. Contract checks live in checkpoint_contract.cpp.
#include "riftco_transformer/checkpoint.hpp"

#include <algorithm>
#include <atomic>
#include <optional>

#include "checkpoint_contract.hpp"
#include "gradient_context.hpp"

namespace riftco_transformer {
namespace {

std::atomic<std::int64_t> g_replays{0};

/// Whether the callable running on this thread is a replay (see
/// checkpoint_replaying()).
thread_local bool t_replaying = false;

/// Sets t_replaying for one callable invocation and puts it back after.
class ReplayingScope {
 public:
  explicit ReplayingScope(bool replaying) : previous_(t_replaying) { t_replaying = replaying; }
  ~ReplayingScope() { t_replaying = previous_; }
  ReplayingScope(const ReplayingScope&) = delete;
  ReplayingScope& operator=(const ReplayingScope&) = delete;

 private:
  bool previous_;
};

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

constexpr const char* kReadOnlyInput =
    "it is the checkpoint callable's view of its input, whose buffer other nodes saved; a checkpoint callable "
    "must not change its input (compute a new value instead)";

struct TracedCall {
  Variable fresh;  // the read-only leaf the callable received
  Variable out;
  checkpoint_contract::BoundaryScan scan;
};

/// Runs the callable on a fresh read-only leaf that shares `input_value`'s
/// buffer, recording every edge, and checks the boundary: what the output
/// reached, and that the call changed neither the input nor a dependency.
TracedCall traced_call(const std::function<Variable(const Variable&)>& recompute, const Tensor& input_value,
                       bool input_requires_grad, std::span<const Variable> dependencies, const std::string& where,
                       bool replaying) {
  TracedCall call;
  // The callable sees its input as the caller's graph has it: requiring
  // grad or not (a constant input gives constants, as outside).
  call.fresh = Variable(input_value, input_requires_grad, where + " input");
  call.fresh.node()->read_only = kReadOnlyInput;
  call.fresh.node()->checkpoint_private = where;
  const std::vector<checkpoint_contract::BoundaryVersion> before =
      checkpoint_contract::boundary_versions(call.fresh, dependencies);
  const std::uint64_t first_inside = next_node_id();
  TraceGuard trace;  // its constants drop their traced inputs when this returns
  {
    OutsideWriteWatch writes;
    OutsideLeafWatch leaf_changes;
    {
      ReplayingScope replay_flag(replaying);
      call.out = recompute(call.fresh);
    }
    trace.stop();
    // The input and the dependencies by name first, then any other buffer.
    checkpoint_contract::check_boundary_unchanged(before, call.fresh, dependencies, where);
    if (writes.tripped()) {
      throw CheckpointContractError(
          CheckpointContractError::Violation::BoundaryModified,
          "[checkpoint] " + where + ": the callable wrote into a buffer of " + std::to_string(writes.numel()) +
              " elements made outside it (" + writes.why() +
              "); a checkpoint callable may write only into buffers it makes: its replay would run the write again");
    }
    if (leaf_changes.tripped()) {
      throw CheckpointContractError(
          CheckpointContractError::Violation::BoundaryModified,
          "[checkpoint] " + where + ": the callable changed a variable made outside it (" + leaf_changes.what() +
              "); a checkpoint callable may change only variables it makes: its replay would change it again");
    }
  }
  if (!call.out.defined()) {
    throw CheckpointContractError(CheckpointContractError::Violation::OutputChanged,
                                  "[checkpoint] " + where + ": the callable returned an undefined variable");
  }
  call.scan = checkpoint_contract::check_boundary(call.out, call.fresh, dependencies, first_inside, where);
  return call;
}

}  // namespace

std::int64_t checkpoint_replay_count() { return g_replays.load(); }
bool checkpoint_replaying() { return t_replaying; }
void reset_checkpoint_replay_count() { g_replays.store(0); }

Variable checkpoint(const Variable& input, std::span<const Variable> dependencies,
                    std::function<Variable(const Variable&)> recompute, const CheckpointOptions& options) {
  const std::string where = options.name.empty() ? "checkpoint" : options.name;
  if (!input.defined()) throw ValueError("[checkpoint] " + where + ": the input is undefined");
  if (!recompute) throw ValueError("[checkpoint] " + where + ": no callable given");
  checkpoint_contract::check_dependencies(dependencies, where);

  // 1. Evaluate normally (on a fresh leaf), recording the generators' starts,
  // 2. check the boundary.
  const Random::State forward_state = options.random != nullptr ? options.random->state() : Random::State{};
  const Tensor saved_input = input.value();
  std::vector<RandomStreamStart> streams;
  Tensor output_value;
  checkpoint_contract::BoundaryScan scan;
  bool differentiable = false;
  {
    std::optional<RandomStreamRecorder> recorder;
    if (options.preserve_random_state) recorder.emplace();
    TracedCall call = traced_call(recompute, saved_input, input.requires_grad(), dependencies, where, false);
    if (recorder) streams = recorder->take();
    // 3. Keep the output value; the internal graph goes when `call` does.
    output_value = call.out.value();
    differentiable = call.out.requires_grad();
    scan = std::move(call.scan);
  }
  const Shape out_shape = output_value.shape();
  const Backend out_backend = output_value.backend();

  // Parents: the input, the dependencies, then the constants (no gradient;
  // their versions are checked before any replay like a dependency's).
  std::vector<Variable> parents;
  parents.reserve(dependencies.size() + scan.constants.size() + 1);
  parents.push_back(input);
  parents.insert(parents.end(), dependencies.begin(), dependencies.end());
  parents.insert(parents.end(), scan.constants.begin(), scan.constants.end());
  if (!differentiable) {
    // No differentiable path (everything under NoGradGuard, or no grad mode
    // now): a constant, as the ordinary graph gives. Under an outer trace it
    // keeps its inputs for the outer contract walk.
    NoGradGuard constant;
    return Variable::from_op("checkpoint", std::move(output_value), std::move(parents), nullptr);
  }
  const std::size_t parent_count = parents.size();
  std::vector<Variable> deps(dependencies.begin(), dependencies.end());
  // The dependencies whose whole gradient through this node the replay's
  // pass computes: not one that is also the input (its input part comes
  // through the replay's fresh leaf, after the pass), so never final inside.
  std::vector<Variable> final_inside;
  for (const Variable& d : deps) {
    if (d.node() != input.node()) final_inside.push_back(d);
  }
  Random* random = options.random;
  const bool input_requires_grad = input.requires_grad();
  const std::vector<bool> reached = scan.differentiable;  // input, then dependencies
  // Every constant the forward read (made outside it, or made by it and
  // cached): a replay may read no other constant made before it started.
  std::vector<std::uint64_t> constants_read = scan.constant_ids;
  for (const WatchedStorage& w : scan.watched) {  // an inner checkpoint's too
    if (const std::shared_ptr<Node> n = w.node.lock()) constants_read.push_back(n->id);
  }
  std::sort(constants_read.begin(), constants_read.end());

  BackwardFn backward = [recompute = std::move(recompute), saved_input, deps, final_inside = std::move(final_inside), where, out_shape, out_backend, random,
                         forward_state, streams = std::move(streams), input_requires_grad, reached,
                         constants_read = std::move(constants_read),
                         parent_count](const Tensor& grad_output, const std::vector<bool>& needs) {
    g_replays.fetch_add(1);
    // Fresh leaf from the saved input; the same callable again, with grad
    // mode on and the forward's random streams; the contract re-checked
    // (structure may have changed since the forward: an adapter added or
    // removed).
    TracedCall replay;
    {
      GradModeGuard grad_mode(true);
      RandomReplayScope scope(random, forward_state);
      RandomStreamReplay streams_replay(streams);
      replay = traced_call(recompute, saved_input, input_requires_grad, deps, where + " replay", true);
    }
    checkpoint_contract::check_replay_output(replay.out, out_shape, out_backend, where + " replay");
    for (const Variable& c : replay.scan.constants) {
      // Made before this replay and not read by the forward: a constant the
      // callable cached was replaced by another since (a rebuilt mask or
      // table); the ordinary graph differentiates with the values its forward
      // read, so the replay must not use the new ones.
      if (!std::binary_search(constants_read.begin(), constants_read.end(), c.node()->id)) {
        throw StaleGraphError("[checkpoint] " + where + " replay: stale graph: the callable read " +
                              c.node()->label() +
                              ", a constant its forward did not read (a constant it cached was replaced after the "
                              "forward); run the forward pass again");
      }
    }
    if (replay.scan.differentiable != reached) {
      throw CheckpointContractError(
          CheckpointContractError::Violation::OutputChanged,
          "[checkpoint] " + where + " replay: the replay reads its input or a dependency with gradient where the "
              "forward read it without (NoGradGuard), or the other way round; a checkpoint callable must do the same "
              "at every call");
    }
    std::vector<Tensor> grads(parent_count);  // constants' slots stay undefined
    // Local VJP in a nested, isolated context. The replay graph is this
    // closure's alone, so the pass frees it as it goes: each replayed node's
    // saved tensors and value go once its backward ran, not after the whole
    // block's (the block's peak is its replay, not its replay plus all of
    // its backward's temporaries).
    // When the enclosing pass has hooks (an optimizer step in the backward
    // pass), each dependency leaf is reported to them as soon as this pass
    // has it final, not after it (NestedPassHooks); a gradient they consume
    // is freed right there and its slot stays undefined.
    NestedPassHooks forward_final(final_inside);
    // This pass alone may reach the replay's own input leaf.
    struct OpenPrivate {
      Node* node;
      ~OpenPrivate() { node->private_open = false; }
    } open{replay.fresh.node()};
    open.node->private_open = true;
    PassResult pass = run_backward_pass(replay.out, grad_output, "checkpoint replay", forward_final.active(),
                                        GraphAfterBackward::Release);
    auto extract = [&](std::size_t slot, const Variable& leaf) {
      if (!needs[slot] || pass.consumed.contains(leaf.node())) return;
      Tensor g = pass.context.take(leaf.node());
      grads[slot] = g.defined() ? std::move(g) : Tensor::zeros(leaf.value().shape(), leaf.value().backend());
    };
    extract(0, replay.fresh);
    for (std::size_t i = 0; i < deps.size(); ++i) extract(i + 1, deps[i]);
    return grads;  // the outer pass adds these to its context; the replay graph is released here
  };
  Variable node = Variable::from_op("checkpoint", std::move(output_value), std::move(parents), std::move(backward),
                                    {saved_input});
  // The input or a dependency the callable read only without gradient: no
  // pass follows its edge (the ordinary graph has none); its version is
  // still checked.
  for (std::size_t i = 0; i < reached.size() && !node.is_leaf(); ++i) {
    node.node()->parents[i].differentiable = reached[i];
  }
  if (!node.is_leaf()) node.node()->watched = std::move(scan.watched);
  return node;
}

}  // namespace riftco_transformer
