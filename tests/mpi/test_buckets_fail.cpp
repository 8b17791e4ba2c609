// A data-parallel backward with gradient buckets where one rank fails while
// the other waits for a bucket's all-reduce. Mode "throw" (default): rank 1
// throws inside backward after its first bucket started; the exception
// escapes main and the terminate path aborts the job. Mode "hang": rank 1
// never joins (sleeps 60 s); rank 0's bounded wait (RIFTCO_MPI_WAIT_TIMEOUT)
// throws a CommunicationError, which ends the job. Either way mpirun must end
// every rank non-zero, fast, with the message (expect_fail_fast.cmake).
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/gradient_buckets.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/random.hpp"

int main(int argc, char** argv) {
  using namespace riftco_transformer;
  Communicator& comm = Communicator::world();
  const bool hang = argc > 1 && std::strcmp(argv[1], "hang") == 0;
  Random init(1);
  std::vector<Variable> params;
  for (int k = 0; k < 4; ++k) params.emplace_back(Tensor::normal({32, 32}, init, 0.0F, 0.1F), true, "w" + std::to_string(k));
  // 4 KiB per parameter, one bucket each.
  GradientBucketer bucketer(comm, params, BucketOptions{4.0 / 1024.0, true});
  Variable h(Tensor::normal({4, 32}, init), false, "x");
  for (std::size_t k = 0; k < params.size(); ++k) {
    h = matmul(h, params[k]);
    if (k == 1 && comm.rank() == 1 && !hang) {
      // Between w1 and w2: its backward runs after bucket 0 (w3) and 1 (w2) started.
      h = Variable::from_op("fail", h.value(), {h}, [](const Tensor&, const std::vector<bool>&) -> std::vector<Tensor> {
        throw BackwardError("[buckets_fail] rank 1 fails inside backward on purpose");
      });
    }
  }
  const Variable loss = sum(h);
  if (hang && comm.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  bucketer.backward(loss);
  std::cout << "rank " << comm.rank() << " was not stopped" << std::endl;
  return 0;
}
