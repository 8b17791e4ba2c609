#pragma once
// The model's activation offload (DecoderOnlyTransformer::
// set_activation_offload): which tensors of one forward are parked in host
// memory and when they come back. The checkpoint primitive is unchanged: the
// group's callable itself brings its input back when it runs as a replay.
#include <cstddef>
#include <memory>
#include <vector>

#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer {

/// One forward's parked group inputs, in forward order. Shared by the
/// callables of that forward's checkpoints (so it lives as long as the graph).
class ActivationOffload {
 public:
  /// The index the next park() takes (a group's callable is made before its
  /// input is parked).
  std::size_t next_index() const { return inputs_.size(); }
  /// Parks a checkpointed group's input once its forward has run.
  void park(const Tensor& input);
  /// Called first by group `index`'s callable. In the forward (the input is
  /// not parked yet) nothing; in a replay, the group's input back on the
  /// device, the next group's input (its replay done) off it again, and the
  /// previous group's copy back started (prefetch one ahead).
  void before_call(std::size_t index);
  /// After the last group: the last parked block goes back to the allocator.
  void finish_forward();

 private:
  std::vector<Tensor> inputs_;
};

}  // namespace riftco_transformer
