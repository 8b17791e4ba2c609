// Allocator accounting per backend (memory.hpp) and the backends this build has.
#include "common.hpp"
#include "riftco_transformer/memory.hpp"

namespace riftco_python {

void init_memory(nb::module_& m) {
  nb::class_<rt::MemoryStats>(m, "MemoryStats", "Allocator counters of one backend (bytes tensors asked for).")
      .def_ro("live_bytes", &rt::MemoryStats::live_bytes)
      .def_ro("peak_bytes", &rt::MemoryStats::peak_bytes)
      .def_ro("allocation_count", &rt::MemoryStats::allocation_count)
      .def_ro("free_count", &rt::MemoryStats::free_count)
      .def_ro("reserved_bytes", &rt::MemoryStats::reserved_bytes)
      .def("__repr__", [](const rt::MemoryStats& s) {
        return "MemoryStats(live_bytes=" + std::to_string(s.live_bytes) + ", peak_bytes=" +
               std::to_string(s.peak_bytes) + ", allocation_count=" + std::to_string(s.allocation_count) +
               ", free_count=" + std::to_string(s.free_count) + ", reserved_bytes=" +
               std::to_string(s.reserved_bytes) + ")";
      });
  m.def("memory_stats", [](nb::str backend) {
          return rt::memory_stats(backend_for(choice_of(backend, "[memory_stats] backend"), "memory_stats"));
        },
        "backend"_a = "cpu", "Allocator counters: live, peak (since the last reset_peak_memory), reserved bytes.");
  m.def("reset_peak_memory", [](nb::str backend) {
          rt::reset_peak_memory(backend_for(choice_of(backend, "[reset_peak_memory] backend"), "reset_peak_memory"));
        },
        "backend"_a = "cpu", "Sets peak_bytes to the current live_bytes.");
  m.def("release_cached_memory",
        [](nb::str backend) {
          return rt::release_cached_memory(
              backend_for(choice_of(backend, "[release_cached_memory] backend"), "release_cached_memory"));
        },
        "backend"_a = "cpu", "Gives the allocator's cached free blocks back to the system; returns the bytes released.");
  m.def("available_backends", &available_backends, "The backends this build has, e.g. ('cpu',).");
}

}  // namespace riftco_python
