#pragma once
// Activation offload (docs/cuda.md, "Activation offload"): a cuda tensor's
// bytes parked in pinned host memory and brought back before they are read
// again. The storage is parked, not the handle: every Tensor that views it
// (a graph node's value, a checkpoint's saved input) sees the bytes leave and
// come back, and device_data() on a parked storage is a BackendError rather
// than a stale address. Copies run on one copy stream; the compute stream
// (the legacy default stream, where every kernel runs) and the copy stream
// are ordered by events, never by host waits. Every function is a no-op for
// a cpu tensor, an undefined or empty one.
#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::detail {

/// Starts copying the bytes to pinned host memory (memory_stats(Cpu) counts
/// it until the storage goes) after the work queued on the compute stream so
/// far. The device block
/// leaves memory_stats(Cuda) at the next offload_to_host or
/// release_offloaded_blocks (the compute stream first waits for this copy),
/// so the copy overlaps the next block's kernels. No-op when already parked.
void offload_to_host(const Tensor& t);
/// Gives the device blocks of earlier offloads back to the allocator now
/// (the compute stream waits for their copies, on the device).
void release_offloaded_blocks();
/// Starts the copy back into a fresh device block, after the work queued on
/// the compute stream so far (no-op unless parked and not already started).
void prefetch_to_device(const Tensor& t);
/// The bytes usable on the device again: starts the copy back unless
/// prefetch_to_device did and makes the compute stream wait for it (the
/// pinned copy is kept for evict_from_device). No-op unless parked.
void restore_on_device(const Tensor& t);
/// Once its last reader is queued (its replay's backward ran): the device
/// block goes back to the allocator and the storage is parked again, on the
/// pinned copy it kept (no copy). No-op unless restored, or when the bytes
/// were written since they were parked (they stay on the device).
void evict_from_device(const Tensor& t);
/// True while the bytes are in host memory only (or being copied back).
bool offloaded(const Tensor& t);

/// Storage internals for the functions above and ~Storage.
struct OffloadAccess {
  static Storage* storage(const Tensor& t) { return t.storage_.get(); }
  static bool parked(const Storage& s) { return s.park_ != nullptr; }
  static bool resident(const Storage& s) { return s.data_ != nullptr; }
  static void park(Storage& s);
  static void evict(Storage& s);
  static void prefetch(Storage& s);
  static void restore(Storage& s);
  /// ~Storage of a parked storage: waits for a copy back in flight (on the
  /// device), frees its device block and the pinned block. Never throws.
  static void drop(Storage& s) noexcept;
};

}  // namespace riftco_transformer::detail
