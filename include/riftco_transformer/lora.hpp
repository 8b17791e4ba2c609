#pragma once
// LoRA (Hu et al. 2021): a projection y = x Wᵀ gains a low-rank update
//   y = x Wᵀ + (alpha / r) · (x Aᵀ) Bᵀ,   A (r, in), B (out, r)
// A starts small and random (uniform ±1/√in), B at zero, so adding adapters
// does not change the model's output until B trains.
#include <cstdint>
#include <string>
#include <vector>

#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

enum class LoraTarget : std::uint8_t { Query, Key, Value, Output, Gate, Up, Down };

/// "query", "key", "value", "output", "gate", "up", "down".
const char* lora_target_name(LoraTarget target);
/// Comma-separated names, or "attention" (query,key,value,output), "mlp"
/// (gate,up,down), "all". ValueError naming `op` and the bad name.
std::vector<LoraTarget> parse_lora_targets(const std::string& list, const char* op = "lora");
std::string lora_targets_string(const std::vector<LoraTarget>& targets);

struct TransformerDimensions;

struct LoraConfig {
  std::int64_t rank = 8;
  float alpha = 16.0F;
  std::vector<LoraTarget> targets{LoraTarget::Query, LoraTarget::Value};
  /// ValueError naming the field: rank > 0, alpha > 0, targets non-empty and unique.
  void validate() const;
  /// validate(), and rank <= min(out, in) of every target projection of a
  /// model with `dimensions` (a larger rank adds nothing and can ask for
  /// gigabytes). ValueError tagged `op`.
  void validate_for(const TransformerDimensions& dimensions, const char* op) const;
  /// Adapter parameters add_lora(*this) adds to a model with `dimensions`.
  std::int64_t parameter_count(const TransformerDimensions& dimensions) const;
  float scale() const { return alpha / static_cast<float>(rank); }
};

/// One adapter on one projection of one block.
struct LoraAdapter {
  LoraTarget target = LoraTarget::Query;
  Variable a;  // (r, in)
  Variable b;  // (out, r)
  float scale = 1.0F;
};

}  // namespace riftco_transformer
