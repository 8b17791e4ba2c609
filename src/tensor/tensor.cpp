#include "riftco_transformer/tensor.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>

#include "device_runtime.hpp"
#include "offload.hpp"

namespace riftco_transformer {

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::ostringstream out;
  out << '(';
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) out << ", ";
    out << shape[i];
  }
  if (shape.size() == 1) out << ',';
  out << ')';
  return out.str();
}

std::int64_t shape_numel(const Shape& shape, const char* op) {
  // The product of the nonzero dimensions bounds every stride, so it must fit
  // even when a zero makes the tensor empty: (0, 6, 2^62) was accepted while
  // (2^62, 0) was refused, and its strides overflowed.
  std::int64_t n = 1;
  std::int64_t extent = 1;
  for (const std::int64_t d : shape) {
    if (d < 0) throw ShapeError(std::string("[") + op + "] shape " + shape_string(shape) + " has a negative dimension");
    if (d != 0 && extent > std::numeric_limits<std::int64_t>::max() / 4 / d) {
      throw ShapeError(std::string("[") + op + "] shape " + shape_string(shape) + " is too large");
    }
    if (d != 0) extent *= d;
    n *= d;
  }
  return n;
}

namespace {
std::atomic<std::uint64_t> g_next_storage_serial{1};
thread_local std::vector<OutsideWriteWatch*> t_write_watches;

[[noreturn]] void host_access_error(Backend backend) {
  throw BackendError(std::string("[tensor] data() needs a cpu tensor, this one is on ") + backend_name(backend) +
                     " (copy it with to(Backend::Cpu))");
}
}  // namespace

Storage::Storage(Backend backend, std::int64_t numel)
    : backend_(backend),
      numel_(numel),
      data_(static_cast<float*>(detail::allocate_bytes(backend, static_cast<std::size_t>(numel) * sizeof(float)))),
      serial_(g_next_storage_serial.fetch_add(1)) {}

void Storage::bump_version(const char* why) {
  last_change_.store(why, std::memory_order_relaxed);
  version_.fetch_add(1, std::memory_order_acq_rel);
  for (OutsideWriteWatch* watch : t_write_watches) {
    if (watch->why_ == nullptr && serial_ < watch->first_serial_) {
      watch->why_ = why;
      watch->numel_ = numel_;
    }
  }
}

OutsideWriteWatch::OutsideWriteWatch() : first_serial_(g_next_storage_serial.load()) { t_write_watches.push_back(this); }
OutsideWriteWatch::~OutsideWriteWatch() { std::erase(t_write_watches, this); }

void Storage::throw_parked() const {
  throw BackendError("[tensor] a cuda buffer of " + std::to_string(numel_) +
                     " elements is offloaded to host memory (activation offload) and was read before it was copied "
                     "back; the offload must restore it before its replay");
}

Storage::~Storage() {
  if (park_ != nullptr) detail::OffloadAccess::drop(*this);  // parked bytes, a copy in flight
  detail::free_bytes(backend_, data_, static_cast<std::size_t>(numel_) * sizeof(float));
}

Tensor Tensor::empty(const Shape& shape, Backend backend) {
  Tensor t;
  t.numel_ = shape_numel(shape, "tensor");
  if (backend != Backend::Cpu && backend != Backend::Cuda) {
    throw ValueError("[tensor] unknown backend " + std::to_string(static_cast<int>(backend)) +
                     " (expected cpu or cuda)");
  }
  if (!backend_available(backend)) throw BackendError("[tensor] " + detail::cuda_unavailable_reason());
  t.storage_ = std::make_shared<Storage>(backend, t.numel_);
  t.shape_ = shape;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, Backend backend) { return full(shape, 0.0F, backend); }
Tensor Tensor::ones(const Shape& shape, Backend backend) { return full(shape, 1.0F, backend); }

Tensor Tensor::full(const Shape& shape, float value, Backend backend) {
  Tensor t = empty(shape, backend);
  t.fill(value);
  return t;
}

Tensor Tensor::scalar(float value) { return full({}, value); }

Tensor Tensor::from_data(const Shape& shape, std::span<const float> values) {
  const std::int64_t n = shape_numel(shape, "from_data");
  if (static_cast<std::int64_t>(values.size()) != n) {
    throw ShapeError("[from_data] shape " + shape_string(shape) + " needs " + std::to_string(n) +
                     " values, got " + std::to_string(values.size()));
  }
  Tensor t = empty(shape);
  std::copy(values.begin(), values.end(), t.data());
  return t;
}

Tensor Tensor::from_data(const Shape& shape, std::initializer_list<float> values) {
  return from_data(shape, std::span<const float>(values.begin(), values.size()));
}

Tensor Tensor::normal(const Shape& shape, Random& random, float mean, float std) {
  if (!std::isfinite(mean) || !(std >= 0.0F) || !std::isfinite(std)) {
    throw ValueError("[normal] mean " + std::to_string(mean) + " and std " + std::to_string(std) +
                     " must be finite, std >= 0");
  }
  Tensor t = empty(shape);
  announce_random_use(random);
  float* p = t.data();
  for (std::int64_t i = 0; i < t.numel_; ++i) p[i] = random.normal(mean, std);
  return t;
}

Tensor Tensor::uniform(const Shape& shape, Random& random, float low, float high) {
  if (!std::isfinite(low) || !std::isfinite(high) || !(low <= high)) {
    throw ValueError("[uniform] low " + std::to_string(low) + " and high " + std::to_string(high) +
                     " must be finite, low <= high");
  }
  Tensor t = empty(shape);
  announce_random_use(random);
  float* p = t.data();
  for (std::int64_t i = 0; i < t.numel_; ++i) p[i] = random.uniform(low, high);
  return t;
}

std::int64_t Tensor::size(std::int64_t d) const {
  const std::int64_t n = dim();
  const std::int64_t k = d < 0 ? d + n : d;
  if (k < 0 || k >= n) {
    throw ShapeError("[size] dimension " + std::to_string(d) + " out of range for shape " + shape_string(shape_));
  }
  return shape_[static_cast<std::size_t>(k)];
}

Backend Tensor::backend() const {
  if (!storage_) throw ValueError("[tensor] undefined tensor has no backend");
  return storage_->backend();
}

float* Tensor::data() { return data_for_write("written through a data() pointer"); }

float* Tensor::data_for_write(const char* why) {
  if (!storage_) throw ValueError("[tensor] data() of an undefined tensor");
  if (storage_->backend() != Backend::Cpu) host_access_error(storage_->backend());
  storage_->bump_version(why);
  return storage_->data();
}

float* Tensor::device_data() {
  if (!storage_) throw ValueError("[tensor] device_data() of an undefined tensor");
  storage_->bump_version("written through a device_data() pointer");
  return storage_->data();
}

const float* Tensor::device_data() const {
  if (!storage_) throw ValueError("[tensor] device_data() of an undefined tensor");
  return storage_->data();
}

void Tensor::bump_version(const char* why) {
  if (!storage_) throw ValueError("[tensor] bump_version() of an undefined tensor");
  storage_->bump_version(why);
}

const float* Tensor::data() const {
  if (!storage_) throw ValueError("[tensor] data() of an undefined tensor");
  if (storage_->backend() != Backend::Cpu) host_access_error(storage_->backend());
  return storage_->data();
}

Tensor Tensor::clone() const {
  if (!defined()) return {};
  Tensor t = empty(shape_, backend());
  if (backend() == Backend::Cpu) {
    std::memcpy(t.data(), data(), static_cast<std::size_t>(nbytes()));
  } else {
    detail::copy_bytes(t.device_data(), backend(), storage_->data(), backend(), static_cast<std::size_t>(nbytes()),
                       "clone");
  }
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape resolved = shape;
  int inferred = -1;
  for (std::size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      if (inferred >= 0) throw ShapeError("[reshape] only one dimension may be -1 in " + shape_string(shape));
      inferred = static_cast<int>(i);
      resolved[i] = 1;  // for the product of the others, checked below
    } else if (resolved[i] < 0) {
      throw ShapeError("[reshape] bad target shape " + shape_string(shape));
    }
  }
  if (inferred >= 0) {
    // The other dimensions' product, overflow-checked (a running product
    // overflowed for (2^62, 6, -1) before any check: UB).
    const std::int64_t known = shape_numel(resolved, "reshape");
    if (known == 0 || numel_ % known != 0) {
      throw ShapeError("[reshape] cannot reshape " + shape_string(shape_) + " to " + shape_string(shape));
    }
    resolved[static_cast<std::size_t>(inferred)] = numel_ / known;
  }
  if (shape_numel(resolved, "reshape") != numel_) {
    throw ShapeError("[reshape] cannot reshape " + shape_string(shape_) + " (" + std::to_string(numel_) +
                     " elements) to " + shape_string(shape));
  }
  Tensor t = *this;
  t.shape_ = std::move(resolved);
  return t;
}

Tensor Tensor::to(Backend target) const {
  if (!defined()) throw ValueError("[to] undefined tensor");
  if (target == backend()) return *this;
  if (!backend_available(target)) throw BackendError("[to] " + detail::cuda_unavailable_reason());
  Tensor t = empty(shape_, target);
  detail::copy_bytes(t.device_data(), target, storage_->data(), backend(), static_cast<std::size_t>(nbytes()),
                     "to");
  return t;
}

std::vector<float> Tensor::to_vector() const {
  if (!defined()) return {};
  std::vector<float> values(static_cast<std::size_t>(numel_));
  detail::copy_bytes(values.data(), Backend::Cpu, storage_->data(), backend(), static_cast<std::size_t>(nbytes()),
             "to_vector");
  return values;
}

float Tensor::at(std::initializer_list<std::int64_t> index) const {
  if (static_cast<std::int64_t>(index.size()) != dim()) {
    throw ShapeError("[at] " + std::to_string(index.size()) + " indices for shape " + shape_string(shape_));
  }
  std::int64_t offset = 0;
  std::size_t d = 0;
  for (const std::int64_t i : index) {
    if (i < 0 || i >= shape_[d]) {
      throw ShapeError("[at] index " + std::to_string(i) + " out of range in dimension " + std::to_string(d) +
                       " of " + shape_string(shape_));
    }
    offset = offset * shape_[d] + i;
    ++d;
  }
  return data()[offset];
}

float Tensor::item() const {
  if (numel_ != 1) throw ShapeError("[item] needs one element, shape is " + shape_string(shape_));
  float value = 0.0F;  // one float to the host, from any backend
  detail::copy_bytes(&value, Backend::Cpu, storage_->data(), backend(), sizeof(float), "item");
  return value;
}

void Tensor::fill(float value) {
  if (!storage_) throw ValueError("[tensor] fill() of an undefined tensor");
  if (backend() == Backend::Cpu) {
    float* p = data_for_write("filled in place");
    std::fill(p, p + numel_, value);
    return;
  }
  storage_->bump_version("filled in place");
  const auto bytes = static_cast<std::size_t>(nbytes());
  if (std::bit_cast<std::uint32_t>(value) == 0) {  // +0.0: every byte zero
    detail::cuda_zero(storage_->data(), bytes, "fill");
  } else {
    const std::vector<float> host(static_cast<std::size_t>(numel_), value);
    detail::cuda_copy(storage_->data(), host.data(), bytes, detail::CopyKind::HostToDevice, "fill");
  }
}

void Tensor::copy_from(const Tensor& other) {
  if (other.shape_ != shape_) {
    throw ShapeError("[copy_from] destination " + shape_string(shape_) + " and source " +
                     shape_string(other.shape_) + " differ");
  }
  if (storage_ == other.storage_) return;
  if (storage_ && other.storage_ && (backend() != Backend::Cpu || other.backend() != Backend::Cpu)) {
    storage_->bump_version("overwritten by copy_from");
    detail::copy_bytes(storage_->data(), backend(), other.storage_->data(), other.backend(),
               static_cast<std::size_t>(nbytes()), "copy_from");
    return;
  }
  const float* source = other.data();
  std::memcpy(data_for_write("overwritten by copy_from"), source, static_cast<std::size_t>(nbytes()));
}

bool bit_equal(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  if (!a.defined()) return true;
  if (a.shape() != b.shape()) return false;
  return std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.nbytes())) == 0;
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) {
    throw ShapeError("[max_abs_diff] " + shape_string(a.shape()) + " and " + shape_string(b.shape()) + " differ");
  }
  float m = 0.0F;
  const float* pa = a.data();
  const float* pb = b.data();
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    const float d = std::fabs(pa[i] - pb[i]);
    if (!(d <= m)) m = d;  // NaN propagates as NaN
  }
  return m;
}

}  // namespace riftco_transformer
