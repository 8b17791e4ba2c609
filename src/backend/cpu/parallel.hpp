#pragma once
// How many OpenMP threads a kernel's parallel region gets (private to
// backend/cpu). Each thread must get at least `min_per_thread` units of
// work: a region that would hand a thread less costs more in fork, barrier
// and (on a loaded machine) waiting for a descheduled thread than it saves.
// Kernels using it split work so that their bits never depend on the count.
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace riftco_transformer::cpu {

/// Elements per thread for streaming kernels that do a few operations per
/// element (about 64–128 KiB of traffic each).
inline constexpr std::int64_t kMinStreamPerThread = 16384;

/// min(OpenMP's thread limit, work / min_per_thread), at least 1.
inline int threads_for(std::int64_t work, std::int64_t min_per_thread) {
  const std::int64_t by_work = work / std::max<std::int64_t>(min_per_thread, 1);
  return static_cast<int>(std::clamp<std::int64_t>(by_work, 1, omp_get_max_threads()));
}

/// Runs body(begin, end) over [0, n) in fixed chunks of at least
/// kMinStreamPerThread elements (at most 64) handed out dynamically, so a
/// thread that loses its core holds up one chunk, not half the work. For
/// elementwise work: the bits do not depend on which thread runs a chunk.
template <class F>
void parallel_spans(std::int64_t n, F&& body) {
  const std::int64_t chunks = std::clamp<std::int64_t>(n / kMinStreamPerThread, 1, 64);
  const int threads = static_cast<int>(std::min<std::int64_t>(chunks, omp_get_max_threads()));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (std::int64_t c = 0; c < chunks; ++c) body(n * c / chunks, n * (c + 1) / chunks);
}

}  // namespace riftco_transformer::cpu
