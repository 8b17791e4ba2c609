#include "gradient_context.hpp"

#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "../backend/kernels.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "donation.hpp"

namespace riftco_transformer {

void GradientContext::accumulate(const Node* node, Tensor g) {
  auto it = grads_.find(node);
  if (it == grads_.end()) {
    grads_.emplace(node, std::move(g));
    return;
  }
  Tensor& existing = it->second;
  const backend::Kernels& kernels = backend::kernels_for("backward", existing, g);
  if (existing.use_count() == 1) {
    kernels.add_inplace(existing, g);  // existing += g (we own the buffer)
  } else {
    existing = kernels.add(existing, g);  // buffer shared elsewhere: new buffer
  }
}

const Tensor* GradientContext::find(const Node* node) const {
  auto it = grads_.find(node);
  return it == grads_.end() ? nullptr : &it->second;
}

Tensor GradientContext::take(const Node* node) {
  auto it = grads_.find(node);
  if (it == grads_.end()) return {};
  Tensor t = std::move(it->second);
  grads_.erase(it);
  return t;
}

std::vector<std::shared_ptr<Node>> topological_order(const std::shared_ptr<Node>& root) {
  // Iterative DFS post-order: deep graphs (thousands of nodes) must not
  // recurse.
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_set<Node*> visited;
  struct Frame {
    const std::shared_ptr<Node>* node;  // in the root handle or a parent edge, both alive during the walk
    std::size_t next_parent;
  };
  std::vector<Frame> stack;
  stack.push_back({&root, 0});
  visited.insert(root.get());
  while (!stack.empty()) {
    Frame& frame = stack.back();
    Node& node = **frame.node;
    if (frame.next_parent < node.parents.size()) {
      const Edge& edge = node.parents[frame.next_parent++];
      const std::shared_ptr<Node>& parent = edge.node;
      if (edge.differentiable && parent->requires_grad && visited.insert(parent.get()).second) {
        stack.push_back({&parent, 0});
      }
    } else {
      order.push_back(*frame.node);
      stack.pop_back();
    }
  }
  return order;  // parents before children
}

namespace {

/// StaleGraphError when input `i` of `node` changed since the graph was built.
void check_input_version(const Node& node, std::size_t i, const char* op) {
  const Edge& edge = node.parents[i];
  const std::uint64_t now = edge.node->version();
  if (now != edge.version) {
    throw StaleGraphError(std::string("[") + op + "] stale graph: " + edge.node->label() + " (input " +
                          std::to_string(i) + " of " + node.label() + ") changed (" +
                          change_reason(*edge.node, edge.structural) + ") from version " +
                          std::to_string(edge.version) + " to " + std::to_string(now) +
                          " after the graph was built; run the forward pass again");
  }
}

/// A pass with hooks, right before `node` runs: its leaf inputs' versions
/// again. Hooks may update a final leaf in place (an optimizer step in the
/// pass); a node still to run never has that leaf as an input, but may read
/// its buffer through another leaf (a constant sharing it), and would use the
/// new values. Leaves only: a non-leaf's buffer may legitimately be donated
/// to a closure and written during a Release pass.
void check_leaf_inputs(const Node& node, const char* op) {
  for (std::size_t i = 0; i < node.parents.size(); ++i) {
    if (node.parents[i].node->is_leaf) check_input_version(node, i, op);
  }
}

/// StaleGraphError when a constant `node` read (a checkpoint's watched
/// constants and buffers: it replays from them) changed since it was built.
void check_watched(const Node& node, const char* op) {
  for (const WatchedStorage& w : node.watched) {
    if (const std::shared_ptr<Node> constant = w.node.lock(); constant && constant->version() != w.node_version) {
      throw StaleGraphError(std::string("[") + op + "] stale graph: " + w.what + ", a constant that " + node.label() +
                            " read, changed (" + change_reason(*constant, w.node_structural) + ") from version " +
                            std::to_string(w.node_version) + " to " + std::to_string(constant->version()) +
                            " after the graph was built; run the forward pass again");
    }
    const std::shared_ptr<const Storage> storage = w.storage.lock();
    if (storage && storage->version() != w.version) {
      throw StaleGraphError(std::string("[") + op + "] stale graph: " + w.what + ", a constant that " + node.label() +
                            " read, changed (its buffer was " + storage->last_change() + ") from version " +
                            std::to_string(w.version) + " to " + std::to_string(storage->version()) +
                            " after the graph was built; run the forward pass again");
    }
  }
}

void validate_versions(const std::vector<std::shared_ptr<Node>>& order, const char* op) {
  for (const std::shared_ptr<Node>& node : order) {
    if (!node->checkpoint_private.empty() && !node->private_open && node->requires_grad) {
      throw CheckpointContractError(
          CheckpointContractError::Violation::InternalValueEscaped,
          std::string("[") + op + "] a value computed inside checkpoint '" + node->checkpoint_private +
              "' is used outside it (the callable kept or handed out a variable of its own graph): its gradient "
              "would reach the callable's private input, not the checkpoint's input. Return it as (part of) the "
              "checkpoint's output, or compute it outside the callable");
    }
    if (node->released) {
      throw BackwardError(std::string("[") + op + "] " + node->label() +
                          " was released by an earlier backward(GraphAfterBackward::Release): its saved tensors "
                          "are gone; run the forward pass again (or keep the graph for a second backward)");
    }
    if (!node->is_leaf && node->value.version() != node->own_version) {
      throw StaleGraphError(std::string("[") + op + "] stale graph: the value of " + node->label() +
                            ", which its backward may read, changed (its buffer was " + node->value.last_change() +
                            ") after the graph was built; run the forward pass again");
    }
    for (std::size_t i = 0; i < node->parents.size(); ++i) check_input_version(*node, i, op);
    check_watched(*node, op);
  }
}

}  // namespace

/// Leaves requiring grad and how many inputs of nodes still to run point at
/// each (an input listed twice counts twice): a leaf is final at zero.
class Finality {
 public:
  Finality(const std::vector<std::shared_ptr<Node>>& order, BackwardHooks* hooks, PassResult& result)
      : hooks_(hooks), result_(result) {
    if (hooks_ == nullptr) return;
    // Leaves the pass gives a gradient (a differentiable edge reaches them);
    // every node reading one counts as its consumer, through an edge the pass
    // does not follow too (a checkpoint that reads it without gradient must
    // run before the hooks may update it in place).
    std::unordered_set<const Node*> reached;
    for (const std::shared_ptr<Node>& node : order) {
      if (node->is_leaf) continue;
      for (const Edge& e : node->parents) {
        if (e.differentiable && e.node->is_leaf && e.node->requires_grad) reached.insert(e.node.get());
      }
    }
    for (const std::shared_ptr<Node>& node : order) {
      if (node->is_leaf) continue;
      for (const Edge& e : node->parents) {
        if (reached.contains(e.node.get())) {
          auto [it, fresh] = pending_.try_emplace(e.node.get(), Entry{e.node, 0});
          ++it->second.consumers;
        }
      }
    }
  }
  /// `node` ran (or had no gradient to pass on): its leaf inputs have one consumer fewer.
  void consumed(const Node* node) {
    if (hooks_ == nullptr) return;
    for (const Edge& e : node->parents) {
      auto it = pending_.find(e.node.get());
      if (it == pending_.end() || --it->second.consumers > 0) continue;
      const std::shared_ptr<Node> leaf = std::move(it->second.leaf);
      pending_.erase(it);
      report(leaf);
    }
  }
  /// A pass nested in `node`'s closure has `leaf` final with `gradient`:
  /// when it is final here too (`node` is its last pending consumer and no
  /// gradient for it reached this pass), reported now and never again.
  /// Returns whether the hooks consumed it (then listed in `consumed`;
  /// `node` returns no gradient for it).
  bool final_inside(const Node& node, const Node* leaf, const Tensor& gradient) {
    const auto it = pending_.find(leaf);
    if (hooks_ == nullptr || it == pending_.end() || result_.context.find(leaf) != nullptr) return false;
    const auto edges = std::count_if(node.parents.begin(), node.parents.end(),
                                     [&](const Edge& e) { return e.node.get() == leaf; });
    if (it->second.consumers != static_cast<int>(edges)) return false;  // used outside the node too (a tied weight)
    const std::shared_ptr<Node> held = std::move(it->second.leaf);
    pending_.erase(it);
    const Variable handle = NodeAccess::wrap(held);
    hooks_->gradient_final(handle, gradient);
    if (!hooks_->consumes(handle)) return false;  // handed back by `node`, committed as usual
    result_.consumed.insert(held.get());
    return true;
  }
  /// A node of a pass nested in one of this pass's closures ran: the hooks'
  /// node_done() (communication progress) runs for it too, so a long replay
  /// does not leave the collectives in flight waiting for its end.
  void nested_node_done() {
    if (hooks_ != nullptr) hooks_->node_done();
  }
  /// The root itself, when it is a leaf (nothing consumes it). A gradient
  /// the hook consumed goes now (its memory back to the allocator during the
  /// pass) and the commit clears the leaf's.
  void report(const std::shared_ptr<Node>& leaf) {
    if (hooks_ == nullptr) return;
    const Tensor* g = result_.context.find(leaf.get());
    const Variable handle = NodeAccess::wrap(leaf);
    hooks_->gradient_final(handle, g != nullptr ? *g : Tensor());
    if (hooks_->consumes(handle)) {
      result_.consumed.insert(leaf.get());
      result_.context.erase(leaf.get());
    }
  }

 private:
  struct Entry {
    std::shared_ptr<Node> leaf;
    int consumers = 0;
  };
  BackwardHooks* hooks_;
  PassResult& result_;
  std::unordered_map<const Node*, Entry> pending_;
};

/// What a closure running in a pass with hooks sees of that pass: its
/// Finality and the node whose closure runs (NestedPassHooks).
struct PassChannel {
  Finality* finality;
  const Node* node;
};

namespace {

thread_local const PassChannel* t_channel = nullptr;

/// Sets this thread's channel around one closure (none when the pass has no
/// hooks: a pass without hooks, nested or not, forwards nothing) and puts
/// the previous one (an enclosing pass's) back after, whatever happens.
class ChannelScope {
 public:
  ChannelScope(Finality* finality, const Node* node, bool hooked) : previous_(t_channel), channel_{finality, node} {
    t_channel = hooked ? &channel_ : nullptr;
  }
  ~ChannelScope() { t_channel = previous_; }
  ChannelScope(const ChannelScope&) = delete;
  ChannelScope& operator=(const ChannelScope&) = delete;

 private:
  const PassChannel* previous_;
  PassChannel channel_;
};

/// The passes running on this thread, outermost first. A pass a hook or a
/// checkpoint replay starts runs inside them.
struct RunningOrder {
  const std::vector<std::shared_ptr<Node>>* order;
  bool indexed;  // its interior nodes are counted in t_running_nodes
};
thread_local std::vector<RunningOrder> t_running;
/// Interior nodes of the indexed running passes (a count per pass that has
/// the node), indexed only once a nested pass needs the check: a pass with
/// no pass inside it pays nothing. A released node leaves at once (its
/// address may be reused by a node made later, a replay's).
thread_local std::unordered_map<const Node*, int> t_running_nodes;

void forget_running(const Node* node) {
  if (t_running_nodes.empty()) return;
  const auto it = t_running_nodes.find(node);
  if (it != t_running_nodes.end() && --it->second == 0) t_running_nodes.erase(it);
}

/// A pass's place on t_running while it runs. A pass started inside another
/// on the same thread — a checkpoint function calling loss.backward() when
/// its replay runs, a hook doing so — that reaches an interior node of a
/// running pass is a BackwardError before it computes anything: with
/// Release on either side it freed or donated what the other still read (a
/// crash), and with Keep on both it replayed the same checkpoint again and
/// again (unbounded recursion). Passes over other graphs (a replay's own, a
/// hook's over another model) and shared leaves are fine: each pass sums into
/// its own context. Linear: each running pass is indexed at most once, when
/// the first pass inside it starts.
class RunningPass {
 public:
  RunningPass(const std::vector<std::shared_ptr<Node>>& order, const char* op) {
    if (!t_running.empty()) check_apart(order, op);
    t_running.push_back({&order, false});
  }
  ~RunningPass() {
    const RunningOrder& mine = t_running.back();
    if (mine.indexed) {
      for (const auto& n : *mine.order) {
        if (n != nullptr && !n->is_leaf) forget_running(n.get());  // null: released, forgotten then
      }
    }
    t_running.pop_back();
  }
  RunningPass(const RunningPass&) = delete;
  RunningPass& operator=(const RunningPass&) = delete;

 private:
  static void check_apart(const std::vector<std::shared_ptr<Node>>& order, const char* op) {
    for (RunningOrder& r : t_running) {
      if (r.indexed) continue;
      for (const auto& n : *r.order) {
        if (n != nullptr && !n->is_leaf) ++t_running_nodes[n.get()];
      }
      r.indexed = true;
    }
    for (const auto& n : order) {
      if (n->is_leaf || !t_running_nodes.contains(n.get())) continue;
      throw BackwardError(std::string("[") + op + "] the graph of " + n->label() +
                          " is being differentiated by a backward pass still running on this thread (this one "
                          "started from a checkpoint function its replay runs again, or from a hook): a pass "
                          "cannot run inside another over the same nodes; call backward() after it returns");
    }
  }
};

/// GraphAfterBackward::Release: `node` ran (or received no gradient) and
/// its leaf inputs were reported; what it kept for its backward goes now.
/// Its inputs stay alive through `order` until they ran themselves; the
/// node goes with its handle in `order` unless the caller (or
/// PassResult::retained) still holds it.
void release(std::shared_ptr<Node>& handle) {
  Node& node = *handle;
  node.released = true;
  node.backward = nullptr;  // the closure and the tensors it captured
  node.saved.clear();
  node.watched.clear();
  std::vector<Edge>().swap(node.parents);
  forget_running(&node);
  handle.reset();
}

/// Runs `node`'s closure with its gradient from `ctx` and adds what it
/// returns to its inputs' gradients, after checking count and shapes.
void run_node(Node& node_ref, GradientContext& ctx, std::vector<bool>& needs, const char* op) {
  Node* node = &node_ref;
  const Tensor* grad_ptr = ctx.find(node);
  std::vector<Tensor> parent_grads;
  {
    const Tensor grad = node->retain_grad ? *grad_ptr : ctx.take(node);  // freed with this scope unless retained
    needs.assign(node->parents.size(), false);
    for (std::size_t i = 0; i < node->parents.size(); ++i) {
      needs[i] = node->parents[i].differentiable && node->parents[i].node->requires_grad;
    }
    parent_grads = node->backward(grad, needs);
  }
  if (parent_grads.size() != node->parents.size()) {
    throw BackwardError(std::string("[") + op + "] " + node->label() + " returned " +
                        std::to_string(parent_grads.size()) + " gradients for " +
                        std::to_string(node->parents.size()) + " inputs");
  }
  for (std::size_t i = 0; i < parent_grads.size(); ++i) {
    if (!needs[i] || !parent_grads[i].defined()) continue;
    const Node* parent = node->parents[i].node.get();
    if (parent_grads[i].shape() != parent->value.shape()) {
      throw BackwardError(std::string("[") + op + "] " + node->label() + " returned a gradient of shape " +
                          shape_string(parent_grads[i].shape()) + " for input " + std::to_string(i) +
                          " of shape " + shape_string(parent->value.shape()));
    }
    ctx.accumulate(parent, std::move(parent_grads[i]));
  }
}

}  // namespace

NestedPassHooks::NestedPassHooks(std::span<const Variable> dependencies) : channel_(t_channel) {
  if (channel_ == nullptr) return;
  for (const Variable& d : dependencies) {
    if (d.is_leaf() && d.requires_grad()) dependencies_.insert(d.node());
  }
}

void NestedPassHooks::node_done() {
  if (channel_ != nullptr) channel_->finality->nested_node_done();
}

void NestedPassHooks::gradient_final(const Variable& leaf, const Tensor& gradient) {
  if (channel_ == nullptr || !dependencies_.contains(leaf.node())) return;  // the replay's own input: not the outer's
  // No contribution reached it: the zeros the closure would hand back.
  const Tensor g = gradient.defined() ? gradient : Tensor::zeros(leaf.value().shape(), leaf.value().backend());
  if (channel_->finality->final_inside(*channel_->node, leaf.node(), g)) consumed_.insert(leaf.node());
}

PassResult run_backward_pass(const Variable& root_var, const Tensor& seed, const char* op, BackwardHooks* hooks,
                             GraphAfterBackward graph) {
  Node* root = root_var.node();
  if (root == nullptr) throw BackwardError(std::string("[") + op + "] undefined variable");
  if (!root->requires_grad) {
    throw BackwardError(std::string("[") + op + "] " + root->label() +
                        " does not require grad: no input of the graph requires grad");
  }
  if (seed.shape() != root->value.shape()) {
    throw ShapeError(std::string("[") + op + "] seed gradient " + shape_string(seed.shape()) +
                     " does not match output " + shape_string(root->value.shape()));
  }
  if (seed.backend() != root->value.backend()) {
    throw BackendError(std::string("[") + op + "] seed gradient " + shape_string(seed.shape()) + " is on " +
                       backend_name(seed.backend()) + " but output " + root->label() + " is on " +
                       backend_name(root->value.backend()) + ": move the seed to the output's backend");
  }
  std::vector<std::shared_ptr<Node>> order = topological_order(root_var.node_ptr());
  const RunningPass running(order, op);  // before anything is computed or touched
  validate_versions(order, op);

  if (hooks != nullptr) hooks->begin_pass();

  PassResult result;
  GradientContext& ctx = result.context;
  ctx.accumulate(root, seed);
  Finality finality(order, hooks, result);
  if (root->is_leaf) finality.report(root_var.node_ptr());
  const bool release_graph = graph == GraphAfterBackward::Release;
  std::optional<NoDonationGuard> keep_pass;  // a Keep pass never donates, nor does any pass inside it
  if (!release_graph) keep_pass.emplace();
  std::vector<bool> needs;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    Node* node = it->get();
    if (node->is_leaf) {
      result.leaves.push_back(*it);
      continue;
    }
    if (node->retain_grad) result.retained.push_back(*it);
    const Tensor* grad_ptr = ctx.find(node);
    if (grad_ptr == nullptr) {
      finality.consumed(node);
      if (release_graph) release(*it);
      continue;
    }
    if (hooks != nullptr) {  // a leaf updated in the pass, read through another leaf or a checkpoint's constant
      check_leaf_inputs(*node, op);
      check_watched(*node, op);
    }
    // Released: a node only `order` still holds goes after its backward, and
    // its backward never reads its value through the node (closures keep
    // what they need), so the value goes first: the pass never holds a
    // node's output and its gradient's temporaries at once (a block's
    // gate/up projections while their gradient is taken).
    if (release_graph && it->use_count() == 1) node->value = Tensor();
    std::optional<DonationScope> donation;  // take_if_unique counts node->saved's report copies as owners
    if (release_graph) donation.emplace(*node);
    try {
      const ChannelScope channel(&finality, node, hooks != nullptr);
      run_node(*node, ctx, needs, op);
    } catch (...) {
      // A closure that took a saved buffer over cannot run again: released
      // even though the pass fails (its public gradients are untouched).
      if (donation && donation->donated()) release(*it);
      throw;
    }
    donation.reset();
    finality.consumed(node);
    if (release_graph) release(*it);
    if (hooks != nullptr) hooks->node_done();
  }
  return result;
}

}  // namespace riftco_transformer
