// write_loss_curve_svg: the shared layout as SVG elements.
#include <algorithm>
#include <cstdio>
#include <string>

#include "plot_layout.hpp"
#include "riftco_transformer/atomic_file.hpp"

namespace riftco_transformer {
namespace {

using plot_detail::Layout;

std::string escape(std::string_view text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default:
        if (static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n') out += c;  // XML forbids the rest
    }
  }
  return out;
}

std::string num(double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f", v);
  return buffer;
}

std::string colour(std::uint32_t rgb) {
  char buffer[8];
  std::snprintf(buffer, sizeof buffer, "#%06X", rgb);
  return buffer;
}

std::string line(double x0, double y0, double x1, double y1, const char* stroke) {
  return "<line x1=\"" + num(x0) + "\" y1=\"" + num(y0) + "\" x2=\"" + num(x1) + "\" y2=\"" + num(y1) +
         "\" stroke=\"" + stroke + "\"/>\n";
}

std::string text(double x, double y, const char* anchor, std::string_view s, int size = 11) {
  return "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" text-anchor=\"" + anchor + "\" font-size=\"" +
         std::to_string(size) + "\">" + escape(s) + "</text>\n";
}

std::string axes(const Layout& l) {
  std::string out;
  for (const double t : l.x.ticks) {
    out += line(l.px(t), l.top, l.px(t), l.bottom, "#E4E4E4");
    out += line(l.px(t), l.bottom, l.px(t), l.bottom + 4, "#303030");
    out += text(l.px(t), l.bottom + 16, "middle", plot_detail::tick_label(t, l.x));
  }
  for (const double t : l.y.ticks) {
    out += line(l.left, l.py(t), l.right, l.py(t), "#E4E4E4");
    out += line(l.left - 4, l.py(t), l.left, l.py(t), "#303030");
    out += text(l.left - 7, l.py(t) + 4, "end", plot_detail::tick_label(t, l.y));
  }
  out += "<rect x=\"" + num(l.left) + "\" y=\"" + num(l.top) + "\" width=\"" + num(l.right - l.left) +
         "\" height=\"" + num(l.bottom - l.top) + "\" fill=\"none\" stroke=\"#303030\"/>\n";
  return out;
}

std::string legend(const Layout& l, const std::vector<CurveSeries>& series) {
  if (series.empty()) return {};
  std::size_t longest = 0;
  for (const CurveSeries& s : series) longest = std::max(longest, s.label.size());
  const double width = 8 + 18 + 6 + 7.0 * static_cast<double>(longest) + 8;
  const double height = 6 + 14.0 * static_cast<double>(series.size()) + 2;
  const double x0 = l.right - 8 - width, y0 = l.top + 8;
  std::string out = "<rect x=\"" + num(x0) + "\" y=\"" + num(y0) + "\" width=\"" + num(width) + "\" height=\"" +
                    num(height) + "\" fill=\"white\" stroke=\"#303030\"/>\n";
  for (std::size_t i = 0; i < series.size(); ++i) {
    const double y = y0 + 13 + 14.0 * static_cast<double>(i);
    out += "<line x1=\"" + num(x0 + 8) + "\" y1=\"" + num(y - 4) + "\" x2=\"" + num(x0 + 26) + "\" y2=\"" +
           num(y - 4) + "\" stroke=\"" + colour(series[i].rgb) + "\" stroke-width=\"3\"/>\n";
    out += text(x0 + 32, y, "start", series[i].label);
  }
  return out;
}

}  // namespace

void write_loss_curve_svg(const std::filesystem::path& path, const std::vector<CurveSeries>& series,
                          const std::string& title) {
  const Layout l = plot_detail::make_layout(series);
  std::string svg = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
                    std::to_string(l.width) + "\" height=\"" + std::to_string(l.height) + "\" viewBox=\"0 0 " +
                    std::to_string(l.width) + " " + std::to_string(l.height) +
                    "\" font-family=\"monospace\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += text(l.width / 2.0, 26, "middle", title, 16);
  svg += axes(l);
  for (const CurveSeries& s : series) {
    for (const auto& run : plot_detail::finite_runs(s)) {
      svg += "<polyline fill=\"none\" stroke=\"" + colour(s.rgb) + "\" stroke-width=\"2\" points=\"";
      for (std::size_t i = 0; i < run.size(); ++i) {
        if (i > 0) svg += ' ';
        svg += num(l.px(run[i].first)) + "," + num(l.py(run[i].second));
      }
      svg += "\"/>\n";
      if (run.size() == 1) {  // a one-point polyline draws nothing: mark the point
        svg += "<circle cx=\"" + num(l.px(run[0].first)) + "\" cy=\"" + num(l.py(run[0].second)) +
               "\" r=\"2.5\" fill=\"" + colour(s.rgb) + "\"/>\n";
      }
    }
  }
  svg += legend(l, series);
  svg += "</svg>\n";
  write_file_atomically(path, svg);
}

}  // namespace riftco_transformer
