#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "kernels.hpp"

namespace riftco_transformer::cpu {
namespace {

/// cos and sin of position · base^(-2i/D) for positions [0, positions) and
/// i < D/2, computed in double and rounded once (identical for forward,
/// replay and decode).
struct RopeTable {
  std::int64_t positions = 0;
  std::vector<float> cos;  // (positions, D/2)
  std::vector<float> sin;  // (positions, D/2)
};

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
  const std::int64_t half = d / 2;
  table->positions = std::max<std::int64_t>(positions, slot ? 2 * slot->positions : 0);
  table->cos.resize(static_cast<std::size_t>(table->positions * half));
  table->sin.resize(static_cast<std::size_t>(table->positions * half));
  for (std::int64_t i = 0; i < half; ++i) {
    const double theta = std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / static_cast<double>(d));
    for (std::int64_t p = 0; p < table->positions; ++p) {
      const double angle = static_cast<double>(p) * theta;
      table->cos[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::cos(angle));
      table->sin[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::sin(angle));
    }
  }
  slot = table;
  return slot;
}

/// Rotates the pairs of one head row of D floats at absolute position p.
inline void rotate_row(const float* x, float* out, const float* cr, const float* sr, std::int64_t half,
                       bool inverse) {
  for (std::int64_t i = 0; i < half; ++i) {
    const float a = x[2 * i];
    const float b = x[2 * i + 1];
    const float c = cr[i];
    const float s = inverse ? -sr[i] : sr[i];
    out[2 * i] = a * c - b * s;
    out[2 * i + 1] = a * s + b * c;
  }
}

}  // namespace

Tensor rope_apply(const Tensor& x, std::int64_t offset, float base, bool inverse) {
  const std::int64_t d = x.size(-1);
  const std::int64_t t = x.size(-2);
  const std::int64_t half = d / 2;
  const std::int64_t mats = t * d == 0 ? 0 : x.numel() / (t * d);
  Tensor out = Tensor::empty(x.shape());
  if (mats == 0) return out;
  const auto table = rope_table(d, base, offset + t);
  const float* px = x.data();
  float* po = out.data();
#pragma omp parallel for schedule(static) if (x.numel() > 16384)
  for (std::int64_t m = 0; m < mats; ++m) {
    for (std::int64_t p = 0; p < t; ++p) {
      const std::size_t row = static_cast<std::size_t>((offset + p) * half);
      rotate_row(px + (m * t + p) * d, po + (m * t + p) * d, table->cos.data() + row, table->sin.data() + row, half,
                 inverse);
    }
  }
  return out;
}

void rope_packed(const float* src, std::int64_t src_stride, float* dst, std::int64_t dst_stride, std::int64_t batch,
                 std::int64_t t, std::int64_t width, std::int64_t d, float base, bool inverse) {
  const std::int64_t half = d / 2;
  const std::int64_t heads = width / d;
  if (batch * t * width == 0) return;
  const auto table = rope_table(d, base, t);
#pragma omp parallel for schedule(dynamic, 16) if (batch * t * width > 16384)
  for (std::int64_t r = 0; r < batch * t; ++r) {
    const std::int64_t p = r % t;
    const float* cr = table->cos.data() + p * half;
    const float* sr = table->sin.data() + p * half;
    for (std::int64_t h = 0; h < heads; ++h) {
      rotate_row(src + r * src_stride + h * d, dst + r * dst_stride + h * d, cr, sr, half, inverse);
    }
  }
}

}  // namespace riftco_transformer::cpu
