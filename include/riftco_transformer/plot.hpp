#pragma once
// Loss curves as files a person can open: PNG (own encoder, no dependency)
// and SVG. Both draw the same 640x400 layout: title, axes with "nice" ticks,
// light grid lines, one line per series, a legend in the top-right corner.
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace riftco_transformer {

struct CurveSeries {
  std::string label;
  /// (x, y) in drawing order, typically (step, loss). Non-finite points are
  /// skipped and break the line.
  std::vector<std::pair<double, double>> points;
  /// 0xRRGGBB.
  std::uint32_t rgb = 0x1F77B4;
};

/// 640x400 8-bit RGB PNG (stored deflate blocks). The text uses a built-in
/// 5x7 bitmap font (ASCII letters, digits and common punctuation; any other
/// character is drawn as '?'). Written to a temporary file in the same
/// folder, then renamed over `path`. ValueError for an rgb above 0xFFFFFF;
/// ModelStateError "[save] <path>: ..." (atomic_file.hpp) when the file cannot be written.
void write_loss_curve_png(const std::filesystem::path& path, const std::vector<CurveSeries>& series,
                          const std::string& title);

/// The same plot as SVG text: one <polyline> per run of finite points of
/// each series (one per series when every point is finite). Same errors.
void write_loss_curve_svg(const std::filesystem::path& path, const std::vector<CurveSeries>& series,
                          const std::string& title);

}  // namespace riftco_transformer
