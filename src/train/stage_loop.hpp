#pragma once
// The training loop both stages share: schedule, steps, evaluation, metrics,
// training checkpoints and resume, final files. Private to the train layer.
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <utility>
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
/// ValueError (tagged `op`) when an input of the run — its data, tokenizer
/// or base model, given as (field, path) — is a file the run writes or
/// removes in `output_dir` (its weights, metadata.json, metrics.jsonl,
/// loss_curve.svg, the training checkpoint, the partial log, .lock
/// or .write_probe): the run would
/// train on it and then replace or delete it. Empty paths are skipped.
void check_inputs_are_not_outputs(const std::filesystem::path& output_dir,
                                  std::initializer_list<std::pair<const char*, std::filesystem::path>> inputs,
                                  const char* op);
/// ValueError (tagged `op`) naming the first of `paths` (field, path) that
/// is not valid UTF-8: metadata.json and the training checkpoint record them
/// as JSON text, which would fail only when the run writes them (after
/// training). Empty paths are skipped.
void check_paths_are_text(std::initializer_list<std::pair<const char*, std::filesystem::path>> paths, const char* op);
/// optimizer_in_backward's conditions (max_grad_norm 0, one micro-batch per
/// step, one rank of `world`): a ValueError naming the field and the fix.
/// Nothing when the option is off.
void check_optimizer_in_backward(const StageSettings& s, int world, const char* op);

}  // namespace riftco_transformer::stage
