// A C++ RAII layer over the C ABI (rt.h), for programs that want the stable
// ABI instead of the C++ API: handles that release themselves, and statuses
// turned into exceptions (rt::Error with the status and the message).
// Header-only; needs only rt.h and the shared library.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "riftco_transformer/rt.h"

namespace rt {

/// A failed rt_* call: status() and the library's message.
class Error : public std::runtime_error {
 public:
  Error(rt_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  rt_status status() const { return status_; }

 private:
  rt_status status_;
};

/// Throws rt::Error when `status` is not RT_OK.
inline void check(rt_status status) {
  if (status != RT_OK) {
    throw Error(status, std::string(rt_status_name(status)) + ": " + rt_last_error_message());
  }
}

namespace detail {
template <typename T, rt_status (*Destroy)(T*)>
struct Deleter {
  void operator()(T* p) const { Destroy(p); }
};
}  // namespace detail

using ModelHandle = std::unique_ptr<rt_model, detail::Deleter<rt_model, rt_model_destroy>>;
using VariableHandle = std::unique_ptr<rt_variable, detail::Deleter<rt_variable, rt_variable_destroy>>;
using AdamHandle = std::unique_ptr<rt_adam, detail::Deleter<rt_adam, rt_adam_destroy>>;
using DecodeSessionHandle =
    std::unique_ptr<rt_decode_session, detail::Deleter<rt_decode_session, rt_decode_session_destroy>>;

/// A graph node (a loss, logits, a parameter).
class Variable {
 public:
  explicit Variable(rt_variable* handle) : handle_(handle) {}
  rt_variable* get() const { return handle_.get(); }

  void backward() const { check(rt_variable_backward(get())); }
  /// retain_graph false frees the graph as the pass goes (ABI 2.5,
  /// rt_variable_backward_ex): a later backward through it throws.
  void backward(bool retain_graph) const {
    check(rt_variable_backward_ex(get(), nullptr, 0, retain_graph ? 1 : 0));
  }
  float item() const {
    float value = 0.0F;
    check(rt_variable_item(get(), &value));
    return value;
  }
  std::vector<int64_t> shape() const {
    size_t ndim = 0;
    check(rt_variable_ndim(get(), &ndim));
    std::vector<int64_t> dims(ndim);
    check(rt_variable_shape(get(), dims.data(), dims.size()));
    return dims;
  }
  std::vector<float> value() const {
    std::vector<float> out(static_cast<size_t>(numel()));
    check(rt_variable_value(get(), out.data(), out.size()));
    return out;
  }
  /// Empty before the first backward that reached it.
  std::vector<float> grad() const {
    std::vector<float> out(static_cast<size_t>(numel()));
    int has = 0;
    check(rt_variable_grad(get(), out.data(), out.size(), &has));
    if (has == 0) out.clear();
    return out;
  }
  void set_value(const std::vector<float>& values) { check(rt_variable_set_value(get(), values.data(), values.size())); }
  int64_t numel() const {
    int64_t n = 0;
    check(rt_variable_numel(get(), &n));
    return n;
  }
  std::string name() const {
    size_t needed = 0;
    check(rt_variable_name(get(), nullptr, 0, &needed));  // a size query (RT_OK; the last error stays)
    std::string out(needed, '\0');
    check(rt_variable_name(get(), out.data(), out.size(), &needed));
    out.resize(needed - 1);
    return out;
  }
  /// The graph's leaves that require grad (its parameters).
  std::vector<Variable> leaves() const {
    size_t count = 0;
    check(rt_variable_leaf_count(get(), &count));
    std::vector<Variable> out;
    for (size_t i = 0; i < count; ++i) {
      rt_variable* leaf = nullptr;
      check(rt_variable_leaf(get(), i, &leaf));
      out.emplace_back(leaf);
    }
    return out;
  }

 private:
  VariableHandle handle_;
};

class Model {
 public:
  Model(const rt_transformer_config& config, uint64_t seed, rt_attention attention = RT_ATTENTION_FLASH,
        rt_activation_checkpointing policy = RT_ACTIVATION_CHECKPOINTING_DISABLED) {
    rt_model* m = nullptr;
    check(rt_model_create(&config, seed, attention, policy, &m));
    handle_.reset(m);
  }
  static Model load(const std::string& path, rt_attention attention = RT_ATTENTION_FLASH,
                    rt_activation_checkpointing policy = RT_ACTIVATION_CHECKPOINTING_DISABLED, uint32_t flags = 0) {
    rt_model* m = nullptr;
    check(rt_model_load_new(path.c_str(), attention, policy, flags, &m));
    return Model(m);
  }
  rt_model* get() const { return handle_.get(); }

  void set_activation_checkpointing(rt_activation_checkpointing kind) {
    check(rt_model_set_activation_checkpointing(get(), kind));
  }
  rt_activation_checkpointing activation_checkpointing() const {
    rt_activation_checkpointing kind = RT_ACTIVATION_CHECKPOINTING_DISABLED;
    check(rt_model_activation_checkpointing(get(), &kind));
    return kind;
  }
  Variable loss(const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets, int64_t batch) const {
    // Checked here: the C call reads batch x (tokens / batch) ids from each
    // buffer, and a status without a call would report an older message.
    if (batch <= 0 || tokens.empty() || tokens.size() % static_cast<size_t>(batch) != 0) {
      throw Error(RT_ERROR_INVALID_ARGUMENT, "RT_ERROR_INVALID_ARGUMENT: [rt::Model::loss] " +
                                                 std::to_string(tokens.size()) + " tokens do not split into batch " +
                                                 std::to_string(batch));
    }
    if (targets.size() != tokens.size()) {
      throw Error(RT_ERROR_INVALID_ARGUMENT, "RT_ERROR_INVALID_ARGUMENT: [rt::Model::loss] " +
                                                 std::to_string(targets.size()) + " targets for " +
                                                 std::to_string(tokens.size()) + " tokens");
    }
    rt_variable* v = nullptr;
    check(rt_model_loss(get(), tokens.data(), targets.data(), batch,
                        static_cast<int64_t>(tokens.size()) / batch, &v));
    return Variable(v);
  }
  Variable parameter(const std::string& name) const {
    rt_variable* v = nullptr;
    check(rt_model_parameter(get(), name.c_str(), &v));
    return Variable(v);
  }
  void save(const std::string& path) const { check(rt_model_save(get(), path.c_str())); }

 private:
  explicit Model(rt_model* m) : handle_(m) {}
  ModelHandle handle_;
};

/// Hugging Face Llama checkpoint directory -> model-state file, and back.
inline void convert_from_hf(const std::string& directory, const std::string& output, uint32_t flags = 0) {
  check(rt_convert_from_hf(directory.c_str(), output.c_str(), flags));
}
inline void convert_to_hf(const std::string& model_state, const std::string& directory, uint32_t flags = 0) {
  check(rt_convert_to_hf(model_state.c_str(), directory.c_str(), flags));
}

class Adam {
 public:
  explicit Adam(Model& model) {
    rt_adam_options options;
    check(rt_adam_options_default(&options));
    rt_adam* a = nullptr;
    check(rt_adam_create(model.get(), &options, &a));
    handle_.reset(a);
  }
  Adam(Model& model, const rt_adam_options& options) {
    rt_adam* a = nullptr;
    check(rt_adam_create(model.get(), &options, &a));
    handle_.reset(a);
  }
  /// Two parameter groups: no weight decay on norm weights (and on the
  /// embedding and LM head unless decay_embeddings); rt_adam_create_grouped.
  Adam(Model& model, const rt_adam_options& options, bool decay_embeddings) {
    rt_adam* a = nullptr;
    check(rt_adam_create_grouped(model.get(), &options, decay_embeddings ? 1 : 0, &a));
    handle_.reset(a);
  }
  float weight_decay(const std::string& parameter_name) const {
    float wd = 0.0F;
    check(rt_adam_weight_decay(handle_.get(), parameter_name.c_str(), &wd));
    return wd;
  }
  float step() {
    float norm = 0.0F;
    check(rt_adam_step(handle_.get(), &norm));
    return norm;
  }
  /// The step fused into the backward pass of `loss` (ABI 2.6,
  /// rt_adam_backward_and_step): the graph is freed, the parameters are left
  /// without gradients; a failure after the first update throws with
  /// status() RT_ERROR_PARTIAL_STEP.
  float backward_and_step(const Variable& loss) {
    float norm = 0.0F;
    check(rt_adam_backward_and_step(handle_.get(), loss.get(), &norm));
    return norm;
  }
  void zero_grad() { check(rt_adam_zero_grad(handle_.get())); }

 private:
  AdamHandle handle_;
};

class DecodeSession {
 public:
  explicit DecodeSession(const Model& model) {
    rt_decode_session* s = nullptr;
    check(rt_decode_session_create(model.get(), &s));
    handle_.reset(s);
    rt_transformer_config config;
    config.struct_size = sizeof config;
    check(rt_model_config(model.get(), &config));
    vocab_ = static_cast<size_t>(config.vocab_size);
  }
  std::vector<float> decode(int32_t token) {
    std::vector<float> logits(vocab_);
    check(rt_decode_session_decode(handle_.get(), token, logits.data(), logits.size()));
    return logits;
  }
  void reset() { check(rt_decode_session_reset(handle_.get())); }

 private:
  DecodeSessionHandle handle_;
  size_t vocab_ = 0;
};

}  // namespace rt
