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

BoundaryScan check_boundary(const Variable& output, const Variable& input, std::span<const Variable> dependencies,
                            std::uint64_t first_inside_id, const std::string& where) {
  std::unordered_map<const Node*, bool> boundary;  // node → reached
  boundary[input.node()] = false;
  for (const Variable& d : dependencies) boundary[d.node()] = false;

  BoundaryScan scan;
  std::unordered_set<const void*> watched_storages;
  std::unordered_set<const Node*> seen{output.node()};
  std::vector<std::shared_ptr<Node>> stack{output.node_ptr()};
  auto visit = [&](const std::shared_ptr<Node>& next) {
    if (seen.insert(next.get()).second) stack.push_back(next);
  };
  while (!stack.empty()) {
    const std::shared_ptr<Node> ptr = std::move(stack.back());
    stack.pop_back();
    const Node* n = ptr.get();
    if (auto it = boundary.find(n); it != boundary.end()) {
      it->second = true;
      continue;
    }
    const bool inside = n->id >= first_inside_id;
    if (!inside) {
      if (n->requires_grad) {
        if (n->is_leaf) {
          fail(Violation::MissingDependency, where,
               "the callable uses " + describe(*n) +
                   ", a leaf that requires grad but is not a declared dependency; declare it");
        }
        fail(Violation::CapturedExternalNode, where,
             "the callable captured " + describe(*n) +
                 ", a graph node computed outside the checkpoint; pass it as the input or recompute it inside");
      }
      scan.constants.push_back(NodeAccess::wrap(ptr));  // a constant made outside: kept as a parent
      scan.constant_ids.push_back(n->id);
      continue;
    }
    if (n->is_leaf) {
      if (n->requires_grad) {
        fail(Violation::UndeclaredLeaf, where,
             "the callable created " + describe(*n) +
                 ", a new leaf that requires grad; parameters must be made outside and declared");
      }
      scan.constant_ids.push_back(n->id);
      if (watched_storages.insert(n->value.storage_id()).second) {
        scan.watched.push_back(
            {n->value.weak_storage(), n->value.version(), ptr, n->version(), n->structural_changes, describe(*n)});
      }
      for (const std::shared_ptr<Node>& t : n->trace_parents) visit(t);
      continue;
    }
    // An inner checkpoint made inside: what its callable made and read is
    // read by this one too.
    scan.watched.insert(scan.watched.end(), n->watched.begin(), n->watched.end());
    for (const Edge& e : n->parents) visit(e.node);
  }
  if (!boundary[input.node()]) {
    fail(Violation::InputUnused, where, "the output does not depend on the input " + describe(*input.node()));
  }
  // Which of them a gradient reaches: through the callable's non-leaf nodes
  // (ops with an input that requires grad) only; a constant it computed
  // from one under NoGradGuard leads back to it through trace_parents alone.
  std::unordered_set<const Node*> differentiable;
  {
    std::unordered_set<const Node*> walked{output.node()};
    std::vector<const Node*> todo{output.node()};
    while (!todo.empty()) {
      const Node* n = todo.back();
      todo.pop_back();
      if (boundary.contains(n)) {
        differentiable.insert(n);
        continue;
      }
      if (n->is_leaf || n->id < first_inside_id) continue;
      for (const Edge& e : n->parents) {
        if (e.differentiable && e.node->requires_grad && walked.insert(e.node.get()).second) todo.push_back(e.node.get());
      }
    }
  }
  scan.differentiable.push_back(differentiable.contains(input.node()));
  for (const Variable& d : dependencies) scan.differentiable.push_back(differentiable.contains(d.node()));
  for (std::size_t i = 0; i < dependencies.size(); ++i) {
    if (!boundary[dependencies[i].node()]) {
      fail(Violation::DependencyUnused, where,
           "the output does not depend on dependency " + std::to_string(i) + " " + describe(*dependencies[i].node()));
    }
  }
  return scan;
}

std::vector<BoundaryVersion> boundary_versions(const Variable& input, std::span<const Variable> dependencies) {
  std::vector<BoundaryVersion> versions{{input.version(), input.node()->structural_changes}};
  for (const Variable& d : dependencies) versions.push_back({d.version(), d.node()->structural_changes});
  return versions;
}

void check_boundary_unchanged(const std::vector<BoundaryVersion>& before, const Variable& input,
                              std::span<const Variable> dependencies, const std::string& where) {
  auto check = [&](const Variable& v, const BoundaryVersion& was, const std::string& role) {
    if (v.version() == was.version) return;
    const Node& n = *v.node();
    fail(Violation::BoundaryModified, where,
         "the callable changed its " + role + " " + describe(n) + " (" + change_reason(n, was.structural) +
             "); a checkpoint callable must not write into what it reads: its replay would see other values");
  };
  check(input, before[0], "input");
  for (std::size_t i = 0; i < dependencies.size(); ++i) check(dependencies[i], before[i + 1], "dependency " + std::to_string(i));
}

void check_replay_output(const Variable& replayed, const Shape& shape, Backend backend, const std::string& where) {
  if (!replayed.defined()) fail(Violation::OutputChanged, where, "the replay returned an undefined variable");
  if (replayed.shape() != shape || replayed.backend() != backend) {
    fail(Violation::OutputChanged, where,
         "the replay returned shape " + shape_string(replayed.shape()) + " on " + backend_name(replayed.backend()) +
             " but the forward returned " + shape_string(shape) + " on " + backend_name(backend));
  }
  // Only a forward output that required grad has a checkpoint node to
  // replay. A replay without that path (run under no_grad, or returning a
  // constant) would send zeros to the input and every dependency.
  if (!replayed.requires_grad()) {
    fail(Violation::OutputChanged, where,
         "the replay's output does not require grad but the forward's did (the callable ran under no_grad or "
         "returned a constant when replaying): its gradients would be zeros");
  }
}

}  // namespace riftco_transformer::checkpoint_contract
