#pragma once
// A minimal PNG writer: 8-bit RGB, filter 0 on every row, zlib stream of
// stored (uncompressed) deflate blocks. Large but valid and dependency-free.
#include <cstdint>
#include <string>
#include <vector>

namespace riftco_transformer::plot_detail {

/// rgb: (height, width, 3) bytes, row-major. Returns the whole file.
std::string encode_png_rgb(int width, int height, const std::vector<std::uint8_t>& rgb);

std::uint32_t crc32(const std::uint8_t* data, std::size_t size, std::uint32_t crc = 0);
std::uint32_t adler32(const std::uint8_t* data, std::size_t size);

}  // namespace riftco_transformer::plot_detail
