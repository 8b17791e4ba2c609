#include "hash.hpp"

#include <bit>
#include <cstdio>
#include <cstring>

namespace riftco_transformer::detail {
namespace {

constexpr std::uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr std::uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;

/// MurmurHash3's 64-bit finalizer: full avalanche.
std::uint64_t mix(std::uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDULL;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ULL;
  h ^= h >> 33;
  return h;
}

}  // namespace

void Hash64::round(std::uint64_t word) {
  state_ = std::rotl(state_ ^ (word * kPrime2), 31) * kPrime1;
}

void Hash64::update(const void* data, std::size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  length_ += bytes;
  while (bytes > 0 && tail_size_ > 0 && tail_size_ < 8) {
    tail_[tail_size_++] = *p++;
    --bytes;
    if (tail_size_ == 8) {
      std::uint64_t word = 0;
      std::memcpy(&word, tail_, 8);
      round(word);
      tail_size_ = 0;
    }
  }
  while (bytes >= 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, p, 8);  // little-endian hosts only (as the file formats)
    round(word);
    p += 8;
    bytes -= 8;
  }
  while (bytes > 0) {
    tail_[tail_size_++] = *p++;
    --bytes;
  }
}

void Hash64::update(std::string_view name, const Tensor& tensor) {
  update(name);
  update(std::string_view("\0", 1));
  const std::uint64_t rank = tensor.shape().size();
  update(&rank, sizeof rank);
  for (const std::int64_t d : tensor.shape()) update(&d, sizeof d);
  const Tensor host = tensor.to(Backend::Cpu);  // a cuda tensor's bytes are hashed on the host (cpu: no copy)
  const std::span<const float> values = host.values();
  update(values.data(), values.size_bytes());
}

std::uint64_t Hash64::digest() const {
  std::uint64_t h = state_;
  std::uint64_t word = 0;
  std::memcpy(&word, tail_, tail_size_);
  h = std::rotl(h ^ (word * kPrime2), 31) * kPrime1;
  return mix(h ^ length_);
}

std::string Hash64::hex() const {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(digest()));
  return text;
}

}  // namespace riftco_transformer::detail
