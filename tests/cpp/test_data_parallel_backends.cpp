// Data parallelism's backend rules without a GPU: a CPU model on a device
// communicator (the nccl one's contract, faked) is a BackendError naming
// both, raised by GradientBucketer, ShardedAdam and synchronize_gradients
// before any communication or change; and the kernel table's flat-buffer
// kernels those paths pack with, on the CPU, against plain loops. The CUDA
// side is tests/nccl/test_nccl_data_parallel.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../../src/backend/kernels.hpp"
#include "backend_error.hpp"
#include "model_fixtures.hpp"
#include "riftco_transformer/data_parallel.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/gradient_buckets.hpp"
#include "riftco_transformer/zero_adam.hpp"

using namespace riftco_transformer;
using rt_test::backend_error;
using rt_test::randn;

namespace {

/// Rank 1 of 2 of a communicator that takes CUDA tensors (as the nccl one
/// does); counts the collectives it is asked for.
class DeviceCommunicator final : public Communicator {
 public:
  int rank() const override { return 1; }
  int world_size() const override { return 2; }
  std::string_view kind() const override { return "nccl"; }
  bool accepts(Backend) const override { return true; }
  void all_reduce_sum(std::span<float>) override { ++calls; }
  void reduce_scatter_sum(std::span<const float>, std::span<float>) override { ++calls; }
  void all_gather(std::span<const float>, std::span<float>) override { ++calls; }
  void broadcast(std::span<float>, int) override { ++calls; }
  void barrier() override { ++calls; }
  [[noreturn]] void abort(std::string_view, int) override { std::abort(); }
  int calls = 0;
};

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST(DataParallelBackends, ACpuModelOnADeviceCommunicatorIsRefusedNamingBothBeforeAnything) {
  DeviceCommunicator device;
  const std::vector<Variable> params{Variable(randn({4, 3}, 1), true, "w"), Variable(randn({3}, 2), true, "b")};
  std::vector<Tensor> gradients{randn({4, 3}, 3), randn({3}, 4)};
  const Tensor kept = gradients[0];
  const std::string expected =
      "the model is on cpu (parameter 0 'w' (4, 3)) but the nccl communicator (rank 1 of 2) reduces cuda tensors";
  const std::string bucketer = backend_error([&] { GradientBucketer(device, params); });
  EXPECT_NE(bucketer.find("[GradientBucketer] " + expected), std::string::npos) << bucketer;
  const std::string zero = backend_error([&] { ShardedAdam(device, params); });
  EXPECT_NE(zero.find("[ShardedAdam] " + expected), std::string::npos) << zero;
  const std::string sync = backend_error([&] { synchronize_gradients(device, params, gradients); });
  EXPECT_NE(sync.find("[synchronize_gradients] " + expected), std::string::npos) << sync;
  EXPECT_EQ(device.calls, 0);
  EXPECT_TRUE(gradients[0].shares_storage(kept));
  EXPECT_TRUE(bit_equal(gradients[0], randn({4, 3}, 3)));
  // The same model on a host communicator: accepted (the CPU path, unchanged).
  const auto single = make_single_process_communicator();
  const std::uint64_t version = kept.version();
  synchronize_gradients(*single, params, gradients);  // reads the inputs: no version bump, new outputs
  EXPECT_EQ(kept.version(), version);
  EXPECT_FALSE(gradients[0].shares_storage(kept));
  EXPECT_TRUE(bit_equal(gradients[0], kept));
  GradientBucketer buckets(*single, params);
  EXPECT_EQ(buckets.backend(), Backend::Cpu);
  EXPECT_EQ(ShardedAdam(*single, params).backend(), Backend::Cpu);
}

TEST(DataParallelBackends, FlatBufferKernelsOnTheCpuAreThePlainLoops) {
  const backend::Kernels& cpu = backend::kernels(Backend::Cpu);
  const Tensor x = randn({1001}, 5);
  std::vector<float> out(1001, -1.0F);
  cpu.copy_values(x.values().data(), out.data(), 1001);
  EXPECT_TRUE(same_bits(out, x.values()));
  cpu.fill_values(out.data() + 10, 5, 0.0F);
  for (int i = 10; i < 15; ++i) EXPECT_EQ(out[static_cast<std::size_t>(i)], 0.0F);
  EXPECT_EQ(out[15], x.values()[15]);
  cpu.divide_values(out.data(), out.data(), 1001, 3.0F);  // in place
  for (std::size_t i = 0; i < out.size(); ++i) {
    const float v = i >= 10 && i < 15 ? 0.0F : x.values()[i] / 3.0F;
    ASSERT_EQ(std::memcmp(&out[i], &v, sizeof(float)), 0) << i;
  }
  // The norm's terms: one per 32768-element chunk of each span, in order,
  // adding up to sum_of_squares bit for bit.
  const Tensor big = randn({70000}, 6);
  const Tensor small = randn({7}, 7);
  const std::vector<std::span<const float>> spans{big.values(), small.values()};
  const std::vector<double> partials = cpu.sum_of_squares_partials(spans);
  ASSERT_EQ(partials.size(), 4U);  // 32768 + 32768 + 4464, then 7
  double total = 0.0;
  for (const double p : partials) total += p;
  const double whole = cpu.sum_of_squares(spans);
  EXPECT_EQ(std::memcmp(&total, &whole, sizeof(double)), 0);
  const std::vector<std::span<const float>> last{big.values().subspan(65536)};
  const double alone = cpu.sum_of_squares(last);
  EXPECT_EQ(std::memcmp(&partials[2], &alone, sizeof(double)), 0) << "a chunk's term does not depend on the others";
}
