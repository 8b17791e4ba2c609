#include "donation.hpp"

#include <algorithm>
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

DonationScope::DonationScope(Node& node) : previous_(t_scope), node_(&node) { t_scope = this; }

DonationScope::~DonationScope() { t_scope = previous_; }

Tensor take_if_unique(Tensor& saved) {
  DonationScope* scope = t_scope;
  if (scope == nullptr || NoDonationGuard::active() || !saved.defined()) return {};
  if (detail::OffloadAccess::parked(*detail::OffloadAccess::storage(saved))) return {};
  Node& node = *scope->node_;
  long owners = 1;  // `saved` itself
  for (const Edge& e : node.parents) {
    const Node& p = *e.node;
    // 2 = the pass's order + this edge: no caller's Variable, no other
    // child (whose closure or parents() could still read the value).
    if (!p.is_leaf && !p.retain_grad && !p.released && e.node.use_count() == 2 && p.value.shares_storage(saved)) {
      ++owners;
    }
  }
  const auto listed = [&](const Tensor& s) { return &s != &saved && s.shares_storage(saved); };
  owners += std::count_if(node.saved.begin(), node.saved.end(), listed);
  if (saved.use_count() != owners) return {};
  // The node is released once its closure returns or throws; its report
  // copy goes now so the handed-over buffer has one owner.
  std::erase_if(node.saved, listed);
  scope->donated_ = true;
  return std::exchange(saved, Tensor());
}

}  // namespace riftco_transformer
