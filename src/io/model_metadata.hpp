#pragma once
// Architecture metadata shared by model-state and adapter-state files.
#include <filesystem>
#include <map>
#include <string>

#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/transformer.hpp"

namespace riftco_transformer::detail {

/// {"vocab_size": .., "context_length": .., ...} in a fixed key order.
std::string dimensions_json(const TransformerDimensions& dimensions);
/// Shortest text that parses back to the same float.
std::string float_string(float value);
/// metadata[key] or a "[load] <path>: ..." ModelStateError.
const std::string& required(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata,
                            const std::string& key);
/// Parses and validates dimensions_json() text.
TransformerDimensions parse_dimensions(const std::filesystem::path& path, const std::string& text);
/// {"path": .., "checksum": ..} of a TokenizerRecord.
std::string tokenizer_json(const TokenizerRecord& record);
/// Why `record` could not be read back ("" when it can): the checksum is 16
/// lowercase hex digits, the path is not empty.
std::string tokenizer_record_problem(const TokenizerRecord& record);
/// Parses and validates tokenizer_json() text (tokenizer_record_problem).
TokenizerRecord parse_tokenizer_record(const std::filesystem::path& path, const std::string& text);
/// "[load] <path>: tensor 'x' holds N values that are not finite (first: nan at element i)" for the
/// first tensor of `file` holding NaN or infinity.
void check_finite(const std::filesystem::path& path, const TensorFile& file);

}  // namespace riftco_transformer::detail
