#pragma once
// The pipelines' optimizer: plain Adam, or ZeRO-1's ShardedAdam when
// zero_stage is 1 and the job has more than one rank (docs/distributed.md).
// One interface for the training loop, the data-parallel step and the
// training checkpoints; the same bits either way. Private to the train layer.
#include <optional>
#include <span>
#include <vector>

#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/gradient_accumulator.hpp"
#include "riftco_transformer/zero_adam.hpp"

namespace riftco_transformer::stage {

class StageOptimizer {
 public:
  /// sharded: ShardedAdam over `communicator` (only meaningful with more
  /// than one rank; with one it is plain Adam, as ZeroRedundancyOptimizer).
  StageOptimizer(Communicator& communicator, std::vector<ParameterGroup> groups, const AdamOptions& options,
                 bool sharded);

  bool sharded() const { return zero_.has_value(); }
  const std::vector<Variable>& parameters() const;
  const std::vector<Adam::GroupInfo>& groups() const;
  void set_learning_rate(float lr);
  void zero_grad();
  /// One process (never sharded, since sharding needs world size > 1): the
  /// parameters' own gradients, or the accumulator's. An Error when sharded.
  float step();
  float step(const GradientAccumulator& accumulator);
  /// One process: Adam::backward_and_step (optimizer_in_backward): the
  /// backward pass of `loss`, graph released, with each update inside it.
  float backward_and_step(const Variable& loss);
  /// Data parallelism: gradients already averaged over the ranks
  /// (collective when sharded: every rank calls it for the same step).
  float step_averaged(std::span<const Tensor> gradients);
  /// The full moments (collective when sharded: every rank calls it).
  Adam::State state() const;
  /// The full state (as saved); a sharded optimizer keeps its shard.
  void set_state(const Adam::State& state);
  /// Bytes of Adam state (both moments) this rank holds.
  std::int64_t state_bytes() const;

 private:
  Adam& one_process(const char* call);
  std::optional<Adam> adam_;
  std::optional<ShardedAdam> zero_;
};

}  // namespace riftco_transformer::stage
