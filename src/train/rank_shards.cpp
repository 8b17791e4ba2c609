// Data-parallel helpers of the stage loop: row shards, per-rank random
// states, and the agreement after a phase where one rank may fail alone.
#include "rank_shards.hpp"

#include <algorithm>
#include <cstring>

#include "../distributed/gather_words.hpp"
#include "riftco_transformer/errors.hpp"
#include "stage_loop.hpp"

namespace riftco_transformer::stage {

void check_world(const StageSettings& s, const Communicator& comm, const char* op) {
  const int world = comm.world_size();
  check_optimizer_in_backward(s, world, op);
  if (world > 1 && s.batch % world != 0) {
    throw ValueError(std::string("[") + op + "] batch " + std::to_string(s.batch) +
                     " (rows per micro-batch, the global batch) is not divisible by the " + std::to_string(world) +
                     " ranks of this job: each rank trains on batch / world_size rows; use a multiple of " +
                     std::to_string(world));
  }
}

TokenBatch rank_rows(const TokenBatch& batch, int rank, int world) {
  if (world == 1) return batch;
  const std::int64_t rows = batch.batch / world;
  const auto first = static_cast<std::ptrdiff_t>(rows * rank * batch.seq_len);
  const auto count = static_cast<std::ptrdiff_t>(rows * batch.seq_len);
  TokenBatch part;
  part.batch = rows;
  part.seq_len = batch.seq_len;
  part.tokens.assign(batch.tokens.begin() + first, batch.tokens.begin() + first + count);
  part.targets.assign(batch.targets.begin() + first, batch.targets.begin() + first + count);
  return part;
}

std::int64_t real_targets(const std::vector<std::int32_t>& targets) {
  return static_cast<std::int64_t>(
      std::count_if(targets.begin(), targets.end(), [](std::int32_t t) { return t != kIgnoreTarget; }));
}

DataError no_validation_targets(std::int64_t batches) {
  return DataError("[evaluate] the " + std::to_string(batches) +
                   " validation batches hold no target: every row's response is cut off or masked (are the "
                   "validation examples' prompts longer than the sequence length?); raise --sequence-length, "
                   "--eval-batches or the validation fraction");
}

std::uint64_t rank_dropout_seed(std::uint64_t seed, int rank) {
  return seed + 1 + static_cast<std::uint64_t>(rank) * 0xD1B54A32D192ED03ULL;
}

namespace {

// A Random::State as 4 words; the spare normal by its bytes.
constexpr std::size_t kStateWords = 4;

void pack(const Random::State& s, std::uint64_t* words) {
  words[0] = s.state;
  words[1] = s.increment;
  words[2] = s.has_spare_normal ? 1U : 0U;
  words[3] = 0;
  std::memcpy(&words[3], &s.spare_normal, sizeof s.spare_normal);
}

Random::State unpack(const std::uint64_t* words) {
  Random::State s;
  s.state = words[0];
  s.increment = words[1];
  s.has_spare_normal = words[2] != 0;
  std::memcpy(&s.spare_normal, &words[3], sizeof s.spare_normal);
  return s;
}

}  // namespace

std::vector<Random::State> gather_random_states(Communicator& comm, const Random::State& mine) {
  std::uint64_t packed[kStateWords];
  pack(mine, packed);
  const std::vector<std::uint64_t> all = distributed_detail::all_gather_words(comm, packed);
  std::vector<Random::State> states;
  for (std::size_t w = 0; w < all.size(); w += kStateWords) states.push_back(unpack(all.data() + w));
  return states;
}

std::vector<std::uint64_t> gather_counts(Communicator& comm, std::uint64_t mine) {
  return distributed_detail::all_gather_words(comm, {&mine, 1});
}

void agree(Communicator& comm, const std::exception_ptr& error, const std::string& op, const std::string& phase) {
  if (comm.world_size() == 1) {
    if (error) std::rethrow_exception(error);
    return;
  }
  std::vector<float> failed(static_cast<std::size_t>(comm.world_size()), 0.0F);
  failed[static_cast<std::size_t>(comm.rank())] = error ? 1.0F : 0.0F;
  comm.all_reduce_sum(std::span<float>(failed));
  if (error) std::rethrow_exception(error);
  std::string ranks;
  for (std::size_t r = 0; r < failed.size(); ++r) {
    if (failed[r] != 0.0F) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!ranks.empty()) {
    throw CommunicationError("[" + op + "] rank " + ranks + " of " + std::to_string(comm.world_size()) +
                             " failed " + phase + " (its message is on its standard error); every rank stops");
  }
}

}  // namespace riftco_transformer::stage
