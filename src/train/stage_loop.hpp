#pragma once
// The training loop both stages share: schedule, steps, evaluation, metrics,
// training checkpoints and resume, final files. Private to the train layer.
#include <functional>
#include <nlohmann/json.hpp>

#include "riftco_transformer/data.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/pipelines.hpp"

namespace riftco_transformer::stage {

struct StageRun {
  std::string stage;  // "pretraining" / "post_training"
  const StageSettings* settings = nullptr;
  DecoderOnlyTransformer* model = nullptr;
  /// What Adam trains (and what a training checkpoint stores).
  std::vector<NamedParameter> trainable;
  /// Draws one batch from a split.
  std::function<TokenBatch(Random&, Split)> sample;
  /// The whole configuration, as metadata.json records it.
  nlohmann::json config;
  /// The final weights' file name in the output directory ("model.safetensors",
  /// "adapter.safetensors"), and what writes them there (given that path).
  std::string weights_file;
  std::function<void(const std::filesystem::path& path)> save_weights;
  /// Extra facts for metadata.json (data sizes, parameter counts, ...).
  nlohmann::json facts;
  /// The job's ranks (data parallelism, docs/distributed.md); never null.
  Communicator* comm = nullptr;
};

RunResult run(StageRun& run, const ProgressCallback& progress, const NoticeCallback& notice = {});

/// FNV-1a 64 of `bytes` as 16 hex digits: a resumed run checks its data and
/// base model are the ones it started with.
std::string fingerprint(std::string_view bytes);
std::string read_bytes(const std::filesystem::path& path);

/// A float as the JSON number a person would write (0.9, not 0.8999999761581421).
double json_number(float value);
/// JSON of the settings every stage shares (enums as their strings).
nlohmann::json settings_json(const StageSettings& s);
/// ValueError naming the first bad shared field.
void validate_settings(const StageSettings& s, std::int64_t context_length, const char* op);
/// optimizer_in_backward's conditions (max_grad_norm 0, one micro-batch per
/// step, one rank of `world`): a ValueError naming the field and the fix.
/// Nothing when the option is off.
void check_optimizer_in_backward(const StageSettings& s, int world, const char* op);

}  // namespace riftco_transformer::stage
