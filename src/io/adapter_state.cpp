#include "riftco_transformer/adapter_state.hpp"

#include <charconv>

#include "json_read.hpp"
#include "model_metadata.hpp"
#include "safetensors_header.hpp"

namespace riftco_transformer {
namespace {

using detail::load_error;
using detail::required;

LoraConfig parse_config(const std::filesystem::path& path, const std::map<std::string, std::string>& metadata,
                        const TransformerDimensions& dimensions) {
  LoraConfig config;
  const std::string& rank = required(path, metadata, "rank");
  const auto r = std::from_chars(rank.data(), rank.data() + rank.size(), config.rank);
  if (r.ec != std::errc() || r.ptr != rank.data() + rank.size()) load_error(path, "metadata \"rank\" '" + rank + "' is not an integer");
  const std::string& alpha = required(path, metadata, "alpha");
  const auto a = std::from_chars(alpha.data(), alpha.data() + alpha.size(), config.alpha);
  if (a.ec != std::errc() || a.ptr != alpha.data() + alpha.size()) load_error(path, "metadata \"alpha\" '" + alpha + "' is not a number");
  try {
    config.targets = parse_lora_targets(required(path, metadata, "targets"), "load");
    config.validate_for(dimensions, "load");
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
  const LoraConfig c = model.lora_config();
  // Three reads: another thread replacing the adapters between them would
  // pair these tensors with another config (a file that never loads).
  const auto layout = model.lora_parameter_layout(c);
  bool same = layout.size() == tensors.size();
  for (std::size_t i = 0; same && i < layout.size(); ++i) {
    same = layout[i].first == tensors[i].first && layout[i].second == tensors[i].second.shape();
  }
  if (!same) {
    throw ValueError("[save_adapter_state] the model's adapters changed while they were saved (another thread "
                     "replaced them?): nothing was written; save again");
  }
  write_safetensors(path, tensors,
                    {{"format", kAdapterStateFormat},
                     {"schema_version", "2"},
                     {"base_fingerprint", model_fingerprint(model)},
                     {"rank", std::to_string(c.rank)},
                     {"alpha", detail::float_string(c.alpha)},
                     {"targets", lora_targets_string(c.targets)},
                     {"dimensions", detail::dimensions_json(model.dimensions())}});
}

namespace {

/// value_version() of every base parameter, in parameters() order.
std::vector<std::uint64_t> base_versions(const DecoderOnlyTransformer& model) {
  std::vector<std::uint64_t> versions;
  for (const NamedParameter& p : model.parameters()) versions.push_back(p.variable.value_version());
  return versions;
}

void check_fingerprint(const DecoderOnlyTransformer& model, const std::filesystem::path& path,
                       const std::string& recorded) {
  const std::string actual = model_fingerprint(model);
  if (recorded != actual) {
    load_error(path, "the adapters were trained on a base model with fingerprint " + detail::quote(recorded) +
                         ", this model's weights have fingerprint " + actual +
                         " (another base of the same dimensions); allow_base_mismatch / --allow-base-mismatch "
                         "applies them anyway");
  }
}

void refuse_existing_adapters(const DecoderOnlyTransformer& model) {
  if (model.has_lora()) {
    throw ValueError("[load_adapter_state] the model already has LoRA adapters; remove_lora() first");
  }
}

}  // namespace

void load_adapter_state(DecoderOnlyTransformer& model, const std::filesystem::path& path, const LoadOptions& options) {
  apply_adapter_state_values(model, read_adapter_state_for(model, path, options));
}

AdapterStateValues read_adapter_state_for(const DecoderOnlyTransformer& model, const std::filesystem::path& path,
                                          const LoadOptions& options) {
  refuse_existing_adapters(model);
  AdapterStateValues out;
  out.path_ = path;
  std::vector<std::pair<std::string, Shape>> layout;
  // Every check the header allows runs before any tensor data is read.
  const TensorFile file = detail::read_safetensors_checked(path, [&](const detail::SafetensorsHeader& header) {
    const std::map<std::string, std::string>& metadata = header.metadata;
    const std::string& format = required(path, metadata, "format");
    if (format != kAdapterStateFormat) {
      load_error(path, "format '" + format + "' is not '" + kAdapterStateFormat + "' (is this a model-state file?)");
    }
    const std::string& schema = required(path, metadata, "schema_version");
    if (schema != "1" && schema != "2") {
      load_error(path, "schema_version '" + detail::quote(schema) + "' is not supported (this build reads 1 and 2)");
    }
    out.dimensions_ = detail::parse_dimensions(path, required(path, metadata, "dimensions"));
    if (out.dimensions_ != model.dimensions()) {
      load_error(path, "the adapters were trained for a base model with dimensions " +
                           detail::dimensions_json(out.dimensions_) + ", this model has " +
                           detail::dimensions_json(model.dimensions()));
    }
    out.config_ = parse_config(path, metadata, out.dimensions_);
    if (schema == "2" && !options.allow_base_mismatch) {  // schema 1 files carry no fingerprint
      out.base_versions_ = base_versions(model);
      out.fingerprint_ = required(path, metadata, "base_fingerprint");
      check_fingerprint(model, path, out.fingerprint_);
    }
    layout = model.lora_parameter_layout(out.config_);
    detail::check_tensor_layout(path, detail::tensor_layout(header), layout, "the model's adapters");
  });
  if (!options.allow_non_finite) detail::check_finite(path, file);
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, tensor] : file.tensors) by_name.emplace(name, &tensor);
  for (const auto& [name, shape] : layout) out.values_.emplace_back(name, *by_name.at(name));
  return out;
}

void apply_adapter_state_values(DecoderOnlyTransformer& model, const AdapterStateValues& values) {
  refuse_existing_adapters(model);
  const std::filesystem::path& path = values.path_;
  if (values.dimensions_ != model.dimensions()) {
    load_error(path, "the model's dimensions changed since the adapters were read");
  }
  const auto layout = model.lora_parameter_layout(values.config_);
  bool same = layout.size() == values.values_.size();
  for (std::size_t i = 0; same && i < layout.size(); ++i) {
    same = layout[i].first == values.values_[i].first && layout[i].second == values.values_[i].second.shape();
  }
  if (!same) load_error(path, "the model's adapter layout changed since the adapters were read");
  if (!values.fingerprint_.empty() && base_versions(model) != values.base_versions_) {
    check_fingerprint(model, path, values.fingerprint_);  // weights set since the read: check them again
  }
  // Everything validated: add the adapters and set their values.
  Random unused(0);
  model.add_lora(values.config_, unused);
  std::vector<NamedParameter> adapters = model.lora_parameters();
  for (std::size_t i = 0; i < adapters.size(); ++i) adapters[i].variable.set_value(values.values_[i].second);
}

}  // namespace riftco_transformer
