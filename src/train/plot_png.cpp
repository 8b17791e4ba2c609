// write_loss_curve_png: rasterize the shared layout into an RGB canvas.
#include <algorithm>
#include <cmath>

#include "font5x7.hpp"
#include "plot_layout.hpp"
#include "riftco_transformer/atomic_file.hpp"
#include "png_encoder.hpp"

namespace riftco_transformer {
namespace {

using plot_detail::Layout;

constexpr std::uint32_t kBackground = 0xFFFFFF;
constexpr std::uint32_t kGrid = 0xE4E4E4;
constexpr std::uint32_t kInk = 0x303030;

class Canvas {
 public:
  Canvas(int width, int height) : width_(width), height_(height), rgb_(static_cast<std::size_t>(width * height) * 3) {
    fill_rect(0, 0, width, height, kBackground);
  }

  void set(int x, int y, std::uint32_t rgb) {
    if (x < clip_x0_ || y < clip_y0_ || x > clip_x1_ || y > clip_y1_) return;
    if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
    const auto i = (static_cast<std::size_t>(y) * static_cast<std::size_t>(width_) + static_cast<std::size_t>(x)) * 3;
    rgb_[i] = static_cast<std::uint8_t>(rgb >> 16);
    rgb_[i + 1] = static_cast<std::uint8_t>(rgb >> 8);
    rgb_[i + 2] = static_cast<std::uint8_t>(rgb);
  }
  void fill_rect(int x0, int y0, int w, int h, std::uint32_t rgb) {
    for (int y = y0; y < y0 + h; ++y)
      for (int x = x0; x < x0 + w; ++x) set(x, y, rgb);
  }
  void hline(int x0, int x1, int y, std::uint32_t rgb) { fill_rect(std::min(x0, x1), y, std::abs(x1 - x0) + 1, 1, rgb); }
  void vline(int x, int y0, int y1, std::uint32_t rgb) { fill_rect(x, std::min(y0, y1), 1, std::abs(y1 - y0) + 1, rgb); }

  // Bresenham, `thickness` pixels square pen.
  void line(int x0, int y0, int x1, int y1, std::uint32_t rgb, int thickness) {
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    for (;;) {
      fill_rect(x0 - thickness / 2, y0 - thickness / 2, thickness, thickness, rgb);
      if (x0 == x1 && y0 == y1) break;
      const int e2 = 2 * err;
      if (e2 >= dy) { err += dy; x0 += sx; }
      if (e2 <= dx) { err += dx; y0 += sy; }
    }
  }

  // Top-left corner at (x, y); each glyph cell is 6 x 8 pixels times scale.
  void text(int x, int y, std::string_view s, std::uint32_t rgb, int scale = 1) {
    for (const char c : s) {
      if ((static_cast<unsigned char>(c) & 0xC0) == 0x80) continue;  // UTF-8 continuation byte
      const auto rows = plot_detail::glyph(c);
      for (int r = 0; r < 7; ++r)
        for (int col = 0; col < 5; ++col)
          if ((rows[static_cast<std::size_t>(r)] >> (4 - col)) & 1U) fill_rect(x + col * scale, y + r * scale, scale, scale, rgb);
      x += 6 * scale;
    }
  }
  static int text_width(std::string_view s, int scale = 1) {
    return static_cast<int>(plot_detail::glyph_count(s)) * 6 * scale - scale;
  }

  void clip(int x0, int y0, int x1, int y1) { clip_x0_ = x0; clip_y0_ = y0; clip_x1_ = x1; clip_y1_ = y1; }
  void unclip() { clip(0, 0, width_ - 1, height_ - 1); }
  const std::vector<std::uint8_t>& pixels() const { return rgb_; }

 private:
  int width_, height_;
  std::vector<std::uint8_t> rgb_;  // (height, width, 3)
  int clip_x0_ = 0, clip_y0_ = 0, clip_x1_ = 1 << 30, clip_y1_ = 1 << 30;
};

int round_px(double v) { return static_cast<int>(std::lround(v)); }

void draw_axes(Canvas& c, const Layout& l) {
  for (const double t : l.x.ticks) {
    const int x = round_px(l.px(t));
    c.vline(x, l.top, l.bottom, kGrid);
    c.vline(x, l.bottom, l.bottom + 4, kInk);
    const std::string label = plot_detail::tick_label(t, l.x);
    const int w = Canvas::text_width(label);
    c.text(std::clamp(x - w / 2, 1, l.width - 1 - w), l.bottom + 8, label, kInk);  // centred, kept on the canvas
  }
  for (const double t : l.y.ticks) {
    const int y = round_px(l.py(t));
    c.hline(l.left, l.right, y, kGrid);
    c.hline(l.left - 4, l.left, y, kInk);
    const std::string label = plot_detail::tick_label(t, l.y);
    c.text(l.left - 7 - Canvas::text_width(label), y - 3, label, kInk);
  }
  c.hline(l.left, l.right, l.bottom, kInk);
  c.hline(l.left, l.right, l.top, kInk);
  c.vline(l.left, l.top, l.bottom, kInk);
  c.vline(l.right, l.top, l.bottom, kInk);
}

void draw_series(Canvas& c, const Layout& l, const CurveSeries& s) {
  c.clip(l.left + 1, l.top + 1, l.right - 1, l.bottom - 1);
  for (const auto& run : plot_detail::finite_runs(s)) {
    if (run.size() == 1) {
      c.fill_rect(round_px(l.px(run[0].first)) - 2, round_px(l.py(run[0].second)) - 2, 5, 5, s.rgb);
      continue;
    }
    for (std::size_t i = 1; i < run.size(); ++i) {
      c.line(round_px(l.px(run[i - 1].first)), round_px(l.py(run[i - 1].second)), round_px(l.px(run[i].first)),
             round_px(l.py(run[i].second)), s.rgb, 2);
    }
  }
  c.unclip();
}

void draw_legend(Canvas& c, const Layout& l, const std::vector<CurveSeries>& series) {
  if (series.empty()) return;
  int label_width = 0;
  for (const CurveSeries& s : series) label_width = std::max(label_width, Canvas::text_width(s.label));
  const int width = 8 + 18 + 6 + label_width + 8, height = 6 + 12 * static_cast<int>(series.size()) + 2;
  const int x0 = l.right - 8 - width, y0 = l.top + 8;
  c.fill_rect(x0, y0, width, height, kBackground);
  c.hline(x0, x0 + width - 1, y0, kInk);
  c.hline(x0, x0 + width - 1, y0 + height - 1, kInk);
  c.vline(x0, y0, y0 + height - 1, kInk);
  c.vline(x0 + width - 1, y0, y0 + height - 1, kInk);
  for (std::size_t i = 0; i < series.size(); ++i) {
    const int y = y0 + 6 + 12 * static_cast<int>(i);
    c.fill_rect(x0 + 8, y + 2, 18, 3, series[i].rgb);
    c.text(x0 + 8 + 18 + 6, y, series[i].label, kInk);
  }
}

}  // namespace

void write_loss_curve_png(const std::filesystem::path& path, const std::vector<CurveSeries>& series,
                          const std::string& title) {
  const Layout l = plot_detail::make_layout(series);
  Canvas c(l.width, l.height);
  draw_axes(c, l);
  for (const CurveSeries& s : series) draw_series(c, l, s);
  draw_legend(c, l, series);
  const int scale = Canvas::text_width(title, 2) <= l.width - 16 ? 2 : 1;  // long titles: small font
  c.text((l.width - Canvas::text_width(title, scale)) / 2, 12, title, kInk, scale);
  write_file_atomically(path, plot_detail::encode_png_rgb(l.width, l.height, c.pixels()));
}

}  // namespace riftco_transformer
