#pragma once
// Shared argument conversion for the bindings: numpy <-> Tensor, token
// arrays, enum strings, float32 fields, and Python objects held by C++.
// No model logic lives here (DESIGN.md "Thin bindings").
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/tensor.hpp"
#include "riftco_transformer/variable.hpp"

namespace riftco_python {

namespace nb = nanobind;
using namespace nb::literals;
namespace rt = riftco_transformer;

/// A read-only numpy view of `tensor`'s buffer (zero-copy: the array keeps
/// the buffer alive through a Tensor handle in its base capsule). In-place
/// updates of the buffer (an Adam step) show through the view; .copy() it
/// for a snapshot. A tensor on another backend is copied to the CPU first.
nb::object to_numpy(const rt::Tensor& tensor);

/// True for Python's bool and numpy's (numpy.bool_, numpy.bool in numpy 2),
/// which numbers refuse: numpy's converts through __index__ (with only a
/// DeprecationWarning) and __float__, so max_new_tokens=np.True_ was 1.
inline bool is_bool_like(PyObject* value) {
  if (PyBool_Check(value)) return true;
  const std::string_view type = Py_TYPE(value)->tp_name;
  return type == "numpy.bool_" || type == "numpy.bool";
}

/// An integer argument or field as T. Python's bool is an int subclass, but
/// rank=True or zero_stage=True is a mistake, not 1: a bool (or anything that
/// is not an integer) is nb::cast_error, for the caller to turn into a
/// TypeError naming the argument; an integer outside T's range is a
/// ValueError naming `what` and the value (was "expects int, got int").
template <class T>
T int_of(nb::handle value, const std::string& what) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (is_bool_like(value.ptr())) throw nb::cast_error();
  T out{};
  if (nb::try_cast<T>(value, out)) return out;
  if (nb::isinstance<nb::int_>(value)) {
    throw rt::ValueError(what + " must be in [" + std::to_string(std::numeric_limits<T>::min()) + ", " +
                         std::to_string(std::numeric_limits<T>::max()) + "], got " +
                         nb::cast<std::string>(nb::str(value)));
  }
  throw nb::cast_error();
}

/// A number argument of a bound function (max_new_tokens=, seed=, lr=...).
/// nanobind's own casters take a bool as 1 or 0 (bool is an int subclass),
/// and give an int that does not fit only the generic "incompatible function
/// arguments" TypeError. These refuse a bool (a TypeError listing the
/// signature, as a str there would get) and keep an int that does not fit
/// for get() to refuse as a ValueError naming the argument and the range.
/// numpy integers and floats are taken, as PyTorch takes them.
template <class T>
struct IntArg {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  T value{};
  std::string too_large;  // the int's text when it does not fit T
  IntArg() = default;
  IntArg(T v) : value(v) {}  // NOLINT: defaults in the argument list
  T get(const char* name) const {
    if (!too_large.empty()) {
      throw rt::ValueError(std::string(name) + " must be in [" + std::to_string(std::numeric_limits<T>::min()) +
                           ", " + std::to_string(std::numeric_limits<T>::max()) + "], got " + too_large);
    }
    return value;
  }
};
template <class T>
struct RealArg {
  static_assert(std::is_floating_point_v<T>);
  T value{};
  RealArg() = default;
  RealArg(T v) : value(v) {}  // NOLINT: defaults in the argument list
};

/// A float32 Tensor holding a copy of any array-like (numpy array, list,
/// Python float).
rt::Tensor tensor_from_python(nb::handle values);

/// Token ids from a (B, T) or (T,) integer array-like (numpy array or
/// nested lists): copied to int32. (T,) is one row. ValueError for ids that
/// do not fit int32 (naming the id as given), ShapeError for other ranks,
/// TypeError for a scalar or a str.
struct TokenArray {
  std::vector<std::int32_t> ids;
  rt::Shape shape;       // (B, T)
  std::size_t ndim = 0;  // of the input: 1 for (T,), 2 for (B, T)
  std::int64_t batch() const { return shape[0]; }
};
/// Token ids from a list, tuple or integer numpy array of 1 or 2 dimensions
/// (bytes and bytearray are refused: text is a str). `max_length` >= 0 (the
/// model's context) refuses a longer sequence before any copy is made: a
/// (65536, 65536) array was converted in full (tens of GiB) before the
/// model's own check.
TokenArray tokens_from_python(nb::handle values, const char* op, std::int64_t max_length = -1);

/// Variables from a Python iterable (a TypeError naming `op` and the
/// offending item's type for anything else; was RuntimeError std::bad_cast).
std::vector<rt::Variable> variables_from_python(nb::iterable values, const char* op);

/// A str as UTF-8 (a ValueError naming `what` for a str that has none, e.g.
/// a lone surrogate; was RuntimeError std::bad_cast).
std::string utf8_of(nb::handle text, const std::string& what);

/// Python threads and the models' variables. C++ that runs with the GIL
/// released and reads variables (a forward, backward, generate, save) holds
/// one process-wide lock shared (ComputeWithoutGil, which also releases the
/// GIL), Adam.step exclusively (StepWithoutGil); a change that replaces variables' values, names or
/// flags (set_value, to, load_state, add_lora, ...) holds it exclusively and
/// the GIL (ExclusiveChange), so neither runs into the other: a value
/// replaced under a running generate freed what it read (heap corruption).
/// Code that holds the GIL (ops, numpy views) is already serialized with the
/// changes by the GIL. A change from inside a computation of the same thread
/// (a Python checkpoint function replayed by backward) is a riftco.ValueError,
/// never a deadlock, unless it is to a Variable that function made itself
/// during the computation (note_made_in_computation), which no other thread
/// can be reading.
class ComputeWithoutGil {
 public:
  ComputeWithoutGil();
  ~ComputeWithoutGil();
  ComputeWithoutGil(const ComputeWithoutGil&) = delete;
  ComputeWithoutGil& operator=(const ComputeWithoutGil&) = delete;

 private:
  nb::gil_scoped_release release_;  // first: the lock is taken without the GIL
  bool held_ = false;
};

/// An optimizer step (Adam.step): it writes the parameters in place, so it
/// holds the lock exclusively — a forward, save or generate on another thread
/// (one that releases the GIL) never reads half-stepped weights — but with
/// the GIL released, as a computation. No user code runs inside it. From
/// inside a computation of this thread it is a ValueError.
/// Adam.backward_and_step runs checkpoint functions, so it computes
/// (ComputeWithoutGil) as backward does: another thread's forward may read
/// weights it has already stepped.
class StepWithoutGil {
 public:
  StepWithoutGil();
  ~StepWithoutGil();
  StepWithoutGil(const StepWithoutGil&) = delete;
  StepWithoutGil& operator=(const StepWithoutGil&) = delete;

 private:
  nb::gil_scoped_release release_;
  bool held_ = false;
};

/// Called for every Variable Python makes: one made inside a computation of
/// this thread may be changed there.
void note_made_in_computation(const rt::Variable& made);

/// Ctrl-C during a computation that runs without the GIL (generate,
/// evaluate): function() is an `interrupt` for GenerationOptions /
/// EvaluationOptions that, on the main thread and at most every 20 ms, takes
/// the GIL and runs Python's pending signal handlers; the exception one
/// raises (KeyboardInterrupt) is kept and SignalCheck::Interrupted thrown to
/// stop the computation. Catch Interrupted around the computation, then call
/// rethrow_if_pending() with the GIL held: it raises the kept exception.
/// Built with the GIL held.
class SignalCheck {
 public:
  struct Interrupted {};
  SignalCheck();
  std::function<void()> function();
  void rethrow_if_pending();

 private:
  bool main_thread_ = false;
  std::chrono::steady_clock::time_point last_;
  std::optional<nb::python_error> pending_;
};

/// The ValueError ExclusiveChange raises from inside a computation of this
/// thread, for a change that wants to refuse before it reads anything.
void refuse_inside_computation(const char* op);

class ExclusiveChange {
 public:
  /// `target`: the Variable changed, if one (a model change has none).
  explicit ExclusiveChange(const char* op, const rt::Variable* target = nullptr);
  ~ExclusiveChange();
  ExclusiveChange(const ExclusiveChange&) = delete;
  ExclusiveChange& operator=(const ExclusiveChange&) = delete;

 private:
  bool held_ = false;
};

/// Bytes that may not be UTF-8 (a path made with os.fsdecode) as a str, each
/// such byte as a \xNN escape: for reprs, which must never raise.
nb::str str_of_bytes(std::string_view bytes);

/// An enum string ("flash", "block", ...) for a parse_* function: utf8_of,
/// with each NUL written as the two characters \0, so the parser's ValueError (which lists the
/// accepted values) is not cut short at it.
std::string choice_of(nb::handle text, const std::string& what);

/// The float32 as the shortest decimal that rounds back to it (0.003, not
/// 0.003000000026077032): what config getters return.
double short_double(float value);

/// A Python object that C++ may copy and destroy on any thread: the last
/// owner takes the GIL to release it (checkpoint callables live in graphs
/// that backward() frees with the GIL released).
using SharedPyObject = std::shared_ptr<nb::object>;
SharedPyObject share_python(nb::object object);

/// Backend by name for `.to()`: "cpu"; a GPU backend this build lacks
/// ("cuda", or the spec's "metal") is a BackendError naming the built
/// backends; anything else a ValueError listing the accepted names.
rt::Backend backend_for(const std::string& name, const char* op);

/// Tuple of the backends this build has ("cpu", ...).
nb::tuple available_backends();

void init_errors(nb::module_& m);
void init_memory(nb::module_& m);
void init_variable(nb::module_& m);
void init_ops(nb::module_& m);
void init_checkpoint(nb::module_& m);
void init_model(nb::module_& m);
void init_optim(nb::module_& m);
void init_decode(nb::module_& m);
void init_io(nb::module_& m);
void init_pipelines(nb::module_& m);
void init_tokenizer(nb::module_& m);

}  // namespace riftco_python

namespace nanobind::detail {

template <class T>
struct type_caster<riftco_python::IntArg<T>> {
  NB_TYPE_CASTER(riftco_python::IntArg<T>, const_name("int"))
  bool from_python(handle src, uint8_t flags, cleanup_list* cleanup) noexcept {
    if (riftco_python::is_bool_like(src.ptr())) return false;
    PyObject* index = PyNumber_Index(src.ptr());  // int, numpy integer; not float or str
    if (index == nullptr) {
      PyErr_Clear();
      return false;
    }
    make_caster<T> inner;
    if (inner.from_python(handle(index), flags | static_cast<uint8_t>(cast_flags::convert), cleanup)) {
      value = riftco_python::IntArg<T>(inner.value);
    } else {
      PyErr_Clear();
      PyObject* text = PyObject_Str(index);
      const char* utf8 = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
      value = riftco_python::IntArg<T>();
      value.too_large = utf8 != nullptr ? utf8 : "an int out of range";
      Py_XDECREF(text);
      PyErr_Clear();
    }
    Py_DECREF(index);
    return true;
  }
  static handle from_cpp(const riftco_python::IntArg<T>& v, rv_policy policy, cleanup_list* cleanup) noexcept {
    return make_caster<T>::from_cpp(v.value, policy, cleanup);
  }
};

template <class T>
struct type_caster<riftco_python::RealArg<T>> {
  NB_TYPE_CASTER(riftco_python::RealArg<T>, const_name("float"))
  bool from_python(handle src, uint8_t flags, cleanup_list* cleanup) noexcept {
    if (riftco_python::is_bool_like(src.ptr())) return false;
    make_caster<T> inner;
    if (!inner.from_python(src, flags, cleanup)) return false;
    value = riftco_python::RealArg<T>(inner.value);
    return true;
  }
  static handle from_cpp(const riftco_python::RealArg<T>& v, rv_policy policy, cleanup_list* cleanup) noexcept {
    return make_caster<T>::from_cpp(v.value, policy, cleanup);
  }
};

}  // namespace nanobind::detail
