#pragma once
// Causal multi-head self-attention over (B, H, T, D) queries, keys, values.
#include <string>

#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

enum class FullSequenceAttentionKind : std::uint8_t {
  /// scores = q kᵀ / sqrt(D), causal mask, softmax, @ v — as graph nodes, so
  /// the (T×T) scores and probabilities of every head are retained.
  Materialized = 0,
  /// FlashAttention-2 style tiled kernel: keeps the output and one
  /// log-sum-exp per query row; backward rematerializes tile by tile.
  Flash = 1,
};

/// "materialized" / "flash".
const char* attention_kind_name(FullSequenceAttentionKind kind);
/// Parses "materialized" / "flash"; ValueError naming `op` and the string.
FullSequenceAttentionKind parse_attention_kind(const std::string& name, const char* op = "attention");

/// Causal attention: q, k, v (B, H, T, D) → (B, H, T, D), scale 1/sqrt(D).
Variable causal_attention(const Variable& q, const Variable& k, const Variable& v, FullSequenceAttentionKind kind);

}  // namespace riftco_transformer
