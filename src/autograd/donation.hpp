#pragma once
// Saved buffers a backward closure may overwrite (take_if_unique): the
// engine's side. Private to the autograd layer.
#include "node.hpp"

namespace riftco_transformer {

/// While alive, this thread's passes never donate (a Keep pass, and every
/// pass it encloses: a checkpoint's replay inside a Keep backward).
class NoDonationGuard {
 public:
  NoDonationGuard();
  ~NoDonationGuard();
  NoDonationGuard(const NoDonationGuard&) = delete;
  NoDonationGuard& operator=(const NoDonationGuard&) = delete;
  static bool active();
};

/// Set by a Release pass around one node's closure (its last run). Only
/// take_if_unique looks further: the values of inputs that only the pass
/// and this node's edge hold, and the node's `saved` list (a report's
/// copy), own a buffer besides the closure's handle; such a buffer may be
/// handed over. Scopes nest (a checkpoint's replay runs its own pass inside
/// the checkpoint node's closure).
class DonationScope {
 public:
  explicit DonationScope(Node& node);
  ~DonationScope();
  DonationScope(const DonationScope&) = delete;
  DonationScope& operator=(const DonationScope&) = delete;
  /// take_if_unique handed a buffer over: the node must be released even if
  /// the pass throws (its closure can no longer run).
  bool donated() const { return donated_; }

 private:
  friend Tensor take_if_unique(Tensor& saved);
  DonationScope* previous_;
  Node* node_;
  bool donated_ = false;
};

}  // namespace riftco_transformer
