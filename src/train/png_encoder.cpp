// PNG (RFC 2083) with a zlib (RFC 1950) stream of stored deflate (RFC 1951)
// blocks; CRC-32 per chunk, Adler-32 over the raw scanlines.
#include "png_encoder.hpp"

#include <algorithm>
#include <array>

namespace riftco_transformer::plot_detail {
namespace {

void put_u32_be(std::string& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>((v >> shift) & 0xFFU);
}

void put_chunk(std::string& out, const char type[4], const std::string& data) {
  put_u32_be(out, static_cast<std::uint32_t>(data.size()));
  std::string body(type, 4);
  body += data;
  out += body;
  put_u32_be(out, crc32(reinterpret_cast<const std::uint8_t*>(body.data()), body.size()));
}

}  // namespace

std::uint32_t crc32(const std::uint8_t* data, std::size_t size, std::uint32_t crc) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t n = 0; n < 256; ++n) {
      std::uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1U) ? 0xEDB88320U ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ data[i]) & 0xFFU] ^ (crc >> 8);
  return ~crc;
}

std::uint32_t adler32(const std::uint8_t* data, std::size_t size) {
  std::uint32_t a = 1, b = 0;
  for (std::size_t i = 0; i < size; ++i) {
    a = (a + data[i]) % 65521U;
    b = (b + a) % 65521U;
  }
  return (b << 16) | a;
}

std::string encode_png_rgb(int width, int height, const std::vector<std::uint8_t>& rgb) {
  const auto row_bytes = static_cast<std::size_t>(width) * 3;
  std::vector<std::uint8_t> raw;  // (height, 1 + width * 3): filter byte 0, then the row
  raw.reserve((row_bytes + 1) * static_cast<std::size_t>(height));
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);
    const auto row = rgb.begin() + static_cast<std::ptrdiff_t>(row_bytes * static_cast<std::size_t>(y));
    raw.insert(raw.end(), row, row + static_cast<std::ptrdiff_t>(row_bytes));
  }

  std::string zlib = {'\x78', '\x01'};  // deflate, 32 KiB window, no dictionary; 0x7801 % 31 == 0
  std::size_t pos = 0;
  do {
    const std::size_t len = std::min<std::size_t>(65535, raw.size() - pos);
    const bool final_block = pos + len == raw.size();
    zlib += static_cast<char>(final_block ? 1 : 0);  // BFINAL, BTYPE = 00 (stored)
    zlib += static_cast<char>(len & 0xFFU);
    zlib += static_cast<char>(len >> 8);
    zlib += static_cast<char>(~len & 0xFFU);
    zlib += static_cast<char>((~len >> 8) & 0xFFU);
    zlib.append(reinterpret_cast<const char*>(raw.data() + pos), len);
    pos += len;
  } while (pos < raw.size());
  put_u32_be(zlib, adler32(raw.data(), raw.size()));

  std::string ihdr;
  put_u32_be(ihdr, static_cast<std::uint32_t>(width));
  put_u32_be(ihdr, static_cast<std::uint32_t>(height));
  ihdr += std::string{'\x08', '\x02', '\x00', '\x00', '\x00'};  // 8-bit RGB, deflate, filter 0, no interlace

  std::string png = "\x89PNG\r\n\x1a\n";
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", zlib);
  put_chunk(png, "IEND", "");
  return png;
}

}  // namespace riftco_transformer::plot_detail
