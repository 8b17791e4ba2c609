// Data parallelism on CUDA tensors (RIFTCO_NCCL builds): the gradient
// bucketer, synchronize_gradients and ZeRO-1's ShardedAdam on a CUDA model
// over the nccl communicator, each against the CPU path (the host
// communicator: single-process, or MPI under mpirun) on host copies of the
// same values, bit for bit. CTest runs it in one process (an N = 1 NCCL
// world: needs 1 GPU) and under `mpirun -np 2` (needs 2 GPUs, one per rank);
// with fewer devices every test skips, saying "needs N GPU(s)".
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../cpp/backend_error.hpp"
#include "../cpp/block_stack.hpp"
#include "backend/kernels.hpp"
#include "nccl_test_world.hpp"
#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/checkpoint.hpp"
#include "riftco_transformer/data_parallel.hpp"
#include "riftco_transformer/errors.hpp"
#include "riftco_transformer/gradient_buckets.hpp"
#include "riftco_transformer/ops.hpp"
#include "riftco_transformer/zero_adam.hpp"

using namespace riftco_transformer;
using rt_test::backend_error;
using rt_nccl_test::host;
using rt_nccl_test::nccl;
using rt_nccl_test::on_device;
using rt_nccl_test::rank_values;
using rt_nccl_test::same_bits;

namespace {

std::vector<float> host_values(const Tensor& t) { return t.to_vector(); }

/// Host copies (new leaves, the same names): the CPU path's model.
std::vector<Variable> cpu_copies(const std::vector<Variable>& params) {
  std::vector<Variable> out;
  for (const Variable& p : params) out.emplace_back(p.value().to(Backend::Cpu), true, p.name());
  return out;
}

std::vector<Tensor> cpu_copies(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> out;
  for (const Tensor& t : tensors) out.push_back(t.defined() ? t.to(Backend::Cpu) : Tensor());
  return out;
}

/// rt_test::BlockStack on CUDA, the input this rank's own.
struct Stack : rt_test::BlockStack {
  explicit Stack(std::uint64_t data_seed, int layers = 4, std::int64_t width = 48)
      : BlockStack(layers, width, data_seed * 100 + static_cast<std::uint64_t>(host().rank()), Backend::Cuda) {}
  /// One plain backward; the gradients (device), cleared from the leaves.
  std::vector<Tensor> gradients(bool checkpointed) {
    loss(checkpointed).backward();
    std::vector<Tensor> g;
    for (Variable& p : params) {
      g.push_back(p.grad());
      p.clear_grad();
    }
    return g;
  }
};

/// The CPU path: synchronize_gradients over the host communicator on host copies.
std::vector<Tensor> host_average(const std::vector<Variable>& device_params, const std::vector<Tensor>& gradients) {
  const std::vector<Variable> cpu = cpu_copies(device_params);
  std::vector<Tensor> g = cpu_copies(gradients);
  synchronize_gradients(host(), cpu, g);
  return g;
}

void expect_same(const std::vector<Tensor>& device, const std::vector<Tensor>& expected) {
  ASSERT_EQ(device.size(), expected.size());
  for (std::size_t k = 0; k < device.size(); ++k) {
    SCOPED_TRACE("gradient " + std::to_string(k));
    ASSERT_EQ(device[k].defined(), expected[k].defined());
    if (!device[k].defined()) continue;
    EXPECT_EQ(device[k].backend(), Backend::Cuda);
    EXPECT_TRUE(same_bits(host_values(device[k]), host_values(expected[k])));
  }
}

/// A communicator over two ranks that moves host buffers only (the mpi
/// one's contract), so one GPU shows the refusal; it is never asked to move
/// anything.
class TwoRankHost final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  std::string_view kind() const override { return "mpi"; }
  void all_reduce_sum(std::span<float>) override { ++calls; }
  void reduce_scatter_sum(std::span<const float>, std::span<float>) override { ++calls; }
  void all_gather(std::span<const float>, std::span<float>) override { ++calls; }
  void broadcast(std::span<float>, int) override { ++calls; }
  void barrier() override { ++calls; }
  [[noreturn]] void abort(std::string_view, int) override { std::abort(); }
  int calls = 0;
};

AdamOptions options(float max_grad_norm) {
  AdamOptions o;
  o.learning_rate = 3e-3F;
  o.weight_decay = 0.05F;
  o.max_grad_norm = max_grad_norm;
  return o;
}

/// Parameters over the norm's 32768-element chunk (uneven shards at N = 2), on CUDA.
std::vector<Variable> zero_params() {
  Random init(11);
  return {Variable(Tensor::normal({40000}, init).to(Backend::Cuda), true, "big"),
          Variable(Tensor::normal({3, 5}, init).to(Backend::Cuda), true, "small"),
          Variable(Tensor::normal({9}, init).to(Backend::Cuda), true, "norm")};
}

std::vector<Variable> device_copies(const std::vector<Variable>& params) {
  std::vector<Variable> out;
  for (const Variable& p : params) out.emplace_back(p.value().clone(), true, p.name());
  return out;
}

/// This rank's gradients of step `step`: "norm" has none anywhere, "small" none on rank 0.
std::vector<Tensor> zero_gradients(std::uint64_t step) {
  const int rank = host().rank();
  std::vector<Tensor> g;
  g.push_back(on_device(rank_values(rank, 40000, 10 + step)));
  g.push_back(rank == 0 && host().world_size() > 1 ? Tensor()
                                                   : on_device(rank_values(rank, 15, 20 + step)).reshape({3, 5}));
  g.push_back(Tensor());
  for (Tensor& t : g) {
    if (t.defined()) t = backend::kernels(Backend::Cuda).scale(t, 1e-4F);
  }
  return g;
}

}  // namespace

TEST(NcclDataParallel, RunsAtTheRankCountCTestStarted) {
  const char* wanted = std::getenv("RIFTCO_TEST_NCCL_RANKS");
  if (wanted == nullptr) GTEST_SKIP() << "RIFTCO_TEST_NCCL_RANKS not set (run by hand)";
  EXPECT_EQ(host().world_size(), std::atoi(wanted));
}

TEST(NcclDataParallel, SynchronizeGradientsOnDeviceHasTheHostPathsBits) {
  SKIP_WITHOUT_GPUS();
  Stack stack(1);
  std::vector<Tensor> g = stack.gradients(false);
  g[1] = Tensor();                           // on every rank: stays undefined
  if (host().rank() == 0) g[3] = Tensor();   // on rank 0 only: zeros there
  const std::vector<Tensor> expected = host_average(stack.params, g);
  reset_peak_memory(Backend::Cpu);
  const std::int64_t cpu_live = memory_stats(Backend::Cpu).live_bytes;
  synchronize_gradients(nccl(), stack.params, g);
  // The flat buffer is a device buffer: nothing the gradients' size on the host.
  EXPECT_LT(memory_stats(Backend::Cpu).peak_bytes - cpu_live, 4096);
  expect_same(g, expected);
  EXPECT_FALSE(g[1].defined());
  EXPECT_EQ(g[3].defined(), expected[3].defined());
}

TEST(NcclDataParallel, AtWorldSizeOneTheHostCommunicatorTakesADeviceModelOnTheDevice) {
  SKIP_WITHOUT_GPUS();
  if (host().world_size() != 1) GTEST_SKIP() << "world size 1 only (Communicator::world_for(Backend::Cuda) without mpirun)";
  Stack stack(5);
  const std::vector<Tensor> plain = stack.gradients(false);
  GradientBucketer buckets(host(), stack.params);  // the single-process communicator: collectives copy on the device
  EXPECT_EQ(buckets.backend(), Backend::Cuda);
  buckets.backward(stack.loss(false));
  std::vector<Tensor> reduced;
  for (const Variable& p : stack.params) reduced.push_back(p.grad());
  expect_same(reduced, plain);
  std::vector<Tensor> synced = plain;
  synchronize_gradients(host(), stack.params, synced);
  expect_same(synced, plain);
}

TEST(NcclDataParallel, BucketerOnDeviceHasTheHostPathsBits) {
  SKIP_WITHOUT_GPUS();
  for (const bool checkpointed : {false, true}) {
    SCOPED_TRACE(checkpointed ? "checkpointed blocks" : "ordinary blocks");
    Stack stack(2);
    const std::vector<Tensor> plain = stack.gradients(checkpointed);
    const std::vector<Tensor> expected = host_average(stack.params, plain);
    BucketOptions small;
    small.bucket_mib = 0.01;  // about one matrix per bucket
    const std::int64_t device_before = memory_stats(Backend::Cuda).live_bytes;
    const std::int64_t host_before = memory_stats(Backend::Cpu).live_bytes;
    GradientBucketer buckets(nccl(), stack.params, small);
    EXPECT_EQ(buckets.backend(), Backend::Cuda);
    EXPECT_GT(buckets.bucket_count(), 2U);
    std::int64_t elements = 0;
    for (const Variable& p : stack.params) elements += p.value().numel();
    EXPECT_GE(memory_stats(Backend::Cuda).live_bytes - device_before, 4 * elements) << "buckets on the device";
    EXPECT_EQ(memory_stats(Backend::Cpu).live_bytes, host_before) << "no host buckets";
    buckets.backward(stack.loss(checkpointed));
    std::vector<Tensor> reduced;
    for (const Variable& p : stack.params) reduced.push_back(p.grad());
    expect_same(reduced, expected);
    EXPECT_GT(buckets.last_pass().started_during_backward, 0U);
  }
}

TEST(NcclDataParallel, BucketerAccumulationAndReduceOnDeviceHaveTheHostPathsBits) {
  SKIP_WITHOUT_GPUS();
  Stack stack(3);
  std::vector<Tensor> base = stack.gradients(false);  // the earlier micro-batches' sums
  base[0] = Tensor();                                 // none for w0
  const std::vector<Tensor> second = stack.gradients(false);
  const float weight = 0.75F;
  // The CPU path: GradientAccumulator::add's kernels on host copies, then the host all-reduce.
  std::vector<Tensor> combined;
  const backend::Kernels& cpu = backend::cpu_kernels();
  for (std::size_t k = 0; k < base.size(); ++k) {
    if (!base[k].defined()) {
      combined.push_back(cpu.scale(second[k].to(Backend::Cpu), weight));
      continue;
    }
    Tensor sum = base[k].to(Backend::Cpu);
    cpu.axpy_inplace(sum, weight, second[k].to(Backend::Cpu));
    combined.push_back(sum);
  }
  const std::vector<Tensor> expected = host_average(stack.params, combined);
  GradientBucketer buckets(nccl(), stack.params);
  buckets.backward(stack.loss(false), base, weight);
  std::vector<Tensor> reduced;
  for (Variable& p : stack.params) {
    reduced.push_back(p.grad());
    p.clear_grad();
  }
  expect_same(reduced, expected);
  // A rank with no pass: reduce(base) is the host path's average of base
  // (base[0], undefined on every rank, stays undefined there as here).
  expect_same(buckets.reduce(base), host_average(stack.params, base));
}

TEST(NcclDataParallel, ShardedAdamOnDeviceIsPlainDeviceAdamBitForBit) {
  SKIP_WITHOUT_GPUS();
  const std::vector<Variable> a = zero_params();
  const std::vector<Variable> b = device_copies(a);
  ShardedAdam zero(nccl(), a, options(0.05F));  // clipping on
  Adam plain(b, options(0.05F));
  EXPECT_EQ(zero.backend(), Backend::Cuda);
  for (std::uint64_t step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<Tensor> local = zero_gradients(step);
    std::vector<Tensor> averaged = local;  // the plain data-parallel path on the device
    synchronize_gradients(nccl(), b, averaged);
    // Local gradients on even steps, already averaged ones on odd steps.
    reset_peak_memory(Backend::Cpu);
    const std::int64_t cpu_live = memory_stats(Backend::Cpu).live_bytes;
    const float zn = step % 2 == 0 ? zero.step(local) : zero.step(averaged, ShardedAdam::Gradients::Averaged);
    EXPECT_LT(memory_stats(Backend::Cpu).peak_bytes - cpu_live, 4096) << "the step's buffers are device buffers";
    const float pn = plain.step(averaged);
    EXPECT_EQ(std::memcmp(&zn, &pn, sizeof(float)), 0);
    for (std::size_t k = 0; k < a.size(); ++k) {
      EXPECT_EQ(a[k].value().backend(), Backend::Cuda);
      EXPECT_TRUE(same_bits(host_values(a[k].value()), host_values(b[k].value()))) << a[k].name();
    }
  }
  const Adam::State zs = zero.state();
  const Adam::State ps = plain.state();
  for (std::size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(zs.first_moment[k].backend(), Backend::Cuda);
    EXPECT_TRUE(same_bits(host_values(zs.first_moment[k]), host_values(ps.first_moment[k])));
    EXPECT_TRUE(same_bits(host_values(zs.second_moment[k]), host_values(ps.second_moment[k])));
  }
  // The gathered state resumes into a new ShardedAdam with the same bits.
  const std::vector<Variable> c = device_copies(a);
  ShardedAdam resumed(nccl(), c, options(0.05F));
  resumed.set_state(zs);
  zero.step(zero_gradients(9));
  resumed.step(zero_gradients(9));
  for (std::size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(same_bits(host_values(a[k].value()), host_values(c[k].value())));
  }
}

TEST(NcclDataParallel, ShardedAdamOnDeviceHasTheHostPathsBits) {
  SKIP_WITHOUT_GPUS();
  // Without clipping the norm only reports (the device's and the CPU's
  // partial sums of squares round differently in double), so the update's
  // bits must match the CPU path's exactly.
  const std::vector<Variable> device = zero_params();
  const std::vector<Variable> cpu = cpu_copies(device);
  ShardedAdam on_device(nccl(), device, options(0.0F));
  ShardedAdam on_host(host(), cpu, options(0.0F));
  EXPECT_EQ(on_device.shard_begin(), on_host.shard_begin());
  EXPECT_EQ(on_device.shard_end(), on_host.shard_end());
  for (std::uint64_t step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<Tensor> g = zero_gradients(step);
    const float dn = on_device.step(g);
    const float hn = on_host.step(cpu_copies(g));
    EXPECT_NEAR(dn, hn, 1e-6F * hn);
    for (std::size_t k = 0; k < device.size(); ++k) {
      EXPECT_TRUE(same_bits(host_values(device[k].value()), cpu[k].value().to_vector())) << device[k].name();
    }
  }
}

TEST(NcclDataParallel, MixedBackendsAreBackendErrorsNamingBothBeforeAnythingChanges) {
  SKIP_WITHOUT_GPUS();
  Stack stack(4);
  const std::vector<Variable> cpu = cpu_copies(stack.params);
  // A CPU model on the nccl communicator.
  for (const std::string& m :
       {backend_error([&] { GradientBucketer(nccl(), cpu); }), backend_error([&] { ShardedAdam(nccl(), cpu); })}) {
    EXPECT_NE(m.find("the model is on cpu"), std::string::npos) << m;
    EXPECT_NE(m.find("the nccl communicator (rank " + std::to_string(host().rank())), std::string::npos) << m;
  }
  std::vector<Tensor> host_grads;
  for (const Variable& p : cpu) host_grads.push_back(Tensor::ones(p.shape()));
  const std::string sync_cpu = backend_error([&] { synchronize_gradients(nccl(), cpu, host_grads); });
  EXPECT_NE(sync_cpu.find("[synchronize_gradients] the model is on cpu"), std::string::npos) << sync_cpu;
  EXPECT_EQ(host_grads[0].at({0, 0}), 1.0F);  // untouched

  // A CUDA model on a communicator that moves host buffers only, at N = 2.
  TwoRankHost two;
  std::vector<Tensor> device_grads = stack.gradients(false);
  const std::vector<float> before = host_values(device_grads[0]);
  for (const std::string& m : {backend_error([&] { GradientBucketer(two, stack.params); }),
                               backend_error([&] { ShardedAdam(two, stack.params); }),
                               backend_error([&] { synchronize_gradients(two, stack.params, device_grads); })}) {
    EXPECT_NE(m.find("the model is on cuda"), std::string::npos) << m;
    EXPECT_NE(m.find("the mpi communicator (rank 0 of 2) moves host buffers only"), std::string::npos) << m;
  }
  EXPECT_EQ(two.calls, 0);
  EXPECT_TRUE(same_bits(host_values(device_grads[0]), before));
  if (host().world_size() > 1) {  // the real MPI communicator alike
    const std::string m = backend_error([&] { GradientBucketer(host(), stack.params); });
    EXPECT_NE(m.find("moves host buffers only"), std::string::npos) << m;
  }

  // Parameters on two backends; a gradient on the host for a device model.
  std::vector<Variable> mixed = stack.params;
  mixed[1] = cpu[1];
  const std::string two_backends = backend_error([&] { GradientBucketer(nccl(), mixed); });
  EXPECT_NE(two_backends.find("parameter 0 'w0' (48, 48) is on cuda but parameter 1 'g0' (48) is on cpu"),
            std::string::npos)
      << two_backends;
  device_grads[2] = device_grads[2].to(Backend::Cpu);
  const std::string grad_on_host = backend_error([&] { synchronize_gradients(nccl(), stack.params, device_grads); });
  EXPECT_NE(grad_on_host.find("the gradient of 'w1' is on cpu, the parameters on cuda"), std::string::npos)
      << grad_on_host;
  EXPECT_TRUE(same_bits(host_values(device_grads[0]), before));
  // The same host gradient given to ShardedAdam, or as the bucketer's
  // accumulated sum: BackendErrors too (not ShapeErrors: the shapes agree),
  // before anything changes.
  ShardedAdam zero(nccl(), stack.params);
  const std::string zero_host = backend_error([&] { zero.step(device_grads, ShardedAdam::Gradients::Averaged); });
  EXPECT_NE(zero_host.find("on cpu of 'w1'"), std::string::npos) << zero_host;
  EXPECT_EQ(zero.step_count(), 0);
  GradientBucketer buckets(nccl(), stack.params);
  const std::string base_host = backend_error([&] { buckets.backward(stack.loss(false), device_grads, 1.0F); });
  EXPECT_NE(base_host.find("the accumulated gradient of 'w1' is (48, 48) on cpu"), std::string::npos) << base_host;
}
