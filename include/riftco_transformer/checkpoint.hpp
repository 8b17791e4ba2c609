#pragma once
// Activation checkpointing: the reusable core primitive (spec "Replay
// contract"). The mechanics are small — run, keep the output value, drop the
// graph, replay on backward — and the contract checks sit beside them in
// src/autograd/checkpoint_contract.cpp.
#include <cstdint>
#include <functional>
#include <span>

#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

/// A violated replay contract. `violation()` says which rule; the message
/// starts with "[checkpoint]" and names the offending node.
class CheckpointContractError : public Error {
 public:
  enum class Violation : std::uint8_t {
    MissingDependency,        ///< an undefined dependency handle, or a leaf the callable uses that is not declared
    DuplicateDependency,      ///< the same leaf declared twice
    DependencyNotLeaf,        ///< a declared dependency is an intermediate graph node
    CapturedExternalNode,     ///< the callable reached a node made outside it that is not declared
    UndeclaredLeaf,           ///< the callable created a new leaf that requires grad
    InputUnused,              ///< the output does not depend on the input
    DependencyUnused,         ///< the output does not depend on a declared dependency
    OutputChanged,            ///< replay output shape/backend differs from the forward's, or lost its grad
    BoundaryModified,         ///< the callable wrote into (or replaced, with set_value...) a buffer or variable made outside it
    InternalValueEscaped,     ///< a backward pass reached a value computed inside the callable through a path outside the checkpoint
  };
  CheckpointContractError(Violation violation, const std::string& message)
      : Error(message), violation_(violation) {}
  Violation violation() const { return violation_; }

 private:
  Violation violation_;
};

struct CheckpointOptions {
  /// On by default (PyTorch's preserve_rng_state=True): every generator the
  /// library's random ops (dropout, Tensor::normal/uniform) draw from inside
  /// the callable is recorded at its first use; the replay rewinds each to
  /// that state at its first use and puts the live state back afterwards, so
  /// the replay rebuilds the same masks and backward never moves the
  /// caller's streams. Such a generator must outlive the backward. Off: the
  /// replay draws fresh numbers from the live generators (and advances them).
  bool preserve_random_state = true;
  /// Optional: a generator whose whole state is captured before the forward
  /// call and restored for the replay (then put back), used or not. Not
  /// owned: it must outlive the backward (every replay reads and restores it).
  Random* random = nullptr;
  /// Name used in messages and retained_nodes() ("checkpoint" by default).
  std::string name;
};

/// Forward: evaluates `recompute(input)` normally (on a fresh, read-only leaf
/// that shares the input's buffer), enforces the replay contract by walking
/// the produced graph back to the boundary, keeps only the output value and
/// returns one node whose parents are the input, the dependencies and the
/// outside constants it read. An output with no differentiable path (all
/// computed under NoGradGuard) is returned as a constant, as the ordinary
/// graph would.
/// Backward: a fresh leaf from the saved input, the same callable again with
/// grad mode on whatever the caller's, a nested isolated gradient pass (VJP),
/// the input and dependency gradients handed to the outer pass; the replay
/// graph is then released.
///
/// One thread builds and differentiates a given graph at a time: "made inside
/// the callable" is decided by node creation order, which is process-wide.
///
/// Every dependency must be a unique leaf. A dependency may be frozen
/// (requires_grad false): it is still part of the boundary (its version is
/// checked) but receives no gradient. The input need not require grad.
Variable checkpoint(const Variable& input, std::span<const Variable> dependencies,
                    std::function<Variable(const Variable&)> recompute, const CheckpointOptions& options = {});

/// True while the calling thread runs a checkpoint callable as a replay
/// (inside backward()), false during its forward call and outside any
/// checkpoint; a checkpoint's forward call inside a replay (a nested
/// checkpoint) sees false, and its own replays true. A replay's output value
/// is never read — only its shape, its backend and its graph are — so a
/// callable may leave the value of its final op uncomputed there (the
/// model's blocks skip their last projection; docs/checkpointing.md,
/// "What a replay computes"). Everything the backward reads must still be
/// computed, with the forward's bits.
bool checkpoint_replaying();

/// Number of checkpoint replays (backward evaluations) since process start or
/// the last reset. Thread-safe.
std::int64_t checkpoint_replay_count();
void reset_checkpoint_replay_count();

}  // namespace riftco_transformer
