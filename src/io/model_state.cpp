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
  if (result.ec != std::errc() || result.ptr != text.data() + text.size() || !is_valid_norm_epsilon(value)) {
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

/// The parameters' names and shapes, as check_tensor_layout expects them.
std::vector<std::pair<std::string, Shape>> parameter_layout(const DecoderOnlyTransformer& model) {
  std::vector<std::pair<std::string, Shape>> layout;
  for (const NamedParameter& p : model.parameters()) layout.emplace_back(p.name, p.variable.shape());
  return layout;
}

/// Everything a header can be refused for against `model` (format, schema,
/// dimensions, norm epsilon, every tensor's name and shape): checked before
/// any tensor data is read.
void check_header_against(const DecoderOnlyTransformer& model, const detail::SafetensorsHeader& header,
                          const std::filesystem::path& path) {
  const ModelStateInfo info = parse_model_metadata(path, header.metadata);
  if (info.dimensions != model.dimensions()) {
    load_error(path, "dimensions " + dimensions_json(info.dimensions) + " in the file differ from the model's " +
                         dimensions_json(model.dimensions()));
  }
  if (info.norm_epsilon != model.norm_epsilon()) {
    load_error(path, "norm_epsilon " + float_string(info.norm_epsilon) + " in the file differs from the model's " +
                         float_string(model.norm_epsilon()));
  }
  detail::check_tensor_layout(path, detail::tensor_layout(header), parameter_layout(model), "the model");
}

/// Sets every parameter from a file whose header passed check_header_against
/// and whose values passed the finite check when required. Nothing is
/// changed unless every check passed.
void apply_model_state(DecoderOnlyTransformer& model, const TensorFile& file) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, tensor] : file.tensors) by_name.emplace(name, &tensor);
  const std::vector<NamedParameter> parameters = model.parameters();
  std::vector<Tensor> values;  // one per parameter, on the parameter's backend
  values.reserve(parameters.size());
  for (const NamedParameter& parameter : parameters) {
    values.push_back(by_name.at(parameter.name)->to(parameter.variable.backend()));
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
  apply_model_state_values(model, read_model_state_for(model, path, options));
}

ModelStateValues read_model_state_for(const DecoderOnlyTransformer& model, const std::filesystem::path& path,
                                      const LoadOptions& options) {
  ModelStateValues values;
  values.path_ = path;
  values.file_ = detail::read_safetensors_checked(
      path, [&](const detail::SafetensorsHeader& header) { check_header_against(model, header, path); });
  if (!options.allow_non_finite) detail::check_finite(path, values.file_);
  return values;
}

void apply_model_state_values(DecoderOnlyTransformer& model, const ModelStateValues& values) {
  const ModelStateInfo info = parse_model_metadata(values.path_, values.file_.metadata);
  if (info.dimensions != model.dimensions() || info.norm_epsilon != model.norm_epsilon()) {
    load_error(values.path_, "the model's dimensions or norm epsilon changed since the file was read");
  }
  std::vector<std::pair<std::string, Shape>> layout;
  for (const auto& [name, tensor] : values.file_.tensors) layout.emplace_back(name, tensor.shape());
  detail::check_tensor_layout(values.path_, layout, parameter_layout(model), "the model");
  apply_model_state(model, values.file_);
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
  ModelStateInfo info;
  std::vector<std::pair<std::string, Shape>> layout;
  const TensorFile file = detail::read_safetensors_checked(path, [&](const detail::SafetensorsHeader& header) {
    info = parse_model_metadata(path, header.metadata);
    layout = detail::tensor_layout(header);
    // Before reading the data or allocating a model of the file's
    // dimensions, check the file holds that many values: a bad header (or a
    // sparse file) cannot ask for gigabytes.
    std::int64_t values = 0;
    for (const detail::SafetensorsEntry& entry : header.entries) values += (entry.end - entry.begin) / 4;
    if (values != info.dimensions.parameter_count()) {
      load_error(path, "the file holds " + std::to_string(values) + " values but its dimensions " +
                           dimensions_json(info.dimensions) + " need " +
                           std::to_string(info.dimensions.parameter_count()));
    }
  });
  Random random(0);  // every parameter is overwritten below
  auto model = std::make_unique<DecoderOnlyTransformer>(info.dimensions, random, info.norm_epsilon, attention,
                                                        activation_checkpointing);
  detail::check_tensor_layout(path, layout, parameter_layout(*model), "the model");
  if (!options.allow_non_finite) detail::check_finite(path, file);
  apply_model_state(*model, file);
  return model;
}

}  // namespace riftco_transformer
