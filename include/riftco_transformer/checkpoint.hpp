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
    OutputChanged,            ///< replay output shape/backend differs from the forward's
  };
  CheckpointContractError(Violation violation, const std::string& message)
      : Error(message), violation_(violation) {}
  Violation violation() const { return violation_; }

 private:
  Violation violation_;
};

struct CheckpointOptions {
  /// When set, the generator's state is captured before the forward call and
  /// restored for the replay (then put back), so random ops such as dropout
  /// rebuild the same masks.
  Random* random = nullptr;
  /// Name used in messages and retained_nodes() ("checkpoint" by default).
  std::string name;
};

/// Forward: evaluates `recompute(input)` normally (on a fresh leaf that shares
/// the input's buffer), enforces the replay contract by walking the produced
/// graph back to the boundary, keeps only the output value and returns one
/// node whose parents are the input and the dependencies.
/// Backward: a fresh leaf from the saved input, the same callable again, a
/// nested isolated gradient pass (VJP), the input and dependency gradients
/// handed to the outer pass; the replay graph is then released.
///
/// One thread builds and differentiates a given graph at a time: "made inside
/// the callable" is decided by node creation order, which is process-wide.
///
/// Every dependency must be a unique leaf. A dependency may be frozen
/// (requires_grad false): it is still part of the boundary (its version is
/// checked) but receives no gradient. The input need not require grad.
Variable checkpoint(const Variable& input, std::span<const Variable> dependencies,
                    std::function<Variable(const Variable&)> recompute, const CheckpointOptions& options = {});

/// Number of checkpoint replays (backward evaluations) since process start or
/// the last reset. Thread-safe.
std::int64_t checkpoint_replay_count();
void reset_checkpoint_replay_count();

}  // namespace riftco_transformer
