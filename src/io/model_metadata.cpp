// Architecture metadata shared by model-state and adapter-state files.
#include "model_metadata.hpp"

#include <charconv>
#include <nlohmann/json.hpp>

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
  const std::string where = "metadata \"dimensions\" " + text + ": ";
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    load_error(path, where + "not valid JSON (" + e.what() + ")");
  }
  if (!json.is_object()) load_error(path, where + "not a JSON object");
  TransformerDimensions dimensions;
  for (const DimensionField& field : kDimensionFields) {
    if (!json.contains(field.name)) load_error(path, where + "missing \"" + field.name + "\"");
    const nlohmann::json& value = json.at(field.name);
    if (!value.is_number_integer()) load_error(path, where + "\"" + field.name + "\" is not an integer");
    dimensions.*field.member = value.get<std::int64_t>();
  }
  if (json.size() != std::size(kDimensionFields)) load_error(path, where + "has unknown fields");
  try {
    dimensions.validate();
  } catch (const ValueError& e) {
    load_error(path, where + e.what());
  }
  return dimensions;
}

}  // namespace riftco_transformer::detail
