// The NCCL communicator on CUDA tensors (RIFTCO_NCCL builds). CTest runs it
// in one process (an N = 1 NCCL world over the single-process communicator:
// needs 1 GPU) and under `mpirun -np 2` (NCCL over MPI: needs 2 GPUs, one
// per rank); without enough devices every test skips, saying "needs N GPUs".
// Every collective is checked against the host communicator's bits on the
// same inputs (the single-process or MPI communicator), and against a
// reference each rank computes locally (rank-order sums).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "nccl_test_world.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/random.hpp"

using namespace riftco_transformer;
using rt_nccl_test::host;
using rt_nccl_test::nccl;
using rt_nccl_test::on_device;
using rt_nccl_test::rank_values;
using rt_nccl_test::same_bits;

namespace {

std::vector<float> rank_order_sum(std::size_t n, std::uint64_t seed) {
  std::vector<float> sum = rank_values(0, n, seed);
  for (int r = 1; r < host().world_size(); ++r) {
    const auto v = rank_values(r, n, seed);
    for (std::size_t i = 0; i < n; ++i) sum[i] += v[i];
  }
  return sum;
}

}  // namespace

// Not skipped: CTest says how many ranks it started (a launch that lost
// mpirun would otherwise skip as "needs 1 GPU" and pass for the 2-rank entry).
TEST(NcclCommunicator, RunsAtTheRankCountCTestStarted) {
  const char* wanted = std::getenv("RIFTCO_TEST_NCCL_RANKS");
  if (wanted == nullptr) GTEST_SKIP() << "RIFTCO_TEST_NCCL_RANKS not set (run by hand)";
  EXPECT_EQ(host().world_size(), std::atoi(wanted));
}

TEST(NcclCommunicator, IsNcclOverTheHostsRanks) {
  SKIP_WITHOUT_GPUS();
  EXPECT_EQ(nccl().kind(), "nccl");
  EXPECT_EQ(nccl().rank(), host().rank());
  EXPECT_EQ(nccl().world_size(), host().world_size());
  EXPECT_TRUE(nccl().accepts(Backend::Cuda));
  EXPECT_TRUE(nccl().accepts(Backend::Cpu));
  int device = -1;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  EXPECT_EQ(device, host().rank()) << "one host: the local rank is the rank";
}

TEST(NcclCommunicator, AllReduceSumHasTheHostCommunicatorsBits) {
  SKIP_WITHOUT_GPUS();
  // Below, at and above the world size, uneven blocks, and past the 2^24 chunk.
  for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{1001},
                              (std::size_t{1} << 24) + 5}) {
    SCOPED_TRACE("n = " + std::to_string(n));
    std::vector<float> expected = rank_values(host().rank(), n, n + 1);
    Tensor t = on_device(expected);
    const auto version = t.version();
    nccl().all_reduce_sum(t);
    EXPECT_GT(t.version(), version);
    host().all_reduce_sum(std::span<float>(expected));  // single-process / MPI bits
    EXPECT_TRUE(same_bits(t.to_vector(), expected));
    EXPECT_TRUE(same_bits(expected, rank_order_sum(n, n + 1)));
  }
}

TEST(NcclCommunicator, AllReduceAverageHasTheHostCommunicatorsBits) {
  SKIP_WITHOUT_GPUS();
  std::vector<float> expected = rank_values(host().rank(), 4099, 3);
  Tensor t = on_device(expected);
  nccl().all_reduce_average(t);
  host().all_reduce_average(std::span<float>(expected));
  EXPECT_TRUE(same_bits(t.to_vector(), expected));
}

TEST(NcclCommunicator, RepeatedAllReducesGiveTheSameBits) {
  SKIP_WITHOUT_GPUS();
  const auto input = rank_values(host().rank(), 70001, 9);
  Tensor first = on_device(input);
  nccl().all_reduce_sum(first);
  for (int i = 0; i < 3; ++i) {
    Tensor again = on_device(input);
    nccl().all_reduce_sum(again);
    EXPECT_TRUE(same_bits(again.to_vector(), first.to_vector()));
  }
}

TEST(NcclCommunicator, StartedAllReducesEqualTheBlockingOnesWaitedInAnyOrder) {
  SKIP_WITHOUT_GPUS();
  const std::vector<std::size_t> sizes{5, 1 << 20, 0, 333333, 1};
  std::vector<Tensor> tensors;
  std::vector<std::unique_ptr<CollectiveRequest>> requests;
  for (std::size_t k = 0; k < sizes.size(); ++k) tensors.push_back(on_device(rank_values(host().rank(), sizes[k], 40 + k)));
  for (Tensor& t : tensors) requests.push_back(nccl().start_all_reduce_sum(t));
  while (!requests.front()->test()) {
  }
  for (std::size_t k = requests.size(); k-- > 0;) requests[k]->wait();
  for (std::size_t k = 0; k < sizes.size(); ++k) {
    SCOPED_TRACE("request " + std::to_string(k));
    EXPECT_TRUE(requests[k]->test());
    EXPECT_TRUE(same_bits(tensors[k].to_vector(), rank_order_sum(sizes[k], 40 + k)));
  }
}

TEST(NcclCommunicator, ReduceScatterHasTheHostCommunicatorsBits) {
  SKIP_WITHOUT_GPUS();
  const auto world = static_cast<std::size_t>(host().world_size());
  for (const std::size_t m : {std::size_t{0}, std::size_t{1}, std::size_t{1001}}) {
    SCOPED_TRACE("m = " + std::to_string(m));
    const auto input = rank_values(host().rank(), m * world, 60 + m);
    std::vector<float> expected(m);
    host().reduce_scatter_sum(input, expected);
    Tensor out = Tensor::zeros({static_cast<std::int64_t>(m)}, Backend::Cuda);
    nccl().reduce_scatter_sum(on_device(input), out);
    EXPECT_TRUE(same_bits(out.to_vector(), expected));
  }
}

TEST(NcclCommunicator, AllGatherAndBroadcastMoveTheHostCommunicatorsBits) {
  SKIP_WITHOUT_GPUS();
  const auto world = static_cast<std::size_t>(host().world_size());
  const auto input = rank_values(host().rank(), 777, 80);
  std::vector<float> gathered(777 * world);
  host().all_gather(input, gathered);
  Tensor out = Tensor::zeros({static_cast<std::int64_t>(777 * world)}, Backend::Cuda);
  nccl().all_gather(on_device(input), out);
  EXPECT_TRUE(same_bits(out.to_vector(), gathered));

  const int root = host().world_size() - 1;
  std::vector<float> expected = rank_values(host().rank(), 1234, 90);
  Tensor t = on_device(expected);
  nccl().broadcast(t, root);
  host().broadcast(std::span<float>(expected), root);
  EXPECT_TRUE(same_bits(t.to_vector(), expected));
}

TEST(NcclCommunicator, HostSpansGoOverTheHostCommunicator) {
  SKIP_WITHOUT_GPUS();
  std::vector<float> via_nccl = rank_values(host().rank(), 1001, 5);
  std::vector<float> via_host = via_nccl;
  nccl().all_reduce_average(std::span<float>(via_nccl));
  host().all_reduce_average(std::span<float>(via_host));
  EXPECT_TRUE(same_bits(via_nccl, via_host));
  Tensor cpu = Tensor::from_data({3}, {1.0F, 2.0F, 3.0F});
  nccl().all_reduce_sum(cpu);  // a CPU tensor takes the host path
  const float w = static_cast<float>(host().world_size());
  EXPECT_EQ(cpu.to_vector(), (std::vector<float>{w, 2.0F * w, 3.0F * w}));
  nccl().barrier();
}

TEST(NcclCommunicator, BadArgumentsAreTypedErrorsBeforeAnyCommunication) {
  SKIP_WITHOUT_GPUS();
  const auto world = host().world_size();
  Tensor four = Tensor::zeros({4 * world + 1}, Backend::Cuda);
  Tensor three = Tensor::zeros({3}, Backend::Cuda);
  EXPECT_THROW(nccl().reduce_scatter_sum(four, three), ShapeError);
  EXPECT_THROW(nccl().all_gather(three, four), ShapeError);
  EXPECT_THROW(nccl().broadcast(three, world), ValueError);
  Tensor host_three = Tensor::zeros({3});
  try {
    nccl().all_gather(host_three, three);
    FAIL() << "expected BackendError";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("[all_gather] input (3) is on cpu but output (3) is on cuda"),
              std::string::npos)
        << e.what();
  }
  Tensor undefined;
  EXPECT_THROW(nccl().all_reduce_sum(undefined), BackendError);
  // Still usable afterwards: nothing was started.
  Tensor one = on_device({1.0F});
  nccl().all_reduce_sum(one);
  EXPECT_EQ(one.to_vector(), std::vector<float>{static_cast<float>(world)});
}

TEST(NcclCommunicator, HostCommunicatorsCopyOnTheDeviceAtWorldOneAndRefuseOtherwise) {
  SKIP_WITHOUT_GPUS();
  const auto values = rank_values(host().rank(), 257, 11);
  if (host().world_size() == 1) {
    const auto single = make_single_process_communicator();
    Tensor t = on_device(values);
    single->all_reduce_average(t);
    EXPECT_TRUE(same_bits(t.to_vector(), values));
    Tensor out = Tensor::zeros({257}, Backend::Cuda);
    single->reduce_scatter_sum(on_device(values), out);
    EXPECT_TRUE(same_bits(out.to_vector(), values));
    single->start_all_reduce_sum(t)->wait();
    EXPECT_TRUE(same_bits(t.to_vector(), values));
    return;
  }
  Tensor t = on_device(values);
  try {
    host().all_reduce_sum(t);
    FAIL() << "expected BackendError";
  } catch (const BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("moves host buffers only; this tensor (257) is on cuda"), std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(same_bits(t.to_vector(), values));  // untouched
}

// Last: a rank that never joins. With a 2 s limit, rank 0's wait ends in a
// CommunicationError naming the limit, the communicator is aborted, and its
// later collectives are refused. A second communicator (the first stays
// usable); N >= 2 only: at N = 1 no rank can be missing.
TEST(NcclCommunicator, AWaitIsBoundedAndAFailureAbortsTheCommunicator) {
  SKIP_WITHOUT_GPUS();
  if (host().world_size() < 2) GTEST_SKIP() << "needs 2 ranks: at N = 1 every rank takes part";
  ::setenv("RIFTCO_NCCL_WAIT_TIMEOUT", "2", 1);
  auto bounded = make_nccl_communicator(host());
  ::unsetenv("RIFTCO_NCCL_WAIT_TIMEOUT");
  if (host().rank() == 0) {
    Tensor t = on_device(rank_values(0, 1 << 20, 1));
    try {
      bounded->all_reduce_sum(t);
      FAIL() << "expected CommunicationError";
    } catch (const CommunicationError& e) {
      const std::string what = e.what();
      // Where it stops depends on NCCL: in the group's connection setup
      // (ncclGroupEnd in progress) or in the collective itself (its event).
      EXPECT_EQ(what.rfind("[all_reduce_sum] ", 0), 0U) << what;
      EXPECT_NE(what.find("2.000000 s (RIFTCO_NCCL_WAIT_TIMEOUT)"), std::string::npos) << what;
      EXPECT_NE(what.find("another rank did not take part on rank 0 of"), std::string::npos) << what;
    }
    try {
      bounded->all_reduce_sum(t);
      FAIL() << "expected CommunicationError";
    } catch (const CommunicationError& e) {
      EXPECT_NE(std::string(e.what()).find("was aborted after an earlier failure"), std::string::npos) << e.what();
    }
  }
  host().barrier();
  // The job's first communicator is untouched.
  Tensor one = on_device({1.0F});
  nccl().all_reduce_sum(one);
  EXPECT_EQ(one.to_vector(), std::vector<float>{static_cast<float>(host().world_size())});
  static_cast<void>(bounded.release());  // rank 1's half would wait for rank 0 in ncclCommFinalize: not destroyed
}
