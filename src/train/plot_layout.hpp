#pragma once
// Geometry of the SVG loss-curve writer: axes with nice ticks, pixel mapping.
#include <string>
#include <vector>

#include "riftco_transformer/plot.hpp"

namespace riftco_transformer::plot_detail {

struct Axis {
  double lo = 0.0;             // first tick
  double hi = 1.0;             // last tick
  std::vector<double> ticks;   // lo, lo + step, ..., hi
  int decimals = 0;            // digits after the point in tick labels
};

struct Layout {
  int width = 640;
  int height = 400;
  // Plot area in pixels: [left, right] x [top, bottom], y grows downwards.
  int left = 72;
  int right = 624;
  int top = 40;
  int bottom = 356;
  Axis x;
  Axis y;

  double px(double value) const { return left + (value - x.lo) / (x.hi - x.lo) * (right - left); }
  double py(double value) const { return bottom - (value - y.lo) / (y.hi - y.lo) * (bottom - top); }
};

/// Checks the colours (ValueError "[plot] ...") and fits both axes around
/// every finite point (a unit range when there is none).
Layout make_layout(const std::vector<CurveSeries>& series);

/// "0.25", "1200", "-3"; never "-0".
std::string tick_label(double value, const Axis& axis);

/// Runs of consecutive finite points of one series (the pieces of its line).
std::vector<std::vector<std::pair<double, double>>> finite_runs(const CurveSeries& series);

}  // namespace riftco_transformer::plot_detail
