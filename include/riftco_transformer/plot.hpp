#pragma once
// Loss curves as files a person can open: SVG (any browser shows it, text in
// the viewer's fonts, scales without blurring). The 640x400 layout: title,
// axes with "nice" ticks, light grid lines, one line per series, a legend in
// the top-right corner. PNGs are drawn by matplotlib from metrics.jsonl
// (`python -m riftco.plot RUN_DIR`, docs/python.md): no hand-written image
// encoder or bitmap font here.
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

/// The plot as SVG text: one <polyline> per run of finite points of each
/// series (one per series when every point is finite). Written to a
/// temporary file in the same folder, then renamed over `path`. ValueError
/// for an rgb above 0xFFFFFF; ModelStateError "[save] <path>: ..."
/// (atomic_file.hpp) when the file cannot be written.
void write_loss_curve_svg(const std::filesystem::path& path, const std::vector<CurveSeries>& series,
                          const std::string& title);

}  // namespace riftco_transformer
