// ShardedAdam: ZeRO stage 1 (include/riftco_transformer/zero_adam.hpp,
// docs/distributed.md).
#include "riftco_transformer/zero_adam.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <unordered_set>
#include <utility>

#include "../backend/kernels.hpp"
#include "../optim/adam_coefficients.hpp"
#include "model_backend.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {
namespace {

/// The norm kernels' chunk (backend::kNormChunk): each
/// parameter is cut from its start into chunks of this many elements, each
/// chunk's sum of squares (in double) is one term of the total, added in
/// order. Shards follow the same grid so every partial is computed whole on
/// one rank and the double total is Adam's, term for term: the grid is the
/// backends' own constant (backend/kernel_types.hpp), not a copy of it.
constexpr std::int64_t kNormChunk = backend::kNormChunk;

/// The slice per rank of the step's reduce-scatter and all-gather and of
/// state()'s gather (1 MiB of floats): their buffers are (world + 1) x this,
/// not world x the largest shard (S3 at N = 8: about 40 slices a step).
constexpr std::int64_t kGatherSlice = std::int64_t{1} << 18;

std::int64_t max_gap(const std::vector<std::int64_t>& bounds) {
  std::int64_t m = 0;
  for (std::size_t r = 0; r + 1 < bounds.size(); ++r) m = std::max(m, bounds[r + 1] - bounds[r]);
  return m;
}

/// The slices the step's reduce-scatter and gather_shards move the shards
/// in: at most kGatherSlice elements per rank, over the largest shard. Row q
/// of a slice holds rank q's flat positions row(q, s, width), then padding
/// up to `slice` elements (a shorter shard's rows, the last slice's).
struct ShardSlices {
  explicit ShardSlices(const std::vector<std::int64_t>& shard_bounds)
      : bounds(shard_bounds), max_shard(max_gap(shard_bounds)), slice(std::min(max_shard, kGatherSlice)) {}

  /// f(s, width) for each slice, from position s of every shard.
  template <class F>
  void each(F&& f) const {
    for (std::int64_t s = 0; s < max_shard; s += slice) f(s, std::min(slice, max_shard - s));
  }

  /// Rank q's [lo, hi) in the slice from s (hi == lo past its shard's end).
  std::pair<std::int64_t, std::int64_t> row(int q, std::int64_t s, std::int64_t width) const {
    const std::int64_t lo = bounds[static_cast<std::size_t>(q)] + s;
    return {lo, std::max(lo, std::min(lo + width, bounds[static_cast<std::size_t>(q) + 1]))};
  }

  /// Fills one row: pack(lo, hi, out) writes out[0, hi - lo), every element
  /// of it; only the padding after it is zeroed here.
  template <class Pack>
  void pack_row(const backend::Kernels& kernels, std::int64_t lo, std::int64_t hi, float* out, Pack&& pack) const {
    pack(lo, hi, out);
    if (hi - lo < slice) kernels.fill_values(out + (hi - lo), slice - (hi - lo), 0.0F);
  }

  const std::vector<std::int64_t>& bounds;
  std::int64_t max_shard;
  std::int64_t slice;
};

}  // namespace

ShardedAdam::ShardedAdam(Communicator& communicator, std::vector<Variable> parameters, AdamOptions options)
    : comm_(communicator), rank_(communicator.rank()), world_(communicator.world_size()), options_(options) {
  options_.validate();
  add_parameters(std::move(parameters));
  groups_.push_back({"all", options_.weight_decay, 0, params_.size()});
  weight_decay_.assign(params_.size(), options_.weight_decay);
  layout();
}

ShardedAdam::ShardedAdam(Communicator& communicator, std::vector<ParameterGroup> groups, AdamOptions options)
    : comm_(communicator), rank_(communicator.rank()), world_(communicator.world_size()), options_(options) {
  options_.validate();
  for (ParameterGroup& g : groups) {
    const float wd = g.weight_decay.value_or(options_.weight_decay);
    if (!(wd >= 0.0F) || !std::isfinite(wd)) {
      throw ValueError("[ShardedAdam] parameter group '" + g.name + "': weight_decay must be finite and >= 0, got " +
                       float_text(wd));
    }
    const std::size_t begin = params_.size();
    add_parameters(std::move(g.parameters));
    groups_.push_back({g.name, wd, begin, params_.size()});
    weight_decay_.resize(params_.size(), wd);
  }
  layout();
}

void ShardedAdam::add_parameters(std::vector<Variable> parameters) {
  for (Variable& p : parameters) {
    const std::size_t i = params_.size();
    if (!p.defined() || !p.is_leaf() || !p.requires_grad()) {
      throw ValueError("[ShardedAdam] parameter " + std::to_string(i) + (p.defined() ? " '" + p.name() + "'" : "") +
                       " must be a leaf that requires grad");
    }
    params_.push_back(std::move(p));
    stepped_serial_.push_back(0);
  }
}

void ShardedAdam::layout() {
  std::unordered_set<const Node*> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (!seen.insert(params_[i].node()).second) {
      throw ValueError("[ShardedAdam] parameter " + std::to_string(i) + " '" + params_[i].name() + "' appears twice");
    }
  }
  backend_ = distributed_detail::model_backend(comm_, params_, "ShardedAdam");
  std::int64_t total = 0;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::int64_t n = params_[i].value().numel();
    offset_.push_back(total);
    numel_.push_back(n);
    parameter_steps_.push_back(0);
    for (std::int64_t b = 0; b < n; b += kNormChunk) chunks_.push_back({i, total + b, total + std::min(n, b + kNormChunk)});
    total += n;
  }
  // Rank r's shard starts at the chunk boundary nearest to total * r / N:
  // contiguous shards within half a chunk of an equal share.
  const auto world = static_cast<std::int64_t>(world_);
  chunk_bounds_.assign(static_cast<std::size_t>(world_) + 1, chunks_.size());
  chunk_bounds_[0] = 0;
  auto start_of = [&](std::size_t c) { return c < chunks_.size() ? chunks_[c].begin : total; };
  for (int r = 1; r < world_; ++r) {
    const std::int64_t target = total * r / world;
    std::size_t c = chunk_bounds_[static_cast<std::size_t>(r) - 1];
    while (c < chunks_.size() && start_of(c + 1) <= target) ++c;  // start_of(c) <= target < start_of(c + 1)
    if (c < chunks_.size() && start_of(c + 1) - target < target - start_of(c)) ++c;
    chunk_bounds_[static_cast<std::size_t>(r)] = c;
  }
  bounds_.resize(static_cast<std::size_t>(world_) + 1);
  for (std::size_t r = 0; r <= static_cast<std::size_t>(world_); ++r) bounds_[r] = start_of(chunk_bounds_[r]);
  const std::int64_t shard = shard_end() - shard_begin();
  m_ = Tensor::zeros({shard}, backend_);
  v_ = Tensor::zeros({shard}, backend_);
}

template <class F>
void ShardedAdam::for_each_piece(int rank, F&& f) const {
  for_each_piece_in(bounds_[static_cast<std::size_t>(rank)], bounds_[static_cast<std::size_t>(rank) + 1],
                    std::forward<F>(f));
}

template <class F>
void ShardedAdam::for_each_piece_in(std::int64_t lo, std::int64_t hi, F&& f) const {
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const std::int64_t b = std::max(lo, offset_[i]);
    const std::int64_t e = std::min(hi, offset_[i] + numel_[i]);
    if (b < e) f(i, b, e);
  }
}

template <class Pack, class Unpack>
void ShardedAdam::gather_shards(Pack&& pack, Unpack&& unpack) const {
  const ShardSlices slices(bounds_);
  const backend::Kernels& kernels = backend::kernels(backend_, "ShardedAdam");
  Tensor send = Tensor::empty({slices.slice}, backend_);
  Tensor gathered = Tensor::empty({slices.slice * world_}, backend_);
  slices.each([&](std::int64_t s, std::int64_t width) {
    const auto mine = slices.row(rank_, s, width);
    slices.pack_row(kernels, mine.first, mine.second, send.device_data(), pack);
    comm_.all_gather(send, gathered);
    const float* rows = std::as_const(gathered).device_data();
    for (int q = 0; q < world_; ++q) {
      const auto [lo, hi] = slices.row(q, s, width);
      if (lo < hi) unpack(q, lo, hi, rows + q * slices.slice);
    }
  });
}

std::int64_t ShardedAdam::state_bytes() const { return m_.nbytes() + v_.nbytes(); }

float ShardedAdam::weight_decay_of(std::size_t index) const {
  if (index >= params_.size()) {
    throw ValueError("[ShardedAdam] parameter index " + std::to_string(index) + " out of range (" +
                     std::to_string(params_.size()) + " parameters)");
  }
  return weight_decay_[index];
}

std::int64_t ShardedAdam::parameter_step_count(std::size_t index) const {
  if (index >= params_.size()) {
    throw ValueError("[ShardedAdam] parameter index " + std::to_string(index) + " out of range (" +
                     std::to_string(params_.size()) + " parameters)");
  }
  return parameter_steps_[index];
}

void ShardedAdam::set_learning_rate(float lr) {
  AdamOptions next = options_;
  next.learning_rate = lr;
  next.validate();
  options_ = next;
}

void ShardedAdam::zero_grad() {
  for (Variable& p : params_) p.clear_grad();
}

float ShardedAdam::step(Gradients kind) {
  std::vector<std::uint64_t> serials;
  const std::vector<Tensor> gradients = detail::fresh_gradients(params_, stepped_serial_, serials);
  std::vector<const Tensor*> pointers;
  pointers.reserve(gradients.size());
  for (const Tensor& g : gradients) pointers.push_back(&g);
  const float norm = update(pointers, kind);
  stepped_serial_ = std::move(serials);  // only once the step succeeded
  return norm;
}

float ShardedAdam::step(std::span<const Tensor> gradients, Gradients kind) {
  if (gradients.size() != params_.size()) {
    throw ValueError("[ShardedAdam] step got " + std::to_string(gradients.size()) + " gradients for " +
                     std::to_string(params_.size()) + " parameters");
  }
  std::vector<const Tensor*> pointers;
  pointers.reserve(gradients.size());
  for (const Tensor& g : gradients) pointers.push_back(&g);
  return update(pointers, kind);
}

float ShardedAdam::step(const GradientAccumulator& accumulator, Gradients kind) {
  const std::vector<Variable>& theirs = accumulator.parameters();
  if (theirs.size() != params_.size()) {
    throw ValueError("[ShardedAdam] step: the GradientAccumulator holds " + std::to_string(theirs.size()) +
                     " parameters, this ShardedAdam " + std::to_string(params_.size()) +
                     " (build the accumulator from this optimizer's parameters)");
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    if (theirs[i].node() != params_[i].node()) {
      throw ValueError("[ShardedAdam] step: the GradientAccumulator's parameter " + std::to_string(i) + " is '" +
                       theirs[i].name() + "', this ShardedAdam's is '" + params_[i].name() +
                       "' (build the accumulator from this optimizer's parameters, in their order)");
    }
  }
  return step(accumulator.gradients(), kind);
}

namespace {
[[noreturn]] void refuse_after_failure(const std::string& failure, const char* call) {
  throw CommunicationError("[ShardedAdam] " + std::string(call) + " refused: " + failure +
                           "; restore a saved state (set_state) with its parameters first");
}
}  // namespace

float ShardedAdam::update(std::span<const Tensor* const> gradients, Gradients kind) {
  detail::refuse_inside_replay("ShardedAdam");  // before any collective
  if (!failure_.empty()) refuse_after_failure(failure_, "step");
  const std::size_t count = params_.size();
  // Local checks, before any communication.
  for (std::size_t i = 0; i < count; ++i) {
    const Tensor& value = params_[i].value();
    if (value.backend() != backend_ || value.numel() != numel_[i]) {
      distributed_detail::throw_mismatch(value.numel() != numel_[i], "[ShardedAdam] parameter '" + params_[i].name() + "' is now " + shape_string(value.shape()) +
                       " on " + backend_name(value.backend()) + " but its shard was laid out for " +
                       std::to_string(numel_[i]) + " elements on " + backend_name(backend_) +
                       ": build a new ShardedAdam");
    }
    const Tensor& g = *gradients[i];
    if (g.defined() && (g.shape() != value.shape() || g.backend() != backend_)) {
      distributed_detail::throw_mismatch(g.shape() != value.shape(), "[ShardedAdam] gradient " + shape_string(g.shape()) + " on " + backend_name(g.backend()) +
                       " of '" + params_[i].name() + "' does not match its value " + shape_string(value.shape()) +
                       " on " + backend_name(backend_));
    }
  }
  // Which parameters step: those with a gradient on some rank (host flags).
  std::vector<float> present(count);
  for (std::size_t i = 0; i < count; ++i) present[i] = gradients[i]->defined() ? 1.0F : 0.0F;
  comm_.all_reduce_sum(present);
  auto steps = [&](std::size_t i) { return present[i] > 0.0F; };
  // No gradient on any rank (every rank sees the same flags): nothing to
  // update and the step count stays, as Adam::step.
  if (std::none_of(present.begin(), present.end(), [](float p) { return p > 0.0F; })) return 0.0F;

  // Every flat buffer below is on the parameters' backend, filled by its kernels.
  const backend::Kernels& kernels = backend::kernels(backend_, "ShardedAdam");
  // 1. This rank's shard of the averaged gradient.
  const std::int64_t begin = shard_begin();
  const std::int64_t max_shard = max_gap(bounds_);
  Tensor grad_shard = Tensor::zeros({max_shard}, backend_);
  auto copy_gradient = [&](std::size_t i, std::int64_t b, std::int64_t e, float* out) {
    const Tensor& g = *gradients[i];
    if (g.defined()) {
      kernels.copy_values(g.device_data() + (b - offset_[i]), out, e - b);
    } else {
      kernels.fill_values(out, e - b, 0.0F);  // no gradient on this rank: zeros
    }
  };
  if (kind == Gradients::Local && world_ > 1) {
    // In slices, as gather_shards: the reduce-scatter's input is world x
    // slice, not world x the largest shard.
    const ShardSlices slices(bounds_);
    Tensor send = Tensor::empty({slices.slice * world_}, backend_);
    Tensor mine = Tensor::empty({slices.slice}, backend_);
    float* shard = grad_shard.device_data();
    auto pack = [&](std::int64_t lo, std::int64_t hi, float* out) {
      for_each_piece_in(lo, hi, [&](std::size_t i, std::int64_t b, std::int64_t e) {
        copy_gradient(i, b, e, out + (b - lo));
      });
    };
    slices.each([&](std::int64_t s, std::int64_t width) {
      float* rows = send.device_data();
      for (int q = 0; q < world_; ++q) {
        const auto [lo, hi] = slices.row(q, s, width);
        slices.pack_row(kernels, lo, hi, rows + q * slices.slice, pack);
      }
      comm_.reduce_scatter_sum(send, mine);  // rank-order sums, as all_reduce_sum
      kernels.copy_values(std::as_const(mine).device_data(), shard + s, width);
    });
    kernels.divide_values(shard, shard, max_shard, static_cast<float>(world_));  // all_reduce_average's arithmetic
  } else {
    float* shard = grad_shard.device_data();
    for_each_piece(rank_, [&](std::size_t i, std::int64_t b, std::int64_t e) {
      copy_gradient(i, b, e, shard + (b - begin));
    });
  }
  const float* grad = std::as_const(grad_shard).device_data();

  // 2. The global norm: this rank's chunk partials (one per chunk of the
  // grid: each piece below is one chunk), gathered, added in Adam's order
  // (parameters in order, each from its start).
  std::size_t max_chunks = 0;
  for (int r = 0; r < world_; ++r) {
    max_chunks = std::max(max_chunks, chunk_bounds_[static_cast<std::size_t>(r) + 1] - chunk_bounds_[static_cast<std::size_t>(r)]);
  }
  std::vector<std::span<const float>> my_chunks;
  for (std::size_t c = chunk_bounds_[static_cast<std::size_t>(rank_)]; c < chunk_bounds_[static_cast<std::size_t>(rank_) + 1]; ++c) {
    if (!steps(chunks_[c].param)) continue;
    my_chunks.emplace_back(grad + (chunks_[c].begin - begin), static_cast<std::size_t>(chunks_[c].end - chunks_[c].begin));
  }
  const std::vector<double> mine = kernels.sum_of_squares_partials(my_chunks);  // one per chunk: exactly its partial
  std::vector<float> packed(2 * max_chunks, 0.0F);
  if (!mine.empty()) std::memcpy(packed.data(), mine.data(), mine.size() * sizeof(double));
  std::vector<float> all_packed(packed.size() * static_cast<std::size_t>(world_));
  comm_.all_gather(packed, all_packed);  // host bytes (the partials), moved only
  double squares = 0.0;
  for (int q = 0; q < world_; ++q) {
    std::size_t k = 0;
    for (std::size_t c = chunk_bounds_[static_cast<std::size_t>(q)]; c < chunk_bounds_[static_cast<std::size_t>(q) + 1]; ++c) {
      if (!steps(chunks_[c].param)) continue;
      double partial = 0.0;
      std::memcpy(&partial, all_packed.data() + static_cast<std::size_t>(q) * packed.size() + 2 * k, sizeof(double));
      squares += partial;
      ++k;
    }
  }
  if (!std::isfinite(static_cast<float>(std::sqrt(squares)))) {
    // Name the first parameter with a non-finite gradient, as Adam does.
    float culprit = std::numeric_limits<float>::max();
    for_each_piece(rank_, [&](std::size_t i, std::int64_t b, std::int64_t e) {
      if (!steps(i) || culprit != std::numeric_limits<float>::max()) return;
      const std::span<const float> piece(grad + (b - begin), static_cast<std::size_t>(e - b));
      if (!kernels.all_finite(piece)) culprit = static_cast<float>(i);
    });
    std::vector<float> culprits(static_cast<std::size_t>(world_));
    comm_.all_gather(std::span<const float>(&culprit, 1), culprits);
    const float first = *std::min_element(culprits.begin(), culprits.end());
    const auto index = static_cast<std::size_t>(first);
    detail::throw_non_finite_gradient_norm("ShardedAdam", params_,
                                           first == std::numeric_limits<float>::max() ? nullptr : &index);
  }
  const auto norm = static_cast<float>(std::sqrt(squares));

  // 3. Adam on this rank's shard, in the parameters' own buffers.
  ++steps_;
  const float clip = detail::adam_clip_factor(options_, norm);
  std::vector<float*> theta(count, nullptr);
  for (std::size_t i = 0; i < count; ++i) {
    if (!steps(i)) continue;
    // Bumps the buffer's version on every rank (graphs that read it become stale).
    Tensor handle = params_[i].mutable_value("updated in place by ShardedAdam::step");
    theta[i] = const_cast<float*>(std::as_const(handle).device_data());
  }
  float* m = m_.device_data();
  float* v = v_.device_data();
  std::vector<backend::AdamUpdate> updates;
  std::vector<std::int64_t> update_steps;  // each piece's step: its parameter's count + 1, as Adam's
  for_each_piece(rank_, [&](std::size_t i, std::int64_t b, std::int64_t e) {
    if (!steps(i)) return;
    updates.push_back({theta[i] + (b - offset_[i]), m + (b - begin), v + (b - begin), grad + (b - begin), e - b,
                       detail::adam_decay_factor(options_, weight_decay_[i])});
    update_steps.push_back(parameter_steps_[i] + 1);
  });
  detail::run_adam_updates(kernels, options_, clip, updates, update_steps);
  for (std::size_t i = 0; i < count; ++i) {
    if (steps(i)) ++parameter_steps_[i];  // on every rank (the flags are the same everywhere)
  }
  grad_shard = Tensor();  // done with: the all-gather below does not hold it too

  // 4. Every rank gets every updated shard (in slices: gather_shards).
  if (world_ > 1) {
    try {
      gather_shards(
          [&](std::int64_t lo, std::int64_t hi, float* out) {
            for_each_piece_in(lo, hi, [&](std::size_t i, std::int64_t b, std::int64_t e) {
              kernels.copy_values(params_[i].value().device_data() + (b - offset_[i]), out + (b - lo), e - b);
            });
          },
          [&](int q, std::int64_t lo, std::int64_t hi, const float* row) {
            if (q == rank_) return;
            for_each_piece_in(lo, hi, [&](std::size_t i, std::int64_t b, std::int64_t e) {
              if (steps(i)) kernels.copy_values(row + (b - lo), theta[i] + (b - offset_[i]), e - b);
            });
          });
    } catch (const std::exception& e) {
      failure_ = "step " + std::to_string(steps_) + "'s parameter all-gather failed (" + e.what() +
                 "): this rank's shard was updated, the others' were not, so the ranks' parameters differ";
      throw;
    }
  }
  return norm;
}

Adam::State ShardedAdam::state() const {
  if (!failure_.empty()) refuse_after_failure(failure_, "state()");
  const backend::Kernels& kernels = backend::kernels(backend_, "ShardedAdam");
  Adam::State s;
  s.steps = steps_;
  s.parameter_steps = parameter_steps_;
  for (const Tensor* moment : {&m_, &v_}) {
    const float* mine = moment->device_data();
    std::vector<Tensor> full;
    for (std::size_t i = 0; i < params_.size(); ++i) full.push_back(Tensor::zeros(params_[i].shape(), backend_));
    gather_shards(
        [&](std::int64_t lo, std::int64_t hi, float* out) { kernels.copy_values(mine + (lo - shard_begin()), out, hi - lo); },
        [&](int, std::int64_t lo, std::int64_t hi, const float* row) {
          for_each_piece_in(lo, hi, [&](std::size_t i, std::int64_t b, std::int64_t e) {
            kernels.copy_values(row + (b - lo), full[i].device_data() + (b - offset_[i]), e - b);
          });
        });
    (moment == &m_ ? s.first_moment : s.second_moment) = std::move(full);
  }
  return s;
}

void ShardedAdam::set_state(const Adam::State& state) {
  if (state.first_moment.size() != params_.size() || state.second_moment.size() != params_.size()) {
    throw ValueError("[ShardedAdam] state has " + std::to_string(state.first_moment.size()) + " and " +
                     std::to_string(state.second_moment.size()) + " moments for " + std::to_string(params_.size()) +
                     " parameters");
  }
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Shape& shape = params_[i].value().shape();
    for (const Tensor* t : {&state.first_moment[i], &state.second_moment[i]}) {
      if (!t->defined() || t->shape() != shape || t->backend() != backend_ ||
          params_[i].value().numel() != numel_[i]) {
        distributed_detail::throw_mismatch(!t->defined() || t->shape() != shape || params_[i].value().numel() != numel_[i],
                                           "[ShardedAdam] state for '" + params_[i].name() + "' has shape " +
                         (t->defined() ? shape_string(t->shape()) + " on " + backend_name(t->backend())
                                       : std::string("(undefined)")) +
                         ", parameter is " + shape_string(shape) + " (" + std::to_string(numel_[i]) +
                         " elements when this ShardedAdam was built), on " + backend_name(backend_));
      }
    }
  }
  detail::check_adam_state_values("ShardedAdam", state, params_);
  const std::int64_t begin = shard_begin();
  const backend::Kernels& kernels = backend::kernels(backend_, "ShardedAdam");
  Tensor m = Tensor::zeros(m_.shape(), backend_);
  Tensor v = Tensor::zeros(v_.shape(), backend_);
  float* mp = m.device_data();
  float* vp = v.device_data();
  for_each_piece(rank_, [&](std::size_t i, std::int64_t b, std::int64_t e) {
    kernels.copy_values(state.first_moment[i].device_data() + (b - offset_[i]), mp + (b - begin), e - b);
    kernels.copy_values(state.second_moment[i].device_data() + (b - offset_[i]), vp + (b - begin), e - b);
  });
  m_ = std::move(m);
  v_ = std::move(v);
  steps_ = state.steps;
  parameter_steps_ = state.parameter_steps.empty() ? std::vector<std::int64_t>(params_.size(), state.steps)
                                                   : state.parameter_steps;
  failure_.clear();
}

}  // namespace riftco_transformer
