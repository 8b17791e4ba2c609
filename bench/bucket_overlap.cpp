// rt-bench-buckets: the time of one data-parallel backward with the gradient
// reduction after it (backward, then one all_reduce_average of the flattened
// gradients: the plain path) against the bucketed, overlapped reduction
// (GradientBucketer), on one transformer shape and policy. Run under mpirun:
//
//   mpirun -np 2 build/rt-bench-buckets [--vocab V] [--layers L] [--width C] [--heads H] [--ffn F]
//          [--seq T] [--batch B] [--policy disabled|block|...] [--bucket-mib M] [--steps N]
//
// Prints, on rank 0, the median wall time of each (ms) over N alternating
// steps after one warm-up of each, and checks that both give the same bits.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/gradient_buckets.hpp"
#include "riftco_transformer/random.hpp"
#include "riftco_transformer/transformer.hpp"

using namespace riftco_transformer;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  TransformerDimensions d;
  d.vocab_size = 512;
  d.context_length = 64;
  d.model_width = 128;
  d.heads = 4;
  d.layers = 4;
  d.feed_forward_width = 344;
  std::int64_t seq = 64;
  std::int64_t batch = 4;
  int steps = 5;
  double bucket_mib = 25.0;
  std::string policy = "disabled";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const char* value = argv[i + 1];
    if (flag == "--layers") d.layers = std::atoll(value);
    else if (flag == "--width") d.model_width = std::atoll(value);
    else if (flag == "--heads") d.heads = std::atoll(value);
    else if (flag == "--vocab") d.vocab_size = std::atoll(value);
    else if (flag == "--ffn") d.feed_forward_width = std::atoll(value);
    else if (flag == "--seq") seq = std::atoll(value);
    else if (flag == "--batch") batch = std::atoll(value);
    else if (flag == "--steps") steps = std::atoi(value);
    else if (flag == "--bucket-mib") bucket_mib = std::atof(value);
    else if (flag == "--policy") policy = value;
    else {
      std::fprintf(stderr, "rt-bench-buckets: unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  d.context_length = std::max(d.context_length, seq);
  Communicator& comm = Communicator::world();
  Random init(1);
  DecoderOnlyTransformer model(d, init);
  model.set_activation_checkpointing_kind(parse_activation_checkpointing(policy));
  std::vector<Variable> params;
  std::int64_t elements = 0;
  for (const NamedParameter& p : model.parameters()) {
    params.push_back(p.variable);
    elements += p.variable.value().numel();
  }
  Random data(100 + static_cast<std::uint64_t>(comm.rank()));
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(batch * seq));
  std::vector<std::int32_t> targets(tokens.size());
  for (auto& t : tokens) t = static_cast<std::int32_t>(data.below(static_cast<std::uint32_t>(d.vocab_size)));
  for (auto& t : targets) t = static_cast<std::int32_t>(data.below(static_cast<std::uint32_t>(d.vocab_size)));
  GradientBucketer bucketer(comm, params, BucketOptions{bucket_mib, true});

  std::vector<float> flat(static_cast<std::size_t>(elements));
  auto plain = [&] {
    model.loss(tokens, targets, batch).backward();
    std::size_t offset = 0;
    for (const Variable& p : params) {
      std::copy(p.grad().values().begin(), p.grad().values().end(), flat.begin() + static_cast<std::ptrdiff_t>(offset));
      offset += static_cast<std::size_t>(p.value().numel());
    }
    comm.all_reduce_average(flat);
  };
  auto bucketed = [&] { bucketer.backward(model.loss(tokens, targets, batch)); };
  auto timed = [&](auto&& f) {
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    f();
    comm.barrier();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  };
  timed(plain);
  timed(bucketed);
  std::vector<double> plain_ms;
  std::vector<double> bucketed_ms;
  for (int s = 0; s < steps; ++s) {
    plain_ms.push_back(timed(plain));
    bucketed_ms.push_back(timed(bucketed));
  }
  // Same bits: the last bucketed pass's gradients against the last plain one's.
  std::size_t offset = 0;
  bool same = true;
  for (const Variable& p : params) {
    same = same && std::memcmp(p.grad().values().data(), flat.data() + offset, static_cast<std::size_t>(p.value().nbytes())) == 0;
    offset += static_cast<std::size_t>(p.value().numel());
  }
  if (comm.rank() == 0) {
    std::printf(
        "ranks %d, %lld parameters (%.1f MiB), policy %s, %zu buckets of <= %.2f MiB: backward + all-reduce %.1f ms, "
        "bucketed %.1f ms (%.2fx); same bits: %s; last pass: %zu buckets started inside backward, %zu done before "
        "its end\n",
        comm.world_size(), static_cast<long long>(elements), static_cast<double>(elements) * 4 / (1 << 20),
        policy.c_str(), bucketer.bucket_count(), bucket_mib, median(plain_ms), median(bucketed_ms),
        median(plain_ms) / median(bucketed_ms), same ? "yes" : "NO", bucketer.last_pass().started_during_backward,
        bucketer.last_pass().completed_during_backward);
    std::printf("parameters final when each bucket started (of %zu):", params.size());
    for (const std::size_t n : bucketer.last_pass().final_parameters_at_start) std::printf(" %zu", n);
    std::printf("\n");
  }
  return same ? 0 : 1;
}
