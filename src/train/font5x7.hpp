#pragma once
// A 5x7 bitmap font for plot text (ASCII letters, digits, punctuation).
#include <array>
#include <cstdint>
#include <string_view>

namespace riftco_transformer::plot_detail {

/// Seven rows, top first; bit 4 is the leftmost of the five columns. Any
/// character without a glyph gives the '?' glyph.
std::array<std::uint8_t, 7> glyph(char c);

/// The characters text draws as (UTF-8 continuation bytes are dropped, so a
/// non-ASCII code point becomes one '?').
std::string_view::size_type glyph_count(std::string_view text);

}  // namespace riftco_transformer::plot_detail
