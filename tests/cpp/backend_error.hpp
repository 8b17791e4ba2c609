#pragma once
// What a call's BackendError says: the tests that check a refusal's message
// (backend dispatch, the pipelines' device option, data parallelism on the
// CPU and over NCCL).
#include <functional>
#include <string>

#include "riftco_transformer/errors.hpp"

namespace rt_test {

/// The what() of the BackendError `f` throws; "(no BackendError)" when it
/// returns (any other exception passes through, failing the test).
inline std::string backend_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const riftco_transformer::BackendError& e) {
    return e.what();
  }
  return "(no BackendError)";
}

}  // namespace rt_test
