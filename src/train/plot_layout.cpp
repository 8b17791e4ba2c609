// Axis ranges, "nice" ticks and tick labels for the loss-curve writers.
#include "plot_layout.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "riftco_transformer/errors.hpp"

namespace riftco_transformer::plot_detail {
namespace {

// 1, 2 or 5 times a power of ten, at least `raw`.
double nice_step(double raw) {
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= raw * (1.0 - 1e-9)) return m * power;
  }
  return 10.0 * power;
}

Axis make_axis(double lo, double hi) {
  if (!(lo <= hi)) {  // no finite points
    lo = 0.0;
    hi = 1.0;
  }
  if (hi - lo <= std::abs(hi) * 1e-12) {  // a single value: widen around it
    const double pad = lo == 0.0 ? 0.5 : std::abs(lo) * 0.05;
    lo -= pad;
    hi += pad;
  }
  const double step = nice_step((hi - lo) / 5.0);
  Axis axis;
  axis.lo = std::floor(lo / step + 1e-9) * step;
  axis.hi = std::ceil(hi / step - 1e-9) * step;
  const auto count = static_cast<int>(std::lround((axis.hi - axis.lo) / step));
  for (int i = 0; i <= count; ++i) axis.ticks.push_back(axis.lo + i * step);
  axis.decimals = std::clamp(static_cast<int>(-std::floor(std::log10(step) + 1e-9)), 0, 8);
  return axis;
}

}  // namespace

Layout make_layout(const std::vector<CurveSeries>& series) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  double x_lo = inf, x_hi = -inf, y_lo = inf, y_hi = -inf;
  for (const CurveSeries& s : series) {
    if (s.rgb > 0xFFFFFFU) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "0x%X", s.rgb);
      throw ValueError("[plot] series '" + s.label + "': colour " + hex + " is not 0xRRGGBB");
    }
    for (const auto& [x, y] : s.points) {
      if (!std::isfinite(x) || !std::isfinite(y)) continue;
      x_lo = std::min(x_lo, x);
      x_hi = std::max(x_hi, x);
      y_lo = std::min(y_lo, y);
      y_hi = std::max(y_hi, y);
    }
  }
  Layout layout;
  layout.x = make_axis(x_lo, x_hi);
  layout.y = make_axis(y_lo, y_hi);
  return layout;
}

std::string tick_label(double value, const Axis& axis) {
  char buffer[64];
  if (std::abs(value) >= 1e7) {
    std::snprintf(buffer, sizeof buffer, "%.3g", value);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.*f", axis.decimals, value);
  }
  std::string text = buffer;
  if (text.find_first_not_of("-0.") == std::string::npos && text[0] == '-') text.erase(0, 1);  // "-0.0"
  return text;
}

std::vector<std::vector<std::pair<double, double>>> finite_runs(const CurveSeries& series) {
  std::vector<std::vector<std::pair<double, double>>> runs(1);
  for (const auto& point : series.points) {
    if (std::isfinite(point.first) && std::isfinite(point.second)) {
      runs.back().push_back(point);
    } else if (!runs.back().empty()) {
      runs.emplace_back();
    }
  }
  if (runs.back().empty()) runs.pop_back();
  return runs;
}

}  // namespace riftco_transformer::plot_detail
