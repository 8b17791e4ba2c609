// The single-process communicator (the default): rank 0 of 1, every
// collective the identity, the same argument checks as the MPI one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/errors.hpp"

using namespace riftco_transformer;

TEST(SingleProcessCommunicator, IsRankZeroOfOne) {
  const auto comm = make_single_process_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(comm->kind(), "single-process");
}

TEST(SingleProcessCommunicator, WorldIsSingleProcessWithoutALauncher) {
  // ctest does not start this binary under mpirun, so even an MPI build must
  // not initialize MPI here.
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr) {
    GTEST_SKIP() << "started by an MPI launcher";
  }
  EXPECT_EQ(Communicator::world().kind(), "single-process");
  EXPECT_EQ(Communicator::world().world_size(), 1);
}

TEST(SingleProcessCommunicator, CollectivesAreTheIdentity) {
  const auto comm = make_single_process_communicator();
  const std::vector<float> original{1.5F, -2.25F, 3.0F, 1e-7F};
  std::vector<float> values = original;
  comm->all_reduce_sum(values);
  EXPECT_EQ(values, original);
  comm->all_reduce_average(values);
  EXPECT_EQ(values, original);
  comm->broadcast(values, 0);
  EXPECT_EQ(values, original);
  std::vector<float> out(original.size(), 0.0F);
  comm->reduce_scatter_sum(original, out);
  EXPECT_EQ(out, original);
  std::fill(out.begin(), out.end(), 0.0F);
  comm->all_gather(original, out);
  EXPECT_EQ(out, original);
  comm->barrier();
}

TEST(SingleProcessCommunicator, TensorOverloadsWriteInPlaceAndBumpTheVersion) {
  const auto comm = make_single_process_communicator();
  Tensor t = Tensor::from_data({2, 2}, {1.0F, 2.0F, 3.0F, 4.0F});
  const auto before = t.version();
  comm->all_reduce_average(t);
  EXPECT_GT(t.version(), before);
  EXPECT_EQ(t.to_vector(), (std::vector<float>{1.0F, 2.0F, 3.0F, 4.0F}));
  Tensor out = Tensor::zeros({4});
  comm->all_gather(t.reshape({4}), out);
  EXPECT_EQ(out.to_vector(), t.to_vector());
}

TEST(SingleProcessCommunicator, RejectsMismatchedSizesAndBadRoots) {
  const auto comm = make_single_process_communicator();
  std::vector<float> four(4), three(3);
  try {
    comm->reduce_scatter_sum(four, three);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("[reduce_scatter_sum] input of 4 elements and output of 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(comm->all_gather(three, four), ShapeError);
  try {
    comm->broadcast(four, 1);
    FAIL() << "expected ValueError";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("[broadcast] root 1 is not a rank of a world of 1"), std::string::npos)
        << e.what();
  }
  Tensor undefined;
  EXPECT_THROW(comm->all_reduce_sum(undefined), BackendError);
}

TEST(SingleProcessCommunicator, BuildReportsWhetherMpiIsIn) {
#ifdef RIFTCO_TEST_MPI_BUILT
  EXPECT_TRUE(mpi_built());
#else
  EXPECT_FALSE(mpi_built());
#endif
}
