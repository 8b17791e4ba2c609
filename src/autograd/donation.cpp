#include "donation.hpp"

#include <utility>

#include "../tensor/offload.hpp"

namespace riftco_transformer {
namespace {
thread_local int t_no_donation = 0;
thread_local DonationScope* t_scope = nullptr;
}  // namespace

NoDonationGuard::NoDonationGuard() { ++t_no_donation; }
NoDonationGuard::~NoDonationGuard() { --t_no_donation; }
bool NoDonationGuard::active() { return t_no_donation > 0; }

DonationScope::DonationScope(const Node& node) : previous_(t_scope) {
  for (const Edge& e : node.parents) {
    const Node& p = *e.node;
    // 2 = the pass's order + this edge: no caller's Variable, no other
    // child (whose closure or parents() could still read the value).
    if (!p.is_leaf && !p.retain_grad && !p.released && e.node.use_count() == 2) graph_values_.push_back(&p.value);
  }
  t_scope = this;
}

DonationScope::~DonationScope() { t_scope = previous_; }

Tensor take_if_unique(Tensor& saved) {
  DonationScope* scope = t_scope;
  if (scope == nullptr || NoDonationGuard::active() || !saved.defined()) return {};
  if (detail::OffloadAccess::parked(*detail::OffloadAccess::storage(saved))) return {};
  long owners = 1;  // `saved` itself
  for (const Tensor* v : scope->graph_values_) {
    if (v->shares_storage(saved)) ++owners;
  }
  if (saved.use_count() != owners) return {};
  scope->donated_ = true;
  return std::exchange(saved, Tensor());
}

}  // namespace riftco_transformer
