// Activation offload: parking a cuda storage in pinned host memory and
// bringing it back (offload.hpp).
#include "offload.hpp"

#include <mutex>
#include <vector>

#include "device_runtime.hpp"

namespace riftco_transformer::detail {

/// Kept from the first offload until the storage goes: the pinned copy stays
/// valid while the bytes are unchanged, so evicting them again copies nothing.
struct ParkState {
  void* host = nullptr;             // pinned copy of the bytes
  std::size_t bytes = 0;
  std::uint64_t version = 0;        // the storage's version the copy holds
  void* incoming = nullptr;         // device block the copy back writes (null until started)
  CudaEvent copied_back = nullptr;  // recorded on the copy stream after that copy
};

namespace {

constexpr const char* kOp = "offload";

/// Device blocks whose bytes are being copied out: given back to the
/// allocator only after the compute stream waits for the copy (a block freed
/// to the cache is next used by compute-stream work).
struct PendingBlock {
  void* device = nullptr;
  std::size_t bytes = 0;
  CudaEvent copied_out = nullptr;
};

struct Pending {
  std::mutex lock;
  std::vector<PendingBlock> blocks;
};

Pending& pending() {
  static Pending p;
  return p;
}

void release_pending() {
  std::vector<PendingBlock> blocks;
  {
    std::lock_guard<std::mutex> guard(pending().lock);
    blocks.swap(pending().blocks);
  }
  for (const PendingBlock& b : blocks) {
    cuda_wait_event(Stream::Compute, b.copied_out, kOp);
    cuda_destroy_event(b.copied_out);
    free_bytes(Backend::Cuda, b.device, b.bytes);
  }
}

/// The copy stream waits for everything queued on the compute stream so far.
void copy_after_compute() {
  const CudaEvent ready = cuda_record_event(Stream::Compute, kOp);
  cuda_wait_event(Stream::Copy, ready, kOp);
  cuda_destroy_event(ready);
}

bool parkable(const Storage* s) { return s != nullptr && s->backend() == Backend::Cuda && s->numel() > 0; }

}  // namespace

void OffloadAccess::park(Storage& s) {
  if (s.park_ != nullptr) return;
  const std::size_t bytes = static_cast<std::size_t>(s.numel_) * sizeof(float);
  release_pending();  // the previous offload's block: its copy ran beside this block's kernels
  void* host = allocate_pinned_bytes(bytes);
  CudaEvent copied_out = nullptr;
  try {
    copy_after_compute();
    cuda_copy_async(host, s.data_, bytes, CopyKind::DeviceToHost, kOp);
    copied_out = cuda_record_event(Stream::Copy, kOp);
    std::lock_guard<std::mutex> guard(pending().lock);
    pending().blocks.push_back(PendingBlock{s.data_, bytes, copied_out});
  } catch (...) {
    cuda_destroy_event(copied_out);
    free_pinned_bytes(host, bytes);
    throw;
  }
  s.park_ = new ParkState{host, bytes, s.version(), nullptr, nullptr};
  s.data_ = nullptr;
}

void OffloadAccess::evict(Storage& s) {
  ParkState* p = s.park_;
  if (p == nullptr || s.data_ == nullptr || s.version() != p->version) return;  // parked, or changed since
  // Every reader of the block was queued on the compute stream, which reuses
  // it only after them; the copy back that filled it was waited for there.
  free_bytes(Backend::Cuda, s.data_, p->bytes);
  s.data_ = nullptr;
}

void OffloadAccess::prefetch(Storage& s) {
  ParkState* p = s.park_;
  if (p == nullptr || s.data_ != nullptr || p->incoming != nullptr) return;
  release_pending();
  void* device = allocate_bytes(Backend::Cuda, p->bytes);
  try {
    copy_after_compute();  // the block may still be read by queued kernels of its last user
    cuda_copy_async(device, p->host, p->bytes, CopyKind::HostToDevice, kOp);
    p->copied_back = cuda_record_event(Stream::Copy, kOp);
  } catch (...) {
    free_bytes(Backend::Cuda, device, p->bytes);
    throw;
  }
  p->incoming = device;
}

void OffloadAccess::restore(Storage& s) {
  ParkState* p = s.park_;
  if (p == nullptr || s.data_ != nullptr) return;
  prefetch(s);
  cuda_wait_event(Stream::Compute, p->copied_back, kOp);
  cuda_destroy_event(p->copied_back);
  p->copied_back = nullptr;
  s.data_ = static_cast<float*>(p->incoming);
  p->incoming = nullptr;
}

void OffloadAccess::drop(Storage& s) noexcept {
  ParkState* p = s.park_;
  s.park_ = nullptr;
  if (p == nullptr) return;
  if (p->incoming != nullptr) {
    try {
      cuda_wait_event(Stream::Compute, p->copied_back, kOp);
    } catch (...) {
      // the device is failing: nothing better to do than free
    }
    cuda_destroy_event(p->copied_back);
    free_bytes(Backend::Cuda, p->incoming, p->bytes);
  }
  // Later copies into this pinned block run on the copy stream, after any in flight.
  free_pinned_bytes(p->host, p->bytes);
  delete p;
}

void offload_to_host(const Tensor& t) {
  Storage* s = OffloadAccess::storage(t);
  if (parkable(s)) OffloadAccess::park(*s);
}

void release_offloaded_blocks() { release_pending(); }

void evict_from_device(const Tensor& t) {
  Storage* s = OffloadAccess::storage(t);
  if (parkable(s)) OffloadAccess::evict(*s);
}

void prefetch_to_device(const Tensor& t) {
  Storage* s = OffloadAccess::storage(t);
  if (parkable(s)) OffloadAccess::prefetch(*s);
}

void restore_on_device(const Tensor& t) {
  Storage* s = OffloadAccess::storage(t);
  if (parkable(s)) OffloadAccess::restore(*s);
}

bool offloaded(const Tensor& t) {
  const Storage* s = OffloadAccess::storage(t);
  return parkable(s) && OffloadAccess::parked(*s) && !OffloadAccess::resident(*s);
}

}  // namespace riftco_transformer::detail
