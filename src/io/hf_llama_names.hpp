#pragma once
// Internal pieces of the Hugging Face Llama converter (hf_llama*.cpp).
#include <string>
#include <vector>

#include "riftco_transformer/transformer.hpp"

namespace riftco_transformer {

/// One parameter under both names. rotary_heads > 0: a query/key weight
/// whose rows are permuted between the two rotary layouts (that many heads).
struct HfTensorName {
  std::string ours;
  std::string hf;
  std::int64_t rotary_heads = 0;
  Shape shape;  // the same under both names
};

/// Every parameter of a model of `d` (no lm_head when tied), in our order.
std::vector<HfTensorName> hf_llama_tensor_names(const TransformerDimensions& d);

/// config.json text for `d` (LlamaForCausalLM, model_type llama).
std::string hf_llama_config_json(const TransformerDimensions& d, float norm_epsilon);

}  // namespace riftco_transformer
