// RMSNorm forward/backward. Row reductions use 8 fixed lanes summed in a
// fixed order (vec_math.hpp) and dw sums each column over rows in row order,
// so results do not depend on the thread count. The loops run in AVX-512F,
// AVX2 and baseline clones; the file is built with -ffp-contract=off, so
// every clone gives the same bits.
#include <algorithm>
#include <cmath>

#include "kernels.hpp"
#include "parallel.hpp"
#include "vec_math.hpp"

// v8 values live inside the AVX2/baseline clones only (see vec_math.hpp).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace riftco_transformer::cpu {
namespace {

using vec::kLanes;
using vec::v8;

/// Σ_j a[j]·b[j]·c[j] (c may be null: Σ a·b) over 8 lanes, fixed order.
[[gnu::always_inline]] inline float dot3(const float* a, const float* b, const float* c, std::int64_t n) {
  v8 acc{};
  std::int64_t j = 0;
  if (c == nullptr) {
    for (; j + kLanes <= n; j += kLanes) acc += vec::load(a + j) * vec::load(b + j);
  } else {
    for (; j + kLanes <= n; j += kLanes) acc += vec::load(a + j) * vec::load(b + j) * vec::load(c + j);
  }
  float total = vec::sum_lanes(acc);
  for (; j < n; ++j) total += c == nullptr ? a[j] * b[j] : a[j] * b[j] * c[j];
  return total;
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void forward_rows(const float* px, const float* pw,
                                                                               float* po, float* pr, std::int64_t r0,
                                                                               std::int64_t r1, std::int64_t c,
                                                                               float eps) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* xr = px + r * c;
    const float ss = dot3(xr, xr, nullptr, c);
    const float s = 1.0F / std::sqrt(ss / static_cast<float>(c) + eps);
    pr[r] = s;
    float* orow = po + r * c;
    for (std::int64_t j = 0; j < c; ++j) orow[j] = xr[j] * s * pw[j];
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void backward_rows(const float* px, const float* pw,
                                                                                const float* pr, const float* pg,
                                                                                float* pd, std::int64_t r0,
                                                                                std::int64_t r1, std::int64_t c) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const float* xr = px + r * c;
    const float* gr = pg + r * c;
    const float s = pr[r];
    const float dot = dot3(gr, pw, xr, c);
    const float k = s * s * s * dot / static_cast<float>(c);
    float* dr = pd + r * c;
    for (std::int64_t j = 0; j < c; ++j) dr[j] = s * gr[j] * pw[j] - xr[j] * k;
  }
}

/// dw[j0, j1) = Σ_rows g·x·rstd, each column summed in row order.
__attribute__((target_clones("avx512f", "avx2", "default"))) void weight_columns(const float* px, const float* pg,
                                                                                 const float* pr, float* pdw,
                                                                                 std::int64_t rows, std::int64_t c,
                                                                                 std::int64_t j0, std::int64_t j1) {
  std::fill(pdw + j0, pdw + j1, 0.0F);
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* gr = pg + r * c;
    const float* xr = px + r * c;
    const float s = pr[r];
    for (std::int64_t j = j0; j < j1; ++j) pdw[j] += gr[j] * xr[j] * s;
  }
}

/// Fixed row ranges handed out dynamically (rows are independent).
template <class F>
void parallel_rows(std::int64_t rows, std::int64_t c, F&& body) {
  const int threads = rows > 1 ? threads_for(rows * c, kMinStreamPerThread) : 1;
  const std::int64_t chunks = threads > 1 ? std::min<std::int64_t>(rows, 4 * threads) : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (std::int64_t i = 0; i < chunks; ++i) body(rows * i / chunks, rows * (i + 1) / chunks);
}

}  // namespace

Tensor rms_norm_forward(const Tensor& x, const Tensor& w, float eps, Tensor& rstd) {
  const std::int64_t c = x.size(-1);
  const std::int64_t rows = c == 0 ? 0 : x.numel() / c;
  Tensor out = Tensor::empty(x.shape());
  rstd = Tensor::empty({rows});
  const float* px = x.data();
  const float* pw = w.data();
  float* po = out.data();
  float* pr = rstd.data();
  parallel_rows(rows, c, [&](std::int64_t r0, std::int64_t r1) { forward_rows(px, pw, po, pr, r0, r1, c, eps); });
  return out;
}

void rms_norm_backward(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& g, Tensor& dx, Tensor& dw,
                       bool need_dx, bool need_dw) {
  // y_j = x_j s w_j, s = (mean(x²) + eps)^(-1/2)
  // dx_j = s (g_j w_j) - x_j s³ / C * Σ_k g_k w_k x_k ;  dw_j = Σ_rows g_j x_j s
  const std::int64_t c = x.size(-1);
  const std::int64_t rows = c == 0 ? 0 : x.numel() / c;
  const float* px = x.data();
  const float* pw = w.data();
  const float* pr = rstd.data();
  const float* pg = g.data();
  if (need_dx) dx = Tensor::empty(x.shape());
  if (need_dw) dw = Tensor::empty(w.shape());
  float* pd = need_dx ? dx.data() : nullptr;
  float* pdw = need_dw ? dw.data() : nullptr;
  // One parallel region for both parts (each region edge costs a thread
  // wake-up at 2 threads): dw's column blocks (multiples of 8, one per
  // thread, the larger tasks) first, then dx's row ranges, all handed out
  // dynamically. Rows are independent and every column sums its rows in
  // order, so the split changes no bits.
  const std::int64_t blocks = (c + kLanes - 1) / kLanes;
  const int threads = (need_dx && rows > 1) || (need_dw && blocks > 1) ? threads_for(rows * c, kMinStreamPerThread) : 1;
  const std::int64_t column_tasks = need_dw ? std::min<std::int64_t>(std::max<std::int64_t>(blocks, 1), threads) : 0;
  const std::int64_t row_tasks = need_dx ? (threads > 1 ? std::min<std::int64_t>(rows, 4 * threads) : 1) : 0;
  const std::int64_t tasks = column_tasks + row_tasks;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1 && tasks > 1)
  for (std::int64_t i = 0; i < tasks; ++i) {
    if (i < column_tasks) {
      const std::int64_t j0 = std::min(c, blocks * i / column_tasks * kLanes);
      const std::int64_t j1 = std::min(c, blocks * (i + 1) / column_tasks * kLanes);
      if (j0 < j1) weight_columns(px, pg, pr, pdw, rows, c, j0, j1);
    } else {
      const std::int64_t k = i - column_tasks;
      backward_rows(px, pw, pr, pg, pd, rows * k / row_tasks, rows * (k + 1) / row_tasks, c);
    }
  }
}

}  // namespace riftco_transformer::cpu
