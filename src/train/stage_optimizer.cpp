// StageOptimizer: Adam or ZeRO-1's ShardedAdam behind one interface.
#include "stage_optimizer.hpp"

#include <string>

#include "riftco_transformer/errors.hpp"

namespace riftco_transformer::stage {

StageOptimizer::StageOptimizer(Communicator& communicator, std::vector<ParameterGroup> groups,
                               const AdamOptions& options, bool sharded) {
  if (sharded && communicator.world_size() > 1) {
    zero_.emplace(communicator, std::move(groups), options);
  } else {
    adam_.emplace(std::move(groups), options);
  }
}

const std::vector<Variable>& StageOptimizer::parameters() const {
  return zero_ ? zero_->parameters() : adam_->parameters();
}

const std::vector<Adam::GroupInfo>& StageOptimizer::groups() const {
  return zero_ ? zero_->groups() : adam_->groups();
}

void StageOptimizer::set_learning_rate(float lr) {
  if (zero_) {
    zero_->set_learning_rate(lr);
  } else {
    adam_->set_learning_rate(lr);
  }
}

void StageOptimizer::zero_grad() {
  if (zero_) {
    zero_->zero_grad();
  } else {
    adam_->zero_grad();
  }
}

Adam& StageOptimizer::one_process(const char* call) {
  if (zero_) {
    throw Error(std::string("[StageOptimizer] ") + call +
                " is the one-process step, but this optimizer is ZeRO-1's ShardedAdam (world size > 1): "
                "a data-parallel step calls step_averaged");
  }
  return *adam_;
}

float StageOptimizer::step() { return one_process("step()").step(); }

float StageOptimizer::step(const GradientAccumulator& accumulator) {
  return one_process("step(accumulator)").step(accumulator);
}

float StageOptimizer::backward_and_step(const Variable& loss) {
  return one_process("backward_and_step(loss)").backward_and_step(loss, GraphAfterBackward::Release);
}

float StageOptimizer::step_averaged(std::span<const Tensor> gradients) {
  return zero_ ? zero_->step(gradients, ShardedAdam::Gradients::Averaged) : adam_->step(gradients);
}

Adam::State StageOptimizer::state() const { return zero_ ? zero_->state() : adam_->state(); }

void StageOptimizer::set_state(const Adam::State& state) {
  if (zero_) {
    zero_->set_state(state);
  } else {
    adam_->set_state(state);
  }
}

std::int64_t StageOptimizer::state_bytes() const {
  if (zero_) return zero_->state_bytes();
  std::int64_t bytes = 0;
  for (const Variable& p : adam_->parameters()) bytes += 2 * p.value().nbytes();
  return bytes;
}

}  // namespace riftco_transformer::stage
