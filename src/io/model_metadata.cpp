// Architecture metadata shared by model-state and adapter-state files.
#include "model_metadata.hpp"

#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "json_read.hpp"
#include "safetensors_header.hpp"

namespace riftco_transformer::detail {
namespace {

struct DimensionField {
  const char* name;
  std::int64_t TransformerDimensions::*member;
};
constexpr DimensionField kDimensionFields[] = {
    {"vocab_size", &TransformerDimensions::vocab_size},
    {"context_length", &TransformerDimensions::context_length},
    {"model_width", &TransformerDimensions::model_width},
    {"heads", &TransformerDimensions::heads},
    {"layers", &TransformerDimensions::layers},
    {"feed_forward_width", &TransformerDimensions::feed_forward_width},
};

}  // namespace

std::string dimensions_json(const TransformerDimensions& dimensions) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  for (const DimensionField& field : kDimensionFields) json[field.name] = dimensions.*field.member;
  // Written only when they differ from the defaults, so files of ordinary
  // models stay byte-identical to those of builds without these fields.
  if (dimensions.kv_heads() != dimensions.heads) json["key_value_heads"] = dimensions.kv_heads();
  if (dimensions.rope_base != TransformerDimensions{}.rope_base) json["rope_base"] = dimensions.rope_base;
  if (dimensions.tie_embeddings) json["tie_embeddings"] = true;
  return json.dump();
}

std::string float_string(float value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return {buffer, result.ptr};
}

const std::string& required(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata,
                            const std::string& key) {
  const auto it = metadata.find(key);
  if (it == metadata.end()) load_error(path, "\"__metadata__\" has no \"" + key + "\"");
  return it->second;
}

TransformerDimensions parse_dimensions(const std::filesystem::path& path, const std::string& text) {
  const std::string where = "metadata \"dimensions\" " + quote(text) + ": ";
  TransformerDimensions dimensions;
  try {
    const Json json = parse_untrusted_json(text);
    if (!json.is_object()) load_error(path, where + "not a JSON object");
    for (const DimensionField& field : kDimensionFields) {
      dimensions.*field.member = json_integer(json, field.name, 1, std::numeric_limits<std::int64_t>::max());
    }
    std::size_t known = std::size(kDimensionFields);
    // Optional (older files lack them and load with the defaults).
    if (json.contains("key_value_heads")) {
      dimensions.key_value_heads = json_integer(json, "key_value_heads", 1, std::numeric_limits<std::int64_t>::max());
      ++known;
    }
    if (json.contains("rope_base")) {
      const double base = json_number(json, "rope_base");
      if (!is_valid_rope_base(base)) load_error(path, where + "\"rope_base\" must be a number > 1 that is a finite float");
      dimensions.rope_base = static_cast<float>(base);
      ++known;
    }
    if (json.contains("tie_embeddings")) {
      if (!json["tie_embeddings"].is_boolean()) load_error(path, where + "\"tie_embeddings\" must be true or false");
      dimensions.tie_embeddings = json["tie_embeddings"].get<bool>();
      ++known;
    }
    if (json.size() != known) load_error(path, where + "has unknown fields");
    dimensions.validate();
  } catch (const JsonReadError& e) {
    load_error(path, where + e.what());
  } catch (const ValueError& e) {
    load_error(path, where + e.what());
  }
  return dimensions;
}

std::string tokenizer_json(const TokenizerRecord& record) {
  nlohmann::ordered_json json = {{"path", record.path}, {"checksum", record.checksum}};
  return json.dump();
}

std::string tokenizer_record_problem(const TokenizerRecord& record) {
  const bool hex = record.checksum.size() == 16 &&
                   record.checksum.find_first_not_of("0123456789abcdef") == std::string::npos;
  if (!hex) return "checksum is not 16 lowercase hex digits";
  if (record.path.empty()) return "path is empty";
  return "";
}

TokenizerRecord parse_tokenizer_record(const std::filesystem::path& path, const std::string& text) {
  const std::string where = "metadata \"tokenizer\" " + quote(text) + ": ";
  TokenizerRecord record;
  try {
    const Json json = parse_untrusted_json(text);
    if (!json.is_object()) load_error(path, where + "not a JSON object");
    record.path = json_string(json, "path");
    record.checksum = json_string(json, "checksum");
    if (json.size() != 2) load_error(path, where + "has unknown fields");
  } catch (const JsonReadError& e) {
    load_error(path, where + e.what());
  }
  if (const std::string why = tokenizer_record_problem(record); !why.empty()) load_error(path, where + why);
  return record;
}

void check_finite(const std::filesystem::path& path, const TensorFile& file) {
  for (const auto& [name, tensor] : file.tensors) {
    const std::span<const float> values = tensor.values();
    std::int64_t bad = 0;
    std::size_t first = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (!std::isfinite(values[i])) {
        if (bad++ == 0) first = i;
      }
    }
    if (bad > 0) {
      load_error(path, "tensor '" + quote(name) + "' holds " + std::to_string(bad) +
                           (bad == 1 ? " value that is" : " values that are") + " not finite (first: " + std::to_string(values[first]) + " at element " +
                           std::to_string(first) + "); such weights give NaN outputs (allow_non_finite / "
                           "--allow-non-finite loads it anyway)");
    }
  }
}

}  // namespace riftco_transformer::detail
