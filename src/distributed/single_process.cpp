// The single-process communicator: rank 0 of 1; every collective is the identity.
#include <algorithm>
#include <cstdlib>
#include <iostream>

#include "collective_checks.hpp"
#include "riftco_transformer/distributed.hpp"

namespace riftco_transformer {
namespace {

class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string_view kind() const override { return "single-process"; }
  void all_reduce_sum(std::span<float> /*values*/) override {}
  void reduce_scatter_sum(std::span<const float> input, std::span<float> output) override {
    distributed_detail::check_reduce_scatter(input.size(), output.size(), 1);
    std::copy(input.begin(), input.end(), output.begin());
  }
  void all_gather(std::span<const float> input, std::span<float> output) override {
    distributed_detail::check_all_gather(input.size(), output.size(), 1);
    std::copy(input.begin(), input.end(), output.begin());
  }
  void broadcast(std::span<float> /*values*/, int root) override { distributed_detail::check_root(root, 1); }
  void barrier() override {}
  [[noreturn]] void abort(std::string_view message, int code) override {
    std::cerr << "[riftco rank 0/1] " << message << std::endl;
    std::_Exit(code);
  }
};

}  // namespace

std::unique_ptr<Communicator> make_single_process_communicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

}  // namespace riftco_transformer
