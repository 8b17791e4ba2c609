// C++ errors → Python exception classes that keep the C++ message:
//   riftco.Error (RuntimeError)          riftco_transformer::Error
//   ├─ ShapeError (also ValueError)      ShapeError
//   ├─ ValueError (also builtins.ValueError)  ValueError (bad argument, enum string, config)
//   ├─ BackendError                      BackendError
//   ├─ StaleGraphError                   StaleGraphError
//   ├─ BackwardError                     BackwardError
//   ├─ CheckpointContractError           CheckpointContractError (.violation)
//   ├─ ModelStateError                   ModelStateError
//   ├─ DataError                         DataError
//   └─ PartialStepError                  PartialStepError (a fused optimizer step failed part-way)
#include <cstring>

#include "common.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/model_state.hpp"

namespace riftco_python {
namespace {

PyObject* g_error = nullptr;
PyObject* g_shape = nullptr;
PyObject* g_value = nullptr;
PyObject* g_backend = nullptr;
PyObject* g_stale = nullptr;
PyObject* g_backward = nullptr;
PyObject* g_contract = nullptr;
PyObject* g_model_state = nullptr;
PyObject* g_data = nullptr;
PyObject* g_partial_step = nullptr;

PyObject* make(nb::module_& m, const char* name, const char* doc, std::initializer_list<PyObject*> bases) {
  nb::tuple base_tuple = nb::steal<nb::tuple>(PyTuple_New(static_cast<Py_ssize_t>(bases.size())));
  Py_ssize_t i = 0;
  for (PyObject* b : bases) PyTuple_SET_ITEM(base_tuple.ptr(), i++, nb::borrow(b).release().ptr());
  // riftco/__init__.py sets __module__ to "riftco"; stubgen needs the real one.
  const std::string qualified = std::string("riftco._core.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, base_tuple.ptr(), nullptr);
  if (type == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(type);
  return type;  // the module keeps a reference; the type lives as long as the process
}

// The message as a str: bytes that are not UTF-8 (a path from os.fsdecode,
// text echoed from a file) become \xNN escapes. PyErr_SetString would fail
// to decode them and leave an exception with no message at all.
nb::object message_of(const char* what) {
  PyObject* text = PyUnicode_DecodeUTF8(what, static_cast<Py_ssize_t>(std::strlen(what)), "backslashreplace");
  if (text == nullptr) {  // out of memory: still an exception of the right type
    PyErr_Clear();
    text = PyUnicode_FromString("(the error message could not be decoded)");
  }
  return nb::steal(text);
}

void raise(PyObject* type, const char* what) { PyErr_SetObject(type, message_of(what).ptr()); }

}  // namespace

void init_errors(nb::module_& m) {
  g_error = make(m, "Error", "Base of every error riftco raises on purpose; the message starts with '[op]'.",
                 {PyExc_RuntimeError});
  g_shape = make(m, "ShapeError", "Shapes that do not fit the operation.", {g_error, PyExc_ValueError});
  g_value = make(m, "ValueError",
                 "An argument outside its valid range (unknown policy string, bad config field, bad index).",
                 {g_error, PyExc_ValueError});
  g_backend = make(m, "BackendError", "Tensors on different backends, or a backend this build does not have.",
                   {g_error});
  g_stale = make(m, "StaleGraphError",
                 "backward() found a value changed since the graph was built (an Adam step, set_value, to()).",
                 {g_error});
  g_backward = make(m, "BackwardError", "backward() called in a way that cannot produce gradients.", {g_error});
  g_contract = make(m, "CheckpointContractError",
                    "checkpoint(): the function broke the replay contract; .violation says which rule.", {g_error});
  g_model_state = make(m, "ModelStateError", "A model-state or adapter file that cannot be written, read or used.",
                       {g_error});
  g_data = make(m, "DataError", "A data file that is missing, unreadable, empty or malformed.", {g_error});
  g_partial_step = make(m, "PartialStepError",
                        "Adam.backward_and_step (or a run with optimizer_in_backward) failed after updating some "
                        "parameters: restore the model and optimizer (e.g. from a training checkpoint) first.",
                        {g_error});

  using V = rt::CheckpointContractError::Violation;
  nb::enum_<V>(m, "CheckpointViolation", "Which replay-contract rule a checkpoint function broke.")
      .value("MissingDependency", V::MissingDependency)
      .value("DuplicateDependency", V::DuplicateDependency)
      .value("DependencyNotLeaf", V::DependencyNotLeaf)
      .value("CapturedExternalNode", V::CapturedExternalNode)
      .value("UndeclaredLeaf", V::UndeclaredLeaf)
      .value("InputUnused", V::InputUnused)
      .value("DependencyUnused", V::DependencyUnused)
      .value("OutputChanged", V::OutputChanged)
      .value("BoundaryModified", V::BoundaryModified)
      .value("InternalValueEscaped", V::InternalValueEscaped);
  nb::handle(g_contract).attr("Violation") = m.attr("CheckpointViolation");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const rt::CheckpointContractError& e) {
      nb::object error = nb::handle(g_contract)(message_of(e.what()));
      error.attr("violation") = nb::cast(e.violation());
      PyErr_SetObject(g_contract, error.ptr());
    } catch (const rt::ShapeError& e) {
      raise(g_shape, e.what());
    } catch (const rt::ValueError& e) {
      raise(g_value, e.what());
    } catch (const rt::BackendError& e) {
      raise(g_backend, e.what());
    } catch (const rt::StaleGraphError& e) {
      raise(g_stale, e.what());
    } catch (const rt::BackwardError& e) {
      raise(g_backward, e.what());
    } catch (const rt::ModelStateError& e) {
      raise(g_model_state, e.what());
    } catch (const rt::DataError& e) {
      raise(g_data, e.what());
    } catch (const rt::PartialStepError& e) {
      raise(g_partial_step, e.what());
    } catch (const rt::Error& e) {
      raise(g_error, e.what());
    } catch (const nb::cast_error&) {
      // A Python value nb::cast could not convert, where no binding names the
      // argument: still a TypeError (nanobind would raise RuntimeError std::bad_cast).
      PyErr_Clear();
      PyErr_SetString(PyExc_TypeError, "an argument has the wrong type (it could not be converted)");
    }
    // Anything else propagates to nanobind's own translators.
  });
}

}  // namespace riftco_python
