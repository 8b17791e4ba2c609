// The ranks of a data-parallel job agree on their run configuration before
// anything else (rank_shards.hpp, check_same_config): every rank gathers
// every rank's canonical configuration text and compares it field by field.
#include <algorithm>
#include <string>
#include <vector>

#include "../distributed/gather_words.hpp"
#include "../io/json_read.hpp"
#include "rank_shards.hpp"

namespace riftco_transformer::stage {
namespace {

/// Every rank's `text` in rank order: the lengths first (one all-gather),
/// then the bytes padded to the longest, 8 to a word (one all-gather whose
/// size every rank knows from the first).
std::vector<std::string> gather_texts(Communicator& comm, const std::string& text) {
  const std::vector<std::uint64_t> lengths = gather_counts(comm, text.size());
  const std::uint64_t longest = *std::max_element(lengths.begin(), lengths.end());
  const std::size_t words = static_cast<std::size_t>((longest + 7) / 8);
  std::vector<std::uint64_t> mine(words, 0);
  for (std::size_t i = 0; i < text.size(); ++i) {
    mine[i / 8] |= static_cast<std::uint64_t>(static_cast<unsigned char>(text[i])) << (8 * (i % 8));
  }
  const std::vector<std::uint64_t> all = distributed_detail::all_gather_words(comm, mine);
  std::vector<std::string> texts;
  for (std::size_t q = 0; q < lengths.size(); ++q) {
    std::string t(static_cast<std::size_t>(lengths[q]), '\0');
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<char>((all[q * words + i / 8] >> (8 * (i % 8))) & 0xFF);
    texts.push_back(std::move(t));
  }
  return texts;
}

/// "dimensions.layers" for nlohmann's "/dimensions/layers".
std::string field_name(const std::string& pointer) {
  std::string name = pointer.substr(pointer.empty() ? 0 : 1);
  std::replace(name.begin(), name.end(), '/', '.');
  return name;
}

/// A configuration text as {"/field/sub": value} (our own dump; anything else: empty).
nlohmann::json flat(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  return j.is_object() ? j.flatten() : nlohmann::json::object();
}

std::string shown(const nlohmann::json& flat, const std::string& key) {
  const auto it = flat.find(key);
  return it == flat.end() ? std::string("absent") : detail::quote(it->dump());
}

}  // namespace

nlohmann::json agreed_config(const nlohmann::json& config, const std::string& stage, bool resume) {
  nlohmann::json agreed = config;
  for (const char* key : kPerRankSettings) agreed.erase(key);
  agreed["stage"] = stage;
  agreed["resume"] = resume;
  return agreed;
}

void check_same_config(Communicator& comm, const nlohmann::json& agreed, const std::string& op) {
  if (comm.world_size() == 1) return;
  // Object keys come sorted: the same settings give the same text.
  const std::vector<std::string> texts = gather_texts(comm, agreed.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  for (std::size_t q = 1; q < texts.size(); ++q) {
    if (texts[q] == texts[0]) continue;
    const nlohmann::json a = flat(texts[0]);
    const nlohmann::json b = flat(texts[q]);
    std::vector<std::string> keys;
    for (const nlohmann::json* j : {&a, &b}) {
      for (auto it = j->begin(); it != j->end(); ++it) keys.push_back(it.key());
    }
    std::sort(keys.begin(), keys.end());
    std::string field = "?";
    for (const std::string& k : keys) {
      if (!a.contains(k) || !b.contains(k) || a[k] != b[k]) {
        field = k;
        break;
      }
    }
    std::size_t differing = 0;
    for (const std::string& t : texts) differing += t != texts[0] ? 1 : 0;
    throw ValueError("[" + op + "] the ranks of this job were started with different settings: '" +
                     field_name(field) + "' is " + shown(a, field) + " on rank 0 and " + shown(b, field) +
                     " on rank " + std::to_string(q) + " (" + std::to_string(differing) + " of " +
                     std::to_string(texts.size()) +
                     " ranks differ from rank 0); every rank of a data-parallel job must run the same configuration "
                     "on the same data (only activation_checkpointing, checkpoint_segment_blocks, "
                     "activation_memory_budget and activation_offload may differ): start every rank with the same "
                     "options and files");
  }
}

}  // namespace riftco_transformer::stage
