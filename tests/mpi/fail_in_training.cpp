// A 2-rank pretraining job in which rank 1's progress callback throws at
// step 2 while rank 0 goes on into the next step's collectives. The pipeline
// must end the whole job with the message (tests/mpi/expect_fail_fast.cmake
// checks the exit code, the message and the time), never leave rank 0
// waiting. ARG "setup": rank 0 cannot create the output directory instead
// (a file is in the way): every rank must stop, none may hang.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/pipelines.hpp"

int main(int argc, char** argv) {
  using namespace riftco_transformer;
  namespace fs = std::filesystem;
  Communicator& comm = Communicator::world();
  const bool setup = argc > 1 && std::strcmp(argv[1], "setup") == 0;
  // In the working directory (CTest's: the build tree), one folder per
  // case: concurrent jobs (ctest -j, other checkouts) must not share it.
  const fs::path dir = fs::current_path() / (std::string("mpi_fail_in_training_") + (setup ? "setup" : "step"));
  if (comm.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::string text;
    for (int i = 0; i < 100; ++i) text += "the quick brown fox jumps over the lazy dog.\n";
    std::ofstream(dir / "corpus.txt") << text;
    if (setup) std::ofstream(dir / "run") << "a file, not a folder";
  }
  comm.barrier();
  PretrainingConfig c;
  c.dimensions = {256, 32, 16, 2, 2, 32};
  c.data = dir / "corpus.txt";
  c.steps = 50;
  c.batch = 2;
  c.sequence_length = 16;
  c.output_dir = dir / "run";
  run_pretraining(c, comm, [&](const StepReport& r) {
    if (comm.rank() == 1 && r.step == 2) throw ValueError("[fail_in_training] rank 1 fails on purpose at step 2");
    return true;
  });
  std::cout << "rank " << comm.rank() << " was not stopped" << std::endl;
  return 0;
}
