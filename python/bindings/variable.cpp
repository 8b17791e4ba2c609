// Variable (autograd handle), its diagnostics, and no_grad.
#include <algorithm>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

#include "common.hpp"
#include "riftco_transformer/ops.hpp"

namespace riftco_python {
namespace {

nb::tuple shape_tuple(const rt::Shape& shape) {
  nb::list out;
  for (const std::int64_t d : shape) out.append(d);
  return nb::tuple(out);
}

std::string variable_repr(const rt::Variable& v) {
  if (!v.defined()) return "Variable(undefined)";
  std::string shape = nb::cast<std::string>(nb::repr(shape_tuple(v.shape())));
  std::string out = "Variable(shape=" + shape + ", op='" + v.op() + "'";
  if (!v.name().empty()) out += ", name='" + v.name() + "'";
  out += std::string(", requires_grad=") + (v.requires_grad() ? "True" : "False");
  if (v.value().numel() == 1) out += ", value=" + nb::cast<std::string>(nb::repr(nb::float_(v.value().item())));
  return out + ")";
}

// The other operand of an arithmetic operator: a Variable, or a constant leaf.
rt::Variable operand(nb::handle other) {
  if (nb::isinstance<rt::Variable>(other)) return nb::cast<rt::Variable>(other);
  return rt::Variable(tensor_from_python(other));
}

/// `with riftco.no_grad():` — ops on this thread build no graph. One object
/// may be entered again while entered (a module-level NO_GRAD, nested
/// blocks, other threads): each __enter__ pushes a guard that saves its
/// thread's mode, and __exit__ pops the calling thread's latest one, which
/// must exist (riftco.Error otherwise, no thread's mode changed). The GIL
/// serializes the calls.
struct NoGrad {
  struct Entry {
    std::thread::id thread;
    std::unique_ptr<rt::NoGradGuard> guard;  // restores `thread`'s mode: destroy it on that thread only
  };
  std::vector<Entry> entries;

  NoGrad() = default;
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;
  ~NoGrad() {  // collected while entered: leave every thread's mode as it is
    for (Entry& e : entries) static_cast<void>(e.guard.release());
  }
  void enter() { entries.push_back({std::this_thread::get_id(), std::make_unique<rt::NoGradGuard>()}); }
  void exit() {
    const auto mine = std::find_if(entries.rbegin(), entries.rend(),
                                   [](const Entry& e) { return e.thread == std::this_thread::get_id(); });
    if (mine == entries.rend()) {
      throw rt::Error(entries.empty() ? "[no_grad] __exit__ without __enter__"
                                      : "[no_grad] __exit__ on a thread that did not enter this no_grad");
    }
    entries.erase(std::next(mine).base());  // the guard restores this thread's mode
  }
};

}  // namespace

void init_variable(nb::module_& m) {
  nb::class_<rt::GraphStatistics>(m, "GraphStatistics",
                                  "Reachable graph nodes and the tensor elements they own directly (structural).")
      .def_ro("node_count", &rt::GraphStatistics::node_count)
      .def_ro("element_count", &rt::GraphStatistics::element_count)
      .def("__repr__", [](const rt::GraphStatistics& s) {
        return "GraphStatistics(node_count=" + std::to_string(s.node_count) +
               ", element_count=" + std::to_string(s.element_count) + ")";
      });

  nb::class_<rt::RetainedNode>(m, "RetainedNode", "One row of Variable.retained_nodes(): what a node keeps alive.")
      .def_ro("kind", &rt::RetainedNode::kind)
      .def_ro("name", &rt::RetainedNode::name)
      .def_prop_ro("shape", [](const rt::RetainedNode& r) { return shape_tuple(r.shape); })
      .def_ro("value_bytes", &rt::RetainedNode::value_bytes)
      .def_ro("grad_bytes", &rt::RetainedNode::grad_bytes)
      .def_ro("saved_bytes", &rt::RetainedNode::saved_bytes);

  nb::class_<rt::Variable>(m, "Variable",
                           "A handle to an autograd node: a float32 value, a gradient slot, parents and a backward.\n"
                           "numpy() and grad are read-only zero-copy views of the buffers (see docs/python.md).")
      .def("__init__",
           [](rt::Variable* self, nb::handle value, bool requires_grad, nb::str name) {
             new (self) rt::Variable(tensor_from_python(value), requires_grad, utf8_of(name, "[Variable] name"));
             note_made_in_computation(*self);
           },
           "value"_a, "requires_grad"_a = false, "name"_a = "",
           "A leaf holding a float32 copy of `value` (numpy array, list or float).")
      .def_prop_ro("shape", [](const rt::Variable& v) { return shape_tuple(v.shape()); })
      .def_prop_ro("ndim", [](const rt::Variable& v) { return v.shape().size(); })
      .def_prop_ro("backend", [](const rt::Variable& v) { return std::string(rt::backend_name(v.backend())); })
      .def_prop_rw("requires_grad", &rt::Variable::requires_grad,
                   [](rt::Variable& v, bool on) {
                     const ExclusiveChange change("requires_grad", &v);
                     v.set_requires_grad(on);
                   },
                   "Leaves only when set; changing it makes graphs built earlier stale.")
      .def_prop_ro("is_leaf", &rt::Variable::is_leaf)
      .def_prop_rw("name", &rt::Variable::name,
                   [](rt::Variable& v, nb::str name) {
                     std::string text = utf8_of(name, "[Variable.name] the name");
                     const ExclusiveChange change("name", &v);
                     v.set_name(std::move(text));
                   },
                   "A label for messages and reprs. A model's parameters keep their structural names\n"
                   "(model.named_parameters(), saved files) whatever their label.")
      .def_prop_ro("op", &rt::Variable::op, "The op that made this node ('leaf' for leaves).")
      .def_prop_ro("version", &rt::Variable::version)
      .def_prop_ro("value_version", &rt::Variable::value_version)
      .def("parents", &rt::Variable::parents)
      .def("numpy", [](const rt::Variable& v) { return to_numpy(v.value()); },
           "The value as a read-only numpy view of its buffer (zero-copy; .copy() for a snapshot).")
      .def("__array__",
           [](const rt::Variable& v, nb::handle dtype, nb::handle copy) {
             nb::object a = to_numpy(v.value());
             if (!dtype.is_none()) a = a.attr("astype")(dtype);
             if (!copy.is_none() && nb::cast<bool>(copy)) a = a.attr("copy")();
             return a;
           },
           "dtype"_a = nb::none(), "copy"_a = nb::none())
      .def("item", [](const rt::Variable& v) { return static_cast<double>(v.value().item()); })
      // As numpy and PyTorch: a one-element value's truth; several are ambiguous (was always True).
      .def("__bool__",
           [](const rt::Variable& v) {
             if (v.value().numel() != 1) {
               throw rt::ValueError("[bool] the truth value of a Variable of shape " + rt::shape_string(v.shape()) +
                                    " is ambiguous: use a one-element Variable, or compare its .numpy()");
             }
             return v.value().item() != 0.0F;
           })
      .def_prop_ro("grad",
                   [](const rt::Variable& v) -> nb::object {
                     // One handle: a backward committing in another thread cannot free it under us.
                     const rt::Tensor g = v.grad_with_serial().first;
                     if (!g.defined()) return nb::none();
                     return to_numpy(g);
                   },
                   "The committed gradient as a read-only numpy view, or None before a backward() reached it.")
      .def_prop_ro("has_grad", &rt::Variable::has_grad)
      .def("backward",
           [](const rt::Variable& v, nb::handle seed, bool retain_graph) {
             const auto graph = retain_graph ? rt::GraphAfterBackward::Keep : rt::GraphAfterBackward::Release;
             if (seed.is_none()) {
               ComputeWithoutGil release;
               v.backward(graph);
             } else {
               rt::Tensor s = tensor_from_python(seed);
               ComputeWithoutGil release;
               // Host data (a list, an array) for a device output goes to the output's backend, as in the C ABI.
               if (s.backend() != v.value().backend()) s = s.to(v.value().backend());
               v.backward(s, graph);
             }
           },
           "seed"_a = nb::none(), nb::kw_only(), "retain_graph"_a = true,
           "Gradients of this output with respect to every leaf (a fresh pass). Scalars need no seed.\n"
           "retain_graph=True (the default) keeps the graph, so backward() may run on it again;\n"
           "retain_graph=False frees each node's saved tensors as the pass goes (PyTorch's default,\n"
           "a lower peak), and a later backward() through it raises BackwardError. Releases the GIL.")
      .def("clear_grad", &rt::Variable::clear_grad)
      .def("zero_grad", &rt::Variable::clear_grad, "Alias of clear_grad() (PyTorch's set_to_none=True).")
      .def("retain_grad", &rt::Variable::retain_grad)
      .def("set_value",
           [](rt::Variable& v, nb::handle value) {
             rt::Tensor t = tensor_from_python(value);
             const ExclusiveChange change("set_value", &v);
             v.set_value(std::move(t));
           },
           "value"_a, "Leaves only: replaces the value with a float32 copy and bumps the version.")
      .def("to",
           [](rt::Variable& v, nb::str backend) {
             const rt::Backend b = backend_for(choice_of(backend, "[to] backend"), "to");
             const ExclusiveChange change("to", &v);
             v.to(b);
           },
           "backend"_a)
      .def("mark_changed",
           [](rt::Variable& v, nb::str reason) {
             std::string text = utf8_of(reason, "[mark_changed] reason");
             const ExclusiveChange change("mark_changed", &v);
             v.mark_changed(std::move(text));
           },
           "reason"_a)
      .def("graph_statistics", &rt::Variable::graph_statistics)
      .def("retained_nodes", &rt::Variable::retained_nodes)
      .def("retained_report", &rt::Variable::retained_report, "A table of what the graph keeps alive, for a person.")
      .def("same_node", &rt::Variable::same_node, "other"_a)
      .def("__repr__", &variable_repr)
      .def("__add__", [](const rt::Variable& a, nb::handle b) { return rt::add(a, operand(b)); }, nb::is_operator())
      .def("__radd__", [](const rt::Variable& a, nb::handle b) { return rt::add(operand(b), a); }, nb::is_operator())
      .def("__sub__", [](const rt::Variable& a, nb::handle b) { return rt::sub(a, operand(b)); }, nb::is_operator())
      .def("__rsub__", [](const rt::Variable& a, nb::handle b) { return rt::sub(operand(b), a); }, nb::is_operator())
      .def("__mul__",
           [](const rt::Variable& a, nb::handle b) {
             if (nb::isinstance<nb::float_>(b) || nb::isinstance<nb::int_>(b)) return rt::scale(a, nb::cast<float>(b));
             return rt::mul(a, operand(b));
           },
           nb::is_operator())
      .def("__rmul__",
           [](const rt::Variable& a, nb::handle b) {
             if (nb::isinstance<nb::float_>(b) || nb::isinstance<nb::int_>(b)) return rt::scale(a, nb::cast<float>(b));
             return rt::mul(operand(b), a);
           },
           nb::is_operator())
      .def("__truediv__", [](const rt::Variable& a, float b) { return rt::scale(a, 1.0F / b); }, nb::is_operator())
      .def("__neg__", [](const rt::Variable& a) { return rt::scale(a, -1.0F); })
      .def("__matmul__", [](const rt::Variable& a, nb::handle b) { return rt::matmul(a, operand(b)); },
           nb::is_operator())
      .def("__rmatmul__", [](const rt::Variable& a, nb::handle b) { return rt::matmul(operand(b), a); },
           nb::is_operator());
  // numpy's operators defer to ours (PyTorch's setting): `np.float64(0.5) *
  // loss` or `array @ v` is a Variable with its graph, not a numpy value made
  // through __array__ (which silently dropped the graph).
  m.attr("Variable").attr("__array_priority__") = 1000.0;

  nb::class_<NoGrad>(m, "no_grad", "`with riftco.no_grad():` ops on this thread build no graph (evaluation).")
      .def(nb::init<>())
      .def("__enter__", [](NoGrad& g) { g.enter(); })
      .def("__exit__", [](NoGrad& g, nb::handle, nb::handle, nb::handle) { g.exit(); }, "exc_type"_a.none(),
           "exc_value"_a.none(), "traceback"_a.none());
  m.def("is_grad_enabled", [] { return !rt::NoGradGuard::active(); });
}

}  // namespace riftco_python
