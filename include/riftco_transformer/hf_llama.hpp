#pragma once
// Hugging Face `transformers` Llama checkpoints (LlamaForCausalLM):
// a directory with config.json and model.safetensors, or
// model.safetensors.index.json plus shards. See docs/model-state.md.
//
// Names map one to one (model.embed_tokens.weight ↔ token_embedding.weight,
// model.layers.N.self_attn.q_proj.weight ↔ blocks.N.attention.query.weight,
// …). Rotary layout: Hugging Face rotates the two halves of a head
// (i, i + D/2); we rotate interleaved pairs (2i, 2i + 1). The query and key
// projections' rows are permuted per head so both compute the same model.
#include <filesystem>
#include <memory>

#include "riftco_transformer/model_state.hpp"
#include "riftco_transformer/transformer.hpp"

namespace riftco_transformer {

/// Rows of a query/key weight (heads·D, C) from Hugging Face's half-split
/// layout to our interleaved pairs: ours[h·D + 2i + j] = hf[h·D + j·D/2 + i].
/// ShapeError unless rows == heads·D with D even.
Tensor hf_rotary_rows_to_interleaved(const Tensor& weight, std::int64_t heads);
/// The inverse of hf_rotary_rows_to_interleaved.
Tensor interleaved_rotary_rows_to_hf(const Tensor& weight, std::int64_t heads);

/// The architecture a config.json describes, with the norm epsilon.
struct HfLlamaConfig {
  TransformerDimensions dimensions;
  float norm_epsilon = 1.0e-6F;
};
/// Parses config.json text. ModelStateError "[load] <path>: ..." naming the
/// field for anything this model cannot represent (rope_scaling, biases,
/// hidden_act other than silu, inconsistent head_dim, …) or that is missing.
HfLlamaConfig parse_hf_llama_config(const std::filesystem::path& path, const std::string& text);

/// Reads a transformers Llama checkpoint directory (F32, F16 or BF16 weights,
/// one file or an index with shards) into a new model. Every tensor must be
/// present with the right shape, and none may be left over.
std::unique_ptr<DecoderOnlyTransformer> load_hf_llama(
    const std::filesystem::path& directory,
    FullSequenceAttentionKind attention = FullSequenceAttentionKind::Materialized,
    ActivationCheckpointingKind activation_checkpointing = ActivationCheckpointingKind::Disabled,
    const LoadOptions& options = {});

/// Writes `model` (no adapters: merge_lora() first) as a transformers
/// checkpoint: directory/config.json and directory/model.safetensors (F32),
/// each atomically. The directory is created when missing.
void save_hf_llama(const DecoderOnlyTransformer& model, const std::filesystem::path& directory);

/// load_hf_llama(directory) then save_model_state(output).
void convert_from_hf(const std::filesystem::path& directory, const std::filesystem::path& output,
                     const LoadOptions& options = {});
/// load_model(model_state) then save_hf_llama(directory).
void convert_to_hf(const std::filesystem::path& model_state, const std::filesystem::path& directory,
                   const LoadOptions& options = {});

}  // namespace riftco_transformer
