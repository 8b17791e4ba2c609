// Model-level state files: DecoderOnlyTransformer parameters by stable name,
// plus the architecture (dimensions, norm epsilon) in the safetensors
// metadata. Execution policy (checkpointing, attention kind) is not stored.
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "riftco_transformer/model_state.hpp"
#include "../tensor/hash.hpp"
#include "model_metadata.hpp"
#include "safetensors_header.hpp"

namespace riftco_transformer {
namespace {

using detail::dimensions_json;
using detail::float_string;
using detail::load_error;
using detail::parse_dimensions;
using detail::required;

/// The architecture recorded in a model-state file.
struct ModelStateInfo {
  TransformerDimensions dimensions;
  float norm_epsilon = 0.0F;
};

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
void apply_model_state(DecoderOnlyTransformer& model, const TensorFile& file, const std::filesystem::path& path,
                       const LoadOptions& options) {
  if (!options.allow_non_finite) detail::check_finite(path, file);
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

void save_model_state(const DecoderOnlyTransformer& model, const std::filesystem::path& path,
                      const TokenizerRecord& tokenizer) {
  model.validate_parameters();  // a file that could not be loaded back is never written
  if (!tokenizer.empty()) {
    if (const std::string why = detail::tokenizer_record_problem(tokenizer); !why.empty()) {
      throw ValueError("[save_model_state] tokenizer record {path '" + tokenizer.path + "', checksum '" +
                       tokenizer.checksum + "'}: " + why + " (it could not be loaded back)");
    }
  }
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const NamedParameter& parameter : model.parameters()) {
    tensors.emplace_back(parameter.name, parameter.variable.value());
  }
  std::map<std::string, std::string> metadata = {
      {"format", kModelStateFormat},
      {"schema_version", kModelStateSchemaVersion},
      {"dimensions", dimensions_json(model.dimensions())},
      {"norm_epsilon", float_string(model.norm_epsilon())},
  };
  if (!tokenizer.empty()) metadata["tokenizer"] = detail::tokenizer_json(tokenizer);
  write_safetensors(path, tensors, metadata);
}

TokenizerRecord read_model_tokenizer(const std::filesystem::path& path) {
  const std::map<std::string, std::string> metadata = detail::read_safetensors_header(path).metadata;
  (void)parse_model_metadata(path, metadata);
  const auto it = metadata.find("tokenizer");
  if (it == metadata.end()) return {};
  return detail::parse_tokenizer_record(path, it->second);
}

TransformerDimensions read_model_dimensions(const std::filesystem::path& path) {
  return parse_model_metadata(path, detail::read_safetensors_header(path).metadata).dimensions;
}

void load_model_state(DecoderOnlyTransformer& model, const std::filesystem::path& path, const LoadOptions& options) {
  apply_model_state(model, read_safetensors(path), path, options);
}

std::string model_fingerprint(const DecoderOnlyTransformer& model) {
  detail::Hash64 hash;
  for (const NamedParameter& p : model.parameters()) hash.update(p.name, p.variable.value());
  return hash.hex();
}

std::unique_ptr<DecoderOnlyTransformer> load_model(const std::filesystem::path& path,
                                                   FullSequenceAttentionKind attention,
                                                   ActivationCheckpointingKind activation_checkpointing,
                                                   const LoadOptions& options) {
  const TensorFile file = read_safetensors(path);
  const ModelStateInfo info = parse_model_metadata(path, file.metadata);
  // Before allocating a model of the file's dimensions, check the file holds
  // that many values: a bad header cannot ask for gigabytes.
  std::int64_t values = 0;
  for (const auto& [name, tensor] : file.tensors) values += tensor.numel();
  if (values != info.dimensions.parameter_count()) {
    load_error(path, "the file holds " + std::to_string(values) + " values but its dimensions " +
                         dimensions_json(info.dimensions) + " need " +
                         std::to_string(info.dimensions.parameter_count()));
  }
  Random random(0);  // every parameter is overwritten below
  auto model = std::make_unique<DecoderOnlyTransformer>(info.dimensions, random, info.norm_epsilon, attention,
                                                        activation_checkpointing);
  apply_model_state(*model, file, path, options);
  return model;
}

}  // namespace riftco_transformer
