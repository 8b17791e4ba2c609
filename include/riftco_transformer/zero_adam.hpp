#pragma once
// ZeRO stage 1 (issue 17 item 4): Adam with its moments sharded across the
// ranks of a communicator. Each rank keeps the first and second moments of
// one contiguous shard of the flattened parameters (the parameters in
// order, concatenated), about 1/N of plain Adam's state. One step:
//   1. reduce-scatter of the ranks' gradients (average: the rank-order sum
//      divided by N), so each rank holds its shard of the averaged gradient;
//   2. the global gradient norm from per-chunk partial sums gathered from
//      every rank and added in plain Adam's order (the same bits as
//      Adam::step on the averaged gradients), clipping as Adam does;
//   3. bias-corrected Adam with decoupled weight decay on the local shard
//      (Adam's own kernel, so the same arithmetic per element);
//   4. an all-gather of the updated shards into every rank's parameters.
// Parameters end bit-identical on every rank and equal to plain
// data-parallel Adam (all_reduce_average, then Adam::step) bit for bit.
// Shards are cut on the boundaries of the norm's 32768-element chunks
// (each parameter cut from its start), so they differ by at most one chunk.
// state() gathers the full moments (Adam::State), so a checkpoint resumes at
// any N, or into a plain Adam. The moments and every flat buffer of a step
// live on the parameters' backend and are packed, divided and updated by its
// kernels: on CUDA over the nccl communicator, without a host copy of
// gradients, moments or parameters. docs/distributed.md.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "riftco_transformer/adam.hpp"
#include "riftco_transformer/distributed.hpp"
#include "riftco_transformer/gradient_accumulator.hpp"

namespace riftco_transformer {

class ShardedAdam {
 public:
  /// What step() receives: this rank's own gradients (reduce-scattered and
  /// averaged here), or gradients already averaged over the ranks (e.g. by
  /// a GradientBucketer; no reduction, each rank takes its shard).
  enum class Gradients { Local, Averaged };

  /// The same parameter rules as Adam (leaves that require grad, each once;
  /// ValueError otherwise), all on one backend that the communicator reduces
  /// (BackendError naming both otherwise: a CPU model on the nccl
  /// communicator, a CUDA model on the mpi one at world size > 1). Every
  /// rank must pass the same shapes in the same order. The communicator must
  /// outlive this object.
  ShardedAdam(Communicator& communicator, std::vector<Variable> parameters, AdamOptions options = {});
  ShardedAdam(Communicator& communicator, std::vector<ParameterGroup> groups, AdamOptions options);

  /// Collective: every rank calls it for the same step. Steps with the
  /// parameters' committed gradients; returns the global gradient norm
  /// before clipping (the same on every rank). A parameter without a
  /// gradient on every rank is skipped (its moments do not move); one that
  /// has a gradient on some ranks counts zeros for the others. A non-finite
  /// norm is a ValueError on every rank naming the parameter, and nothing
  /// changes; a gradient of the wrong shape is a ShapeError, one on another
  /// backend a BackendError (raised before
  /// any communication: every rank must see it, as they do when the shapes
  /// are the same everywhere). As Adam::step(), a committed gradient this
  /// optimizer already stepped with is not used again (grad_serial).
  float step(Gradients kind = Gradients::Local);
  /// The same with explicit gradients, one per parameter in parameters()
  /// order (undefined: none).
  float step(std::span<const Tensor> gradients, Gradients kind = Gradients::Local);
  /// step(accumulator.gradients(), kind) after checking that the accumulator
  /// holds exactly these parameters in parameters() order (ValueError naming
  /// the first that differs; nothing changes), as Adam::step(accumulator).
  float step(const GradientAccumulator& accumulator, Gradients kind = Gradients::Local);
  void zero_grad();

  const AdamOptions& options() const { return options_; }
  void set_learning_rate(float lr);
  std::int64_t step_count() const { return steps_; }
  /// As Adam::parameter_step_count: the updates parameters()[index] has had,
  /// its bias correction's step (the same on every rank).
  std::int64_t parameter_step_count(std::size_t index) const;
  const std::vector<Variable>& parameters() const { return params_; }
  /// Where the moments and the step's buffers live: the parameters' backend.
  Backend backend() const { return backend_; }
  const std::vector<Adam::GroupInfo>& groups() const { return groups_; }
  float weight_decay_of(std::size_t index) const;

  /// This rank's shard of the flattened parameters: [begin, end).
  std::int64_t shard_begin() const { return bounds_[static_cast<std::size_t>(rank_)]; }
  std::int64_t shard_end() const { return bounds_[static_cast<std::size_t>(rank_) + 1]; }
  std::int64_t total_elements() const { return bounds_.back(); }
  /// Bytes of Adam state (both moments) this rank holds.
  std::int64_t state_bytes() const;

  /// Collective: the full moments gathered from every rank, one tensor per
  /// parameter on the parameters' backend (the format of Adam::state(),
  /// whatever N).
  Adam::State state() const;
  /// Every rank passes the full state (as saved, on the parameters'
  /// backend); each keeps its shard. Validates shapes and backends first
  /// (ValueError / ShapeError / BackendError for a state on another
  /// backend; nothing changes), then its values as Adam::set_state does.
  /// Also clears a failed step (below): restoring a saved state together
  /// with its parameters is how a caller recovers.
  void set_state(const Adam::State& state);

  /// A step whose final parameter all-gather failed has updated this rank's
  /// shard but not the others': the ranks' parameters now differ. From then
  /// on step() and state() are a CommunicationError naming that step, until
  /// set_state() restores a saved state. Empty when no step failed so.
  const std::string& failed_step() const { return failure_; }

 private:
  struct Chunk {  // a piece of the norm's chunk grid
    std::size_t param;
    std::int64_t begin;  // flat
    std::int64_t end;
  };
  void add_parameters(std::vector<Variable> parameters);
  void layout();
  float update(std::span<const Tensor* const> gradients, Gradients kind);
  /// Ranges [begin, end) of rank q's shard inside parameter i, in flat positions.
  template <class F>
  void for_each_piece(int rank, F&& f) const;
  /// The same over flat positions [lo, hi) (a slice of a shard).
  template <class F>
  void for_each_piece_in(std::int64_t lo, std::int64_t hi, F&& f) const;
  /// The all-gather of every rank's shard (a step's parameters, state()'s
  /// moments), in slices of a bounded number of elements per rank, so its
  /// buffers stay a small fraction of the model: pack(lo, hi, out) writes
  /// this rank's flat positions [lo, hi) to out[0, hi - lo), every element
  /// (only the row's padding after them is zeroed for it); unpack(q, lo,
  /// hi, row) reads rank q's [lo, hi) from row[0, hi - lo) (every rank, this
  /// one too). The same number of collectives on every rank.
  template <class Pack, class Unpack>
  void gather_shards(Pack&& pack, Unpack&& unpack) const;

  Communicator& comm_;
  int rank_ = 0;
  int world_ = 1;
  Backend backend_ = Backend::Cpu;  // the parameters'
  std::vector<Variable> params_;
  AdamOptions options_;
  std::vector<Adam::GroupInfo> groups_;
  std::vector<float> weight_decay_;
  std::vector<std::int64_t> offset_;  // flat offset of each parameter
  std::vector<std::int64_t> numel_;   // at construction
  std::vector<Chunk> chunks_;
  std::vector<std::size_t> chunk_bounds_;  // rank r's chunks: [chunk_bounds_[r], chunk_bounds_[r+1])
  std::vector<std::int64_t> bounds_;       // rank r's shard: [bounds_[r], bounds_[r+1])
  std::int64_t steps_ = 0;
  std::vector<std::int64_t> parameter_steps_;  // per parameter, as Adam's
  std::vector<std::uint64_t> stepped_serial_;  // per parameter, as Adam's
  std::string failure_;  // set when a step's parameter all-gather failed (failed_step())
  Tensor m_;  // (shard)
  Tensor v_;  // (shard)
};

}  // namespace riftco_transformer
