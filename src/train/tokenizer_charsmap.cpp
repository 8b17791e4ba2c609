#include "tokenizer_charsmap.hpp"

#include <cstdint>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace riftco_transformer::detail {
namespace {

/// One protocol-buffer field: its number, wire type and, for the
/// length-delimited type, its bytes.
struct Field {
  std::uint64_t number = 0;
  int wire_type = 0;
  std::string_view bytes;
};

/// Reads the fields of a serialized message in order, as the protobuf parser
/// SentencePiece uses reads them (Debian's links protobuf 3.21; the copy
/// SentencePiece bundles reads tags the same way); nullopt at the end or, on input
/// that parser refuses too, with malformed() set. Where the two could differ
/// on a model the parser accepts, a map the validator never saw would be
/// used: so a tag is at most 5 bytes and keeps its low 32 bits (a 5-byte tag
/// 9A 80 80 80 10 is field 3 to the parser; read as 64 bits it was field
/// 3 + 2^29 and its map went unchecked), and groups (wire types 3 and 4),
/// which the parser skips as unknown fields, are skipped whole.
class FieldReader {
 public:
  explicit FieldReader(std::string_view message) : rest_(message) {}
  bool malformed() const { return malformed_; }

  std::optional<Field> next() {
    if (rest_.empty() || malformed_) return std::nullopt;
    const std::optional<std::uint32_t> key = tag();
    if (!key) return fail();
    Field field{*key >> 3, static_cast<int>(*key & 7), {}};
    if (field.wire_type == 4 || !skip_value(field, 0)) return fail();  // an end-group with no group open
    return field;
  }

 private:
  static constexpr int kMaxGroupDepth = 100;  // protobuf's recursion limit

  /// Consumes one field's value (a group: up to its matching end-group).
  bool skip_value(Field& field, int depth) {
    switch (field.wire_type) {
      case 0:
        return varint().has_value();
      case 1:
      case 5: {
        const std::size_t n = field.wire_type == 1 ? 8 : 4;
        if (rest_.size() < n) return false;
        rest_.remove_prefix(n);
        return true;
      }
      case 2: {
        const std::optional<std::uint64_t> length = varint();
        if (!length || *length > rest_.size()) return false;
        field.bytes = rest_.substr(0, static_cast<std::size_t>(*length));
        rest_.remove_prefix(static_cast<std::size_t>(*length));
        return true;
      }
      case 3: {
        if (depth >= kMaxGroupDepth) return false;
        while (!rest_.empty()) {
          const std::optional<std::uint32_t> key = tag();
          if (!key) return false;
          Field inner{*key >> 3, static_cast<int>(*key & 7), {}};
          if (inner.wire_type == 4) return inner.number == field.number;
          if (!skip_value(inner, depth + 1)) return false;
        }
        return false;  // no end-group
      }
      default:
        return false;
    }
  }
  std::optional<std::uint32_t> tag() {
    std::uint32_t value = 0;
    for (int i = 0; i < 5 && !rest_.empty(); ++i) {
      const auto byte = static_cast<unsigned char>(rest_.front());
      rest_.remove_prefix(1);
      value |= static_cast<std::uint32_t>(byte & 0x7F) << (7 * i);  // the 5th byte's high bits drop, as in protobuf
      if ((byte & 0x80) == 0) return value == 0 ? std::nullopt : std::optional<std::uint32_t>(value);
    }
    return std::nullopt;  // longer than 5 bytes, or cut off
  }
  std::optional<std::uint64_t> varint() {
    std::uint64_t value = 0;
    for (int shift = 0; shift < 64 && !rest_.empty(); shift += 7) {
      const auto byte = static_cast<unsigned char>(rest_.front());
      rest_.remove_prefix(1);
      value |= static_cast<std::uint64_t>(byte & 0x7F) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    return std::nullopt;
  }
  std::nullopt_t fail() {
    malformed_ = true;
    return std::nullopt;
  }

  std::string_view rest_;
  bool malformed_ = false;
};

// Darts-clone's double-array unit, as SentencePiece's normalizer reads it.
bool has_leaf(std::uint32_t unit) { return ((unit >> 8) & 1) == 1; }
std::uint32_t value_of(std::uint32_t unit) { return unit & ((1U << 31) - 1); }
std::uint32_t label_of(std::uint32_t unit) { return unit & ((1U << 31) | 0xFF); }
std::uint32_t offset_of(std::uint32_t unit) { return (unit >> 10) << ((unit & (1U << 9)) >> 6); }

/// What would read out of bounds in one precompiled map: a 32-bit trie size,
/// the trie (32-bit units), then NUL-terminated replacement strings. Every
/// node reachable from the root is checked against every input byte, as a
/// common-prefix search over arbitrary text would walk it.
///
/// Linear in the map: a node's 256 lookups are the 256 units of its block
/// (bounds: one comparison), its children are found through an index of the
/// units by parent, and the state is flat arrays of one entry per unit. A
/// hostile 64 MiB model of 16 M units, every one a node, takes a few seconds
/// at most and a few bytes per unit (hash maps took 5.8 s and 1.6 GB).
std::string map_problem(std::string_view blob) {
  if (blob.empty()) return "";  // no map: SentencePiece builds no trie
  // SentencePiece's normalizer refuses the next two at init, but its Load
  // checks only the normalizer's status: a denormalizer map like these loaded
  // and every decode() returned "".
  std::uint32_t trie_bytes = 0;
  if (blob.size() <= sizeof trie_bytes) {
    return "it has " + std::to_string(blob.size()) + " bytes, too few for its trie size field";
  }
  std::memcpy(&trie_bytes, blob.data(), sizeof trie_bytes);
  if (trie_bytes >= blob.size()) {
    return "its trie of " + std::to_string(trie_bytes) + " bytes is not smaller than the map's " +
           std::to_string(blob.size()) + " bytes";
  }
  // SentencePiece compares the size with the whole map, size field included:
  // a trie that ends within 4 bytes past the map passes its check and is read
  // out of bounds (and the strings' view then underflows).
  if (trie_bytes > blob.size() - sizeof trie_bytes) {
    return "its trie of " + std::to_string(trie_bytes) + " bytes runs past the map's " +
           std::to_string(blob.size() - sizeof trie_bytes) + " bytes after the size field";
  }
  const std::string_view trie = blob.substr(sizeof trie_bytes, trie_bytes);
  const std::string_view strings = blob.substr(sizeof trie_bytes + trie_bytes);
  const std::size_t units = trie.size() / sizeof(std::uint32_t);
  if (units == 0) return "its trie has no units";
  const auto unit = [&](std::size_t i) {
    std::uint32_t u = 0;
    std::memcpy(&u, trie.data() + i * sizeof u, sizeof u);
    return u;
  };
  // A replacement starting at byte v is terminated iff a NUL lies at or after v.
  const std::size_t last_nul = strings.rfind('\0');
  // A lookup of byte b at the node whose children start at `base` reads unit
  // base ^ b: the node's 256 lookups are exactly the units of base's block.
  const auto lookups_in_bounds = [&](std::uint32_t base) { return (static_cast<std::size_t>(base) | 0xFFU) < units; };
  const auto out_of_bounds = [&](std::uint32_t base) {
    std::uint32_t byte = 0;
    while ((base ^ byte) < units) ++byte;  // the first input byte that reads past the trie
    return "its trie reads unit " + std::to_string(base ^ byte) + " of " + std::to_string(units) + " (input byte " +
           std::to_string(byte) + ")";
  };
  // Unit x is the child, on input byte label(x), of the node at x ^ label(x)
  // (in x's block). Index the units by that parent (counting sort).
  std::vector<std::uint32_t> first(units + 1, 0);
  for (std::size_t x = 0; x < units; ++x) {
    const std::uint32_t label = label_of(unit(x));
    if (label < 256 && (x ^ label) < units) ++first[(x ^ label) + 1];
  }
  for (std::size_t i = 0; i < units; ++i) first[i + 1] += first[i];
  std::vector<std::uint32_t> children(first[units]);
  {
    std::vector<std::uint32_t> fill(first.begin(), first.end() - 1);
    for (std::size_t x = 0; x < units; ++x) {
      const std::uint32_t label = label_of(unit(x));
      if (label < 256 && (x ^ label) < units) children[fill[x ^ label]++] = static_cast<std::uint32_t>(x);
    }
  }
  const std::uint32_t root = offset_of(unit(0));  // the root's children start here
  if (!lookups_in_bounds(root)) return out_of_bounds(root);
  // Breadth-first from the root: every reachable node's lookups and rules.
  std::vector<std::uint8_t> seen(units, 0);
  std::vector<std::uint32_t> pending{root};
  seen[root] = 1;
  for (std::size_t next = 0; next < pending.size(); ++next) {
    const std::uint32_t base = pending[next];
    for (std::uint32_t i = first[base]; i < first[base + 1]; ++i) {
      const std::uint32_t at = children[i];
      const std::uint32_t u = unit(at);
      const std::uint32_t child = at ^ offset_of(u);
      if (has_leaf(u)) {
        if (child >= units) {
          return "a rule's value is at unit " + std::to_string(child) + " of " + std::to_string(units);
        }
        const std::uint32_t value = value_of(unit(child));
        if (value >= strings.size() || last_nul == std::string_view::npos || last_nul < value) {
          return "a rule's replacement starts at byte " + std::to_string(value) + " of " +
                 std::to_string(strings.size()) + " with no terminating NUL after it";
        }
      }
      if (!lookups_in_bounds(child)) return out_of_bounds(child);
      if (seen[child] == 0) {
        seen[child] = 1;
        pending.push_back(child);
      }
    }
  }
  // SentencePiece keeps the matches along one input in an array of 32 but
  // loops over as many as the trie reports: a path through more than 32 rule
  // ends (or a loop through one, unbounded) reads past it. The most rule ends
  // on a path from the root, raised node by node (each node at most 33 times).
  constexpr int kMaxMatches = 32;
  constexpr std::uint8_t kUnreached = 0xFF;
  std::vector<std::uint8_t> most(units, kUnreached);
  most[root] = 0;
  std::deque<std::uint32_t> raised{root};
  while (!raised.empty()) {
    const std::uint32_t node = raised.front();
    raised.pop_front();
    for (std::uint32_t i = first[node]; i < first[node + 1]; ++i) {
      const std::uint32_t u = unit(children[i]);
      const std::uint32_t child = children[i] ^ offset_of(u);
      const int count = most[node] + (has_leaf(u) ? 1 : 0);
      if (count > kMaxMatches) {
        return "more than " + std::to_string(kMaxMatches) +
               " of its rules match prefixes of one input (SentencePiece keeps " + std::to_string(kMaxMatches) +
               " matches)";
      }
      if (most[child] == kUnreached || count > most[child]) {
        most[child] = static_cast<std::uint8_t>(count);
        raised.push_back(child);
      }
    }
  }
  return "";
}

}  // namespace

std::string charsmap_problem(std::string_view model_bytes) {
  FieldReader model(model_bytes);
  while (const std::optional<Field> field = model.next()) {
    // ModelProto: 3 normalizer_spec, 5 denormalizer_spec (NormalizerSpec:
    // 2 precompiled_charsmap). Every occurrence is checked: the parser merges
    // repeated ones, so any of them may be the map that is used.
    if (field->wire_type != 2 || (field->number != 3 && field->number != 5)) continue;
    const char* which = field->number == 3 ? "normalizer" : "denormalizer";
    FieldReader spec(field->bytes);
    while (const std::optional<Field> inner = spec.next()) {
      if (inner->number != 2 || inner->wire_type != 2) continue;
      if (std::string problem = map_problem(inner->bytes); !problem.empty()) {
        return std::string("the ") + which + "'s precompiled character map is broken: " + problem;
      }
    }
    if (spec.malformed()) return std::string("the ") + which + " specification is malformed";
  }
  if (model.malformed()) return "it is not a well-formed protocol buffer";
  return "";
}

}  // namespace riftco_transformer::detail
