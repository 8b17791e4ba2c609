#pragma once
// SentencePiece checks a model's normalization rules (its precompiled
// character maps) only for their outer size: a map whose double-array trie
// points outside itself loads, then reads out of bounds at the first encode
// or decode (a crash). charsmap_problem() walks every trie a model carries the
// way SentencePiece's lookups do and says what would read out of bounds.
#include <string>
#include <string_view>

namespace riftco_transformer::detail {

/// "" when every precompiled character map in the serialized ModelProto (the
/// normalizer's and the denormalizer's, every occurrence) is safe to look up
/// with any input; otherwise what is wrong and where (also when the bytes are
/// not a protocol buffer SentencePiece's parser would read). Called before
/// SentencePiece loads the bytes: its Load already normalizes with the maps.
std::string charsmap_problem(std::string_view model_bytes);

}  // namespace riftco_transformer::detail
