#pragma once
// GradientContext: where one backward pass accumulates gradients. Nothing in
// it is public until the pass commits; a nested pass (checkpoint replay) uses
// its own context and hands its results to the outer one.
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "node.hpp"

namespace riftco_transformer {

class GradientContext {
 public:
  /// grad(node) += g. Takes `g` by handle; copies only when a second
  /// contribution arrives and the first buffer is shared with someone else.
  void accumulate(const Node* node, Tensor g);
  /// The accumulated gradient, or nullptr.
  const Tensor* find(const Node* node) const;
  /// Removes and returns the gradient (undefined when none).
  Tensor take(const Node* node);
  void erase(const Node* node) { grads_.erase(node); }

 private:
  std::unordered_map<const Node*, Tensor> grads_;
};

/// One backward pass from `root` with gradient `seed`, in a fresh context.
/// Validates versions of the whole reachable graph first (StaleGraphError),
/// then runs closures in reverse topological order. On return the context
/// holds the gradients of every reached leaf that requires grad and of every
/// node with retain_grad; other intermediate gradients are freed as soon as
/// they are consumed. Touches no public state. With `hooks`, calls
/// hooks->begin_pass() after the version check and hooks->gradient_final()
/// for each leaf requiring grad right after the last node that has it as an
/// input ran (leaves no node consumes: at the start); finish() is the
/// caller's (Variable::backward).
/// With GraphAfterBackward::Release, each non-leaf node is released right
/// after it ran (or was found to receive no gradient): its closure, saved
/// tensors and edges go, and the node itself (value included) when nothing
/// outside the graph holds it; a pass that reaches a released node throws
/// BackwardError before computing anything.
/// A leaf whose gradient the hooks consumed (BackwardHooks::consumes) loses
/// it from the context right after gradient_final and is listed in
/// `consumed`: the commit clears its public gradient.
struct PassResult {
  GradientContext context;
  // Held, not borrowed: with Release the graph no longer keeps them alive.
  std::vector<std::shared_ptr<Node>> leaves;    // leaves requiring grad, in discovery order
  std::vector<std::shared_ptr<Node>> retained;  // non-leaf nodes with retain_grad
  std::unordered_set<const Node*> consumed;     // leaves whose gradient a hook consumed
};
PassResult run_backward_pass(const Variable& root, const Tensor& seed, const char* op,
                             BackwardHooks* hooks = nullptr, GraphAfterBackward graph = GraphAfterBackward::Keep);

struct PassChannel;  // gradient_context.cpp

/// The BackwardHooks a pass nested in a node's closure (a checkpoint's
/// replay) runs with, so that the enclosing pass's hooks hear of the node's
/// dependency leaves as soon as the nested pass has them final instead of
/// after the whole nested pass (docs/autograd.md, "Leaves final inside a
/// nested pass"). Made inside the closure, it captures the enclosing pass's
/// channel (set by run_backward_pass around each closure it runs while it
/// has hooks): when the nested pass finds one of `dependencies` final and
/// the closure's node is that leaf's last pending consumer in the enclosing
/// pass, whose context holds no gradient for it yet, the enclosing pass
/// reports it there and then (never again). When its hooks consume it,
/// consumes() says so: the nested pass drops the gradient at once and the
/// closure returns an undefined gradient for that input. Otherwise the
/// gradient goes back as usual. Nests: the enclosing pass may itself run
/// with a NestedPassHooks, and the report goes up level by level.
/// `dependencies` must be leaves whose every contribution through the node
/// comes from this nested pass: a leaf that is also the node's input through
/// a different nested leaf (a checkpoint's input that is also a dependency)
/// is left out by the caller, or its report would miss that part.
class NestedPassHooks final : public BackwardHooks {
 public:
  explicit NestedPassHooks(std::span<const Variable> dependencies);
  /// this, or nullptr when the enclosing pass has no hooks (no cost then).
  BackwardHooks* active() { return channel_ != nullptr ? this : nullptr; }
  void gradient_final(const Variable& leaf, const Tensor& gradient) override;
  bool consumes(const Variable& leaf) const override { return consumed_.contains(leaf.node()); }
  /// The enclosing pass's hooks' node_done(), for each node the nested pass
  /// runs (a bucketed all-reduce keeps moving during a replay).
  void node_done() override;
  std::vector<std::pair<Variable, Tensor>> finish() override { return {}; }

 private:
  const PassChannel* channel_;
  std::unordered_set<const Node*> dependencies_;
  std::unordered_set<const Node*> consumed_;
};

/// Reverse topological order helper: every node reachable from `root`
/// through edges to nodes that require grad; parents come before children.
std::vector<std::shared_ptr<Node>> topological_order(const std::shared_ptr<Node>& root);

}  // namespace riftco_transformer
