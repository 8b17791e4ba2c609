#pragma once
// LoRA adapter files: the adapters alone (safetensors), validated like model
// state. Metadata: "format" riftco.lora_adapters, "schema_version" 2, "rank",
// "alpha", "targets" (comma list), "dimensions" of the base model and
// "base_fingerprint" (model_fingerprint() of the base it was trained on;
// schema 1 files, written before it existed, are read without it).
#include <filesystem>

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

}  // namespace riftco_transformer
