// What the NCCL communicator does before NCCL starts, and the communicator
// choice, without a GPU (nccl_bootstrap.hpp): CTest runs it in one process
// and, in MPI builds, under `mpirun -np 3`, where the ncclUniqueId's bytes
// really cross ranks and the ranks share one host.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "distributed/nccl_bootstrap.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/errors.hpp"

using namespace riftco_transformer;
using namespace riftco_transformer::distributed_detail;

namespace {

Communicator& comm() { return Communicator::world(); }

bool launched() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(NcclBootstrap, EveryByteRoundTripsThroughAFloat) {
  std::vector<unsigned char> bytes(256);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(255 - i);
  const std::vector<float> values = bytes_as_floats(bytes);
  std::vector<unsigned char> back(bytes.size(), 7);
  floats_as_bytes(values, back, "test");
  EXPECT_EQ(back, bytes);
}

TEST(NcclBootstrap, AValueThatIsNotAByteIsACommunicationError) {
  std::vector<unsigned char> one(1);
  for (const float bad : {256.0F, -1.0F, 0.5F, std::numeric_limits<float>::quiet_NaN()}) {
    const std::vector<float> values{bad};
    const std::string what = error_of([&] { floats_as_bytes(values, one, "broadcast_bytes"); });
    EXPECT_TRUE(contains(what, "[broadcast_bytes] value 0 is")) << what;
    EXPECT_THROW(floats_as_bytes(values, one, "x"), CommunicationError);
  }
  const std::vector<float> two{1.0F, 2.0F};
  EXPECT_THROW(floats_as_bytes(two, one, "x"), CommunicationError);
}

TEST(NcclBootstrap, TheUniqueIdBytesOfRankZeroReachEveryRank) {
  // 129 bytes: an ncclUniqueId (128) and the flag byte the communicator sends with it.
  std::vector<unsigned char> id(129);
  for (std::size_t i = 0; i < id.size(); ++i) {
    id[i] = comm().rank() == 0 ? static_cast<unsigned char>((i * 37 + 11) % 256) : static_cast<unsigned char>(0xAA);
  }
  broadcast_bytes(comm(), id, 0);
  for (std::size_t i = 0; i < id.size(); ++i) {
    ASSERT_EQ(id[i], static_cast<unsigned char>((i * 37 + 11) % 256)) << "byte " << i << " on rank " << comm().rank();
  }
}

TEST(NcclBootstrap, RanksOnOneHostGetLocalRanksInRankOrder) {
  const LocalPlacement here = local_placement(comm(), this_host_name());
  EXPECT_EQ(here.local_rank, comm().rank());  // CTest starts every rank on this machine
  EXPECT_EQ(here.local_size, comm().world_size());
  EXPECT_EQ(here.host, this_host_name());
  // Two "hosts" by parity: rank r is local rank r / 2 of ceil or floor of world / 2.
  const int world = comm().world_size();
  const int rank = comm().rank();
  const LocalPlacement split = local_placement(comm(), rank % 2 == 0 ? "even-host" : "odd-host");
  EXPECT_EQ(split.local_rank, rank / 2);
  EXPECT_EQ(split.local_size, rank % 2 == 0 ? (world + 1) / 2 : world / 2);
}

TEST(NcclBootstrap, EachRankTakesTheDeviceOfItsLocalRank) {
  LocalPlacement placement;
  placement.local_rank = 1;
  placement.local_size = 2;
  placement.host = "node7";
  EXPECT_EQ(device_for_rank(placement, 2, 3, 4), 1);
  EXPECT_EQ(device_for_rank(placement, 8, 3, 4), 1);
  const std::string what = error_of([&] { device_for_rank(placement, 1, 3, 4); });
  EXPECT_TRUE(contains(what, "[nccl] rank 3 of 4: host 'node7' runs 2 ranks but has 1 CUDA device(s) visible")) << what;
  EXPECT_TRUE(contains(what, "one device per rank")) << what;
  EXPECT_THROW(device_for_rank(placement, 0, 3, 4), BackendError);
}

TEST(NcclBootstrap, MoreRanksThanDevicesFailsOnEveryRank) {
  // The last rank's "host" has no device: it names its host, the others say how many ranks lack one.
  const int world = comm().world_size();
  const int last = world - 1;
  const LocalPlacement placement = local_placement(comm(), comm().rank() == last ? "no-gpu-host" : "gpu-host");
  const int devices = comm().rank() == last ? 0 : world;
  const std::string what = error_of([&] { agree_on_device(comm(), placement, devices); });
  if (comm().rank() == last) {
    EXPECT_TRUE(contains(what, "host 'no-gpu-host' runs 1 ranks but has 0 CUDA device(s)")) << what;
  } else {
    EXPECT_TRUE(contains(what, "1 rank(s) have no CUDA device of their own")) << what;
  }
  // Enough devices everywhere: each rank its local rank, and nobody fails.
  const LocalPlacement here = local_placement(comm(), this_host_name());
  EXPECT_EQ(agree_on_device(comm(), here, world), comm().rank());
}

TEST(NcclBootstrap, TheWaitLimitIsValidatedLikeMpis) {
  ::unsetenv("RIFTCO_NCCL_WAIT_TIMEOUT");
  EXPECT_EQ(nccl_wait_limit(), 600.0);
  ::setenv("RIFTCO_NCCL_WAIT_TIMEOUT", "2.5", 1);
  EXPECT_EQ(nccl_wait_limit(), 2.5);
  for (const char* bad : {"nan", "inf", "0", "-3", "abc", "5s"}) {
    ::setenv("RIFTCO_NCCL_WAIT_TIMEOUT", bad, 1);
    const std::string what = error_of([] { nccl_wait_limit(); });
    EXPECT_TRUE(contains(what, std::string("RIFTCO_NCCL_WAIT_TIMEOUT is '") + bad + "'; expected a number of seconds"))
        << what;
  }
  ::unsetenv("RIFTCO_NCCL_WAIT_TIMEOUT");
}

TEST(NcclSelection, TheCommunicatorFollowsTheModelsBackendAndTheLauncher) {
  for (const bool nccl : {false, true}) {
    for (const bool mpi : {false, true}) {
      EXPECT_EQ(communicator_kind_for(Backend::Cpu, false, mpi, nccl), "single-process");
      EXPECT_EQ(communicator_kind_for(Backend::Cuda, false, mpi, nccl), "single-process");
    }
    EXPECT_EQ(communicator_kind_for(Backend::Cpu, true, true, nccl), "mpi");
    // Without MPI every process is alone, as for CPU models.
    EXPECT_EQ(communicator_kind_for(Backend::Cuda, true, false, nccl), "single-process");
  }
  EXPECT_EQ(communicator_kind_for(Backend::Cuda, true, true, true), "nccl");
  const std::string what = error_of([] { communicator_kind_for(Backend::Cuda, true, true, false); });
  EXPECT_TRUE(contains(what, "a cuda model under an MPI launcher needs the nccl communicator, and this build has none"))
      << what;
  EXPECT_TRUE(contains(what, "not copied through the host")) << what;
  EXPECT_THROW(communicator_kind_for(Backend::Cuda, true, true, false), BackendError);
}

TEST(NcclSelection, WorldForFollowsTheRules) {
  EXPECT_EQ(&Communicator::world_for(Backend::Cpu), &Communicator::world());
  if (!launched() || !mpi_built()) {
    EXPECT_EQ(&Communicator::world_for(Backend::Cuda), &Communicator::world());
    EXPECT_EQ(Communicator::world_for(Backend::Cuda).kind(), "single-process");
  } else if (!nccl_built()) {
    EXPECT_THROW(Communicator::world_for(Backend::Cuda), BackendError);
  }
  // With NCCL under a launcher: tests/nccl/test_nccl_communicator.cpp (needs GPUs).
}

TEST(NcclSelection, BuildReportsWhetherNcclIsIn) {
#ifdef RIFTCO_TEST_NCCL_BUILT
  EXPECT_TRUE(nccl_built());
#else
  EXPECT_FALSE(nccl_built());
  const std::string what = error_of([] { make_nccl_communicator(comm()); });
  EXPECT_TRUE(contains(what, "[nccl] rank " + std::to_string(comm().rank()) + " of " +
                                 std::to_string(comm().world_size()) +
                                 ": the nccl communicator is not built in this package"))
      << what;
  EXPECT_THROW(make_nccl_communicator(comm()), BackendError);
#endif
}

TEST(NcclSelection, HostCommunicatorsStillRefuseUndefinedTensorsAndKeepTheirKind) {
  Tensor undefined;
  const std::string what = error_of([&] { comm().all_reduce_sum(undefined); });
  EXPECT_TRUE(contains(what, "[all_reduce_sum] collectives take defined tensors")) << what;
  EXPECT_FALSE(comm().accepts(Backend::Cuda));
  EXPECT_TRUE(comm().accepts(Backend::Cpu));
}
