// rt_c::guard: the exception-to-status map (included by c_api_common.hpp).
#include <filesystem>
#include <new>

#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/data.hpp"
#include "riftco_transformer/model_state.hpp"

namespace rt_c {

template <typename Body>
rt_status guard(const char* function, Body&& body) noexcept {
  using namespace riftco_transformer;
  try {
    body();
    return RT_OK;
  } catch (const ArgumentError& e) {
    return fail(RT_ERROR_INVALID_ARGUMENT, e.what());
  } catch (const CheckpointContractError& e) {
    return fail(RT_ERROR_CHECKPOINT_CONTRACT, e.what());
  } catch (const ShapeError& e) {
    return fail(RT_ERROR_SHAPE, e.what());
  } catch (const BackendError& e) {
    return fail(RT_ERROR_BACKEND, e.what());
  } catch (const StaleGraphError& e) {
    return fail(RT_ERROR_STALE_GRAPH, e.what());
  } catch (const BackwardError& e) {
    return fail(RT_ERROR_BACKWARD, e.what());
  } catch (const ModelStateError& e) {
    return fail(RT_ERROR_MODEL_STATE, e.what());
  } catch (const DataError& e) {
    return fail(RT_ERROR_DATA, e.what());
  } catch (const ValueError& e) {
    return fail(RT_ERROR_VALUE, e.what());
  } catch (const PartialStepError& e) {
    return fail(RT_ERROR_PARTIAL_STEP, e.what());
  } catch (const Error& e) {  // a riftco error of no narrower class: a diverged run, a full disk
    return fail(RT_ERROR_RUNTIME, e.what());
  } catch (const std::filesystem::filesystem_error& e) {  // I/O outside the library's own checks
    return fail(RT_ERROR_MODEL_STATE, (std::string("[") + function + "] " + e.what()).c_str());
  } catch (const OutOfMemoryError& e) {  // says what wanted how much
    return fail(RT_ERROR_OUT_OF_MEMORY, e.what());
  } catch (const std::bad_alloc&) {
    return fail(RT_ERROR_OUT_OF_MEMORY, (std::string("[") + function + "] out of memory").c_str());
  } catch (const std::exception& e) {
    return fail(RT_ERROR_INTERNAL, (std::string("[") + function + "] internal error: " + e.what()).c_str());
  } catch (...) {
    return fail(RT_ERROR_INTERNAL, (std::string("[") + function + "] internal error: unknown exception").c_str());
  }
}

}  // namespace rt_c
