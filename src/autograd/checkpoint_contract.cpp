#include "checkpoint_contract.hpp"

#include <unordered_map>
#include <unordered_set>

namespace riftco_transformer::checkpoint_contract {
namespace {

using Violation = CheckpointContractError::Violation;

[[noreturn]] void fail(Violation v, const std::string& where, const std::string& what) {
  throw CheckpointContractError(v, "[checkpoint] " + where + ": " + what);
}

std::string describe(const Node& n) {
  return n.label() + " of shape " + shape_string(n.value.shape());
}

}  // namespace

void check_dependencies(std::span<const Variable> dependencies, const std::string& where) {
  std::unordered_set<const Node*> seen;
  for (std::size_t i = 0; i < dependencies.size(); ++i) {
    const Variable& d = dependencies[i];
    if (!d.defined()) fail(Violation::MissingDependency, where, "dependency " + std::to_string(i) + " is undefined");
    if (!d.is_leaf()) {
      fail(Violation::DependencyNotLeaf, where,
           "dependency " + std::to_string(i) + " " + describe(*d.node()) +
               " is not a leaf: declare the parameters it was computed from instead");
    }
    if (!seen.insert(d.node()).second) {
      fail(Violation::DuplicateDependency, where,
           "dependency " + std::to_string(i) + " " + describe(*d.node()) + " is declared twice");
    }
  }
}

std::vector<Variable> check_boundary(const Variable& output, const Variable& input,
                                     std::span<const Variable> dependencies, std::uint64_t first_inside_id,
                                     const std::string& where) {
  std::unordered_map<const Node*, bool> boundary;  // node → reached
  boundary[input.node()] = false;
  for (const Variable& d : dependencies) boundary[d.node()] = false;

  std::vector<Variable> implicit;
  std::unordered_set<const Node*> seen{output.node()};
  std::vector<std::shared_ptr<Node>> stack{output.node_ptr()};
  while (!stack.empty()) {
    const std::shared_ptr<Node> ptr = std::move(stack.back());
    stack.pop_back();
    const Node* n = ptr.get();
    if (auto it = boundary.find(n); it != boundary.end()) {
      it->second = true;
      continue;
    }
    const bool inside = n->id >= first_inside_id;
    if (n->is_leaf) {
      if (n->requires_grad) {
        fail(inside ? Violation::UndeclaredLeaf : Violation::MissingDependency, where,
             inside ? "the callable created " + describe(*n) +
                          ", a new leaf that requires grad; parameters must be made outside and declared"
                    : "the callable uses " + describe(*n) +
                          ", a leaf that requires grad but is not a declared dependency; declare it");
      }
      if (!inside) implicit.push_back(NodeAccess::wrap(ptr));  // an external constant: kept as a parent
      continue;
    }
    if (!inside) {
      fail(Violation::CapturedExternalNode, where,
           "the callable captured " + describe(*n) +
               ", a graph node computed outside the checkpoint; pass it as the input or recompute it inside");
    }
    for (const Edge& e : n->parents) {
      if (seen.insert(e.node.get()).second) stack.push_back(e.node);
    }
  }
  if (!boundary[input.node()]) {
    fail(Violation::InputUnused, where, "the output does not depend on the input " + describe(*input.node()));
  }
  for (std::size_t i = 0; i < dependencies.size(); ++i) {
    if (!boundary[dependencies[i].node()]) {
      fail(Violation::DependencyUnused, where,
           "the output does not depend on dependency " + std::to_string(i) + " " + describe(*dependencies[i].node()));
    }
  }
  return implicit;
}

void check_replay_output(const Variable& replayed, const Shape& shape, Backend backend, const std::string& where) {
  if (!replayed.defined()) fail(Violation::OutputChanged, where, "the replay returned an undefined variable");
  if (replayed.shape() != shape || replayed.backend() != backend) {
    fail(Violation::OutputChanged, where,
         "the replay returned shape " + shape_string(replayed.shape()) + " on " + backend_name(replayed.backend()) +
             " but the forward returned " + shape_string(shape) + " on " + backend_name(backend));
  }
}

}  // namespace riftco_transformer::checkpoint_contract
