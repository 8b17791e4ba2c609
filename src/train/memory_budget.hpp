#pragma once
// A run's memory, predicted before anything is allocated: a run that cannot
// fit is refused with the sizes named, instead of ending in std::bad_alloc
// (maybe after its output directory was created). Private to the train layer.
#include <cstdint>
#include <string>

#include "riftco_transformer/pipelines.hpp"

namespace riftco_transformer::stage {

/// A lower bound of what one training step holds at its peak, in bytes:
/// every term is memory the step certainly allocates, so a refusal is never
/// a false alarm (the real peak is higher; docs/reliability.md).
struct MemoryEstimate {
  double parameters = 0;   // all weights (base and adapters)
  double training = 0;     // gradients + two Adam moments of the trainable weights
  double activations = 0;  // block boundaries, one block's working set, logits and their softmax
  double total() const { return parameters + training + activations; }
};

MemoryEstimate estimate_training_memory(const TransformerDimensions& dims, std::int64_t trainable_parameters,
                                        std::int64_t lora_parameters, const StageSettings& settings);

/// Physical memory, or the cgroup's limit or the address-space limit
/// (ulimit -v) when lower.
double available_memory_bytes();

/// ValueError "[op] this run needs at least X GiB (...) but the machine has Y GiB" when the estimate
/// exceeds what is available.
void check_memory_budget(const MemoryEstimate& estimate, const char* op);

}  // namespace riftco_transformer::stage
