#pragma once
// Model-state files: the safetensors layout (8-byte little-endian header
// length, JSON header, raw little-endian float32 data) so PyTorch and other
// tools can read what we write. See docs/model-state.md.
//
// The file holds architecture and weights only. Execution policy — the
// activation-checkpointing kind and the attention kind — is not stored:
// pipelines record it in their run metadata.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/tensor.hpp"
#include "riftco_transformer/transformer.hpp"

namespace riftco_transformer {

/// A model-state or safetensors file that cannot be written or read, or that
/// does not fit the model. Messages start with "[save] <path>: " or
/// "[load] <path>: ".
class ModelStateError : public Error {
 public:
  using Error::Error;
};

/// The contents of a safetensors file: tensors in data-section order (ties
/// between empty tensors keep header order), and the "__metadata__" map.
struct TensorFile {
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, std::string> metadata;
};

/// Writes `tensors` (F32, in the given order) and `metadata` in the
/// safetensors layout. Atomic: the file is written beside the target under a
/// temporary name, synced, and renamed over it; on any failure the temporary
/// file is removed and an existing target is left untouched. Names must be
/// unique, non-empty, valid UTF-8 and not "__metadata__"; tensors must be
/// defined (non-CPU tensors are copied to the CPU first).
void write_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// Reads and validates the whole file (header, dtypes, shapes, offsets,
/// coverage of the data section, metadata) before returning; any problem is a
/// ModelStateError "[load] <path>: ...".
TensorFile read_safetensors(const std::filesystem::path& path);

// ---- model level ---------------------------------------------------------

/// What a loader may accept that it refuses by default.
struct LoadOptions {
  /// Accept NaN or infinite weights. By default such a file is refused,
  /// naming the first tensor and element that is not finite.
  bool allow_non_finite = false;
  /// Adapters: accept a file whose recorded base-model fingerprint differs
  /// from the model's (trained on another base of the same dimensions).
  bool allow_base_mismatch = false;
};

/// A hash of the model's base weights (names, shapes, bytes) as 16 hex
/// digits; adapter files record their base's.
std::string model_fingerprint(const DecoderOnlyTransformer& model);

/// Metadata "format" of a model-state file.
inline constexpr const char* kModelStateFormat = "riftco.model_state";
/// Metadata "schema_version" this build writes and reads.
inline constexpr const char* kModelStateSchemaVersion = "1";

/// The tokenizer a model was trained with, as its model-state file records
/// it (metadata "tokenizer": {"path": .., "checksum": ..}). Empty: the byte
/// tokenizer (no "tokenizer" key is written, as before subword tokenizers).
struct TokenizerRecord {
  std::string path;      // the model file as the run named it
  std::string checksum;  // Tokenizer::checksum(): 16 hex digits
  bool empty() const { return checksum.empty(); }
};

/// Every parameter by its stable name, plus metadata "format",
/// "schema_version", "dimensions" (a JSON object of the six
/// TransformerDimensions fields), "norm_epsilon" and, for a subword
/// tokenizer, "tokenizer".
void save_model_state(const DecoderOnlyTransformer& model, const std::filesystem::path& path,
                      const TokenizerRecord& tokenizer = {});

/// The tokenizer recorded in a model-state file (header only); empty for the
/// byte tokenizer. ModelStateError for a malformed record.
TokenizerRecord read_model_tokenizer(const std::filesystem::path& path);

/// The dimensions recorded in a model-state file (validated).
TransformerDimensions read_model_dimensions(const std::filesystem::path& path);

/// Reads and validates the whole file against `model` (format, schema
/// version, dimensions, norm epsilon, every parameter present with its shape,
/// no extra tensors), and only then sets every parameter's value (which bumps
/// its version). Non-finite weights are refused unless options allow them.
/// On any ModelStateError the model is untouched.
void load_model_state(DecoderOnlyTransformer& model, const std::filesystem::path& path,
                      const LoadOptions& options = {});

/// load_model_state in two steps, for a caller that reads the file while
/// other threads may still use the model and sets the weights once they
/// cannot (the Python bindings read with the GIL released, then set the
/// weights holding the lock that keeps readers out).
/// read_model_state_for does every check load_model_state does and keeps the
/// values; it reads `model`'s layout, not its weights.
class ModelStateValues;
ModelStateValues read_model_state_for(const DecoderOnlyTransformer& model, const std::filesystem::path& path,
                                      const LoadOptions& options = {});
/// Sets every parameter from `values`, checking the model's dimensions and
/// layout against the file again first (a ModelStateError, the model
/// untouched, if they changed since the read).
void apply_model_state_values(DecoderOnlyTransformer& model, const ModelStateValues& values);

/// A model-state file's checked values (only the two functions above make
/// and read them, so what was checked is what is set).
class ModelStateValues {
 public:
  const std::filesystem::path& path() const { return path_; }

 private:
  friend ModelStateValues read_model_state_for(const DecoderOnlyTransformer&, const std::filesystem::path&,
                                               const LoadOptions&);
  friend void apply_model_state_values(DecoderOnlyTransformer&, const ModelStateValues&);
  std::filesystem::path path_;
  TensorFile file_;
};

/// A model of the file's dimensions and norm epsilon with the file's weights.
/// The execution policies are the caller's choice: the file has none.
std::unique_ptr<DecoderOnlyTransformer> load_model(
    const std::filesystem::path& path,
    FullSequenceAttentionKind attention = FullSequenceAttentionKind::Materialized,
    ActivationCheckpointingKind activation_checkpointing = ActivationCheckpointingKind::Disabled,
    const LoadOptions& options = {});

}  // namespace riftco_transformer
