#pragma once
// LoRA adapter files: the adapters alone (safetensors), validated like model
// state. Metadata: "format" riftco.lora_adapters, "schema_version" 2, "rank",
// "alpha", "targets" (comma list), "dimensions" of the base model and
// "base_fingerprint" (model_fingerprint() of the base it was trained on;
// schema 1 files, written before it existed, are read without it).
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "riftco_transformer/model_state.hpp"

namespace riftco_transformer {

inline constexpr const char* kAdapterStateFormat = "riftco.lora_adapters";

/// ValueError when the model has no adapters. Atomic write.
void save_adapter_state(const DecoderOnlyTransformer& model, const std::filesystem::path& path);

/// Reads and validates the whole file against the model (format, schema,
/// the base dimensions, rank/alpha/targets, every adapter tensor present with
/// its shape, no extra tensors), then adds the adapters (active) with the
/// file's values. The file's base fingerprint must match this model's weights
/// and its values must be finite, unless `options` allow otherwise.
/// ModelStateError for a bad or incompatible file; ValueError when the model
/// already has adapters. On any error the model is untouched.
void load_adapter_state(DecoderOnlyTransformer& model, const std::filesystem::path& path,
                        const LoadOptions& options = {});

/// load_adapter_state in two steps, like read_model_state_for and
/// apply_model_state_values: the read does every check on the file (the base
/// fingerprint against `model`'s weights as they are then) and keeps the
/// values; the apply refuses a model that has adapters by then (ValueError) or
/// whose dimensions or, where the fingerprint was checked, weights changed
/// since the read and no longer match (ModelStateError), then adds the
/// adapters. On any error the model is untouched.
class AdapterStateValues;
AdapterStateValues read_adapter_state_for(const DecoderOnlyTransformer& model, const std::filesystem::path& path,
                                          const LoadOptions& options = {});
void apply_adapter_state_values(DecoderOnlyTransformer& model, const AdapterStateValues& values);

class AdapterStateValues {
 public:
  const std::filesystem::path& path() const { return path_; }

 private:
  friend AdapterStateValues read_adapter_state_for(const DecoderOnlyTransformer&, const std::filesystem::path&,
                                                   const LoadOptions&);
  friend void apply_adapter_state_values(DecoderOnlyTransformer&, const AdapterStateValues&);
  std::filesystem::path path_;
  TransformerDimensions dimensions_;
  LoraConfig config_;
  std::vector<std::pair<std::string, Tensor>> values_;  // the model's adapter layout order
  std::string fingerprint_;  // the recorded base fingerprint, when it was checked
  std::vector<std::uint64_t> base_versions_;  // value_version() of each base parameter at that check
};

}  // namespace riftco_transformer
