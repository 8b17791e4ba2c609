#pragma once
// The replay contract checks of checkpoint(), kept apart from the mechanics.
#include <span>

#include "node.hpp"
#include "riftco_transformer/checkpoint.hpp"

namespace riftco_transformer::checkpoint_contract {

/// Dependencies: defined, leaves, unique.
void check_dependencies(std::span<const Variable> dependencies, const std::string& where);

/// What the boundary walk found besides the declared boundary.
struct BoundaryScan {
  /// Nodes made outside the callable that do not require grad (constants,
  /// leaf or not: masks, frozen tables, values computed under NoGradGuard):
  /// the checkpoint keeps them as extra parents so their versions are
  /// checked like a dependency's.
  std::vector<Variable> constants;
  /// Buffers of constants the callable made itself (a table it caches for
  /// later calls, a leaf over a captured Tensor): watched without being kept
  /// alive, so a later in-place write to one that survives is a stale graph.
  std::vector<WatchedStorage> watched;
  /// The input, then each dependency: whether the output reaches it through
  /// a differentiable path (not only through values computed from it
  /// without gradient).
  std::vector<bool> differentiable;
  /// Ids of every constant node the walk reached (outside ones and the
  /// callable's own, a cached one included): a replay may read no constant
  /// made before it that its forward did not read.
  std::vector<std::uint64_t> constant_ids;
};

/// Walks the graph of `output` back to the boundary {input} ∪ dependencies.
/// Nodes created at or after `first_inside_id` belong to the callable.
/// Rejects captured external nodes that require grad, undeclared leaves that
/// require grad (made outside: missing dependency; made inside: undeclared
/// leaf), an unused input and unused dependencies. Afterwards the callable's
/// own constants drop the inputs they were traced from (only this walk needed
/// them).
BoundaryScan check_boundary(const Variable& output, const Variable& input, std::span<const Variable> dependencies,
                            std::uint64_t first_inside_id, const std::string& where);

/// Versions of the boundary (input, dependencies) before a call, and the check
/// that the call changed none of them: a replay-safe callable never writes
/// into what it reads.
struct BoundaryVersion {
  std::uint64_t version;
  std::uint64_t structural;
};
std::vector<BoundaryVersion> boundary_versions(const Variable& input, std::span<const Variable> dependencies);
void check_boundary_unchanged(const std::vector<BoundaryVersion>& before, const Variable& input,
                              std::span<const Variable> dependencies, const std::string& where);

/// Replay output must keep the forward output's shape and backend, and
/// require grad (as the forward's did: only such an output has a node).
void check_replay_output(const Variable& replayed, const Shape& shape, Backend backend, const std::string& where);

}  // namespace riftco_transformer::checkpoint_contract
