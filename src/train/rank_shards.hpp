#pragma once
// Data parallelism inside the train layer (docs/distributed.md): which rows
// of a batch a rank trains on, the random states every rank must save, and
// the agreement that keeps a failure on one rank from leaving the others
// waiting. Private to the train layer.
#include <cstdint>
#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "riftco_transformer/data.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/gradient_buckets.hpp"
#include "riftco_transformer/pipelines.hpp"
#include "riftco_transformer/random.hpp"
#include "riftco_transformer/tokenizer.hpp"

namespace riftco_transformer::stage {

/// ValueError before anything is written when the job's ranks cannot split
/// every micro-batch evenly (batch must be a multiple of the world size), or
/// when optimizer_in_backward meets more than one rank.
void check_world(const StageSettings& s, const Communicator& comm, const char* op);

/// The settings each rank may choose for itself: how it keeps activations
/// (the bits and the collectives are the same either way). Every other
/// field of a run's configuration must be the same on every rank.
inline constexpr const char* kPerRankSettings[] = {"activation_checkpointing", "checkpoint_segment_blocks",
                                                   "activation_memory_budget", "activation_offload"};

/// What the ranks must agree on: `config` (a run's metadata.json "config",
/// with its data, base-model and tokenizer fingerprints) without
/// kPerRankSettings, plus the stage and resume.
nlohmann::json agreed_config(const nlohmann::json& config, const std::string& stage, bool resume);

/// The first collective of a run (config_agreement.cpp): every rank's
/// `agreed` text is gathered (two all-gathers whose sizes do not depend on
/// the configuration); when any rank's differs from rank 0's, every rank
/// throws the same ValueError naming the first differing field and both
/// ranks' values. Nothing at world size 1.
void check_same_config(Communicator& comm, const nlohmann::json& agreed, const std::string& op);

/// Rows [rank·b/world, (rank+1)·b/world) of a batch of b rows (b a multiple of world).
TokenBatch rank_rows(const TokenBatch& batch, int rank, int world);

/// Targets that are not kIgnoreTarget.
std::int64_t real_targets(const std::vector<std::int32_t>& targets);

/// The DataError of a validation whose `batches` batches hold no real target
/// (a mean over no target has no value; 0 would read as a perfect model).
DataError no_validation_targets(std::int64_t batches);

/// The seed of rank `rank`'s dropout stream: seed + 1 on rank 0 (as in a
/// single process), a different stream on every other rank.
std::uint64_t rank_dropout_seed(std::uint64_t seed, int rank);

/// Every rank's `mine`, in rank order (one all-gather).
std::vector<Random::State> gather_random_states(Communicator& comm, const Random::State& mine);

/// Every rank's `mine` (a count, < 2^64), in rank order (one all-gather).
std::vector<std::uint64_t> gather_counts(Communicator& comm, std::uint64_t mine);

/// The end of a phase in which a rank may fail alone (rank 0 writing files):
/// every rank says whether it failed (one all-reduce). A rank that failed
/// rethrows its own error; the others throw a CommunicationError naming
/// the ranks that failed and the phase. Nothing happens when no rank failed.
void agree(Communicator& comm, const std::exception_ptr& error, const std::string& op, const std::string& phase);

}  // namespace riftco_transformer::stage

namespace riftco_transformer {
class GradientAccumulator;
class DecoderOnlyTransformer;
}  // namespace riftco_transformer

namespace riftco_transformer::stage {

/// One optimizer step of a data-parallel job (world_size > 1). Every rank
/// holds the step's K global micro-batches; each trains on its rows of each
/// (rank_rows), weights micro-batch k's gradient by world_size × its share of
/// the step's real targets, and the gradients are averaged over the ranks
/// by `buckets` during the last micro-batch's backward (over the
/// accumulated sums), so the update is that of one process on the whole
/// batch up to summation order. The loss is the global one on every
/// rank. A non-finite loss or gradient anywhere is `diverged(...)` thrown on
/// every rank alike, before the weights change. start_pass / end_pass wrap
/// each forward + backward (memory accounting).
struct ShardedStep {
  float loss = 0.0F;
  float grad_norm = 0.0F;
};
class StageOptimizer;
ShardedStep data_parallel_step(Communicator& comm, DecoderOnlyTransformer& model, StageOptimizer& adam,
                               GradientAccumulator& accumulator, GradientBucketer& buckets,
                               const std::vector<TokenBatch>& batches,
                               const std::function<void()>& start_pass, const std::function<void()>& end_pass,
                               const std::function<Error(const std::string&)>& diverged);

/// The mean over `batches` (validation batches, every rank the same ones) of
/// each batch's mean loss, each rank computing its rows; the same value on
/// every rank.
float data_parallel_loss(Communicator& comm, DecoderOnlyTransformer& model, const std::vector<TokenBatch>& batches);

}  // namespace riftco_transformer::stage
