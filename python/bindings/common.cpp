// Argument conversion shared by the bindings (common.hpp).
#include "common.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <shared_mutex>
#include <utility>
#include <vector>

#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/memory.hpp"

namespace riftco_python {

nb::object to_numpy(const rt::Tensor& tensor) {
  if (!tensor.defined()) throw rt::ValueError("[numpy] the tensor is undefined");
  auto* keep = new rt::Tensor(tensor.backend() == rt::Backend::Cpu ? tensor : tensor.to(rt::Backend::Cpu));
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<rt::Tensor*>(p); });
  std::vector<std::size_t> shape(keep->shape().begin(), keep->shape().end());
  // rv_policy::reference: numpy wraps the buffer (move or copy would copy it);
  // the capsule's Tensor handle keeps the storage alive, and use_count() > 1
  // keeps backward from donating the buffer.
  nb::object array = nb::cast(
      nb::ndarray<nb::numpy, const float>(std::as_const(*keep).data(), shape.size(), shape.data(), owner),
      nb::rv_policy::reference);
  array.attr("flags").attr("writeable") = false;  // writes must go through set_value (versions)
  return array;
}

rt::Tensor tensor_from_python(nb::handle values) {
  nb::module_ np = nb::module_::import_("numpy");
  // Numbers only: numpy's float32 cast dropped a complex value's imaginary
  // part (a warning at most), read None in an object array as NaN, and parsed
  // strings and dates.
  nb::object source = np.attr("asarray")(values);
  const nb::object dtype = source.attr("dtype");  // an object: nb::str() of an accessor casts, not str()s
  const std::string kind = nb::cast<std::string>(nb::str(dtype.attr("kind")));
  if (kind != "f" && kind != "i" && kind != "u" && kind != "b" &&
      !(kind == "O" && nb::cast<std::size_t>(source.attr("size")) == 0)) {
    throw nb::type_error(("a Variable's values must be real numbers (float, int or bool), got dtype " +
                          nb::cast<std::string>(nb::str(dtype)))
                             .c_str());
  }
  // asarray keeps a 0-d value 0-d (ascontiguousarray made it shape (1,)).
  nb::object array = np.attr("asarray")(source, "dtype"_a = np.attr("float32"), "order"_a = "C");
  auto view = nb::cast<nb::ndarray<const float, nb::c_contig, nb::device::cpu>>(array);
  rt::Shape shape;
  for (std::size_t d = 0; d < view.ndim(); ++d) shape.push_back(static_cast<std::int64_t>(view.shape(d)));
  return rt::Tensor::from_data(shape, {view.data(), view.size()});
}

namespace {

// Checks every id against int32 in the array's own type (a uint64 id above
// 2**63 would wrap to a negative int64 first).
template <class Id>
void copy_ids(nb::handle array, const char* op, std::vector<std::int32_t>& out) {
  auto view = nb::cast<nb::ndarray<const Id, nb::c_contig, nb::device::cpu>>(array);
  out.reserve(view.size());
  for (std::size_t i = 0; i < view.size(); ++i) {
    const Id id = view.data()[i];
    if (!std::in_range<std::int32_t>(id)) {
      throw rt::ValueError(std::string("[") + op + "] token id " + std::to_string(id) + " at index " +
                           std::to_string(i) + " does not fit int32");
    }
    out.push_back(static_cast<std::int32_t>(id));
  }
}

}  // namespace

TokenArray tokens_from_python(nb::handle values, const char* op, std::int64_t max_length) {
  if (nb::isinstance<nb::bytes>(values) || nb::isinstance<nb::bytearray>(values)) {
    // bytes was a TypeError and bytearray became its byte values: one rule.
    throw nb::type_error((std::string("[") + op + "] token ids must be a (B, T) or (T,) array or list of integers, "
                          "got " + nb::cast<std::string>(nb::str(values.type().attr("__name__"))) +
                          " (text is a str)").c_str());
  }
  nb::module_ np = nb::module_::import_("numpy");
  nb::object array = np.attr("asarray")(values);
  const auto ndim = nb::cast<std::size_t>(array.attr("ndim"));
  if (ndim == 0) {  // 5, "hello": nb::len() would say only "len() of unsized object"
    const std::string type = nb::cast<std::string>(nb::str(values.type().attr("__name__")));
    throw nb::type_error(
        (std::string("[") + op + "] token ids must be a (B, T) or (T,) array or list of integers, got " + type).c_str());
  }
  nb::object dtype = array.attr("dtype");
  const std::string kind = nb::cast<std::string>(nb::str(dtype.attr("kind")));
  const bool empty = nb::cast<std::size_t>(array.attr("size")) == 0;
  if (kind != "i" && kind != "u" && !empty) {
    throw rt::ValueError(std::string("[") + op + "] token ids must be integers, got dtype " +
                         nb::cast<std::string>(nb::str(dtype)));
  }
  TokenArray out;
  out.ndim = ndim;
  if (ndim == 1) {
    out.shape = {1, nb::cast<std::int64_t>(array.attr("shape")[0])};
  } else if (ndim == 2) {
    out.shape = {nb::cast<std::int64_t>(array.attr("shape")[0]), nb::cast<std::int64_t>(array.attr("shape")[1])};
  } else {
    throw rt::ShapeError(std::string("[") + op + "] token ids must have shape (B, T) or (T,), got " +
                         std::to_string(ndim) + " dimensions");
  }
  if (max_length >= 0 && out.shape[1] > max_length) {
    throw rt::ShapeError(std::string("[") + op + "] sequence length " + std::to_string(out.shape[1]) +
                         " exceeds the context length " + std::to_string(max_length));
  }
  const bool is_unsigned = kind == "u";
  array = np.attr("ascontiguousarray")(array, "dtype"_a = np.attr(is_unsigned ? "uint64" : "int64"));
  if (is_unsigned) {
    copy_ids<std::uint64_t>(array, op, out.ids);
  } else {
    copy_ids<std::int64_t>(array, op, out.ids);
  }
  return out;
}

std::vector<rt::Variable> variables_from_python(nb::iterable values, const char* op) {
  std::vector<rt::Variable> out;
  for (nb::handle v : values) {
    if (!nb::isinstance<rt::Variable>(v)) {
      throw nb::type_error((std::string("[") + op + "] parameter " + std::to_string(out.size()) +
                            " must be a Variable, got " + nb::cast<std::string>(nb::str(v.type().attr("__name__"))))
                               .c_str());
    }
    out.push_back(nb::cast<rt::Variable>(v));
  }
  return out;
}

namespace {
/// Reader-preferring (std::shared_mutex), unlike the C ABI's writer-first
/// lock: user Python runs while it is held shared (checkpoint functions,
/// signal handlers at the Ctrl-C check), and such code may wait for another
/// thread's computation; a waiting change must not keep that computation out
/// (it deadlocked with a writer-first lock: review of 2026-12-02). A stream
/// of computations on several threads can therefore delay a change.
std::shared_mutex& variables_lock() {
  static std::shared_mutex lock;
  return lock;
}
thread_local int t_computing = 0;  // ComputeWithoutGil scopes open on this thread
thread_local int t_changing = 0;   // ExclusiveChange scopes open on this thread
/// Variables Python made while this thread computes (until its outermost
/// ComputeWithoutGil ends).
thread_local std::vector<rt::Variable> t_made;
}  // namespace

void note_made_in_computation(const rt::Variable& made) {
  if (t_computing > 0) t_made.push_back(made);
}

ComputeWithoutGil::ComputeWithoutGil() {
  if (t_computing == 0 && t_changing == 0) {
    variables_lock().lock_shared();
    held_ = true;
  }
  ++t_computing;
}

ComputeWithoutGil::~ComputeWithoutGil() {
  if (--t_computing == 0) t_made.clear();
  if (held_) variables_lock().unlock_shared();
}

StepWithoutGil::StepWithoutGil() {
  // From code that runs inside a computation of this thread (a signal
  // handler at generate's Ctrl-C check) a step would write weights other
  // threads' computations are reading: refused, as any change there is.
  refuse_inside_computation("Adam.step");
  if (t_computing == 0 && t_changing == 0) {
    variables_lock().lock();
    held_ = true;
  }
  ++t_computing;  // a computation otherwise: a hook's change inside it is refused as before
}

StepWithoutGil::~StepWithoutGil() {
  if (--t_computing == 0) t_made.clear();
  if (held_) variables_lock().unlock();
}

void refuse_inside_computation(const char* op) {
  if (t_computing > 0) {
    throw rt::ValueError(std::string("[") + op +
                         "] called from code that runs inside a forward, backward, optimizer step or generation "
                         "on this thread (a checkpoint function, a hook): change variables between those calls");
  }
}

ExclusiveChange::ExclusiveChange(const char* op, const rt::Variable* target) {
  const auto own = [&] {
    return target != nullptr &&
           std::any_of(t_made.begin(), t_made.end(), [&](const rt::Variable& v) { return v.same_node(*target); });
  };
  if (t_computing > 0 && own()) {  // made by this computation: nobody else reads it
    ++t_changing;
    return;
  }
  refuse_inside_computation(op);
  if (t_changing == 0) {
    nb::gil_scoped_release wait;  // readers may need the GIL to finish
    variables_lock().lock();
    held_ = true;
  }
  ++t_changing;
}

ExclusiveChange::~ExclusiveChange() {
  --t_changing;
  if (held_) variables_lock().unlock();
}

SignalCheck::SignalCheck() : last_(std::chrono::steady_clock::now()) {
  const nb::object threading = nb::module_::import_("threading");
  main_thread_ = threading.attr("current_thread")().is(threading.attr("main_thread")());
}

std::function<void()> SignalCheck::function() {
  if (!main_thread_) return {};  // Python runs signal handlers on the main thread only
  return [this] {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_ < std::chrono::milliseconds(20)) return;  // a token is cheaper than the GIL's round trip
    last_ = now;
    nb::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() == 0) return;
    pending_.emplace();  // takes the raised exception (KeyboardInterrupt) from Python's error state
    throw Interrupted{};
  };
}

void SignalCheck::rethrow_if_pending() {
  if (!pending_) return;
  nb::python_error error = std::move(*pending_);
  pending_.reset();
  throw error;
}

nb::str str_of_bytes(std::string_view bytes) {
  PyObject* text = PyUnicode_DecodeUTF8(bytes.data(), static_cast<Py_ssize_t>(bytes.size()), "backslashreplace");
  if (text == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(text);
}

std::string utf8_of(nb::handle text, const std::string& what) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
  if (data == nullptr) {
    PyErr_Clear();
    throw rt::ValueError(what + " is not valid Unicode text (it cannot be encoded as UTF-8: a lone surrogate?)");
  }
  return std::string(data, static_cast<std::size_t>(size));
}

std::string choice_of(nb::handle text, const std::string& what) {
  std::string out;
  for (const char c : utf8_of(text, what)) out += c == '\0' ? std::string("\\0") : std::string(1, c);
  return out;
}

double short_double(float value) {
  char buffer[64];
  const auto r = std::to_chars(buffer, buffer + sizeof buffer - 1, value);
  *r.ptr = '\0';
  return std::strtod(buffer, nullptr);
}

SharedPyObject share_python(nb::object object) {
  return SharedPyObject(new nb::object(std::move(object)), [](nb::object* p) {
    if (!Py_IsInitialized()) {  // interpreter gone: leak rather than touch it
      p->release();
      delete p;
      return;
    }
    nb::gil_scoped_acquire gil;
    delete p;
  });
}

nb::tuple available_backends() {
  nb::list names;
  for (const rt::Backend b : {rt::Backend::Cpu, rt::Backend::Cuda}) {
    if (rt::backend_available(b)) names.append(rt::backend_name(b));
  }
  return nb::tuple(names);
}

rt::Backend backend_for(const std::string& name, const char* op) {
  auto missing = [&](const std::string& backend) {
    std::string built;
    for (nb::handle b : available_backends()) built += (built.empty() ? "'" : ", '") + nb::cast<std::string>(b) + "'";
    return rt::BackendError(std::string("[") + op + "] the " + backend +
                            " backend is not built in this package (this build has: " + built + ")");
  };
  if (name == "metal") throw missing("metal");  // the spec's GPU backend; ours is CUDA
  const rt::Backend backend = rt::parse_backend(name, op);
  if (!rt::backend_available(backend)) throw missing(rt::backend_name(backend));
  return backend;
}

}  // namespace riftco_python
