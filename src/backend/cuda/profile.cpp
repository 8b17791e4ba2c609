// RIFTCO_CUDA_PROFILE=1: per-kernel GPU time. Every launch check (and every
// cuBLAS call) records an event on the default stream and waits for it; the
// time since the previous mark goes to "op/kernel". The totals print to stderr
// at exit, largest first. Off (one getenv, cached) unless the variable is 1;
// on, every kernel is serialized, so step times are not representative.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cuda_common.hpp"

namespace riftco_transformer::cuda::detail {
namespace {

struct Profiler {
  bool on = false;
  bool started = false;
  cudaEvent_t last = nullptr;
  std::map<std::string, std::pair<double, long>> totals;  // ms, calls
  Profiler() {
    const char* v = std::getenv("RIFTCO_CUDA_PROFILE");
    on = v != nullptr && std::strcmp(v, "1") == 0;
  }
  ~Profiler() {
    if (!on || totals.empty()) return;
    std::vector<std::pair<std::string, std::pair<double, long>>> rows(totals.begin(), totals.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
    double all = 0.0;
    for (const auto& r : rows) all += r.second.first;
    std::fprintf(stderr, "RIFTCO_CUDA_PROFILE total %.3f ms over %zu kernels\n", all, rows.size());
    for (const auto& r : rows) {
      std::fprintf(stderr, "  %10.3f ms %6.2f%% %7ld calls  %s\n", r.second.first, 100.0 * r.second.first / all,
                   r.second.second, r.first.c_str());
    }
  }
};

Profiler& profiler() {
  static Profiler p;
  return p;
}

}  // namespace

void profile_mark(const char* op, const char* kernel) {
  Profiler& p = profiler();
  if (!p.on) return;
  cudaEvent_t now = nullptr;
  if (cudaEventCreate(&now) != cudaSuccess) return;
  cudaEventRecord(now, nullptr);
  cudaEventSynchronize(now);
  if (p.started) {
    float ms = 0.0F;
    cudaEventElapsedTime(&ms, p.last, now);
    auto& slot = p.totals[std::string(op) + "/" + kernel];
    slot.first += ms;
    slot.second += 1;
    cudaEventDestroy(p.last);
  }
  p.last = now;
  p.started = true;
}

}  // namespace riftco_transformer::cuda::detail
