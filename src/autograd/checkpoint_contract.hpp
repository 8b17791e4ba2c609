#pragma once
// The replay contract checks of checkpoint(), kept apart from the mechanics.
#include <span>

#include "node.hpp"
#include "riftco_transformer/checkpoint.hpp"

namespace riftco_transformer::checkpoint_contract {

/// Dependencies: defined, leaves, unique.
void check_dependencies(std::span<const Variable> dependencies, const std::string& where);

/// Walks the graph of `output` back to the boundary {input} ∪ dependencies.
/// Nodes created at or after `first_inside_id` belong to the callable.
/// Rejects captured external nodes, undeclared leaves that require grad (made
/// outside: missing dependency; made inside: undeclared leaf), an unused input
/// and unused dependencies. Returns the constant leaves (requires_grad false)
/// made outside the callable that it reads without declaring them — buffers
/// such as masks or frozen tables: the checkpoint keeps them as extra parents
/// so their versions are checked like a dependency's.
std::vector<Variable> check_boundary(const Variable& output, const Variable& input,
                                     std::span<const Variable> dependencies, std::uint64_t first_inside_id,
                                     const std::string& where);

/// Replay output must keep the forward output's shape and backend.
void check_replay_output(const Variable& replayed, const Shape& shape, Backend backend, const std::string& where);

}  // namespace riftco_transformer::checkpoint_contract
