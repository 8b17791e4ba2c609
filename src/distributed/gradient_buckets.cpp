// GradientBucketer: bucketed gradient all-reduce overlapped with backward
// (include/riftco_transformer/gradient_buckets.hpp, docs/distributed.md).
#include "riftco_transformer/gradient_buckets.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>
#include <utility>

#include "../backend/kernels.hpp"
#include "model_backend.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer {
namespace {
/// MPI_Test calls per poll (after each node of backward and each final gradient).
constexpr int kPollsPerCall = 16;
}  // namespace

void BucketOptions::validate() const {
  if (!(bucket_mib > 0.0) || !std::isfinite(bucket_mib)) {
    throw ValueError("[GradientBucketer] bucket_mib must be finite and > 0, got " + std::to_string(bucket_mib));
  }
}

GradientBucketer::GradientBucketer(Communicator& communicator, std::vector<Variable> parameters,
                                   BucketOptions options)
    : comm_(communicator), params_(std::move(parameters)), options_(options),
      buffers_(std::make_unique<std::vector<Tensor>>()) {
  options_.validate();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const Variable& p = params_[i];
    if (!p.defined() || !p.is_leaf() || !p.requires_grad()) {
      throw ValueError("[GradientBucketer] parameter " + std::to_string(i) +
                       (p.defined() ? " '" + p.name() + "'" : "") + " must be a leaf that requires grad");
    }
    if (!index_.emplace(p.node(), i).second) {
      throw ValueError("[GradientBucketer] parameter " + std::to_string(i) + " '" + p.name() + "' appears twice");
    }
  }
  backend_ = distributed_detail::model_backend(comm_, params_, "GradientBucketer");
  // Reverse registration order: the last parameters fill the first bucket.
  // Clamped in double first: converting a value past int64's range (1e300
  // MiB) is undefined behaviour; 2^62 elements is more than any model holds.
  const double elements = std::min(options_.bucket_mib * 1024.0 * 1024.0 / sizeof(float), 0x1p62);
  const auto capacity = std::max<std::int64_t>(1, static_cast<std::int64_t>(elements));
  slots_.resize(params_.size());
  for (std::size_t k = params_.size(); k-- > 0;) {
    const std::int64_t n = params_[k].value().numel();
    if (buckets_.empty() || (buckets_.back().elements > 0 && buckets_.back().elements + n > capacity)) {
      buckets_.emplace_back();
    }
    Bucket& b = buckets_.back();
    slots_[k] = Slot{buckets_.size() - 1, b.elements, n, false};
    b.members.push_back(k);
    b.elements += n;
  }
  for (const Bucket& b : buckets_) buffers_->push_back(Tensor::zeros({b.elements}, backend_));
  requests_.resize(buckets_.size());
}

GradientBucketer::~GradientBucketer() {
  // A request MPI may still write into (a failed pass): keep the buffers.
  if (in_flight() > 0) static_cast<void>(buffers_.release());
}

const std::vector<std::size_t>& GradientBucketer::bucket_parameters(std::size_t b) const {
  if (b >= buckets_.size()) {
    throw ValueError("[GradientBucketer] bucket " + std::to_string(b) + " out of range (" +
                     std::to_string(buckets_.size()) + " buckets)");
  }
  return buckets_[b].members;
}

std::int64_t GradientBucketer::bucket_elements(std::size_t b) const {
  bucket_parameters(b);  // the range check
  return buckets_[b].elements;
}

std::size_t GradientBucketer::in_flight() const {
  std::size_t count = 0;
  for (const auto& r : requests_) count += r != nullptr ? 1 : 0;
  return count;
}

void GradientBucketer::backward(const Variable& output) {
  base_.clear();
  output.backward(*this);
}

void GradientBucketer::backward(const Variable& output, const Tensor& seed) {
  base_.clear();
  output.backward(seed, *this);
}

void GradientBucketer::set_base(std::span<const Tensor> base, float weight) {
  if (base.size() != params_.size()) {
    throw ShapeError("[GradientBucketer] " + std::to_string(base.size()) + " accumulated gradients for " +
                     std::to_string(params_.size()) + " parameters");
  }
  if (!std::isfinite(weight)) throw ValueError("[GradientBucketer] weight must be finite, got " + std::to_string(weight));
  for (std::size_t k = 0; k < base.size(); ++k) {
    const Tensor& b = base[k];
    if (b.defined() && (b.shape() != params_[k].shape() || b.backend() != backend_)) {
      distributed_detail::throw_mismatch(b.shape() != params_[k].shape(), "[GradientBucketer] the accumulated gradient of '" + params_[k].name() + "' is " +
                       shape_string(b.shape()) + " on " + backend_name(b.backend()) + ", the parameter " +
                       shape_string(params_[k].shape()) + " on " + backend_name(backend_));
    }
  }
  base_.assign(base.begin(), base.end());
  weight_ = weight;
}

void GradientBucketer::backward(const Variable& output, std::span<const Tensor> base, float weight,
                                GraphAfterBackward graph) {
  set_base(base, weight);
  try {
    output.backward(*this, graph);
  } catch (...) {
    base_.clear();
    throw;
  }
  base_.clear();
}

std::vector<Tensor> GradientBucketer::reduce(std::span<const Tensor> base) {
  set_base(base, 1.0F);
  std::vector<Tensor> out;
  try {
    begin_pass();
    complete_pass();  // every slot from `base`; the buckets start in order
    out = reduced_gradients();
  } catch (...) {
    base_.clear();
    throw;
  }
  base_.clear();
  return out;
}

void GradientBucketer::begin_pass() {
  // A request of a failed pass that has not completed means the ranks no
  // longer issue the same collectives: nothing sensible can follow.
  for (auto& r : requests_) {
    if (r != nullptr && r->test()) r.reset();
  }
  if (const std::size_t pending = in_flight(); pending > 0) {
    throw CommunicationError("[GradientBucketer] a previous backward failed with " + std::to_string(pending) +
                             " bucket all-reduce(s) still in flight on rank " + std::to_string(comm_.rank()) +
                             " of " + std::to_string(comm_.world_size()) +
                             ": the ranks are out of step; end the job");
  }
  for (Bucket& b : buckets_) b.pending = b.members.size();
  for (Slot& s : slots_) {
    s.filled = false;
    s.present = false;
  }
  next_start_ = 0;
  final_count_ = 0;
  report_ = PassReport{};
  in_pass_ = true;
}

void GradientBucketer::fill(std::size_t index, const Tensor* gradient) {
  Slot& slot = slots_[index];
  const Variable& p = params_[index];
  // The bucket's layout was made for the sizes at construction.
  const std::int64_t n = p.value().numel();
  if (n != slot.elements || p.backend() != backend_) {
    distributed_detail::throw_mismatch(n != slot.elements, "[GradientBucketer] parameter " + std::to_string(index) + " '" + p.name() + "' is now " +
                     shape_string(p.shape()) + " on " + backend_name(p.backend()) +
                     ", not what its bucket was laid out for: build a new GradientBucketer");
  }
  const bool has_gradient = gradient != nullptr && gradient->defined();
  if (has_gradient && (gradient->shape() != p.shape() || gradient->backend() != backend_)) {
    distributed_detail::throw_mismatch(gradient->shape() != p.shape(), "[GradientBucketer] gradient " + shape_string(gradient->shape()) + " on " +
                     backend_name(gradient->backend()) + " for parameter '" + p.name() + "' " +
                     shape_string(p.shape()) + ": the buckets reduce " + backend_name(backend_) +
                     " gradients of the parameter's shape");
  }
  // Packing, accumulation and zeros on the buckets' backend, by its kernels.
  const backend::Kernels& kernels = backend::kernels(backend_, "GradientBucketer");
  Tensor combined;  // accumulation: GradientAccumulator::add's kernels, so its bits
  const Tensor* source = has_gradient ? gradient : nullptr;
  if (!base_.empty()) {
    const Tensor& base = base_[index];
    if (has_gradient && base.defined()) {
      combined = base.clone();
      kernels.axpy_inplace(combined, weight_, *gradient);  // base + weight · g
      source = &combined;
    } else if (has_gradient) {
      combined = kernels.scale(*gradient, weight_);  // weight · g
      source = &combined;
    } else if (base.defined()) {
      source = &base;
    }
  }
  float* out = (*buffers_)[slot.bucket].device_data() + slot.offset;
  if (source != nullptr) {
    kernels.copy_values(source->device_data(), out, n);
  } else {
    kernels.fill_values(out, n, 0.0F);  // no contribution on this rank: zeros, as the commit would publish
  }
  slot.filled = true;
  slot.present = slot.present || source != nullptr;
  ++final_count_;
  --buckets_[slot.bucket].pending;
}

void GradientBucketer::start_ready_buckets() {
  while (next_start_ < buckets_.size() && buckets_[next_start_].pending == 0) {
    requests_[next_start_] = comm_.start_all_reduce_sum((*buffers_)[next_start_]);  // on its backend
    report_.started.push_back(next_start_);
    report_.final_parameters_at_start.push_back(final_count_);
    ++next_start_;
  }
}

void GradientBucketer::progress() {
  // MPI moves non-blocking collectives along only inside MPI calls, about
  // one message fragment per call (Open MPI has no progress thread): poll a
  // few times. The requests run in start order, so testing the oldest
  // unfinished one advances the queue.
  for (int poll = 0; poll < kPollsPerCall; ++poll) {
    std::size_t b = 0;
    while (b < next_start_ && (requests_[b] == nullptr || requests_[b]->test())) ++b;
    if (b == next_start_) return;  // nothing in flight
  }
}

void GradientBucketer::gradient_final(const Variable& leaf, const Tensor& gradient) {
  if (!in_pass_) {
    throw BackwardError("[GradientBucketer] gradient_final outside a pass: use GradientBucketer::backward");
  }
  const auto it = index_.find(leaf.node());
  if (it == index_.end() || slots_[it->second].filled) return;  // not a registered parameter (an input)
  slots_[it->second].present = true;  // reached (without a contribution: the commit's zeros)
  fill(it->second, &gradient);
  start_ready_buckets();
  progress();
}

void GradientBucketer::node_done() {
  if (in_pass_) progress();
}

std::vector<std::pair<Variable, Tensor>> GradientBucketer::finish() {
  complete_pass();
  std::vector<Tensor> gradients = reduced_gradients();
  std::vector<std::pair<Variable, Tensor>> reduced;
  reduced.reserve(params_.size());
  for (std::size_t k = 0; k < params_.size(); ++k) {
    // No rank had one: the commit leaves the parameter as backward() does
    // a leaf it did not reach.
    if (gradients[k].defined()) reduced.emplace_back(params_[k], std::move(gradients[k]));
  }
  return reduced;
}

void GradientBucketer::complete_pass() {
  if (!in_pass_) throw BackwardError("[GradientBucketer] finish outside a pass: use GradientBucketer::backward");
  report_.started_during_backward = next_start_;
  // Parameters the pass did not reach: zeros (this rank adds nothing).
  for (std::size_t k = 0; k < params_.size(); ++k) {
    if (!slots_[k].filled) fill(k, nullptr);
  }
  for (std::size_t b = 0; b < next_start_; ++b) {
    if (requests_[b] != nullptr && requests_[b]->test()) ++report_.completed_during_backward;
  }
  start_ready_buckets();
  in_pass_ = false;
  for (auto& r : requests_) {
    r->wait();
    r.reset();
  }
}

std::vector<Tensor> GradientBucketer::reduced_gradients() {
  std::vector<float> present(params_.size(), 0.0F);
  for (std::size_t k = 0; k < params_.size(); ++k) present[k] = slots_[k].present ? 1.0F : 0.0F;
  comm_.all_reduce_sum(std::span<float>(present));
  const auto world = static_cast<float>(comm_.world_size());
  const backend::Kernels& kernels = backend::kernels(backend_, "GradientBucketer");
  std::vector<Tensor> out(params_.size());
  for (std::size_t k = 0; k < params_.size(); ++k) {
    if (present[k] == 0.0F) continue;
    const Slot& slot = slots_[k];
    const float* in = std::as_const((*buffers_)[slot.bucket]).device_data() + slot.offset;
    Tensor g = Tensor::empty(params_[k].shape(), backend_);
    if (options_.average && world != 1.0F) {
      kernels.divide_values(in, g.device_data(), g.numel(), world);  // all_reduce_average's arithmetic
    } else {
      kernels.copy_values(in, g.device_data(), g.numel());
    }
    out[k] = std::move(g);
  }
  return out;
}

}  // namespace riftco_transformer
