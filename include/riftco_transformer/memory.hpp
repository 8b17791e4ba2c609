#pragma once
// Per-backend allocation accounting. Every Tensor buffer is allocated through
// `allocate_bytes` / `free_bytes`, so these counters are exact (they count
// the bytes tensors asked for; `reserved_bytes` counts what the caching
// allocator holds, src/tensor/memory.cpp).
#include <cstddef>
#include <cstdint>
#include <string>

namespace riftco_transformer {

enum class Backend : std::uint8_t { Cpu = 0, Cuda = 1 };

/// "cpu" / "cuda".
const char* backend_name(Backend backend);
/// Parses "cpu" / "cuda"; throws ValueError naming `op` otherwise.
Backend parse_backend(const std::string& name, const char* op);
/// True when this build contains the backend's kernels and, for cuda, a
/// CUDA device is present.
bool backend_available(Backend backend);
/// Why `backend` is not available ("the cuda backend is not built in this
/// package", "no CUDA device: ..."); empty when it is.
std::string backend_unavailable_reason(Backend backend);

struct MemoryStats {
  std::int64_t live_bytes = 0;        // bytes currently allocated
  std::int64_t peak_bytes = 0;        // max of live_bytes since the last reset
  std::int64_t allocation_count = 0;  // allocations since process start
  std::int64_t free_count = 0;        // frees since process start
  /// Bytes the allocator holds for this backend: live tensor bytes (rounded
  /// up to the allocator's block sizes) plus freed blocks kept for reuse. On
  /// the CPU the large blocks (>= 64 KiB) among them never exceed the most
  /// large-block bytes live at once since the start or the last
  /// release_cached_memory(): freed blocks are recycled across sizes, so the
  /// resident set follows the live bytes.
  std::int64_t reserved_bytes = 0;
};

MemoryStats memory_stats(Backend backend = Backend::Cpu);

/// Host memory this process may use: physical memory, or the cgroup's limit
/// or the address-space limit (ulimit -v) when lower; 0 when unknown.
double available_host_memory_bytes();

class ThreadMemoryMeter;
namespace detail {
void meter_note(Backend backend, std::int64_t bytes) noexcept;
}

/// The bytes the calling thread allocates (minus those it frees) on
/// `backend` while this meter lives, and the most of them live at once: a
/// measurement other threads' allocations do not disturb, unlike
/// memory_stats() and reset_peak_memory(), which count the whole process
/// (the activation planner's probes and the pipelines' step reports use
/// one). Meters nest (each counts). Not seen: allocations another thread
/// makes for this one (riftco's kernels allocate before their parallel
/// regions), and frees on another thread of blocks allocated here. Created
/// and destroyed on one thread, innermost first (a scope object).
class ThreadMemoryMeter {
 public:
  explicit ThreadMemoryMeter(Backend backend = Backend::Cpu);
  ~ThreadMemoryMeter();
  ThreadMemoryMeter(const ThreadMemoryMeter&) = delete;
  ThreadMemoryMeter& operator=(const ThreadMemoryMeter&) = delete;
  /// Allocated minus freed since the meter started (may be negative: frees
  /// of blocks allocated before it).
  std::int64_t live_bytes() const { return live_; }
  /// The most live_bytes() reached since the start or the last reset_peak().
  std::int64_t peak_bytes() const { return peak_; }
  /// peak_bytes() = live_bytes(), as reset_peak_memory() for this meter alone.
  void reset_peak() { peak_ = live_; }

 private:
  friend void detail::meter_note(Backend backend, std::int64_t bytes) noexcept;
  Backend backend_;
  std::int64_t live_ = 0;
  std::int64_t peak_ = 0;
  ThreadMemoryMeter* outer_;
};
/// Sets peak_bytes to the current live_bytes.
void reset_peak_memory(Backend backend = Backend::Cpu);
/// Gives every freed block the allocator keeps for reuse back to the system
/// (reserved_bytes drops to what live tensors hold); returns the bytes
/// released, and restarts the CPU cache's high-water mark at the live bytes.
/// Large CPU buffers (>= 64 KiB) are page mappings kept when freed and reused
/// for requests of any size (their pages moved, not faulted in again), so a
/// training loop does not fault the same pages in every step; CUDA buffers
/// of every size are cached by size class (cudaMalloc and cudaFree are slow).
std::int64_t release_cached_memory(Backend backend = Backend::Cpu);

namespace detail {
/// 64-byte aligned (512 on cuda: a device pointer); counts the bytes on
/// `backend`. Never returns null (throws std::bad_alloc on the CPU,
/// BackendError naming cudaMalloc on cuda, or when the backend is not
/// available; std::bad_alloc for any request above 2^62 bytes, before
/// anything is touched). Zero bytes returns a valid unique pointer. The
/// allocator's locks are held across fork(), so a child can allocate.
void* allocate_bytes(Backend backend, std::size_t bytes);
void free_bytes(Backend backend, void* ptr, std::size_t bytes) noexcept;
/// Page-locked host memory (cudaHostAlloc) for activation offload: counted in
/// memory_stats(Backend::Cpu) like any host buffer (live, peak, allocations,
/// frees, reserved); freed blocks are kept by size class and given back by
/// release_cached_memory(Backend::Cpu). BackendError without a CUDA device.
void* allocate_pinned_bytes(std::size_t bytes);
void free_pinned_bytes(void* ptr, std::size_t bytes) noexcept;
}  // namespace detail

}  // namespace riftco_transformer
