// The model structure's reader/writer lock (transformer_core.hpp).
#include <algorithm>
#include <string>
#include <vector>

#include "riftco_transformer/errors.hpp"
#include "transformer_core.hpp"

namespace riftco_transformer {
namespace {

/// The models whose structure lock this thread holds now (shared or
/// exclusive), innermost last: a read inside a change (to() listing the
/// parameters it moves) needs no second hold.
std::vector<const TransformerCore*>& held_by_this_thread() {
  thread_local std::vector<const TransformerCore*> held;
  return held;
}

bool held_here(const TransformerCore& core) {
  const auto& held = held_by_this_thread();
  return std::find(held.begin(), held.end(), &core) != held.end();
}

}  // namespace

StructureReadLock::StructureReadLock(const TransformerCore& core) {
  if (held_here(core)) return;
  auto& held = held_by_this_thread();
  held.reserve(held.size() + 1);  // the push below cannot throw once locked
  core.structure_lock.lock_shared();
  held.push_back(&core);
  held_ = &core;
}

StructureReadLock::~StructureReadLock() {
  if (held_ == nullptr) return;
  auto& held = held_by_this_thread();
  held.erase(std::find(held.begin(), held.end(), held_));
  held_->structure_lock.unlock_shared();
}

StructureWriteLock::StructureWriteLock(const TransformerCore& core, const char* op) {
  if (held_here(core)) {
    throw ValueError(std::string("[") + op +
                     "] called while this thread runs a forward, replay or decode step of the same model; "
                     "change the model's structure between calls");
  }
  auto& held = held_by_this_thread();
  held.reserve(held.size() + 1);
  guard_ = std::unique_lock<WriterFirstSharedMutex>(core.structure_lock);
  held.push_back(&core);
  core_ = &core;
}

StructureWriteLock::~StructureWriteLock() {
  auto& held = held_by_this_thread();
  held.erase(std::find(held.begin(), held.end(), core_));
}

}  // namespace riftco_transformer
