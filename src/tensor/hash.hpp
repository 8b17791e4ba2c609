#pragma once
// A 64-bit streaming hash for integrity checks (checkpoint checksums, model
// fingerprints, the data-parallel ranks' parameter checksum): not
// cryptographic, but every bit of the input moves about half of the output
// bits, so a flipped bit or an edited number is caught with probability
// 1 - 2^-64. Eight bytes per round (several GB/s). In the tensor layer (it
// knows Tensor only), so every layer above may use it.
#include <cstdint>
#include <string>
#include <string_view>

#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer::detail {

class Hash64 {
 public:
  void update(const void* data, std::size_t bytes);
  void update(std::string_view text) { update(text.data(), text.size()); }
  /// Name, shape and bytes of a tensor (a cuda tensor is copied to the host first).
  void update(std::string_view name, const Tensor& tensor);
  std::uint64_t digest() const;
  /// digest() as 16 lowercase hex digits.
  std::string hex() const;

 private:
  void round(std::uint64_t word);
  std::uint64_t state_ = 0x243F6A8885A308D3ULL;  // digits of pi
  std::uint64_t length_ = 0;
  unsigned char tail_[8] = {};
  std::size_t tail_size_ = 0;
};

}  // namespace riftco_transformer::detail
