// Data-parallel helpers of the stage loop: row shards, per-rank random
// states, and the agreement after a phase where one rank may fail alone.
#include "rank_shards.hpp"

#include <algorithm>
#include <cstring>

#include "riftco_transformer/errors.hpp"

namespace riftco_transformer::stage {

void check_world(const StageSettings& s, const Communicator& comm, const char* op) {
  const int world = comm.world_size();
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

std::uint64_t rank_dropout_seed(std::uint64_t seed, int rank) {
  return seed + 1 + static_cast<std::uint64_t>(rank) * 0xD1B54A32D192ED03ULL;
}

namespace {

// A Random::State as 16 floats of 16 bits each (exact): the communicator moves floats.
constexpr std::size_t kStateFloats = 16;

void pack(const Random::State& s, float* out) {
  std::uint64_t words[4] = {s.state, s.increment, s.has_spare_normal ? 1U : 0U, 0};
  std::memcpy(&words[3], &s.spare_normal, sizeof words[3]);
  for (std::size_t w = 0; w < 4; ++w) {
    for (std::size_t i = 0; i < 4; ++i) out[4 * w + i] = static_cast<float>((words[w] >> (16 * i)) & 0xFFFFU);
  }
}

Random::State unpack(const float* in) {
  std::uint64_t words[4] = {};
  for (std::size_t w = 0; w < 4; ++w) {
    for (std::size_t i = 0; i < 4; ++i) words[w] |= static_cast<std::uint64_t>(in[4 * w + i]) << (16 * i);
  }
  Random::State s;
  s.state = words[0];
  s.increment = words[1];
  s.has_spare_normal = words[2] != 0;
  std::memcpy(&s.spare_normal, &words[3], sizeof words[3]);
  return s;
}

}  // namespace

std::vector<Random::State> gather_random_states(Communicator& comm, const Random::State& mine) {
  float packed[kStateFloats];
  pack(mine, packed);
  const auto world = static_cast<std::size_t>(comm.world_size());
  std::vector<float> all(kStateFloats * world);
  comm.all_gather(std::span<const float>(packed, kStateFloats), std::span<float>(all));
  std::vector<Random::State> states;
  for (std::size_t r = 0; r < world; ++r) states.push_back(unpack(all.data() + kStateFloats * r));
  return states;
}

std::vector<std::uint64_t> gather_counts(Communicator& comm, std::uint64_t mine) {
  float pieces[4];  // 16 bits each: exact as floats
  for (std::size_t i = 0; i < 4; ++i) pieces[i] = static_cast<float>((mine >> (16 * i)) & 0xFFFFU);
  const auto world = static_cast<std::size_t>(comm.world_size());
  std::vector<float> all(4 * world);
  comm.all_gather(std::span<const float>(pieces, 4), std::span<float>(all));
  std::vector<std::uint64_t> counts(world, 0);
  for (std::size_t r = 0; r < world; ++r) {
    for (std::size_t i = 0; i < 4; ++i) counts[r] |= static_cast<std::uint64_t>(all[4 * r + i]) << (16 * i);
  }
  return counts;
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
