// A job where rank 1 fails while rank 0 waits in an all-reduce. By default
// rank 1 throws: the exception escapes main, the terminate path prints it and
// calls MPI_Abort. With the argument "return", rank 1 prints the message and
// returns 1 from main: the exit path sees the status and calls MPI_Abort.
// Either way mpirun must end every rank non-zero (tests/mpi/expect_fail_fast.cmake
// checks the exit code, the message and the time).
#include <iostream>
#include <vector>

#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/errors.hpp"

#include <cstring>

int main(int argc, char** argv) {
  using namespace riftco_transformer;
  Communicator& comm = Communicator::world();
  std::vector<float> values(1024, 1.0F);
  comm.all_reduce_sum(values);  // every rank is up
  if (comm.rank() == 1) {
    if (argc > 1 && std::strcmp(argv[1], "return") == 0) {
      std::cerr << "[fail_one_rank] rank 1 fails on purpose (returns 1)" << std::endl;
      return 1;
    }
    throw ValueError("[fail_one_rank] rank 1 fails on purpose");
  }
  comm.all_reduce_sum(values);  // rank 0 waits here for a rank that is gone
  std::cout << "rank " << comm.rank() << " was not stopped" << std::endl;
  return 0;
}
