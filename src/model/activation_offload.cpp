// The model's activation offload (activation_offload.hpp).
#include "activation_offload.hpp"

#include "../tensor/offload.hpp"

namespace riftco_transformer {

void ActivationOffload::park(const Tensor& input) {
  inputs_.push_back(input);
  detail::offload_to_host(input);
}

void ActivationOffload::before_call(std::size_t index) {
  if (index >= inputs_.size()) return;  // the forward call: not parked yet
  detail::restore_on_device(inputs_[index]);
  // Replays run last group first: the next group's replay and its backward
  // are done, so its input can leave the device again (its pinned copy kept).
  if (index + 1 < inputs_.size()) detail::evict_from_device(inputs_[index + 1]);
  if (index > 0) detail::prefetch_to_device(inputs_[index - 1]);
}

void ActivationOffload::finish_forward() { detail::release_offloaded_blocks(); }

}  // namespace riftco_transformer
