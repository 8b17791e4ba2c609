// Rotary embedding: pairs (2i, 2i+1) of a head row rotated by position · θ_i.
// The rows run in AVX-512F / AVX2 / baseline clones over 8-float vectors
// (four pairs); every element is one product pair and one add or subtract
// in the scalar formula's order, and the file is built with
// -ffp-contract=off, so every build gives the scalar formula's bits.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "kernels.hpp"
#include "parallel.hpp"
#include "vec_math.hpp"

// v8 values live inside the clones only (see vec_math.hpp).
#pragma GCC diagnostic ignored "-Wpsabi"

namespace riftco_transformer::cpu {
namespace {

using vec::kLanes;
using vec::v8;

/// cos and sin of position · base^(-2i/D) for positions [0, positions) and
/// i < D/2, computed in double and rounded once (identical for forward,
/// replay and decode), stored per element of a head row: cos2[p·D + 2i] =
/// cos2[p·D + 2i + 1] = cos, sin2[p·D + 2i] = −sin, sin2[p·D + 2i + 1] = sin,
/// so a row rotates as out = x·cos2 + swap_pairs(x)·sin2 (inverse: − ·sin2).
struct RopeTable {
  std::int64_t positions = 0;
  std::vector<float> cos2;  // (positions, D)
  std::vector<float> sin2;  // (positions, D)
};

/// Fills `table` (its `positions` set) with the rows of positions
/// [first, first + table.positions).
void fill_rope_rows(RopeTable& table, std::int64_t d, float base, std::int64_t first) {
  const std::int64_t half = d / 2;
  table.cos2.resize(static_cast<std::size_t>(table.positions * d));
  table.sin2.resize(static_cast<std::size_t>(table.positions * d));
  for (std::int64_t i = 0; i < half; ++i) {
    const double theta = std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / static_cast<double>(d));
    for (std::int64_t p = 0; p < table.positions; ++p) {
      const double angle = static_cast<double>(first + p) * theta;
      const auto c = static_cast<float>(std::cos(angle));
      const auto s = static_cast<float>(std::sin(angle));
      const auto at = static_cast<std::size_t>(p * d + 2 * i);
      table.cos2[at] = c;
      table.cos2[at + 1] = c;
      table.sin2[at] = -s;
      table.sin2[at + 1] = s;
    }
  }
}

/// Positions the shared tables hold at most; rows further out are made for
/// the call alone (the same bits: each row depends only on its position).
constexpr std::int64_t kCachedPositions = std::int64_t{1} << 16;

/// Tables per (D, base), grown on demand and shared: a training step asks
/// for the same one four times per block.
std::shared_ptr<const RopeTable> rope_table(std::int64_t d, float base, std::int64_t positions) {
  static std::mutex lock;
  static std::map<std::pair<std::int64_t, std::uint32_t>, std::shared_ptr<const RopeTable>> tables;
  std::uint32_t base_bits = 0;
  std::memcpy(&base_bits, &base, sizeof base_bits);
  const auto key = std::make_pair(d, base_bits);
  std::lock_guard<std::mutex> guard(lock);
  auto& slot = tables[key];
  if (slot && slot->positions >= positions) return slot;
  auto table = std::make_shared<RopeTable>();
  table->positions = std::max<std::int64_t>(positions, slot ? std::min(2 * slot->positions, kCachedPositions) : 0);
  fill_rope_rows(*table, d, base, 0);
  slot = table;
  return slot;
}

/// One head row of d floats (d even): out = x·c2 ± swap_pairs(x)·s2, i.e.
/// (a, b) → (a·c − b·s, a·s + b·c) with s negated for the inverse. In place
/// (x == out) is allowed: a vector or pair is read whole before it is written.
template <bool kInverse>
[[gnu::always_inline]] inline void rotate_row(const float* x, float* out, const float* c2, const float* s2,
                                              std::int64_t d) {
  std::int64_t j = 0;
  for (; j + kLanes <= d; j += kLanes) {
    const v8 xv = vec::load(x + j);
    const v8 swapped = __builtin_shufflevector(xv, xv, 1, 0, 3, 2, 5, 4, 7, 6);
    const v8 p = xv * vec::load(c2 + j);
    const v8 q = swapped * vec::load(s2 + j);
    vec::store(out + j, kInverse ? p - q : p + q);
  }
  for (; j + 1 < d; j += 2) {
    const float a = x[j];
    const float b = x[j + 1];
    out[j] = kInverse ? a * c2[j] - b * s2[j] : a * c2[j] + b * s2[j];
    out[j + 1] = kInverse ? b * c2[j + 1] - a * s2[j + 1] : b * c2[j + 1] + a * s2[j + 1];
  }
}

/// Rows [r0, r1) of `heads` head rows each; row r is at position r % t
/// (+ offset), its head h at src + r·src_stride + h·d.
struct RopeRows {
  const float* src;
  std::int64_t src_stride;
  float* dst;
  std::int64_t dst_stride;
  std::int64_t t;
  std::int64_t offset;
  std::int64_t heads;
  std::int64_t d;
  const RopeTable* table;
};

template <bool kInverse>
[[gnu::always_inline]] inline void rotate_rows_impl(const RopeRows& job, std::int64_t r0, std::int64_t r1) {
  for (std::int64_t r = r0; r < r1; ++r) {
    const std::int64_t p = job.offset + r % job.t;
    const float* c2 = job.table->cos2.data() + p * job.d;
    const float* s2 = job.table->sin2.data() + p * job.d;
    for (std::int64_t h = 0; h < job.heads; ++h) {
      rotate_row<kInverse>(job.src + r * job.src_stride + h * job.d, job.dst + r * job.dst_stride + h * job.d, c2, s2,
                           job.d);
    }
  }
}

__attribute__((target_clones("avx512f", "avx2", "default"))) void rotate_rows(const RopeRows& job, bool inverse,
                                                                              std::int64_t r0, std::int64_t r1) {
  if (inverse) {
    rotate_rows_impl<true>(job, r0, r1);
  } else {
    rotate_rows_impl<false>(job, r0, r1);
  }
}

/// Rows handed out in fixed blocks (rows are independent: any split gives the same bits).
void rotate_all(const RopeRows& job, std::int64_t rows, bool inverse) {
  const std::int64_t per_row = job.heads * job.d;
  const int threads = threads_for(rows * per_row, kMinStreamPerThread);
  const std::int64_t block = std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(per_row, 1));
  const std::int64_t blocks = (rows + block - 1) / block;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (std::int64_t i = 0; i < blocks; ++i) rotate_rows(job, inverse, i * block, std::min(rows, (i + 1) * block));
}

}  // namespace

Tensor rope_apply(const Tensor& x, std::int64_t offset, float base, bool inverse) {
  const std::int64_t d = x.size(-1);
  const std::int64_t t = x.size(-2);
  const std::int64_t mats = t * d == 0 ? 0 : x.numel() / (t * d);
  Tensor out = Tensor::empty(x.shape());
  if (mats == 0) return out;
  if (offset + t <= kCachedPositions) {
    const auto table = rope_table(d, base, offset + t);
    const RopeRows job{x.data(), d, out.data(), d, t, offset, 1, d, table.get()};
    rotate_all(job, mats * t, inverse);
    return out;
  }
  RopeTable window;  // positions [offset, offset + t) only
  window.positions = t;
  fill_rope_rows(window, d, base, offset);
  const RopeRows job{x.data(), d, out.data(), d, t, 0, 1, d, &window};
  rotate_all(job, mats * t, inverse);
  return out;
}

void rope_packed(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride, std::int64_t batch,
                 std::int64_t t, std::int64_t width, std::int64_t d, float base, bool inverse) {
  if (batch * t * width == 0) return;
  RopeTable window;  // past the shared tables' positions: for this call
  std::shared_ptr<const RopeTable> table;
  if (t <= kCachedPositions) {
    table = rope_table(d, base, t);
  } else {
    window.positions = t;
    fill_rope_rows(window, d, base, 0);
  }
  const RopeRows job{src, src_stride, dst, dst_stride, t, 0, width / d, d, table ? table.get() : &window};
  rotate_all(job, batch * t, inverse);
}

}  // namespace riftco_transformer::cpu
