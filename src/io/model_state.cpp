// Model-level state files: DecoderOnlyTransformer parameters by stable name,
// plus the architecture (dimensions, norm epsilon) in the safetensors
// metadata. Execution policy (checkpointing, attention kind) is not stored.
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "riftco_transformer/model_state.hpp"
#include "safetensors_header.hpp"

namespace riftco_transformer {
namespace {

using detail::load_error;

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

std::string dimensions_json(const TransformerDimensions& dimensions) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  for (const DimensionField& field : kDimensionFields) json[field.name] = dimensions.*field.member;
  return json.dump();
}

/// Shortest text that parses back to the same float.
std::string float_string(float value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return {buffer, result.ptr};
}

/// The architecture recorded in a model-state file.
struct ModelStateInfo {
  TransformerDimensions dimensions;
  float norm_epsilon = 0.0F;
};

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

float parse_norm_epsilon(const std::filesystem::path& path, const std::string& text) {
  float value = 0.0F;
  const auto result = std::from_chars(text.data(), text.data() + text.size(), value);
  if (result.ec != std::errc() || result.ptr != text.data() + text.size() || !std::isfinite(value) || value <= 0.0F) {
    load_error(path, "metadata \"norm_epsilon\" '" + text + "' is not a positive finite number");
  }
  return value;
}

ModelStateInfo parse_model_metadata(const std::filesystem::path& path,
                                    const std::map<std::string, std::string>& metadata) {
  const std::string& format = required(path, metadata, "format");
  if (format != kModelStateFormat) {
    load_error(path, "format '" + format + "' is not '" + kModelStateFormat + "'");
  }
  const std::string& version = required(path, metadata, "schema_version");
  if (version != kModelStateSchemaVersion) {
    load_error(path, "schema_version '" + version + "' is not supported (this build reads '" +
                         kModelStateSchemaVersion + "')");
  }
  return {parse_dimensions(path, required(path, metadata, "dimensions")),
          parse_norm_epsilon(path, required(path, metadata, "norm_epsilon"))};
}

/// Validates everything against `model`, then sets every parameter. Nothing
/// is changed unless every check passed.
void apply_model_state(DecoderOnlyTransformer& model, const TensorFile& file, const std::filesystem::path& path) {
  const ModelStateInfo info = parse_model_metadata(path, file.metadata);
  if (info.dimensions != model.dimensions()) {
    load_error(path, "dimensions " + dimensions_json(info.dimensions) + " in the file differ from the model's " +
                         dimensions_json(model.dimensions()));
  }
  if (info.norm_epsilon != model.norm_epsilon()) {
    load_error(path, "norm_epsilon " + float_string(info.norm_epsilon) + " in the file differs from the model's " +
                         float_string(model.norm_epsilon()));
  }

  std::map<std::string, const Tensor*> unclaimed;
  for (const auto& [name, tensor] : file.tensors) unclaimed.emplace(name, &tensor);
  const std::vector<NamedParameter> parameters = model.parameters();
  std::vector<Tensor> values;  // one per parameter, on the parameter's backend
  values.reserve(parameters.size());
  for (const NamedParameter& parameter : parameters) {
    const auto it = unclaimed.find(parameter.name);
    if (it == unclaimed.end()) {
      load_error(path, "tensor '" + parameter.name + "' is missing (the model expects shape " +
                           shape_string(parameter.variable.shape()) + ")");
    }
    const Tensor& tensor = *it->second;
    if (tensor.shape() != parameter.variable.shape()) {
      load_error(path, "tensor '" + parameter.name + "' has shape " + shape_string(tensor.shape()) +
                           " in the file, the model expects " + shape_string(parameter.variable.shape()));
    }
    values.push_back(tensor.to(parameter.variable.backend()));
    unclaimed.erase(it);
  }
  if (!unclaimed.empty()) {
    std::string names;
    for (const auto& [name, tensor] : unclaimed) names += (names.empty() ? "'" : ", '") + name + "'";
    load_error(path, "the file has tensors the model does not: " + names);
  }

  for (std::size_t i = 0; i < parameters.size(); ++i) {
    Variable variable = parameters[i].variable;
    variable.set_value(values[i]);
  }
}

}  // namespace

void save_model_state(const DecoderOnlyTransformer& model, const std::filesystem::path& path) {
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const NamedParameter& parameter : model.parameters()) {
    tensors.emplace_back(parameter.name, parameter.variable.value());
  }
  const std::map<std::string, std::string> metadata = {
      {"format", kModelStateFormat},
      {"schema_version", kModelStateSchemaVersion},
      {"dimensions", dimensions_json(model.dimensions())},
      {"norm_epsilon", float_string(model.norm_epsilon())},
  };
  write_safetensors(path, tensors, metadata);
}

TransformerDimensions read_model_dimensions(const std::filesystem::path& path) {
  return parse_model_metadata(path, detail::read_safetensors_header(path).metadata).dimensions;
}

void load_model_state(DecoderOnlyTransformer& model, const std::filesystem::path& path) {
  apply_model_state(model, read_safetensors(path), path);
}

std::unique_ptr<DecoderOnlyTransformer> load_model(const std::filesystem::path& path,
                                                   FullSequenceAttentionKind attention,
                                                   ActivationCheckpointingKind activation_checkpointing) {
  const TensorFile file = read_safetensors(path);
  const ModelStateInfo info = parse_model_metadata(path, file.metadata);
  Random random(0);  // every parameter is overwritten below
  auto model = std::make_unique<DecoderOnlyTransformer>(info.dimensions, random, info.norm_epsilon, attention,
                                                        activation_checkpointing);
  apply_model_state(*model, file, path);
  return model;
}

}  // namespace riftco_transformer
