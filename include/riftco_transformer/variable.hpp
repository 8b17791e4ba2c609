#pragma once
// Variable: a shared handle to an autograd node.
//
// A node holds its value Tensor, a public gradient slot of the same shape,
// its parents with the versions they had when the node was made, a backward
// closure, requires_grad / leaf flags and a name for error messages.
// backward() runs every pass in an isolated GradientContext and commits
// gradients only after the whole pass succeeded (see docs/autograd.md).
// Versions live with the bytes (Storage): an in-place write through any
// handle on a buffer makes every graph that read it stale.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer {

struct Node;
class Variable;

/// Observes one backward pass and may replace the gradients it commits
/// (data-parallel gradient reduction: GradientBucketer). Used through
/// Variable::backward(seed, hooks); the engine calls, in this order:
/// begin_pass() once the graph's versions were checked; gradient_final()
/// for each leaf as soon as it is final; finish() after the last node ran.
class BackwardHooks {
 public:
  virtual ~BackwardHooks() = default;
  /// The pass starts (nothing was computed yet). May throw: nothing is committed.
  virtual void begin_pass() {}
  /// `leaf` (a leaf that requires grad) receives nothing more in this pass:
  /// no node still to run has it as an input. For a checkpointed block's
  /// dependencies that is inside the block's replay backward, as soon as
  /// that nested pass has it final (docs/autograd.md). `gradient` is its gradient in the pass, undefined when no
  /// contribution reached it (the commit makes that zeros). Read it, never
  /// write into it: its buffer may be shared with other gradients of the
  /// pass. Called in the order leaves become final, once per leaf.
  virtual void gradient_final(const Variable& leaf, const Tensor& gradient) = 0;
  /// Asked right after gradient_final(leaf, ...): true when the hook
  /// consumed that gradient (an optimizer step inside the backward pass,
  /// Adam::backward_and_step). The engine then frees the gradient at once,
  /// and the commit leaves the leaf without one (grad() undefined, as after
  /// clear_grad) instead of publishing it; finish() may not return a
  /// gradient for it (BackwardError). Default: false for every leaf.
  virtual bool consumes(const Variable& leaf) const {
    (void)leaf;
    return false;
  }
  /// After each node's backward ran (and its leaves were reported): a place
  /// to make progress on communication in flight. Default: nothing.
  virtual void node_done() {}
  /// After every node ran and every leaf was reported, before anything is
  /// committed: gradients that replace the pass's own (e.g. the all-reduced
  /// ones), for any leaves that require grad, including leaves the pass did
  /// not reach, each at most once (BackwardError otherwise); each must have
  /// its leaf's shape and backend (ShapeError otherwise). An
  /// exception here (a failed collective) commits nothing.
  virtual std::vector<std::pair<Variable, Tensor>> finish() = 0;
};

/// What backward() does with the graph it runs through.
enum class GraphAfterBackward : std::uint8_t {
  /// Keep every node's closure and saved tensors: backward() may run on the
  /// same graph again and gives the same gradients (the default).
  Keep,
  /// Free the graph as the pass goes (PyTorch's backward without
  /// retain_graph): right after a node's backward ran, its closure, the
  /// tensors it saved and its edges to its inputs go, and so does the node
  /// unless something outside the graph (a Variable the caller holds,
  /// retain_grad) keeps it; such a node's value goes before its backward
  /// runs (closures keep what they read). A training step's peak is then
  /// the gradients plus what is not yet differentiated, not every
  /// activation plus every gradient. The commit is unchanged: all or
  /// nothing. A later pass that reaches a released node throws
  /// BackwardError before computing anything, also after a pass that threw
  /// midway (its public gradients are untouched; run the forward again).
  Release,
};

/// Gradient of the loss with respect to each parent, given the gradient with
/// respect to the node's output. Returns one Tensor per parent, in order; an
/// undefined Tensor means "no gradient" (allowed where needs_grad is false).
using BackwardFn =
    std::function<std::vector<Tensor>(const Tensor& grad_output, const std::vector<bool>& needs_grad)>;

/// Structural diagnostic (spec "Diagnostics and tests"): reachable nodes and
/// the Tensor elements they own directly (values and committed gradients).
/// Backend workspaces and tensors captured by closures are not counted; a
/// buffer that several nodes view (reshape) counts once.
struct GraphStatistics {
  std::int64_t node_count = 0;
  std::int64_t element_count = 0;
};

/// One row of the "what is saved" view: what a node keeps alive.
struct RetainedNode {
  std::string kind;  // op name, or "leaf"
  std::string name;  // the node's name ("" for unnamed intermediates)
  Shape shape;
  std::int64_t value_bytes = 0;
  std::int64_t grad_bytes = 0;
  std::int64_t saved_bytes = 0;  // tensors kept for backward that no reachable node owns as its value
};

class Variable {
 public:
  /// An undefined handle.
  Variable() = default;
  /// A leaf holding `value`.
  explicit Variable(Tensor value, bool requires_grad = false, std::string name = "");

  /// A node made by a differentiable op. When no parent requires grad (or
  /// NoGradGuard is active) the result is a constant leaf with no parents
  /// (inside a checkpoint callable too: tracing never changes what it sees).
  /// `saved` lists the tensors the closure keeps (for retained_nodes()).
  /// ValueError naming `op`: an undefined value or parent, or an empty
  /// `backward` when a parent requires grad (outside NoGradGuard).
  static Variable from_op(std::string op, Tensor value, std::vector<Variable> parents, BackwardFn backward,
                          std::vector<Tensor> saved = {});

  bool defined() const { return node_ != nullptr; }
  const Tensor& value() const;
  const Shape& shape() const { return value().shape(); }
  Backend backend() const { return value().backend(); }

  bool requires_grad() const;
  /// Leaves only. Changing it is a structural change: bumps the version.
  void set_requires_grad(bool requires_grad);
  bool is_leaf() const;
  const std::string& name() const;
  void set_name(std::string name);
  /// The op that made this node ("leaf" for leaves).
  const std::string& op() const;
  std::vector<Variable> parents() const;

  /// Leaves only: replaces the value (any shape) and bumps the version.
  /// An Adam built over this leaf refuses to step it with a new shape.
  void set_value(Tensor value);
  /// Leaves only: a handle on the value's buffer for an in-place update.
  /// Bumps the buffer's version first, so every graph that read the buffer,
  /// through this leaf or any other handle on it, becomes stale. `why` (a
  /// string literal) appears in the StaleGraphError message.
  Tensor mutable_value(const char* why = "updated in place");
  /// Leaves only: moves the value to `backend` and bumps the version.
  void to(Backend backend);
  /// Moves every leaf of `leaves` (and its gradient) to `backend`, all or
  /// nothing: every copy is made before any leaf changes, so a failed copy
  /// (out of device memory, a non-leaf in the list) leaves them all as they
  /// were. Leaves already there are not touched.
  static void to(std::span<const Variable> leaves, Backend backend);
  /// Moves up on every change a graph must not survive: an in-place write to
  /// the value's buffer through any handle, set_value, to(), mark_changed,
  /// set_requires_grad. Never repeats a value.
  std::uint64_t version() const;
  /// Like version() but not moved by set_requires_grad: what a cache of
  /// computed values (a DecodeSession's K/V cache) depends on.
  std::uint64_t value_version() const;
  /// Leaves only: a structural change that graphs built earlier must not
  /// survive (e.g. a LoRA adapter added to this weight); bumps the version.
  /// `reason` appears in the StaleGraphError message.
  void mark_changed(std::string reason);

  /// The committed gradient; undefined before the first backward() that
  /// reached this node.
  const Tensor& grad() const;
  bool has_grad() const { return grad().defined(); }
  /// Which commit set grad(): moves whenever a pass commits this node's
  /// gradient (or clear_grad drops it), never repeats within the process.
  /// An optimizer compares it with the one it last stepped with, so a
  /// gradient a pass did not renew is not applied twice (docs/autograd.md).
  std::uint64_t grad_serial() const;
  /// grad() and grad_serial() read together, the gradient as a handle of its
  /// own: a backward committing or clear_grad() dropping this gradient in
  /// another thread meanwhile cannot free what the caller reads (optimizers).
  std::pair<Tensor, std::uint64_t> grad_with_serial() const;
  /// Drops the committed gradient (PyTorch's zero_grad(set_to_none=True)).
  /// Serialised with commits of other threads' passes.
  void clear_grad();
  /// Keep this non-leaf node's gradient after backward().
  void retain_grad();

  /// Scalar outputs: seed 1. Non-scalar outputs must pass a seed. Works the
  /// same under NoGradGuard. Graphs on several threads may share leaves:
  /// each pass commits all its gradients at once under a process-wide lock
  /// (the last commit wins whole). Reading grad() while another thread
  /// commits to the same leaf is a race: join first.
  void backward() const;
  void backward(const Tensor& seed) const;
  /// The same pass, observed by `hooks` (see BackwardHooks): the gradients
  /// finish() returns are committed instead of the pass's own, with the
  /// same all-or-nothing guarantee (an exception in a hook commits nothing).
  /// backward(hooks) seeds a scalar output with 1.
  void backward(BackwardHooks& hooks) const;
  void backward(const Tensor& seed, BackwardHooks& hooks) const;
  /// The same four, choosing what happens to the graph (GraphAfterBackward:
  /// the overloads above keep it).
  void backward(GraphAfterBackward graph) const;
  void backward(const Tensor& seed, GraphAfterBackward graph) const;
  void backward(BackwardHooks& hooks, GraphAfterBackward graph) const;
  void backward(const Tensor& seed, BackwardHooks& hooks, GraphAfterBackward graph) const;

  /// The leaves of this graph that require grad (its parameters and
  /// inputs), each once, in depth-first discovery order from this node. They
  /// stay reachable (and their gradients readable) for as long as this
  /// Variable lives, whatever made them, unless a
  /// backward(GraphAfterBackward::Release) ran through the graph: a released
  /// node no longer leads to its inputs, and leaves() throws BackwardError
  /// naming it (list them before that backward). parents() of a released
  /// node is empty.
  std::vector<Variable> leaves() const;

  GraphStatistics graph_statistics() const;
  std::vector<RetainedNode> retained_nodes() const;
  /// A table of retained_nodes() for a person to read.
  std::string retained_report() const;

  bool same_node(const Variable& other) const { return node_ == other.node_; }
  Node* node() const { return node_.get(); }
  const std::shared_ptr<Node>& node_ptr() const { return node_; }

 private:
  explicit Variable(std::shared_ptr<Node> node) : node_(std::move(node)) {}
  friend class GradientContext;
  friend struct NodeAccess;
  std::shared_ptr<Node> node_;
};

/// While alive, ops on this thread build no graph (decode, evaluation).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;
  static bool active();

 private:
  bool previous_;
};


/// For backward closures: the buffer of a tensor the closure saved, to
/// overwrite with a gradient, when nothing but the graph can read it again.
/// Returns `saved` (leaving the closure's handle empty) only while a
/// backward(GraphAfterBackward::Release) pass that no Keep pass encloses
/// runs the calling node's closure (its last run: the node is released after
/// it, also when the closure or a later check throws) and the buffer has no
/// other handle than `saved` and the value of an input node held only by the
/// pass and this node's edge (not a leaf, not retain_grad): no Variable or
/// Tensor of the caller's, no view, no other node's closure, no checkpoint
/// input, not parked by activation offload. Otherwise returns an undefined
/// Tensor and `saved` is untouched: the caller allocates as usual
/// (docs/autograd.md, "Buffers donated to the gradient").
Tensor take_if_unique(Tensor& saved);

}  // namespace riftco_transformer
