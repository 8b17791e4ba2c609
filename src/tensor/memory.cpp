#include "riftco_transformer/memory.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {
namespace {

struct Counters {
  std::atomic<std::int64_t> live{0};
  std::atomic<std::int64_t> peak{0};
  std::atomic<std::int64_t> allocations{0};
  std::atomic<std::int64_t> frees{0};
};

Counters& counters(Backend backend) {
  static Counters per_backend[2];
  return per_backend[static_cast<int>(backend)];
}

void raise_peak(Counters& c, std::int64_t live) {
  std::int64_t peak = c.peak.load(std::memory_order_relaxed);
  while (live > peak && !c.peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
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

bool backend_available(Backend backend) { return backend == Backend::Cpu; }

MemoryStats memory_stats(Backend backend) {
  Counters& c = counters(backend);
  return MemoryStats{c.live.load(), c.peak.load(), c.allocations.load(), c.frees.load()};
}

void reset_peak_memory(Backend backend) {
  Counters& c = counters(backend);
  c.peak.store(c.live.load());
}

namespace detail {

void* allocate_bytes(Backend backend, std::size_t bytes) {
  if (backend != Backend::Cpu) {
    throw BackendError(std::string("[allocate] the ") + backend_name(backend) +
                       " backend is not built in this package");
  }
  constexpr std::size_t kAlign = 64;
  std::size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  if (rounded == 0) rounded = kAlign;
  void* ptr = std::aligned_alloc(kAlign, rounded);
  if (ptr == nullptr) throw std::bad_alloc();
  Counters& c = counters(backend);
  const std::int64_t live = c.live.fetch_add(static_cast<std::int64_t>(bytes)) +
                            static_cast<std::int64_t>(bytes);
  c.allocations.fetch_add(1);
  raise_peak(c, live);
  return ptr;
}

void free_bytes(Backend backend, void* ptr, std::size_t bytes) noexcept {
  if (ptr == nullptr) return;
  std::free(ptr);
  Counters& c = counters(backend);
  c.live.fetch_sub(static_cast<std::int64_t>(bytes));
  c.frees.fetch_add(1);
}

}  // namespace detail
}  // namespace riftco_transformer
