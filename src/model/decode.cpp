#include "riftco_transformer/decode.hpp"

#include <algorithm>
#include <cmath>
#include <new>
#include <numeric>
#include <string>
#include <utility>

#include "../backend/kernels.hpp"
#include "riftco_transformer/ops.hpp"
#include "transformer_core.hpp"

namespace riftco_transformer {
namespace {

/// Rows a session's K/V caches start with; they double as positions fill
/// them, up to the context length. A session for a long context no longer
/// holds the whole context's caches from its first token (a 1 M-token context
/// zero-filled 531 MiB to generate 2 tokens).
constexpr std::int64_t kFirstCacheRows = 128;

/// `cache` (G, rows, D) with room for `rows` rows, its first rows kept.
Tensor widened(const Tensor& cache, std::int64_t rows) {
  const backend::Kernels& kernels = backend::kernels_for("decode_token", cache);
  const std::int64_t heads = cache.size(0);
  const std::int64_t d = cache.size(2);
  const std::int64_t perm[3] = {1, 0, 2};
  const Tensor by_position = kernels.permute(cache, perm);  // (rows, G, D): one block per position
  Tensor wider = Tensor::empty({rows, heads, d}, cache.backend());
  kernels.copy_values(by_position.device_data(), wider.device_data(), by_position.numel());
  return kernels.permute(wider, perm);  // (G, rows, D); the rows past the old ones are never read
}

/// The bytes a session's caches take at `rows` rows, for a message.
std::string cache_bytes(const TransformerDimensions& d, std::int64_t rows) {
  const double bytes = 2.0 * static_cast<double>(d.layers) * static_cast<double>(d.kv_heads()) *
                       static_cast<double>(rows) * static_cast<double>(d.head_width()) * sizeof(float);
  return std::to_string(static_cast<std::int64_t>(bytes / (1 << 20))) + " MiB";
}

}  // namespace

DecodeSession::DecodeSession(const DecoderOnlyTransformer& model) : core_(model.core()) { reset(); }

std::int64_t DecodeSession::position() const {
  const std::lock_guard<std::mutex> guard(*lock_);
  return position_;
}
std::int64_t DecodeSession::capacity() const { return core_->dims.context_length; }
std::int64_t DecodeSession::vocab_size() const { return core_->dims.vocab_size; }

void DecodeSession::reset() {
  const std::lock_guard<std::mutex> guard(*lock_);
  const StructureReadLock structure(*core_);
  core_->check_parameters("DecodeSession");  // before anything changes
  const TransformerDimensions& d = core_->dims;
  const Backend backend = core_->token_embedding.value().backend();  // the caches live with the weights
  const std::int64_t rows = std::min(d.context_length, kFirstCacheRows);
  std::vector<Tensor> keys;
  std::vector<Tensor> values;
  for (std::int64_t i = 0; i < d.layers; ++i) {
    keys.push_back(Tensor::zeros({d.kv_heads(), rows, d.head_width()}, backend));
    values.push_back(Tensor::zeros({d.kv_heads(), rows, d.head_width()}, backend));
  }
  keys_ = std::move(keys);  // nothing changes if an allocation failed
  values_ = std::move(values);
  versions_.clear();
  for (const Variable& p : core_->all_leaves()) versions_.push_back(p.value_version());
  position_ = 0;
}

Tensor DecodeSession::decode_token(std::int32_t token) {
  const std::lock_guard<std::mutex> guard(*lock_);
  TransformerCore& m = *core_;
  const StructureReadLock structure(m);
  const TransformerDimensions& dims = m.dims;
  if (position_ >= dims.context_length) {
    throw ValueError("[decode_token] the context is full (" + std::to_string(dims.context_length) +
                     " tokens); reset() the session or start a new one");
  }
  if (token < 0 || token >= dims.vocab_size) {
    throw ValueError("[decode_token] token " + std::to_string(token) + " is outside the vocabulary [0, " +
                     std::to_string(dims.vocab_size) + ")");
  }
  const std::vector<Variable> params = m.all_leaves();
  if (params.size() != versions_.size()) {
    throw StaleGraphError("[decode_token] the model's adapters changed since the session started; reset() the session");
  }
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (params[i].value_version() != versions_[i]) {
      throw StaleGraphError("[decode_token] parameter '" + params[i].name() +
                            "' changed since the session started; its K/V cache is stale: reset() the session");
    }
  }
  if (position_ == keys_.front().size(1)) {  // the caches are full: twice the rows, up to the context
    const std::int64_t rows = std::min(dims.context_length, 2 * position_);
    std::vector<Tensor> keys;
    std::vector<Tensor> values;
    try {
      for (std::size_t i = 0; i < keys_.size(); ++i) {
        keys.push_back(widened(keys_[i], rows));
        values.push_back(widened(values_[i], rows));
      }
    } catch (const std::bad_alloc& e) {
      const bool ours = dynamic_cast<const OutOfMemoryError*>(&e) != nullptr;  // the allocator's: device, bytes
      throw OutOfMemoryError("[decode_token] no memory to grow the K/V caches to " + std::to_string(rows) +
                             " positions (" + cache_bytes(dims, rows) + "); the session is as it was at position " +
                             std::to_string(position_) + (ours ? std::string(" (") + e.what() + ")" : std::string()));
    }
    keys_ = std::move(keys);
    values_ = std::move(values);
  }
  NoGradGuard no_graph;
  const std::int64_t heads = dims.heads;
  const std::int64_t d = dims.head_width();
  const std::int64_t c = dims.model_width;
  const std::int32_t ids[1] = {token};
  const std::int64_t kv_heads = dims.kv_heads();
  const float base = dims.rope_base;
  auto split_heads = [&](const Variable& x, std::int64_t n) {  // (1, 1, n·D) → (1, n, 1, D)
    return permute(reshape(x, {1, 1, n, d}), {0, 2, 1, 3});
  };
  Variable h = embedding(m.token_embedding, ids, {1, 1});  // (1, 1, C)
  for (std::size_t i = 0; i < m.blocks.size(); ++i) {
    const BlockWeights& w = m.blocks[i];
    const Variable x = rms_norm(h, w.attention_norm, m.eps);
    const Variable q = rope(split_heads(m.project(w, LoraTarget::Query, x), heads), position_, base);   // (1, H, 1, D)
    const Variable k = rope(split_heads(m.project(w, LoraTarget::Key, x), kv_heads), position_, base);  // (1, G, 1, D)
    const Variable v = split_heads(m.project(w, LoraTarget::Value, x), kv_heads);                       // (1, G, 1, D)
    const backend::Kernels& kernels = backend::kernels_for("decode_token", q.value(), keys_[i], k.value());
    kernels.cache_write(keys_[i], k.value(), position_);  // (G, 1, D) into row position_ of (G, capacity, D)
    kernels.cache_write(values_[i], v.value(), position_);
    const Tensor a = kernels.cached_attention(q.value().reshape({heads, d}), keys_[i], values_[i], position_ + 1);
    const Variable merged(a.reshape({1, 1, c}));
    const Variable h1 = add(h, m.project(w, LoraTarget::Output, merged));
    const Variable y = rms_norm(h1, w.mlp_norm, m.eps);
    const Variable g = swiglu(m.project(w, LoraTarget::Gate, y), m.project(w, LoraTarget::Up, y));
    h = add(h1, m.project(w, LoraTarget::Down, g));
  }
  const Variable logits = linear(rms_norm(h, m.final_norm, m.eps), m.lm_head);  // (1, 1, V)
  ++position_;
  return logits.value().reshape({dims.vocab_size});
}

}  // namespace riftco_transformer
