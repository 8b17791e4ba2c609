#include "riftco_transformer/variable.hpp"

#include <algorithm>
#include <atomic>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "gradient_context.hpp"
#include "node.hpp"

namespace riftco_transformer {
namespace {

thread_local bool g_no_grad = false;
thread_local TraceGuard* g_trace = nullptr;
std::atomic<std::uint64_t> g_next_node_id{1};
/// Publishing gradients (commit, clear_grad) is serialised process-wide, so
/// two threads whose graphs share leaves never race on a gradient handle;
/// each commit is whole (one pass's gradients, never a mix).
std::mutex g_commit_mutex;
std::uint64_t g_grad_serials = 0;  // under g_commit_mutex: the last serial a commit gave

Node& require(const std::shared_ptr<Node>& node, const char* op) {
  if (!node) throw ValueError(std::string("[") + op + "] undefined variable");
  return *node;
}

void require_leaf(const Node& node, const char* op) {
  if (!node.is_leaf) {
    throw ValueError(std::string("[") + op + "] " + node.label() +
                     " is not a leaf: only leaves (parameters, inputs) can be changed");
  }
  if (node.read_only != nullptr) {
    throw ValueError(std::string("[") + op + "] " + node.label() + " is read-only: " + node.read_only);
  }
}

/// Every node reachable from root through all edges (graph statistics count
/// constants too: they are retained by the graph).
std::vector<Node*> reachable(Node* root) {
  std::vector<Node*> out;
  std::unordered_set<Node*> seen{root};
  std::vector<Node*> stack{root};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    out.push_back(n);
    for (const Edge& e : n->parents) {
      if (seen.insert(e.node.get()).second) stack.push_back(e.node.get());
    }
  }
  return out;
}

/// Publishes a pass's gradients: `replacements` (from BackwardHooks::finish)
/// instead of the pass's own where given, for any leaf; a leaf whose
/// gradient a hook consumed is left without one. Builds and checks
/// every committed tensor first (this may allocate and throw), then
/// publishes them with non-throwing handle assignments.
void commit_pass(PassResult pass, std::vector<std::pair<Variable, Tensor>> replacements) {
  std::unordered_map<Node*, Tensor> replaced;
  for (auto& [leaf, g] : replacements) {
    Node* node = leaf.node();
    if (node == nullptr || !node->is_leaf || !node->requires_grad) {
      throw BackwardError("[backward] a backward hook returned a gradient for " +
                          (node == nullptr    ? std::string("an undefined variable")
                           : !node->is_leaf   ? node->label() + ", not a leaf"
                                              : node->label() + ", a leaf that does not require grad"));
    }
    if (replaced.contains(node)) {
      throw BackwardError("[backward] a backward hook returned two gradients for " + node->label());
    }
    if (pass.consumed.contains(node)) {
      throw BackwardError("[backward] a backward hook returned a gradient for " + node->label() +
                          ", whose gradient it consumed in the pass");
    }
    if (!g.defined() || g.shape() != node->value.shape() || g.backend() != node->value.backend()) {
      throw ShapeError("[backward] a backward hook returned a gradient " +
                       (g.defined() ? shape_string(g.shape()) + " on " + backend_name(g.backend())
                                    : std::string("(undefined)")) +
                       " for " + node->label() + " " + shape_string(node->value.shape()) + " on " +
                       backend_name(node->value.backend()));
    }
    replaced[node] = std::move(g);
  }
  std::vector<std::pair<Node*, Tensor>> commits;
  commits.reserve(pass.leaves.size() + pass.retained.size() + replaced.size());
  auto prepare = [&](Node* node) {
    if (pass.consumed.contains(node)) {  // a hook consumed it (an optimizer step in the pass): cleared
      commits.emplace_back(node, Tensor());
      return;
    }
    Tensor g;
    if (auto it = replaced.find(node); it != replaced.end()) {
      g = std::move(it->second);
      replaced.erase(it);
    } else {
      g = pass.context.take(node);
    }
    if (!g.defined()) {
      g = Tensor::zeros(node->value.shape(), node->value.backend());  // leaves always receive a gradient
    } else if (g.use_count() != 1) {
      g = g.clone();  // never publish a buffer another node or the caller also holds
    }
    commits.emplace_back(node, std::move(g));
  };
  for (const std::shared_ptr<Node>& leaf : pass.leaves) prepare(leaf.get());
  for (const std::shared_ptr<Node>& node : pass.retained) prepare(node.get());
  for (auto& replacement : replacements) {  // leaves the pass did not reach, in the hook's order
    if (replaced.contains(replacement.first.node())) prepare(replacement.first.node());
  }
  {
    std::lock_guard<std::mutex> lock(g_commit_mutex);  // graphs on other threads may share these leaves
    for (auto& [node, g] : commits) {
      std::swap(node->grad, g);
      node->grad_serial = ++g_grad_serials;
    }
  }  // the previous gradients (now in `commits`) are freed outside the lock
}

}  // namespace

namespace {
thread_local std::vector<OutsideLeafWatch*> t_leaf_watches;
}  // namespace

OutsideLeafWatch::OutsideLeafWatch() : first_id_(g_next_node_id.load()) { t_leaf_watches.push_back(this); }
OutsideLeafWatch::~OutsideLeafWatch() { std::erase(t_leaf_watches, this); }

void note_leaf_change(const Node& node) {
  for (OutsideLeafWatch* watch : t_leaf_watches) {
    if (watch->what_.empty() && node.id < watch->first_id_) watch->what_ = node.label() + ": " + node.last_change;
  }
}

Node::Node() : id(g_next_node_id.fetch_add(1)) {}

std::uint64_t next_node_id() { return g_next_node_id.load(); }

TraceGuard::TraceGuard() : previous_(g_trace) { g_trace = this; }
TraceGuard::~TraceGuard() {
  stop();
  release_traces();
}
void TraceGuard::stop() {
  if (!stopped_) g_trace = previous_;
  stopped_ = true;
}
bool TraceGuard::active() { return g_trace != nullptr; }
void TraceGuard::note(const std::shared_ptr<Node>& constant) {
  if (g_trace != nullptr) g_trace->constants_.push_back(constant);
}
void TraceGuard::release_traces() {
  for (const std::weak_ptr<Node>& weak : constants_) {
    if (const std::shared_ptr<Node> node = weak.lock()) node->trace_parents.clear();
  }
  constants_.clear();
}

Node::~Node() {
  // Unlink parents iteratively: take ownership of every parent whose last
  // handle is ours and drain them from a local stack.
  std::vector<std::shared_ptr<Node>> pending;
  for (Edge& e : parents) pending.push_back(std::move(e.node));
  for (std::shared_ptr<Node>& t : trace_parents) pending.push_back(std::move(t));
  parents.clear();
  trace_parents.clear();
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    if (n && n.use_count() == 1) {
      for (Edge& e : n->parents) pending.push_back(std::move(e.node));
      for (std::shared_ptr<Node>& t : n->trace_parents) pending.push_back(std::move(t));
      n->parents.clear();
      n->trace_parents.clear();
      n->backward = nullptr;  // closures may hold Variables too; they go now
    }
  }
}

std::string Node::label() const {
  if (!name.empty()) return "'" + name + "' (" + op + ")";
  return op + " node";
}

Variable::Variable(Tensor value, bool requires_grad, std::string name) : node_(std::make_shared<Node>()) {
  if (!value.defined()) throw ValueError("[variable] a leaf needs a defined value");
  node_->value = std::move(value);
  node_->requires_grad = requires_grad;
  node_->name = std::move(name);
}

Variable Variable::from_op(std::string op, Tensor value, std::vector<Variable> parents, BackwardFn backward,
                           std::vector<Tensor> saved) {
  // A custom op's mistakes, named before any node exists (an undefined
  // parent was dereferenced later; an empty closure threw
  // std::bad_function_call from inside a pass).
  if (!value.defined()) throw ValueError("[" + op + "] Variable::from_op: the value is an undefined Tensor");
  bool any = false;
  for (std::size_t i = 0; i < parents.size(); ++i) {
    if (!parents[i].defined()) {
      throw ValueError("[" + op + "] Variable::from_op: parent " + std::to_string(i) + " of " +
                       std::to_string(parents.size()) + " is an undefined Variable");
    }
    any = any || parents[i].node_->requires_grad;
  }
  if (any && !g_no_grad && !backward) {
    throw ValueError("[" + op + "] Variable::from_op: a parent requires grad but the backward function is empty");
  }
  auto node = std::make_shared<Node>();
  node->value = std::move(value);
  node->op = std::move(op);
  if (!any || g_no_grad) {
    // A constant: a leaf with no graph, as outside a checkpoint. Under
    // TraceGuard its inputs are kept aside for the contract walk only.
    if (g_trace != nullptr) {
      for (const Variable& p : parents) node->trace_parents.push_back(p.node_);
      if (!node->trace_parents.empty()) TraceGuard::note(node);
    }
    return Variable(std::move(node));
  }
  node->is_leaf = false;
  node->requires_grad = true;
  node->own_version = node->value.version();
  node->backward = std::move(backward);
  node->saved = std::move(saved);
  node->parents.reserve(parents.size());
  for (Variable& p : parents) node->parents.push_back(Edge{p.node_, p.node_->version(), p.node_->structural_changes});
  return Variable(std::move(node));
}

const Tensor& Variable::value() const { return require(node_, "value").value; }
bool Variable::requires_grad() const { return require(node_, "requires_grad").requires_grad; }

void Variable::set_requires_grad(bool requires_grad) {
  Node& n = require(node_, "set_requires_grad");
  require_leaf(n, "set_requires_grad");
  if (n.requires_grad != requires_grad) {
    n.requires_grad = requires_grad;
    ++n.flag_changes;
    ++n.structural_changes;
    n.last_change = requires_grad ? "requires_grad turned on" : "requires_grad turned off (frozen)";
    note_leaf_change(n);
  }
}

bool Variable::is_leaf() const { return require(node_, "is_leaf").is_leaf; }
const std::string& Variable::name() const { return require(node_, "name").name; }
void Variable::set_name(std::string name) { require(node_, "set_name").name = std::move(name); }
const std::string& Variable::op() const { return require(node_, "op").op; }

std::vector<Variable> Variable::parents() const {
  std::vector<Variable> out;
  for (const Edge& e : require(node_, "parents").parents) out.push_back(Variable(e.node));
  return out;
}

void Variable::set_value(Tensor value) {
  Node& n = require(node_, "set_value");
  require_leaf(n, "set_value");
  if (!value.defined()) throw ValueError("[set_value] undefined tensor for " + n.label());
  const bool same_shape = n.value.shape() == value.shape();
  std::string why = same_shape ? "value replaced" : "replaced by a value of shape " + shape_string(value.shape());
  n.replace_value(std::move(value), std::move(why));
}

Tensor Variable::mutable_value(const char* why) {
  Node& n = require(node_, "mutable_value");
  require_leaf(n, "mutable_value");
  n.value.bump_version(why);  // the storage's counter: every view and every leaf on this buffer sees it
  return n.value;
}

void Variable::to(Backend backend) { Variable::to(std::span<const Variable>(this, 1), backend); }

void Variable::to(std::span<const Variable> leaves, Backend backend) {
  struct Move {
    Node* node;
    Tensor value, grad;
  };
  std::vector<Move> moves;
  moves.reserve(leaves.size());
  for (const Variable& v : leaves) {  // every copy first: a throw here changes nothing
    Node& n = require(v.node_, "to");
    require_leaf(n, "to");
    if (n.value.backend() == backend) continue;
    Tensor value = n.value.to(backend);
    Tensor grad = n.grad.defined() ? n.grad.to(backend) : Tensor();
    moves.push_back({&n, std::move(value), std::move(grad)});
  }
  for (Move& m : moves) {
    m.node->replace_value(std::move(m.value), std::string("moved to ") + backend_name(backend));
    std::lock_guard<std::mutex> lock(g_commit_mutex);
    m.node->grad = std::move(m.grad);
  }
}

void Variable::mark_changed(std::string reason) {
  Node& n = require(node_, "mark_changed");
  require_leaf(n, "mark_changed");
  n.bump(std::move(reason));
}

std::uint64_t Variable::version() const { return require(node_, "version").version(); }
std::uint64_t Variable::value_version() const { return require(node_, "value_version").value_version(); }
const Tensor& Variable::grad() const { return require(node_, "grad").grad; }

std::uint64_t Variable::grad_serial() const {
  const Node& n = require(node_, "grad_serial");
  std::lock_guard<std::mutex> lock(g_commit_mutex);
  return n.grad_serial;
}

std::pair<Tensor, std::uint64_t> Variable::grad_with_serial() const {
  const Node& n = require(node_, "grad_with_serial");
  std::lock_guard<std::mutex> lock(g_commit_mutex);
  return {n.grad, n.grad_serial};
}

void Variable::clear_grad() {
  Node& n = require(node_, "clear_grad");
  Tensor old;
  {
    std::lock_guard<std::mutex> lock(g_commit_mutex);
    old = std::move(n.grad);
    n.grad = Tensor();
    n.grad_serial = ++g_grad_serials;
  }
}  // `old` is freed outside the lock

void Variable::retain_grad() {
  Node& n = require(node_, "retain_grad");
  if (!n.is_leaf) n.retain_grad = true;
}

namespace {

/// A scalar output's seed (1); BackwardError for any other output.
Tensor scalar_seed(const std::shared_ptr<Node>& node) {
  const Node& n = require(node, "backward");
  if (n.value.numel() != 1) {
    throw BackwardError("[backward] output " + n.label() + " of shape " + shape_string(n.value.shape()) +
                        " is not a scalar: pass a seed gradient of the same shape");
  }
  return Tensor::ones(n.value.shape(), n.value.backend());
}

}  // namespace

void Variable::backward() const { backward(GraphAfterBackward::Keep); }
void Variable::backward(const Tensor& seed) const { backward(seed, GraphAfterBackward::Keep); }
void Variable::backward(BackwardHooks& hooks) const { backward(hooks, GraphAfterBackward::Keep); }
void Variable::backward(const Tensor& seed, BackwardHooks& hooks) const {
  backward(seed, hooks, GraphAfterBackward::Keep);
}

void Variable::backward(GraphAfterBackward graph) const { backward(scalar_seed(node_), graph); }

void Variable::backward(const Tensor& seed, GraphAfterBackward graph) const {
  commit_pass(run_backward_pass(*this, seed, "backward", nullptr, graph), {});
}

void Variable::backward(BackwardHooks& hooks, GraphAfterBackward graph) const {
  backward(scalar_seed(node_), hooks, graph);
}

void Variable::backward(const Tensor& seed, BackwardHooks& hooks, GraphAfterBackward graph) const {
  PassResult pass = run_backward_pass(*this, seed, "backward", &hooks, graph);
  commit_pass(std::move(pass), hooks.finish());
}

std::vector<Variable> Variable::leaves() const {
  std::vector<Variable> out;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack{&require(node_, "leaves")};
  std::vector<std::shared_ptr<Node>> found;
  while (!stack.empty()) {  // iterative: deep graphs must not recurse
    Node* n = stack.back();
    stack.pop_back();
    if (!seen.insert(n).second) continue;
    if (n->released) {  // its edges are gone: a silent partial list would hide leaves
      throw BackwardError("[leaves] " + n->label() +
                          " was released by an earlier backward(GraphAfterBackward::Release): its edges to its inputs "
                          "are gone, so its graph's leaves cannot be listed; list them before that backward (or keep "
                          "the graph)");
    }
    const std::size_t first_pushed = stack.size();
    for (const Edge& e : n->parents) {
      Node* p = e.node.get();
      if (!e.differentiable || !p->requires_grad || seen.contains(p)) continue;
      if (p->is_leaf) {
        seen.insert(p);
        found.push_back(e.node);
      } else {
        stack.push_back(p);
      }
    }
    std::reverse(stack.begin() + static_cast<std::ptrdiff_t>(first_pushed), stack.end());  // first parent first
  }
  if (node_->is_leaf && node_->requires_grad) found.insert(found.begin(), node_);
  out.reserve(found.size());
  for (std::shared_ptr<Node>& n : found) out.push_back(Variable(std::move(n)));
  return out;
}

GraphStatistics Variable::graph_statistics() const {
  GraphStatistics stats;
  std::unordered_set<const void*> counted;  // a buffer shared by views (reshape) counts once
  auto count = [&](const Tensor& t) {
    if (t.defined() && counted.insert(t.storage_id()).second) stats.element_count += t.numel();
  };
  for (Node* n : reachable(&require(node_, "graph_statistics"))) {
    ++stats.node_count;
    count(n->value);
    count(n->grad);
  }
  return stats;
}

std::vector<RetainedNode> Variable::retained_nodes() const {
  const std::vector<Node*> nodes = reachable(&require(node_, "retained_nodes"));
  std::unordered_set<const void*> owned;
  for (Node* n : nodes) owned.insert(n->value.storage_id());
  std::vector<RetainedNode> rows;
  rows.reserve(nodes.size());
  for (Node* n : nodes) {
    RetainedNode row;
    row.kind = n->op;
    row.name = n->name;
    row.shape = n->value.shape();
    row.value_bytes = n->value.nbytes();
    row.grad_bytes = n->grad.defined() ? n->grad.nbytes() : 0;
    std::unordered_set<const void*> counted;
    for (const Tensor& s : n->saved) {
      if (s.defined() && !owned.contains(s.storage_id()) && counted.insert(s.storage_id()).second) {
        row.saved_bytes += s.nbytes();
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

std::string Variable::retained_report() const {
  const std::vector<RetainedNode> rows = retained_nodes();
  std::ostringstream out;
  std::int64_t value = 0;
  std::int64_t grad = 0;
  std::int64_t saved = 0;
  out << std::left << std::setw(22) << "kind" << std::setw(36) << "name" << std::setw(22) << "shape" << std::right
      << std::setw(14) << "value B" << std::setw(14) << "grad B" << std::setw(14) << "saved B" << '\n';
  for (const RetainedNode& r : rows) {
    out << std::left << std::setw(22) << r.kind << std::setw(36) << r.name << std::setw(22) << shape_string(r.shape)
        << std::right << std::setw(14) << r.value_bytes << std::setw(14) << r.grad_bytes << std::setw(14)
        << r.saved_bytes << '\n';
    value += r.value_bytes;
    grad += r.grad_bytes;
    saved += r.saved_bytes;
  }
  out << rows.size() << " nodes; values " << value << " B, gradients " << grad << " B, saved for backward " << saved
      << " B\n";
  return out.str();
}

GradModeGuard::GradModeGuard(bool enabled) : previous_no_grad_(g_no_grad) { g_no_grad = !enabled; }
GradModeGuard::~GradModeGuard() { g_no_grad = previous_no_grad_; }

NoGradGuard::NoGradGuard() : previous_(g_no_grad) { g_no_grad = true; }
NoGradGuard::~NoGradGuard() { g_no_grad = previous_; }
bool NoGradGuard::active() { return g_no_grad; }

}  // namespace riftco_transformer
