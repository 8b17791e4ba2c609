// The MPI communicator, run by CTest under `mpirun -np 2`: each collective
// against a reference every rank computes locally (sums in rank order), and
// the results bit-identical on every rank.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/random.hpp"

using namespace riftco_transformer;

namespace {

Communicator& comm() { return Communicator::world(); }

// Rank r's input: normals of mixed magnitudes, so the summation order shows in the bits.
std::vector<float> rank_values(int rank, std::size_t n, std::uint64_t seed) {
  Random random(seed * 1000 + static_cast<std::uint64_t>(rank));
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = random.normal() * (i % 3 == 0 ? 1e4F : (i % 3 == 1 ? 1.0F : 1e-3F));
  return v;
}

std::vector<float> rank_order_sum(std::size_t n, std::uint64_t seed) {
  std::vector<float> sum = rank_values(0, n, seed);
  for (int r = 1; r < comm().world_size(); ++r) {
    const auto v = rank_values(r, n, seed);
    for (std::size_t i = 0; i < n; ++i) sum[i] += v[i];
  }
  return sum;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp's pointers must not be null, even for zero bytes (an empty vector's data() may be).
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// Every rank's copy of `values` has the same bits as rank 0's.
void expect_identical_on_every_rank(const std::vector<float>& values) {
  std::vector<float> all(values.size() * static_cast<std::size_t>(comm().world_size()));
  comm().all_gather(values, all);
  if (values.empty()) return;  // nothing to compare (and memcmp must not see null pointers)
  for (int r = 1; r < comm().world_size(); ++r) {
    EXPECT_EQ(std::memcmp(all.data(), all.data() + static_cast<std::size_t>(r) * values.size(),
                          values.size() * sizeof(float)),
              0)
        << "rank " << r << " differs from rank 0";
  }
}

}  // namespace

TEST(MpiCommunicator, WorldIsMpiWithDistinctRanks) {
  ASSERT_TRUE(mpi_built());
  ASSERT_EQ(comm().kind(), "mpi");
  ASSERT_GE(comm().world_size(), 2) << "run under mpirun -np 2 (or more)";
  std::vector<float> mine{static_cast<float>(comm().rank())};
  std::vector<float> all(static_cast<std::size_t>(comm().world_size()));
  comm().all_gather(mine, all);
  for (int r = 0; r < comm().world_size(); ++r) EXPECT_EQ(all[static_cast<std::size_t>(r)], static_cast<float>(r));
}

TEST(MpiCommunicator, AllReduceSumIsTheRankOrderSumOnEveryRank) {
  // Sizes below, at and above the world size, uneven blocks, and one above
  // the 2^24-element chunk so the chunking is exercised.
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1001},
                              (std::size_t{1} << 24) + 5}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    auto values = rank_values(comm().rank(), n, n + 1);
    comm().all_reduce_sum(values);
    EXPECT_TRUE(same_bits(values, rank_order_sum(n, n + 1)));
    if (n <= 1001) expect_identical_on_every_rank(values);
  }
}

TEST(MpiCommunicator, AllReduceIsTheSameBitsEveryTime) {
  const auto input = rank_values(comm().rank(), 4099, 7);
  auto first = input;
  comm().all_reduce_sum(first);
  for (int trial = 0; trial < 3; ++trial) {
    auto again = input;
    comm().all_reduce_sum(again);
    EXPECT_TRUE(same_bits(first, again));
  }
}

TEST(MpiCommunicator, AllReduceAverageDividesTheSumByTheWorldSize) {
  const std::size_t n = 777;
  Tensor t = Tensor::from_data({7, 111}, rank_values(comm().rank(), n, 3));
  const auto version = t.version();
  comm().all_reduce_average(t);
  EXPECT_GT(t.version(), version);
  auto expected = rank_order_sum(n, 3);
  for (float& v : expected) v /= static_cast<float>(comm().world_size());
  EXPECT_TRUE(same_bits(t.to_vector(), expected));
  expect_identical_on_every_rank(t.to_vector());
}

TEST(MpiCommunicator, ReduceScatterGivesEachRankItsBlockOfTheSum) {
  const std::size_t block = 513;
  const auto world = static_cast<std::size_t>(comm().world_size());
  const auto input = rank_values(comm().rank(), block * world, 11);
  std::vector<float> output(block);
  comm().reduce_scatter_sum(input, output);
  const auto sum = rank_order_sum(block * world, 11);
  const auto start = sum.begin() + static_cast<std::ptrdiff_t>(block * static_cast<std::size_t>(comm().rank()));
  EXPECT_TRUE(same_bits(output, std::vector<float>(start, start + static_cast<std::ptrdiff_t>(block))));
}

TEST(MpiCommunicator, AllGatherConcatenatesInRankOrder) {
  const std::size_t n = 37;
  const auto world = comm().world_size();
  std::vector<float> output(n * static_cast<std::size_t>(world));
  comm().all_gather(rank_values(comm().rank(), n, 5), output);
  for (int r = 0; r < world; ++r) {
    const auto expected = rank_values(r, n, 5);
    EXPECT_EQ(std::memcmp(output.data() + static_cast<std::size_t>(r) * n, expected.data(), n * sizeof(float)), 0)
        << "block " << r;
  }
}

TEST(MpiCommunicator, BroadcastCopiesTheRootsValues) {
  for (int root = 0; root < comm().world_size(); ++root) {
    auto values = rank_values(comm().rank(), 300, 9);
    comm().broadcast(values, root);
    EXPECT_TRUE(same_bits(values, rank_values(root, 300, 9))) << "root " << root;
  }
  comm().barrier();
}

TEST(MpiCommunicator, ArgumentErrorsAreTypedAndRaisedBeforeAnyCommunication) {
  std::vector<float> four(4), three(3);
  EXPECT_THROW(comm().reduce_scatter_sum(four, three), ShapeError);
  EXPECT_THROW(comm().all_gather(three, four), ShapeError);
  try {
    comm().broadcast(four, comm().world_size());
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[broadcast] root"), std::string::npos) << e.what();
  }
  comm().barrier();  // both ranks are still in step
}
