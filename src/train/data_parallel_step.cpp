// The data-parallel optimizer step and validation loss (rank_shards.hpp).
#include <cmath>

#include "rank_shards.hpp"
#include "stage_optimizer.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/gradient_accumulator.hpp"
#include "riftco_transformer/gradient_buckets.hpp"
#include "riftco_transformer/transformer.hpp"

namespace riftco_transformer::stage {

ShardedStep data_parallel_step(Communicator& comm, DecoderOnlyTransformer& model, StageOptimizer& adam,
                               GradientAccumulator& accumulator, GradientBucketer& buckets,
                               const std::vector<TokenBatch>& batches,
                               const std::function<void()>& start_pass, const std::function<void()>& end_pass,
                               const std::function<Error(const std::string&)>& diverged) {
  const int world = comm.world_size();
  const int rank = comm.rank();
  const auto micro_batches = static_cast<std::int64_t>(batches.size());
  std::int64_t step_targets = 0;  // every rank's rows of every micro-batch
  for (const TokenBatch& b : batches) step_targets += real_targets(b.targets);
  // [0]: this rank's share of the step's loss; [1 + r]: the first micro-batch
  // (1-based) whose loss was not finite on rank r, 0 when none.
  std::vector<float> summary(1 + static_cast<std::size_t>(world), 0.0F);
  double loss_share = 0.0;
  // The last micro-batch's backward reduces the accumulated sums plus its
  // own weighted gradient in buckets as they become final; a rank that runs
  // no such pass (no rows, or a diverged loss) still joins the same bucket
  // collectives after the loop (reduce).
  bool reduced_in_backward = false;
  for (std::int64_t k = 0; k < micro_batches; ++k) {
    const TokenBatch part = rank_rows(batches[static_cast<std::size_t>(k)], rank, world);
    const std::int64_t mine = real_targets(part.targets);
    if (mine == 0 && step_targets > 0) continue;  // weight 0: nothing to add
    start_pass();
    Variable loss = model.loss(part.tokens, part.targets, part.batch);
    const float value = loss.value().item();  // read on the host
    if (!std::isfinite(value)) {
      end_pass();
      summary[1 + static_cast<std::size_t>(rank)] = static_cast<float>(k + 1);
      break;
    }
    // This rank's share of the step's targets; × world, since the ranks' sum is averaged.
    const double share = step_targets > 0 ? static_cast<double>(mine) / static_cast<double>(step_targets)
                                          : 1.0 / static_cast<double>(micro_batches * world);
    if (k + 1 == micro_batches) {
      buckets.backward(loss, accumulator.gradients(), static_cast<float>(share * world), GraphAfterBackward::Release);
      reduced_in_backward = true;
      end_pass();
      loss_share += share * static_cast<double>(value);
      break;
    }
    loss.backward(GraphAfterBackward::Release);
    end_pass();
    loss = Variable();
    accumulator.add(static_cast<float>(share * world));
    adam.zero_grad();
    loss_share += share * static_cast<double>(value);
  }
  std::vector<Tensor> gradients;
  if (reduced_in_backward) {
    for (const Variable& p : adam.parameters()) gradients.push_back(p.grad());
    adam.zero_grad();
  } else {
    gradients = buckets.reduce(accumulator.gradients());
  }
  summary[0] = static_cast<float>(loss_share);
  comm.all_reduce_sum(std::span<float>(summary));
  for (int r = 0; r < world; ++r) {
    const auto k = static_cast<std::int64_t>(summary[1 + static_cast<std::size_t>(r)]);
    if (k == 0) continue;
    accumulator.clear();
    throw diverged("the training loss of micro-batch " + std::to_string(k) + " of " + std::to_string(micro_batches) +
                   " is not finite on rank " + std::to_string(r) + " of " + std::to_string(world));
  }
  ShardedStep result;
  result.loss = summary[0];
  accumulator.clear();
  try {
    // The same averaged gradients on every rank: the same outcome (ZeRO-1:
    // each rank updates its shard, then the parameters are all-gathered).
    result.grad_norm = adam.step_averaged(gradients);
  } catch (const ValueError& e) {
    throw diverged(e.what());
  }
  return result;
}

float data_parallel_loss(Communicator& comm, DecoderOnlyTransformer& model, const std::vector<TokenBatch>& batches) {
  const int world = comm.world_size();
  std::vector<float> shares(batches.size(), 0.0F);
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const TokenBatch part = rank_rows(batches[i], comm.rank(), world);
    const std::int64_t total = real_targets(batches[i].targets);
    const std::int64_t mine = real_targets(part.targets);
    if (mine == 0) continue;  // (a batch without targets: total 0, it adds nothing)
    const double weight = static_cast<double>(mine) / static_cast<double>(total);
    const Variable loss = model.loss(part.tokens, part.targets, part.batch);
    shares[i] = static_cast<float>(weight * loss.value().item());
  }
  comm.all_reduce_sum(std::span<float>(shares));
  // As one process: the mean over every real target (each batch's mean
  // weighted by its targets; a batch without one adds nothing).
  double sum = 0.0;
  std::int64_t targets = 0;
  for (std::size_t i = 0; i < batches.size(); ++i) {
    const std::int64_t total = real_targets(batches[i].targets);
    sum += static_cast<double>(total) * static_cast<double>(shares[i]);
    targets += total;
  }
  if (targets == 0) throw no_validation_targets(static_cast<std::int64_t>(batches.size()));  // on every rank alike
  return static_cast<float>(sum / static_cast<double>(targets));
}

}  // namespace riftco_transformer::stage
