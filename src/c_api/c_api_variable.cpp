// rt_variable_*: graph nodes (losses, logits, parameters) and their values.
#include <utility>

#include "c_api_common.hpp"

using namespace rt_c;
namespace rt = riftco_transformer;

namespace {

void check_count(const rt::Tensor& t, size_t count, const char* function) {
  if (static_cast<std::int64_t>(count) != t.numel()) {
    bad_argument(function, "count is " + std::to_string(count) + " but the variable of shape " +
                               rt::shape_string(t.shape()) + " has " + std::to_string(t.numel()) + " elements");
  }
}

}  // namespace

extern "C" {

rt_status rt_variable_destroy(rt_variable* variable) {
  delete variable;
  return RT_OK;
}

rt_status rt_variable_backward(const rt_variable* variable) {
  constexpr const char* f = "rt_variable_backward";
  return guard(f, [&] {
    const ReadLock lock;
    variable_of(variable, f).backward();
  });
}

rt_status rt_variable_backward_ex(const rt_variable* variable, const float* seed, size_t seed_count,
                                  int retain_graph) {
  constexpr const char* f = "rt_variable_backward_ex";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::Variable& v = variable_of(variable, f);
    if (retain_graph != 0 && retain_graph != 1) {
      bad_argument(f, "retain_graph is " + std::to_string(retain_graph) +
                          ", not 0 (free the graph as the pass goes) or 1 (keep it)");
    }
    const auto graph = retain_graph == 1 ? rt::GraphAfterBackward::Keep : rt::GraphAfterBackward::Release;
    if (seed == nullptr) {
      if (seed_count != 0) bad_argument(f, "seed is NULL but seed_count is " + std::to_string(seed_count));
      v.backward(graph);
      return;
    }
    check_count(v.value(), seed_count, f);
    // The caller's host floats, on the output's backend (a cuda model's loss takes a device seed).
    const rt::Tensor host = rt::Tensor::from_data(v.shape(), std::span<const float>(seed, seed_count));
    v.backward(host.backend() == v.value().backend() ? host : host.to(v.value().backend()), graph);
  });
}

rt_status rt_variable_ndim(const rt_variable* variable, size_t* ndim) {
  constexpr const char* f = "rt_variable_ndim";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::Variable& v = variable_of(variable, f);
    require(ndim, f, "ndim") = v.shape().size();
  });
}

rt_status rt_variable_shape(const rt_variable* variable, int64_t* dims, size_t max_dims) {
  constexpr const char* f = "rt_variable_shape";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::Shape& shape = variable_of(variable, f).shape();
    if (max_dims < shape.size()) {
      bad_argument(f, "max_dims is " + std::to_string(max_dims) + " but the shape " + rt::shape_string(shape) +
                          " has " + std::to_string(shape.size()) + " dimensions");
    }
    if (!shape.empty()) require(dims, f, "dims");
    for (std::size_t i = 0; i < shape.size(); ++i) dims[i] = shape[i];
  });
}

rt_status rt_variable_numel(const rt_variable* variable, int64_t* numel) {
  constexpr const char* f = "rt_variable_numel";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::Variable& v = variable_of(variable, f);
    require(numel, f, "numel") = v.value().numel();
  });
}

rt_status rt_variable_value(const rt_variable* variable, float* values, size_t count) {
  constexpr const char* f = "rt_variable_value";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::Tensor& t = variable_of(variable, f).value();
    check_count(t, count, f);
    if (count > 0) {
      require(values, f, "values");
      const rt::Tensor host = t.to(rt::Backend::Cpu);  // a cuda value too; const: reading bumps no version
      std::memcpy(values, host.data(), count * sizeof(float));
    }
  });
}

rt_status rt_variable_grad(const rt_variable* variable, float* values, size_t count, int* has_grad) {
  constexpr const char* f = "rt_variable_grad";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::Variable& v = variable_of(variable, f);
    require(has_grad, f, "has_grad");
    check_count(v.value(), count, f);
    // A handle of its own, copied under the commit lock: a backward committing
    // or rt_adam_zero_grad dropping this gradient on another thread (both run
    // beside this read) cannot replace it while it is copied (grad() returns
    // a reference to the slot they assign).
    const rt::Tensor g = v.grad_with_serial().first;
    *has_grad = g.defined() ? 1 : 0;
    if (g.defined() && count > 0) {
      require(values, f, "values");
      const rt::Tensor host = g.to(rt::Backend::Cpu);
      std::memcpy(values, host.data(), count * sizeof(float));
    }
  });
}

rt_status rt_variable_set_value(rt_variable* variable, const float* values, size_t count) {
  constexpr const char* f = "rt_variable_set_value";
  return guard(f, [&] {
    const ChangeLock lock(f);
    rt::Variable v = variable_of(variable, f);
    check_count(v.value(), count, f);
    if (count > 0) require(values, f, "values");
    rt::Tensor next = rt::Tensor::from_data(v.shape(), std::span<const float>(values, count));
    v.set_value(std::move(next));  // leaves only (ValueError otherwise); bumps the version
  });
}

rt_status rt_variable_item(const rt_variable* variable, float* value) {
  constexpr const char* f = "rt_variable_item";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::Variable& v = variable_of(variable, f);
    require(value, f, "value") = v.value().item();
  });
}

rt_status rt_variable_name(const rt_variable* variable, char* buffer, size_t buffer_size, size_t* needed) {
  constexpr const char* f = "rt_variable_name";
  return guard(f, [&] {
    const ReadLock lock;
    copy_string(variable_of(variable, f).name(), buffer, buffer_size, needed, f);
  });
}

rt_status rt_variable_graph_statistics(const rt_variable* variable, int64_t* node_count, int64_t* element_count) {
  constexpr const char* f = "rt_variable_graph_statistics";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::GraphStatistics s = variable_of(variable, f).graph_statistics();
    if (node_count == nullptr && element_count == nullptr) bad_argument(f, "node_count and element_count are NULL");
    if (node_count != nullptr) *node_count = s.node_count;
    if (element_count != nullptr) *element_count = s.element_count;
  });
}

rt_status rt_variable_leaf_count(const rt_variable* variable, size_t* count) {
  constexpr const char* f = "rt_variable_leaf_count";
  return guard(f, [&] {
    const ReadLock lock;
    const rt::Variable& v = variable_of(variable, f);
    require(count, f, "count") = v.leaves().size();
  });
}

rt_status rt_variable_leaf(const rt_variable* variable, size_t index, rt_variable** out) {
  constexpr const char* f = "rt_variable_leaf";
  return guard(f, [&] {
    const ReadLock lock;
    const std::vector<rt::Variable> leaves = variable_of(variable, f).leaves();
    require(out, f, "out");
    if (index >= leaves.size()) {
      bad_argument(f, "index " + std::to_string(index) + " is out of range: the graph has " +
                          std::to_string(leaves.size()) + " leaves that require grad");
    }
    *out = wrap(leaves[index]);
  });
}

}  // extern "C"
