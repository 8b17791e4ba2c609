#pragma once
// Tensor: a cheap handle to shared float32 storage, contiguous row-major.
// Copying a Tensor shares the buffer (like MLX `array`); `clone()` copies it.
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <vector>

#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/memory.hpp"
#include "riftco_transformer/random.hpp"

namespace riftco_transformer {

using Shape = std::vector<std::int64_t>;

/// Number of elements of a shape; throws ShapeError naming `op` on a negative
/// dimension or overflow.
std::int64_t shape_numel(const Shape& shape, const char* op = "tensor");

namespace detail {
struct ParkState;
struct OffloadAccess;
}  // namespace detail

/// One allocation, owned by every Tensor that views it. The version counter
/// lives here, with the bytes: every handle that views the buffer (a reshape,
/// a second leaf built on the same value) shares it, and every in-place write
/// through any of them bumps it (docs/autograd.md, "Versions").
class Storage {
 public:
  Storage(Backend backend, std::int64_t numel);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  /// The buffer. A storage whose bytes are parked in host memory
  /// (activation offload, src/tensor/offload.hpp) and not yet brought back
  /// throws BackendError instead of handing out a stale address.
  float* data() {
    if (park_ != nullptr && data_ == nullptr) [[unlikely]] throw_parked();
    return data_;
  }
  const float* data() const {
    if (park_ != nullptr && data_ == nullptr) [[unlikely]] throw_parked();
    return data_;
  }
  std::int64_t numel() const { return numel_; }
  Backend backend() const { return backend_; }

  /// Number of in-place writes so far (monotonic; thread-safe).
  std::uint64_t version() const { return version_.load(std::memory_order_acquire); }
  /// Records an in-place write; `why` must be a string literal (it is kept).
  /// An OutsideWriteWatch on this thread notes it if this buffer is older.
  void bump_version(const char* why);
  /// Why the version last moved ("" before the first write).
  const char* last_change() const { return last_change_.load(std::memory_order_relaxed); }
  /// Creation order, process-wide (tells buffers made inside a checkpoint
  /// callable from those it captured).
  std::uint64_t serial() const { return serial_; }

 private:
  friend struct detail::OffloadAccess;
  [[noreturn]] void throw_parked() const;

  Backend backend_;
  std::int64_t numel_;
  float* data_;
  detail::ParkState* park_ = nullptr;  // set while offloaded or being copied back (offload.cpp)
  std::uint64_t serial_;
  std::atomic<std::uint64_t> version_{0};
  std::atomic<const char*> last_change_{""};
};

/// While alive, notes the first in-place write on this thread into a buffer
/// made before the watch started (checkpoint: a callable may write only into
/// buffers it made itself). Watches nest; each sees the writes older than it.
class OutsideWriteWatch {
 public:
  OutsideWriteWatch();
  ~OutsideWriteWatch();
  OutsideWriteWatch(const OutsideWriteWatch&) = delete;
  OutsideWriteWatch& operator=(const OutsideWriteWatch&) = delete;
  bool tripped() const { return why_ != nullptr; }
  /// How the first such buffer was written ("filled in place", ...), and its shape in elements.
  const char* why() const { return why_; }
  std::int64_t numel() const { return numel_; }

 private:
  friend class Storage;
  std::uint64_t first_serial_;
  const char* why_ = nullptr;
  std::int64_t numel_ = 0;
};

class Tensor {
 public:
  /// An undefined tensor (no storage); `defined()` is false.
  Tensor() = default;

  static Tensor empty(const Shape& shape, Backend backend = Backend::Cpu);
  static Tensor zeros(const Shape& shape, Backend backend = Backend::Cpu);
  static Tensor ones(const Shape& shape, Backend backend = Backend::Cpu);
  static Tensor full(const Shape& shape, float value, Backend backend = Backend::Cpu);
  static Tensor scalar(float value);
  /// Copies `values` (must have shape_numel(shape) elements).
  static Tensor from_data(const Shape& shape, std::span<const float> values);
  static Tensor from_data(const Shape& shape, std::initializer_list<float> values);
  static Tensor normal(const Shape& shape, Random& random, float mean = 0.0F, float std = 1.0F);
  static Tensor uniform(const Shape& shape, Random& random, float low = 0.0F, float high = 1.0F);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim() const { return static_cast<std::int64_t>(shape_.size()); }
  /// Size of dimension `d`; negative counts from the end.
  std::int64_t size(std::int64_t d) const;
  std::int64_t numel() const { return numel_; }
  std::int64_t nbytes() const { return numel_ * static_cast<std::int64_t>(sizeof(float)); }
  Backend backend() const;

  /// Host pointer (CPU tensors only; throws BackendError otherwise). The
  /// non-const overload is for writing: it bumps the storage's version, so
  /// every graph that read this buffer becomes stale. Read through a const
  /// handle (`std::as_const(t).data()`, `values()`) to leave it alone.
  float* data();
  const float* data() const;
  std::span<const float> values() const { return {data(), static_cast<std::size_t>(numel_)}; }
  /// The buffer's address on its own backend (a device pointer for cuda),
  /// for backend kernels only: host code must not dereference it unless the
  /// tensor is on the CPU. The non-const overload bumps the version, like data().
  float* device_data();
  const float* device_data() const;

  /// Deep copy into a new buffer.
  Tensor clone() const;
  /// Same storage, new shape with the same element count. One dimension may be -1.
  Tensor reshape(const Shape& shape) const;
  /// Copy to another backend (a deep copy even for the same backend is not
  /// made: same backend returns *this). cpu <-> cuda copies are synchronous.
  Tensor to(Backend backend) const;
  /// The values on the host (a cuda tensor is copied back first).
  std::vector<float> to_vector() const;

  /// Element access for tests and small host code (cpu tensors only).
  float at(std::initializer_list<std::int64_t> index) const;
  /// The one element of a tensor with numel() == 1 (a ShapeError naming its
  /// shape otherwise), on any backend: one float copied to the host.
  float item() const;
  /// In-place writes: both bump the storage's version.
  void fill(float value);
  /// Copies `other`'s values into this tensor's buffer (same shape; the two
  /// may be on different backends).
  void copy_from(const Tensor& other);

  /// The storage's version (0 for an undefined tensor); see Storage.
  std::uint64_t version() const { return storage_ ? storage_->version() : 0; }
  /// Why the storage's version last moved.
  const char* last_change() const { return storage_ ? storage_->last_change() : ""; }
  /// Records an in-place write made by other means (a kernel writing through
  /// a pointer taken earlier); `why` must be a string literal.
  void bump_version(const char* why);
  /// A non-owning reference to the storage, for watching its version without
  /// keeping its bytes alive.
  std::weak_ptr<const Storage> weak_storage() const { return storage_; }

 private:
  /// The buffer for an in-place write: one version bump, with `why`.
  float* data_for_write(const char* why);

 public:

  /// True when both handles view the same buffer.
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }
  const void* storage_id() const { return storage_.get(); }
  /// Handles sharing this buffer (1: this handle owns it alone).
  long use_count() const { return storage_.use_count(); }

 private:
  friend struct detail::OffloadAccess;
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  std::int64_t numel_ = 0;
};

/// Bitwise equality of shape and values (tests: "bit-identical"); cpu tensors.
bool bit_equal(const Tensor& a, const Tensor& b);
/// max |a - b|; shapes must match; cpu tensors.
float max_abs_diff(const Tensor& a, const Tensor& b);

}  // namespace riftco_transformer
