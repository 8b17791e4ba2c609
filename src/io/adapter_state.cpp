#include "riftco_transformer/adapter_state.hpp"

#include <charconv>

#include "model_metadata.hpp"
#include "safetensors_header.hpp"

namespace riftco_transformer {
namespace {

using detail::load_error;
using detail::required;

LoraConfig parse_config(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata) {
  LoraConfig config;
  const std::string& rank = required(path, metadata, "rank");
  const auto r = std::from_chars(rank.data(), rank.data() + rank.size(), config.rank);
  if (r.ec != std::errc() || r.ptr != rank.data() + rank.size()) load_error(path, "metadata \"rank\" '" + rank + "' is not an integer");
  const std::string& alpha = required(path, metadata, "alpha");
  const auto a = std::from_chars(alpha.data(), alpha.data() + alpha.size(), config.alpha);
  if (a.ec != std::errc() || a.ptr != alpha.data() + alpha.size()) load_error(path, "metadata \"alpha\" '" + alpha + "' is not a number");
  try {
    config.targets = parse_lora_targets(required(path, metadata, "targets"), "load");
    config.validate();
  } catch (const ValueError& e) {
    load_error(path, std::string("adapter metadata: ") + e.what());
  }
  return config;
}

}  // namespace

void save_adapter_state(const DecoderOnlyTransformer& model, const std::filesystem::path& path) {
  if (!model.has_lora()) throw ValueError("[save_adapter_state] the model has no LoRA adapters to save");
  model.validate_parameters();
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const NamedParameter& p : model.lora_parameters()) tensors.emplace_back(p.name, p.variable.value());
  const LoraConfig& c = model.lora_config();
  write_safetensors(path, tensors,
                    {{"format", kAdapterStateFormat},
                     {"schema_version", "1"},
                     {"rank", std::to_string(c.rank)},
                     {"alpha", detail::float_string(c.alpha)},
                     {"targets", lora_targets_string(c.targets)},
                     {"dimensions", detail::dimensions_json(model.dimensions())}});
}

void load_adapter_state(DecoderOnlyTransformer& model, const std::filesystem::path& path) {
  if (model.has_lora()) {
    throw ValueError("[load_adapter_state] the model already has LoRA adapters; remove_lora() first");
  }
  const TensorFile file = read_safetensors(path);
  const std::string& format = required(path, file.metadata, "format");
  if (format != kAdapterStateFormat) {
    load_error(path, "format '" + format + "' is not '" + kAdapterStateFormat + "' (is this a model-state file?)");
  }
  if (required(path, file.metadata, "schema_version") != "1") load_error(path, "unsupported schema_version");
  const TransformerDimensions dims = detail::parse_dimensions(path, required(path, file.metadata, "dimensions"));
  if (dims != model.dimensions()) {
    load_error(path, "the adapters were trained for a base model with dimensions " + detail::dimensions_json(dims) +
                         ", this model has " + detail::dimensions_json(model.dimensions()));
  }
  const LoraConfig config = parse_config(path, file.metadata);
  std::map<std::string, const Tensor*> unclaimed;
  for (const auto& [name, tensor] : file.tensors) unclaimed.emplace(name, &tensor);
  std::vector<Tensor> values;
  for (const auto& [name, shape] : model.lora_parameter_layout(config)) {
    const auto it = unclaimed.find(name);
    if (it == unclaimed.end()) load_error(path, "adapter tensor '" + name + "' is missing");
    if (it->second->shape() != shape) {
      load_error(path, "adapter tensor '" + name + "' has shape " + shape_string(it->second->shape()) +
                           ", the model expects " + shape_string(shape));
    }
    values.push_back(*it->second);
    unclaimed.erase(it);
  }
  if (!unclaimed.empty()) {
    load_error(path, "the file has tensors that are not adapters: '" + unclaimed.begin()->first + "'");
  }
  // Everything validated: add the adapters and set their values.
  Random unused(0);
  model.add_lora(config, unused);
  std::vector<NamedParameter> adapters = model.lora_parameters();
  for (std::size_t i = 0; i < adapters.size(); ++i) adapters[i].variable.set_value(values[i]);
}

}  // namespace riftco_transformer
