#pragma once
// Training checkpoints: trainable parameters, Adam moments, step and RNG
// states in one safetensors file, written atomically, with a checksum over
// everything in it (metadata "checksum") verified before anything is read.
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/transformer.hpp"

namespace riftco_transformer::stage {

struct TrainingState {
  std::int64_t step = 0;
  Random::State data_random;
  Random::State dropout_random;  // this rank's (rank 0's in a file)
  /// Data parallelism: the ranks of the run, and the dropout streams of
  /// ranks 1 .. world_size - 1 (each rank draws its own masks).
  std::int64_t world_size = 1;
  std::vector<Random::State> other_ranks_dropout_random;
  /// Which steps ran at which world size, up to `step`: an array of
  /// {"world_size", "first_step", "last_step"}, contiguous from step 1
  /// (a run resumed at another N has several).
  nlohmann::json world_size_history = nlohmann::json::array();
  /// Seconds the run had trained at `step` (metrics' elapsed_seconds);
  /// absent in checkpoints written before it was recorded.
  std::optional<double> elapsed_seconds;
};

/// `history` with steps first..last (1-based, inclusive) run at `world_size`
/// appended (merged into the last entry when it has the same world size and
/// ends at first - 1). Nothing is added when last < first.
nlohmann::json extend_world_size_history(const nlohmann::json& history, std::int64_t world_size,
                                         std::int64_t first_step, std::int64_t last_step);

inline constexpr const char* kTrainingCheckpointFile = "training_checkpoint.safetensors";
/// The metrics log of a run in progress (metrics.jsonl appears when it completes).
inline constexpr const char* kPartialMetricsFile = "metrics.partial.jsonl";

/// Hash64 over every metadata entry but "checksum" (in key order) and every
/// tensor (name, shape, bytes, in file order), as 16 hex digits.
std::string checkpoint_checksum(const std::map<std::string, std::string>& metadata,
                                const std::vector<std::pair<std::string, Tensor>>& tensors);

/// `moments`: the optimizer's full state (Adam::state(), or ZeRO-1's
/// gathered ShardedAdam::state(): the same format whatever the ranks), on
/// any backend: the file holds host copies (the same format on every device).
void save_training_checkpoint(const std::filesystem::path& path, const std::vector<NamedParameter>& trainable,
                              const Adam::State& moments, const TrainingState& state, const nlohmann::json& config);

/// Validates everything (format, checksum, the configuration it was made with, every
/// parameter and moment with its shape) before changing the parameters, the
/// optimizer or `state`. Values and moments are loaded onto each parameter's
/// backend, whatever device the checkpoint was made on ("device" is
/// execution policy, like "zero_stage"). A checkpoint made by a job of another number of
/// ranks (a file without "world_size" was made by one process) resumes only
/// when the configuration's dropout is 0: every rank draws the whole global
/// batch from the same generator, so the data order is the same at any N,
/// and the Adam state is the full one, but each rank's dropout stream is its
/// own. Otherwise a ModelStateError names both world sizes and the reason.
/// `state.dropout_random` becomes rank `rank`'s saved stream (at the same
/// world size; at another, the caller's `state.dropout_random` stays: no
/// stream is drawn from without dropout).
void load_training_checkpoint(const std::filesystem::path& path, const std::vector<NamedParameter>& trainable,
                              Adam& adam, TrainingState& state, const nlohmann::json& config,
                              std::int64_t world_size = 1, std::int64_t rank = 0);
/// The same, handing the validated full moments to `set_state` (e.g. a
/// ShardedAdam keeping its shard) before the parameters change.
void load_training_checkpoint(const std::filesystem::path& path, const std::vector<NamedParameter>& trainable,
                              const std::function<void(const Adam::State&)>& set_state, TrainingState& state,
                              const nlohmann::json& config, std::int64_t world_size = 1, std::int64_t rank = 0);

}  // namespace riftco_transformer::stage
