#include "safetensors_header.hpp"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "json_read.hpp"
#include "riftco_transformer/model_state.hpp"

namespace riftco_transformer::detail {
namespace {


constexpr std::uint64_t kMaxInt64 = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

// Built with append: GCC 12 warns falsely (-Wrestrict) on "literal" + std::string&& here.
std::string range_string(std::uint64_t begin, std::uint64_t end) {
  return std::string("[").append(std::to_string(begin)).append(", ").append(std::to_string(end)).append(")");
}

/// Parses the untrusted header (json_read.hpp: bounded depth, no NUL bytes,
/// no duplicate keys).
Json parse_json(const std::filesystem::path& path, std::string_view text, std::vector<std::string>& keys) {
  try {
    // Every array of a header is a shape or a [begin, end] pair (metadata
    // values are strings): a longer one is refused before a document is built.
    static const JsonArrayLimit limit{kMaxShapeDimensions, "a tensor shape has at most " +
                                                               std::to_string(kMaxShapeDimensions) + " dimensions"};
    return parse_untrusted_json(text, &keys, limit);
  } catch (const JsonReadError& e) {
    load_error(path, std::string("header ") + e.what());
  }
}

Shape parse_shape(const std::filesystem::path& path, const std::string& name, const Json& shape) {
  const std::string where = "tensor '" + quote(name) + "': ";
  if (!shape.is_array()) load_error(path, where + "\"shape\" is not an array");
  Shape result;  // at most kMaxShapeDimensions entries (parse_json's array limit)
  for (const Json& d : shape) {
    if (d.is_number_integer() && !d.is_number_unsigned()) {
      load_error(path, where + "shape " + quote_json(shape) + " has a negative dimension");
    }
    if (!d.is_number_unsigned()) load_error(path, where + "shape " + quote_json(shape) + " has a non-integer dimension");
    const auto value = d.get<std::uint64_t>();
    if (value > kMaxInt64) load_error(path, where + "shape " + quote_json(shape) + " has a dimension that is too large");
    result.push_back(static_cast<std::int64_t>(value));
  }
  return result;
}

/// numel * element bytes; shapes a Tensor could not hold (shape_numel's limits) are errors.
std::uint64_t shape_bytes(const std::filesystem::path& path, const std::string& name, const Shape& shape,
                          StoredDtype dtype) {
  try {
    return static_cast<std::uint64_t>(shape_numel(shape, "load")) * (dtype == StoredDtype::F32 ? 4U : 2U);
  } catch (const ShapeError&) {
    load_error(path, "tensor '" + name + "': shape " + shape_string(shape) + " is too large");
  }
}

SafetensorsEntry parse_entry(const std::filesystem::path& path, const std::string& name, const Json& info,
                             std::uint64_t data_size, bool accept_half) {
  const std::string where = "tensor '" + quote(name) + "': ";
  if (!info.is_object()) load_error(path, where + "entry is not a JSON object");
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!info.contains(field)) load_error(path, where + "missing \"" + field + "\"");
  }
  // Other keys are ignored, as the reference safetensors reader does.
  const Json& dtype = info.at("dtype");
  if (!dtype.is_string()) load_error(path, where + "\"dtype\" is not a string");
  const std::string& type = dtype.get_ref<const std::string&>();
  StoredDtype stored = StoredDtype::F32;
  if (accept_half && type == "F16") {
    stored = StoredDtype::F16;
  } else if (accept_half && type == "BF16") {
    stored = StoredDtype::BF16;
  } else if (type != "F32") {
    load_error(path, where + "dtype '" + quote(type) + "' is not supported (only F32" +
                         (accept_half ? ", F16 and BF16)" : ")"));
  }
  SafetensorsEntry entry{name, parse_shape(path, name, info.at("shape")), stored, 0, 0};
  const std::uint64_t expected = shape_bytes(path, name, entry.shape, stored);

  const Json& offsets = info.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    load_error(path, where + "\"data_offsets\" must be [begin, end] with non-negative integers, got " +
                         quote_json(offsets));
  }
  entry.begin = offsets[0].get<std::uint64_t>();
  entry.end = offsets[1].get<std::uint64_t>();
  const std::string range = range_string(entry.begin, entry.end);
  if (entry.begin > entry.end) load_error(path, where + "data_offsets " + range + " end before they begin");
  if (entry.end - entry.begin != expected) {
    load_error(path, where + "data_offsets " + range + " hold " + std::to_string(entry.end - entry.begin) +
                         " bytes but shape " + shape_string(entry.shape) + " needs " + std::to_string(expected));
  }
  if (entry.end > data_size) {
    load_error(path, where + "data_offsets " + range + " run past the data section (" + std::to_string(data_size) +
                         " bytes)");
  }
  return entry;
}

std::map<std::string, std::string> parse_metadata(const std::filesystem::path& path, const Json& metadata) {
  if (!metadata.is_object()) load_error(path, "\"__metadata__\" is not a JSON object");
  std::map<std::string, std::string> result;
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) load_error(path, "\"__metadata__\" value of '" + quote(key) + "' is not a string: " + quote_json(value));
    result.emplace(key, value.get<std::string>());
  }
  return result;
}

/// safetensors requires the entries to tile the data section exactly.
void check_coverage(const std::filesystem::path& path, const std::vector<SafetensorsEntry>& entries,
                    std::uint64_t data_size) {
  std::uint64_t cursor = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : entries) {
    if (entry.begin < cursor) {
      load_error(path, "tensor '" + entry.name + "' at " + range_string(entry.begin, entry.end) +
                           " overlaps tensor '" + previous->name + "' at " +
                           range_string(previous->begin, previous->end));
    }
    if (entry.begin > cursor) {
      load_error(path, "bytes " + range_string(cursor, entry.begin) + " of the data section belong to no tensor");
    }
    cursor = entry.end;
    previous = &entry;
  }
  if (cursor != data_size) {
    load_error(path, std::to_string(data_size - cursor) + " trailing bytes after the tensors (data section is " +
                         std::to_string(data_size) + " bytes, tensors cover " + std::to_string(cursor) + ")");
  }
}

}  // namespace

void load_error(const std::filesystem::path& path, const std::string& what) {
  // Messages quote untrusted fields through quote(); this cap is the backstop
  // for names and strings interpolated elsewhere.
  throw ModelStateError("[load] " + path.string() + ": " + quote(what, 600));
}

void save_error(const std::filesystem::path& path, const std::string& what) {
  throw ModelStateError("[save] " + path.string() + ": " + what);
}

std::string encode_safetensors_header(const std::filesystem::path& path,
                                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                                      const std::map<std::string, std::string>& metadata) {
  // Written entry by entry in the tensors' order, each as
  // "name":{"dtype":"F32","shape":[...],"data_offsets":[b,e]} (an object
  // built key by key searched its keys on every insert: quadratic).
  std::string text = "{";
  std::set<std::string> seen;
  std::uint64_t offset = 0;
  try {
    if (!metadata.empty()) text += "\"__metadata__\":" + Json(metadata).dump();
    for (const auto& [name, tensor] : tensors) {
      if (name.empty()) save_error(path, "a tensor name is empty");
      if (name == "__metadata__") save_error(path, "'__metadata__' is reserved and cannot name a tensor");
      if (!seen.insert(name).second) save_error(path, "tensor name '" + name + "' appears twice");
      if (!tensor.defined()) save_error(path, "tensor '" + name + "' is undefined");
      if (tensor.shape().size() > kMaxShapeDimensions) {
        save_error(path, "tensor '" + name + "' has " + std::to_string(tensor.shape().size()) +
                             " dimensions, more than the limit of " + std::to_string(kMaxShapeDimensions) +
                             " (it could not be loaded back)");
      }
      const auto bytes = static_cast<std::uint64_t>(tensor.nbytes());
      if (text.size() > 1) text += ',';
      text += Json(name).dump() + ":{\"dtype\":\"F32\",\"shape\":" + Json(tensor.shape()).dump() +
              ",\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
      offset += bytes;
    }
  } catch (const nlohmann::json::exception&) {
    save_error(path, "a tensor name or metadata string is not valid UTF-8");
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

SafetensorsHeader parse_safetensors_header(const std::filesystem::path& path, std::string_view text,
                                           std::uint64_t data_size, bool accept_half) {
  std::vector<std::string> keys;  // in the file's order (messages, and ties below)
  const Json root = parse_json(path, text, keys);
  if (!root.is_object()) load_error(path, "header is not a JSON object");
  SafetensorsHeader header;
  header.entries.reserve(keys.size());
  for (const std::string& key : keys) {
    const Json& value = root.at(key);
    if (key == "__metadata__") {
      header.metadata = parse_metadata(path, value);
    } else {
      header.entries.push_back(parse_entry(path, key, value, data_size, accept_half));
    }
  }
  std::stable_sort(header.entries.begin(), header.entries.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  check_coverage(path, header.entries, data_size);
  return header;
}

std::vector<std::pair<std::string, Shape>> tensor_layout(const SafetensorsHeader& header) {
  std::vector<std::pair<std::string, Shape>> layout;
  layout.reserve(header.entries.size());
  for (const SafetensorsEntry& entry : header.entries) layout.emplace_back(entry.name, entry.shape);
  return layout;
}

void check_tensor_layout(const std::filesystem::path& path, const std::vector<std::pair<std::string, Shape>>& actual,
                         const std::vector<std::pair<std::string, Shape>>& expected, const std::string& owner) {
  std::map<std::string, const Shape*> unclaimed;
  for (const auto& [name, shape] : actual) unclaimed.emplace(name, &shape);
  for (const auto& [name, shape] : expected) {
    const auto it = unclaimed.find(name);
    if (it == unclaimed.end()) {
      load_error(path, "tensor '" + name + "' is missing (" + owner + " expects shape " + shape_string(shape) + ")");
    }
    if (*it->second != shape) {
      load_error(path, "tensor '" + name + "' has shape " + shape_string(*it->second) + " in the file, " + owner +
                           " expects " + shape_string(shape));
    }
    unclaimed.erase(it);
  }
  if (!unclaimed.empty()) {
    std::string names;
    std::size_t shown = 0;
    for (const auto& [name, shape] : unclaimed) {
      if (shown++ == 5) {
        names += ", ...";
        break;
      }
      names += (names.empty() ? "'" : ", '") + quote(name) + "'";
    }
    load_error(path, "the file has tensors " + owner + " does not: " + names);
  }
}

}  // namespace riftco_transformer::detail
