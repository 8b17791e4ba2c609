#pragma once
// Gradient buckets (issue 17 item 3): data-parallel gradient all-reduce
// overlapped with the backward pass, as PyTorch DDP's Reducer does it.
//
// Parameters are grouped into buckets of about `bucket_mib` MiB in reverse
// registration order (the last layers' gradients are final first in
// backward, so they fill the first bucket). During backward each final
// gradient (BackwardHooks::gradient_final) is copied into its bucket; a
// bucket whose gradients are all final starts a non-blocking all-reduce
// (Communicator::start_all_reduce_sum) while the rest of backward runs.
// Buckets start strictly in bucket order, so every rank issues the same
// collectives in the same order. After the last node, the remaining buckets
// start, every request is waited for (bounded: RIFTCO_MPI_WAIT_TIMEOUT), and
// the reduced gradients replace the pass's own at the commit, which stays
// all-or-nothing: a failure anywhere, communication included, leaves every
// public gradient as it was. The sums are the rank-order sums of the plain
// all-reduce, so the gradients are bit-identical to backward() followed by
// all_reduce_average of each gradient. The buckets live on the parameters'
// backend and are packed, accumulated and divided by that backend's kernels:
// a CUDA model's buckets are device buffers reduced by the nccl communicator
// (no host copy), with the bits of the CPU path on the same values.
// docs/distributed.md.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/variable.hpp"

namespace riftco_transformer {

struct BucketOptions {
  /// Bucket capacity in MiB of float32 gradients (PyTorch DDP's
  /// bucket_cap_mb, default 25). A parameter larger than this gets a bucket
  /// of its own.
  double bucket_mib = 25.0;
  /// Divide the sums by world_size() (the gradients of a mean loss); false
  /// keeps the sums.
  bool average = true;
  void validate() const;  // ValueError naming the field
};

class GradientBucketer final : public BackwardHooks {
 public:
  /// `parameters`: leaves that require grad, each listed once (ValueError
  /// otherwise), all on one backend, which the communicator must reduce (a
  /// BackendError naming both otherwise: a CPU model on the nccl
  /// communicator, a CUDA model on the mpi one at world size > 1). The
  /// buckets are made on that backend. Every rank must register the same
  /// shapes in the same order. The communicator must outlive the bucketer.
  GradientBucketer(Communicator& communicator, std::vector<Variable> parameters, BucketOptions options = {});
  ~GradientBucketer() override;
  GradientBucketer(const GradientBucketer&) = delete;
  GradientBucketer& operator=(const GradientBucketer&) = delete;

  /// output.backward(*this): a backward pass whose committed gradients of
  /// the registered parameters are reduced over the ranks. Every rank must
  /// call it for the same step. A CommunicationError when a previous pass
  /// failed with collectives still in flight (the ranks are out of step).
  void backward(const Variable& output);
  void backward(const Variable& output, const Tensor& seed);
  /// The last micro-batch of a gradient-accumulation step (PyTorch DDP
  /// reduces only then): reduces base[i] + weight · g_i instead of the pass's
  /// g_i, with GradientAccumulator::add(weight)'s arithmetic (weight · g_i
  /// when base[i] is undefined, base[i] when the pass gave no g_i, zeros on
  /// this rank when neither, and no gradient at all when no rank has either),
  /// so the result equals the accumulator's sums followed by a plain
  /// all-reduce (synchronize_gradients), bit for bit. `base`: one tensor per parameter (e.g.
  /// GradientAccumulator::gradients() of the earlier micro-batches), each
  /// undefined or of its parameter's shape on the parameters' backend
  /// (ShapeError, or BackendError for another backend, before anything runs). output.backward() must take a scalar. `graph`: what the
  /// pass does with the graph (GraphAfterBackward; the training loop frees it
  /// as the pass goes).
  void backward(const Variable& output, std::span<const Tensor> base, float weight,
                GraphAfterBackward graph = GraphAfterBackward::Keep);
  /// For a rank that runs no backward pass in this step (no rows of it, or a
  /// loss it will report as diverged) while the others call backward(): the
  /// same collectives in the same order, over `base` alone (undefined:
  /// zeros). Returns the reduced gradients, one per parameter; commits
  /// nothing. A parameter no rank had a gradient for (no pass reached it and
  /// no `base` held one) is undefined here and left as it was by backward()
  /// (its earlier gradient, which an optimizer does not step with twice), as
  /// in one process and as synchronize_gradients: an unused branch does not
  /// move (before 2026-12-02 it got zeros, and Adam decayed it and moved its
  /// moments).
  std::vector<Tensor> reduce(std::span<const Tensor> base);

  const std::vector<Variable>& parameters() const { return params_; }
  const BucketOptions& options() const { return options_; }
  /// Where the buckets live: the parameters' backend.
  Backend backend() const { return backend_; }
  std::size_t bucket_count() const { return buckets_.size(); }
  /// Indices into parameters() of bucket `b`'s members, in their order in
  /// the bucket's buffer (ValueError for a bad index).
  const std::vector<std::size_t>& bucket_parameters(std::size_t b) const;
  std::int64_t bucket_elements(std::size_t b) const;

  /// What the last pass did, to show the overlap.
  struct PassReport {
    /// Buckets in the order they started (always 0, 1, 2, ...).
    std::vector<std::size_t> started;
    /// For each started bucket: how many registered parameters were final
    /// then (all of them means it started only after backward).
    std::vector<std::size_t> final_parameters_at_start;
    /// Buckets started inside backward, before its last node ran.
    std::size_t started_during_backward = 0;
    /// Buckets whose all-reduce had completed before the pass's end (test()).
    std::size_t completed_during_backward = 0;
  };
  const PassReport& last_pass() const { return report_; }

  // BackwardHooks (called by the engine during backward(output, *this)).
  void begin_pass() override;
  void gradient_final(const Variable& leaf, const Tensor& gradient) override;
  void node_done() override;  // polls the requests in flight
  std::vector<std::pair<Variable, Tensor>> finish() override;

 private:
  struct Bucket {
    std::vector<std::size_t> members;  // parameter indices
    std::int64_t elements = 0;
    std::size_t pending = 0;  // members not yet final this pass
  };
  struct Slot {
    std::size_t bucket = 0;
    std::int64_t offset = 0;  // into the bucket's buffer
    std::int64_t elements = 0;  // the parameter's, at construction
    bool filled = false;      // final this pass
    bool present = false;     // this pass reached it on this rank, or `base` holds its gradient
  };
  /// After the buckets' waits: the per-parameter presence flags summed over
  /// the ranks (one more collective, on the host), then each parameter's
  /// reduced gradient, undefined where no rank had one (as
  /// synchronize_gradients leaves it: an optimizer skips it).
  std::vector<Tensor> reduced_gradients();
  /// finish()'s first part: the unreached slots filled, every bucket
  /// started and waited for.
  void complete_pass();
  void fill(std::size_t index, const Tensor* gradient);
  void set_base(std::span<const Tensor> base, float weight);
  void start_ready_buckets();
  void progress();
  std::size_t in_flight() const;

  Communicator& comm_;
  std::vector<Variable> params_;
  BucketOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<Slot> slots_;  // per parameter
  std::unordered_map<const Node*, std::size_t> index_;
  Backend backend_ = Backend::Cpu;  // the parameters', the buckets'
  /// The buckets' buffers (on backend_), kept alive past an abandoned request
  /// (MPI or NCCL may still write into them): released, never freed, when one
  /// is pending.
  std::unique_ptr<std::vector<Tensor>> buffers_;
  std::vector<std::unique_ptr<CollectiveRequest>> requests_;  // per bucket, this pass
  std::vector<Tensor> base_;  // accumulation: the earlier micro-batches' sums (empty: none)
  float weight_ = 1.0F;
  std::size_t next_start_ = 0;
  std::size_t final_count_ = 0;
  bool in_pass_ = false;
  PassReport report_;
};

}  // namespace riftco_transformer
