#pragma once
// Training checkpoints: trainable parameters, Adam moments, step and RNG
// states in one safetensors file, written atomically.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/transformer.hpp"

namespace riftco_transformer::stage {

struct TrainingState {
  std::int64_t step = 0;
  Random::State data_random;
  Random::State dropout_random;
};

inline constexpr const char* kTrainingCheckpointFile = "training_checkpoint.safetensors";
/// The metrics log of a run in progress (metrics.jsonl appears when it completes).
inline constexpr const char* kPartialMetricsFile = "metrics.partial.jsonl";

void save_training_checkpoint(const std::filesystem::path& path, const std::vector<NamedParameter>& trainable,
                              const Adam& adam, const TrainingState& state, const nlohmann::json& config);

/// Validates everything (format, the configuration it was made with, every
/// parameter and moment with its shape) before changing the parameters, the
/// optimizer or `state`. Throws ModelStateError.
void load_training_checkpoint(const std::filesystem::path& path, const std::vector<NamedParameter>& trainable,
                              Adam& adam, TrainingState& state, const nlohmann::json& config);

}  // namespace riftco_transformer::stage
