#pragma once
// The autograd node behind a Variable (private to the autograd layer).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

struct Edge {
  std::shared_ptr<Node> node;
  std::uint64_t version = 0;  // parent's version when this node was made
};

struct Node {
  Tensor value;
  Tensor grad;  // committed public gradient (undefined until a pass reaches it)
  std::vector<Edge> parents;
  BackwardFn backward;
  std::vector<Tensor> saved;  // what the closure keeps, for retained_nodes()
  std::string op = "leaf";
  std::string name;
  std::uint64_t version = 0;
  std::string last_change;  // why the version last moved, for stale-graph messages
  bool requires_grad = false;
  bool is_leaf = true;
  bool retain_grad = false;
  const std::uint64_t id;  // creation order, process-wide (checkpoint tells inside from outside)

  Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  /// Releases long parent chains iteratively (a 10k-node chain must not
  /// overflow the stack when its last handle goes away).
  ~Node();

  std::string label() const;  // "'name' (op)" or "op node" for messages
  void bump(std::string why) {
    ++version;
    last_change = std::move(why);
  }
};

/// The id the next node will get.
std::uint64_t next_node_id();

/// While alive, ops on this thread record their parents even when none
/// requires grad, so a checkpoint can walk everything its callable used.
class TraceGuard {
 public:
  TraceGuard();
  ~TraceGuard();
  TraceGuard(const TraceGuard&) = delete;
  TraceGuard& operator=(const TraceGuard&) = delete;
  static bool active();

 private:
  bool previous_;
};

/// Friend accessor so engine code can reach a Variable's node pointer and
/// build Variables around existing nodes.
struct NodeAccess {
  static Variable wrap(std::shared_ptr<Node> node) { return Variable(std::move(node)); }
};

}  // namespace riftco_transformer
