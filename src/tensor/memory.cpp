#include "riftco_transformer/memory.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "device_runtime.hpp"
#include "host_page_cache.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {
namespace {

// ---- caching allocator ------------------------------------------------------
// A training step allocates and frees the same buffer sizes every step.
// Large buffers handed back to glibc are either returned to the OS (munmap or
// heap trim), so that the next step faults every page in again and the kernel
// zeroes it (measured at ~8% of a step), or kept in its heap, where buffers of
// other sizes may never reuse them.
//
// CPU blocks of at least kCachedMinimum bytes are whole-page mappings kept
// when freed and recycled across sizes by host_page_cache.cpp: the bytes they
// hold (live + cached) never exceed the most ever live in them at once, and a
// request of a size not cached takes pages from a cached block of another size
// (its head, or several cached blocks moved into one new mapping with
// mremap) instead of mapping new ones. Such a block is its request rounded up
// to pages, not to a size class: recycled pages become resident whichever
// size touched them, so a class's rounding (up to 25%) was held resident too
// (S3's training step: 12–15 MiB above the allocator's peak, now ~0.3).
// Other sizes are rounded up to a size class, 4 per octave (2^k, 1.25·2^k,
// 1.5·2^k, 1.75·2^k), so a block is at most 25% larger than the request.
// Smaller CPU buffers go to glibc (its heap reuses them without faults).
// Under AddressSanitizer every CPU buffer goes to glibc, uncached.
//
// CUDA buffers (cudaMalloc, device_runtime.hpp) are cached by size class
// only: every size (cudaMalloc and cudaFree are slow and synchronize the
// device), classes below kCachedMinimum being multiples of 512 bytes, and the
// cache never holds more than the largest live byte count seen so far (a
// freed block beyond that goes back with cudaFree), so reserved memory stays
// within twice that high-water mark. A block freed to the cache may still be
// read by a kernel in flight: every kernel and copy runs on the legacy default
// stream, so the next user of the block is ordered after it.
//
// live/peak/allocation/free counters count requested bytes exactly;
// reserved_bytes counts what the allocator holds (block sizes, cached blocks
// included). release_cached_memory() empties the caches.

constexpr std::size_t kAlign = 64;
constexpr std::size_t kCachedMinimum = std::size_t{1} << 16;  // 64 KiB

// Under AddressSanitizer freed blocks go straight back (a reused block would
// hide a use after free from it).
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kCaching = false;
#else
constexpr bool kCaching = true;
#endif

constexpr std::size_t kCudaAlign = 512;

/// Requests above this many bytes fail with std::bad_alloc before anything
/// else: no machine maps them, and rounding larger ones up to a size class or
/// a page would wrap (SIZE_MAX became a 64-byte block) or pass 2^63 in the
/// signed counters.
constexpr std::size_t kLargestRequest = std::size_t{1} << 62;

void check_request(std::size_t bytes) {
  if (bytes > kLargestRequest) {
    throw OutOfMemoryError("[allocate] out of memory: " + std::to_string(bytes) + " bytes is more than any allocation may be");
  }
}

std::size_t size_class(std::size_t bytes) {
  if (bytes < kCachedMinimum) return (bytes + kAlign - 1) / kAlign * kAlign;
  const int top = std::bit_width(bytes - 1) - 1;  // 2^top < bytes <= 2^(top+1)
  const std::size_t quarter = std::size_t{1} << (top - 2);
  return (bytes + quarter - 1) / quarter * quarter;
}

struct Counters {
  std::atomic<std::int64_t> live{0};
  std::atomic<std::int64_t> peak{0};
  std::atomic<std::int64_t> allocations{0};
  std::atomic<std::int64_t> frees{0};
  std::atomic<std::int64_t> reserved{0};
};

// Freed blocks kept by size class: CUDA's (cudaMalloc; CPU blocks are cached
// by host_page_cache.cpp instead) and the pinned host blocks' (activation
// offload: counted in the CPU counters, given back with cudaFreeHost; every
// freed one is kept, offload parks the same sizes every step).
struct BlockCache {
  std::mutex lock;
  std::unordered_map<std::size_t, std::vector<void*>> free_lists;  // class → blocks
  std::int64_t cached = 0;      // bytes on the free lists
  std::int64_t high_water = 0;  // largest live ever (CUDA's cap)
};

BlockCache& cuda_cache() {
  static BlockCache cache;
  return cache;
}

BlockCache& pinned_cache() {
  static BlockCache cache;
  return cache;
}

/// A Backend value that is neither enumerator (a cast from a bad int, an
/// enum from C) is a ValueError naming it: it indexed past the counters.
void check_backend(Backend backend, const char* op) {
  if (backend != Backend::Cpu && backend != Backend::Cuda) {
    throw ValueError(std::string("[") + op + "] unknown backend " + std::to_string(static_cast<int>(backend)) +
                     " (expected cpu or cuda)");
  }
}

Counters& counters(Backend backend) {
  static Counters per_backend[2];
  // fork() copies only the calling thread: the locks are held across it, so
  // that no other thread holds one then (the child would wait forever).
  static const int fork_guard = pthread_atfork(
      [] {
        cuda_cache().lock.lock();
        pinned_cache().lock.lock();
      },
      [] {
        pinned_cache().lock.unlock();
        cuda_cache().lock.unlock();
      },
      [] {
        new (&pinned_cache().lock) std::mutex();
        new (&cuda_cache().lock) std::mutex();
      });
  (void)fork_guard;
  return per_backend[static_cast<int>(backend)];
}

// Made while the library loads, before any thread of ours: a fork() while
// another thread was inside their first use left the child waiting forever on
// the initialisation guard (host_page_cache.cpp does the same).
[[maybe_unused]] const bool g_initialised_at_load = (counters(Backend::Cpu), cuda_cache(), pinned_cache(), true);

/// A cached block of `rounded` bytes, taken off its free list, or nullptr.
void* take_cached(BlockCache& cache, std::size_t rounded) {
  std::lock_guard<std::mutex> guard(cache.lock);
  auto it = cache.free_lists.find(rounded);
  if (it == cache.free_lists.end() || it->second.empty()) return nullptr;
  void* ptr = it->second.back();
  it->second.pop_back();
  cache.cached -= static_cast<std::int64_t>(rounded);
  return ptr;
}

/// Puts a freed block of `rounded` bytes on its free list; false when it is
/// not kept (the caller gives it back): a capped cache (CUDA's) whose bytes
/// would pass the largest live byte count seen (raised to `live_before`
/// first), or a list that cannot grow.
bool keep_cached(BlockCache& cache, void* ptr, std::size_t rounded, bool capped, std::int64_t live_before) noexcept {
  try {
    std::lock_guard<std::mutex> guard(cache.lock);
    if (capped) {
      cache.high_water = std::max(cache.high_water, live_before);
      if (cache.cached + static_cast<std::int64_t>(rounded) > cache.high_water) return false;
    }
    cache.free_lists[rounded].push_back(ptr);  // may allocate: hence the try
    cache.cached += static_cast<std::int64_t>(rounded);
    return true;
  } catch (...) {
    return false;
  }
}

/// Gives every cached block back with `give_back` (no longer reserved in
/// `c`); the bytes released.
std::int64_t release_cache(BlockCache& cache, Counters& c, void (*give_back)(void*) noexcept) {
  std::unordered_map<std::size_t, std::vector<void*>> lists;
  {
    std::lock_guard<std::mutex> guard(cache.lock);
    lists.swap(cache.free_lists);
    c.reserved.fetch_sub(cache.cached);
    cache.cached = 0;
  }
  std::int64_t released = 0;
  for (auto& [size, blocks] : lists) {
    for (void* p : blocks) give_back(p);
    released += static_cast<std::int64_t>(size * blocks.size());
  }
  return released;
}

void raise_peak(Counters& c, std::int64_t live) {
  std::int64_t peak = c.peak.load(std::memory_order_relaxed);
  while (live > peak && !c.peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

/// The block size the allocator hands out for a request on `backend`.
std::size_t block_size(Backend backend, std::size_t bytes) {
  if (backend == Backend::Cuda && bytes < kCachedMinimum) {
    return std::max((bytes + kCudaAlign - 1) / kCudaAlign * kCudaAlign, kCudaAlign);
  }
  if (backend == Backend::Cpu && kCaching && bytes >= kCachedMinimum) {
    return (bytes + kAlign - 1) / kAlign * kAlign;  // host_page_cache.cpp rounds it to whole pages
  }
  return std::max(size_class(bytes), kAlign);
}

/// Whether a CPU block of this size is a cached page mapping (host_page_cache.cpp).
bool host_pages(Backend backend, std::size_t rounded) {
  return backend == Backend::Cpu && kCaching && rounded >= kCachedMinimum;
}

void* system_allocate(Backend backend, std::size_t bytes) {
  if (backend == Backend::Cuda) return detail::cuda_malloc(bytes);
  void* ptr = std::aligned_alloc(kAlign, bytes);
  if (ptr == nullptr) throw std::bad_alloc();
  return ptr;
}

void system_free(Backend backend, void* ptr) noexcept {
  if (backend == Backend::Cuda) {
    detail::cuda_free(ptr);
  } else {
    std::free(ptr);
  }
}

}  // namespace

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::Cpu:
      return "cpu";
    case Backend::Cuda:
      return "cuda";
  }
  return "unknown";
}

Backend parse_backend(const std::string& name, const char* op) {
  if (name == "cpu") return Backend::Cpu;
  if (name == "cuda") return Backend::Cuda;
  throw ValueError(std::string("[") + op + "] unknown backend '" + name + "' (expected 'cpu' or 'cuda')");
}

bool backend_available(Backend backend) {
  return backend == Backend::Cpu || (backend == Backend::Cuda && detail::cuda_device_present());
}

std::string backend_unavailable_reason(Backend backend) {
  return backend_available(backend) ? std::string() : detail::cuda_unavailable_reason();
}

namespace {
thread_local ThreadMemoryMeter* t_innermost_meter = nullptr;
}  // namespace

ThreadMemoryMeter::ThreadMemoryMeter(Backend backend) : backend_(backend), outer_(t_innermost_meter) {
  t_innermost_meter = this;
}

ThreadMemoryMeter::~ThreadMemoryMeter() { t_innermost_meter = outer_; }

void detail::meter_note(Backend backend, std::int64_t bytes) noexcept {
  for (ThreadMemoryMeter* m = t_innermost_meter; m != nullptr; m = m->outer_) {
    if (m->backend_ != backend) continue;
    m->live_ += bytes;
    m->peak_ = std::max(m->peak_, m->live_);
  }
}

MemoryStats memory_stats(Backend backend) {
  check_backend(backend, "memory_stats");
  Counters& c = counters(backend);
  const std::int64_t pages = backend == Backend::Cpu ? detail::host_pages_reserved() : 0;
  return MemoryStats{c.live.load(), c.peak.load(), c.allocations.load(), c.frees.load(), c.reserved.load() + pages};
}

void reset_peak_memory(Backend backend) {
  check_backend(backend, "reset_peak_memory");
  Counters& c = counters(backend);
  c.peak.store(c.live.load());
}

std::int64_t release_cached_memory(Backend backend) {
  check_backend(backend, "release_cached_memory");
  Counters& c = counters(backend);
  if (backend == Backend::Cuda) return release_cache(cuda_cache(), c, detail::cuda_free);
  return detail::host_pages_release() + release_cache(pinned_cache(), c, detail::cuda_host_free);
}

namespace detail {

namespace {
void* allocate_counted(Backend backend, std::size_t bytes);
}  // namespace

void* allocate_bytes(Backend backend, std::size_t bytes) {
  check_backend(backend, "allocate");
  if (!backend_available(backend)) {
    throw BackendError(std::string("[allocate] ") + detail::cuda_unavailable_reason());
  }
  try {
    return allocate_counted(backend, bytes);
  } catch (const OutOfMemoryError&) {
    throw;
  } catch (const std::bad_alloc&) {  // the host's: say how much, as PyTorch's "you tried to allocate N bytes"
    throw OutOfMemoryError("[allocate] out of memory: " + std::to_string(bytes) + " bytes (" +
                           std::to_string(bytes >> 20) + " MiB) on " + backend_name(backend) + " could not be allocated");
  }
}

namespace {
void* allocate_counted(Backend backend, std::size_t bytes) {
  check_request(bytes);
  Counters& c = counters(backend);
  const std::size_t rounded = block_size(backend, bytes);
  void* ptr = nullptr;
  if (host_pages(backend, rounded)) {
    ptr = host_pages_allocate(rounded);
  } else if (backend == Backend::Cuda) {
    ptr = take_cached(cuda_cache(), rounded);
  }
  if (ptr == nullptr) {
    try {
      ptr = system_allocate(backend, rounded);
    } catch (const OutOfMemoryError&) {
      // Out of device memory with blocks cached: give them back and try once more.
      if (backend != Backend::Cuda || release_cached_memory(backend) == 0) throw;
      ptr = system_allocate(backend, rounded);
    }
    c.reserved.fetch_add(static_cast<std::int64_t>(rounded));
  }
  const std::int64_t live = c.live.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
  c.allocations.fetch_add(1);
  raise_peak(c, live);
  meter_note(backend, static_cast<std::int64_t>(bytes));
  return ptr;
}
}  // namespace

void free_bytes(Backend backend, void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) return;
  Counters& c = counters(backend);
  const std::int64_t live_before = c.live.fetch_sub(static_cast<std::int64_t>(bytes));
  c.frees.fetch_add(1);
  meter_note(backend, -static_cast<std::int64_t>(bytes));
  const std::size_t rounded = block_size(backend, bytes);
  if (host_pages(backend, rounded)) {
    host_pages_free(ptr, rounded);
    return;
  }
  if (backend == Backend::Cuda && keep_cached(cuda_cache(), ptr, rounded, true, live_before)) return;
  system_free(backend, ptr);
  c.reserved.fetch_sub(static_cast<std::int64_t>(rounded));
}

void* allocate_pinned_bytes(std::size_t bytes) {
  check_request(bytes);
  Counters& c = counters(Backend::Cpu);
  const std::size_t rounded = std::max(size_class(bytes), kAlign);
  void* ptr = take_cached(pinned_cache(), rounded);
  if (ptr == nullptr) {
    ptr = cuda_host_alloc(rounded, "offload");
    c.reserved.fetch_add(static_cast<std::int64_t>(rounded));
  }
  const std::int64_t live = c.live.fetch_add(static_cast<std::int64_t>(bytes)) + static_cast<std::int64_t>(bytes);
  c.allocations.fetch_add(1);
  raise_peak(c, live);
  meter_note(Backend::Cpu, static_cast<std::int64_t>(bytes));
  return ptr;
}

void free_pinned_bytes(void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) return;
  Counters& c = counters(Backend::Cpu);
  c.live.fetch_sub(static_cast<std::int64_t>(bytes));
  c.frees.fetch_add(1);
  meter_note(Backend::Cpu, -static_cast<std::int64_t>(bytes));
  const std::size_t rounded = std::max(size_class(bytes), kAlign);
  if (keep_cached(pinned_cache(), ptr, rounded, false, 0)) return;  // every freed one is kept
  cuda_host_free(ptr);
  c.reserved.fetch_sub(static_cast<std::int64_t>(rounded));
}

}  // namespace detail
}  // namespace riftco_transformer
