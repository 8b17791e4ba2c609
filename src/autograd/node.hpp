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
  std::uint64_t version = 0;     // parent's version() when this node was made
  std::uint64_t structural = 0;  // parent's structural_changes then (to word the stale-graph message)
  /// False for a checkpoint's input or dependency its callable read only
  /// without gradient (under NoGradGuard, detached): the edge keeps the
  /// version check, but no pass follows it, as no pass reaches a value read
  /// that way in the ordinary graph (no gradient, grad_serial unmoved).
  bool differentiable = true;
};

/// A constant a checkpoint callable made itself and read, watched without
/// being kept alive: if its node or its buffer still exists at backward,
/// neither may have changed since (a cached constant replaced with
/// set_value, frozen/unfrozen, or written in place through any handle).
struct WatchedStorage {
  std::weak_ptr<const Storage> storage;
  std::uint64_t version = 0;  // the buffer's
  std::weak_ptr<Node> node;
  std::uint64_t node_version = 0;
  std::uint64_t node_structural = 0;  // its structural_changes then (for the message)
  std::string what;  // the constant, for messages
};

struct Node;
/// A structural change of `node` (value replaced or moved, marked changed,
/// requires_grad flipped): an OutsideLeafWatch on this thread notes it when
/// the node is older than the watch.
void note_leaf_change(const Node& node);

struct Node {
  Tensor value;
  Tensor grad;  // committed public gradient (undefined until a pass reaches it)
  std::uint64_t grad_serial = 0;  // the commit that set `grad` (process-wide, never repeats); 0: none yet
  std::vector<Edge> parents;
  BackwardFn backward;
  std::vector<Tensor> saved;  // what the closure keeps, for retained_nodes()
  /// Traced constants only (made by an op under TraceGuard with no input
  /// that requires grad): the op's inputs, for the checkpoint contract walk.
  /// The node is still a leaf; checkpoint() clears these after its walk.
  std::vector<std::shared_ptr<Node>> trace_parents;
  /// Buffers read by what this node replays (checkpoint), checked with the
  /// parents' versions before a pass.
  std::vector<WatchedStorage> watched;
  std::string op = "leaf";
  std::string name;
  // version() = value_offset + value.version() + flag_changes (mod 2^64):
  // the storage's counter (shared by every view of the bytes) plus this
  // node's own structural changes. It never repeats a value: replacing the
  // value re-bases value_offset so version() still moves up by one.
  std::uint64_t value_offset = 0;
  std::uint64_t flag_changes = 0;       // requires_grad turned on or off
  std::uint64_t structural_changes = 0;  // every change made through this node (messages)
  std::uint64_t own_version = 0;         // non-leaves: value.version() when made (backward may read the value)
  std::string last_change;               // why the node last changed structurally, for messages
  /// Set on a checkpoint's replay input: the callable may read it, never
  /// change it (mutable_value, set_value, ... throw ValueError naming this).
  const char* read_only = nullptr;
  /// Set on the leaf a checkpoint's callable receives (its forward's and each
  /// replay's): the checkpoint's name. Only that replay's own nested pass may
  /// reach it (`private_open`); any other pass that does reached a value the
  /// callable let out of the checkpoint, whose gradient would go to this
  /// hidden leaf instead of the real input (CheckpointContractError).
  std::string checkpoint_private;
  bool private_open = false;
  bool requires_grad = false;
  bool is_leaf = true;
  bool retain_grad = false;
  /// A backward with GraphAfterBackward::Release ran through this node and
  /// freed its closure, saved tensors and edges: no pass may reach it again.
  bool released = false;
  const std::uint64_t id;  // creation order, process-wide (checkpoint tells inside from outside)

  Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  /// Releases long parent chains iteratively (a 10k-node chain must not
  /// overflow the stack when its last handle goes away).
  ~Node();

  std::string label() const;  // "'name' (op)" or "op node" for messages
  std::uint64_t version() const { return value_offset + value.version() + flag_changes; }
  /// version() without requires_grad changes: what a cache of values (decode) depends on.
  std::uint64_t value_version() const { return value_offset + value.version(); }
  /// A structural change of this node (value replaced, moved, marked): version() moves up by one.
  void bump(std::string why) {
    ++value_offset;
    ++structural_changes;
    last_change = std::move(why);
    note_leaf_change(*this);
  }
  /// Replaces the value and moves version() up by one whatever the new
  /// storage's own counter is.
  void replace_value(Tensor next, std::string why) {
    const std::uint64_t before = version();
    value = std::move(next);
    value_offset = before + 1 - value.version() - flag_changes;
    ++structural_changes;
    last_change = std::move(why);
    note_leaf_change(*this);
  }
};

/// Why `node` changed since an edge recorded `structural_then` (its
/// structural_changes at the time): its own last structural change, or the
/// last in-place write to its buffer.
inline std::string change_reason(const Node& node, std::uint64_t structural_then) {
  if (node.structural_changes != structural_then) return node.last_change;
  return std::string("its buffer was ") + node.value.last_change();
}

/// The id the next node will get.
std::uint64_t next_node_id();

/// While alive, notes the first structural change on this thread of a node
/// made before the watch started (checkpoint: a callable may change only
/// leaves it makes; an outside leaf it replaced with set_value would be
/// replaced again by every replay).
class OutsideLeafWatch {
 public:
  OutsideLeafWatch();
  ~OutsideLeafWatch();
  OutsideLeafWatch(const OutsideLeafWatch&) = delete;
  OutsideLeafWatch& operator=(const OutsideLeafWatch&) = delete;
  bool tripped() const { return !what_.empty(); }
  /// "<label>: <its change>" of the first such node.
  const std::string& what() const { return what_; }

 private:
  friend void note_leaf_change(const Node& node);
  std::uint64_t first_id_;
  std::string what_;
};

/// While alive, ops on this thread that make constants keep their inputs
/// aside (Node::trace_parents), so a checkpoint can walk everything its
/// callable used. The guard lists those constants; release_traces() drops
/// their inputs once the walk is done (a constant the callable caches must
/// not keep its first input alive).
class TraceGuard {
 public:
  TraceGuard();
  ~TraceGuard();
  TraceGuard(const TraceGuard&) = delete;
  TraceGuard& operator=(const TraceGuard&) = delete;
  static bool active();
  /// Ends tracing on this thread (ops no longer trace) but keeps the list
  /// for release_traces(); the destructor does both.
  void stop();
  /// Called by Variable::from_op for every traced constant.
  static void note(const std::shared_ptr<Node>& constant);
  /// Clears trace_parents of every constant made under this guard.
  void release_traces();

 private:
  TraceGuard* previous_;
  bool stopped_ = false;
  std::vector<std::weak_ptr<Node>> constants_;
};

/// While alive, sets this thread's grad mode (on: ops build graphs even under
/// an outer NoGradGuard; a checkpoint replay needs its graph).
class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled);
  ~GradModeGuard();
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool previous_no_grad_;
};

/// Friend accessor so engine code can reach a Variable's node pointer and
/// build Variables around existing nodes.
struct NodeAccess {
  static Variable wrap(std::shared_ptr<Node> node) { return Variable(std::move(node)); }
};

}  // namespace riftco_transformer
