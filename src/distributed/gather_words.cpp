// all_gather_words: 64-bit words as 16-bit pieces in floats (gather_words.hpp).
#include "gather_words.hpp"

namespace riftco_transformer::distributed_detail {

std::vector<std::uint64_t> all_gather_words(Communicator& comm, std::span<const std::uint64_t> words) {
  constexpr std::size_t kPieces = 4;  // 16 bits each: exact as floats
  std::vector<float> pieces(kPieces * words.size());
  for (std::size_t w = 0; w < words.size(); ++w) {
    for (std::size_t i = 0; i < kPieces; ++i) pieces[kPieces * w + i] = static_cast<float>((words[w] >> (16 * i)) & 0xFFFFU);
  }
  std::vector<float> all(pieces.size() * static_cast<std::size_t>(comm.world_size()));
  comm.all_gather(std::span<const float>(pieces), std::span<float>(all));
  std::vector<std::uint64_t> out(all.size() / kPieces, 0);
  for (std::size_t w = 0; w < out.size(); ++w) {
    for (std::size_t i = 0; i < kPieces; ++i) out[w] |= static_cast<std::uint64_t>(all[kPieces * w + i]) << (16 * i);
  }
  return out;
}

}  // namespace riftco_transformer::distributed_detail
