#include "json_read.hpp"

#include <cmath>
#include <limits>
#include <set>
#include <vector>

namespace riftco_transformer::detail {
namespace {

/// nlohmann's what() without its "[json.exception.parse_error.101] parse
/// error at line 1, column 12: " prefix (our callers give file and line).
std::string clean(const nlohmann::json::exception& e) {
  std::string what = e.what();
  if (const std::size_t bracket = what.find("] "); what.rfind("[json.exception.", 0) == 0 && bracket != std::string::npos) {
    what = what.substr(bracket + 2);
  }
  if (const std::size_t column = what.find("column "); column != std::string::npos) {
    if (const std::size_t colon = what.find(": ", column); colon != std::string::npos) what = what.substr(colon + 2);
  }
  return quote(what, 200);
}

/// The first of parse_untrusted_json's two passes: nesting depth and
/// duplicate keys, checked as events arrive (nothing is built), and the
/// top-level keys in order. A syntax error ends the pass (returns false);
/// the second pass, the DOM parse, reports it. (nlohmann's callback parser
/// searched the enclosing object's items for a discarded value at every
/// object's end: quadratic in the keys, 48 s for a 100k-entry header.)
class StructureCheck final : public nlohmann::json_sax<Json> {
 public:
  StructureCheck(std::vector<std::string>* top_level_keys, const JsonArrayLimit& array_limit)
      : top_level_keys_(top_level_keys), array_limit_(array_limit) {}
  bool null() override { return element(); }
  bool boolean(bool) override { return element(); }
  bool number_integer(number_integer_t) override { return element(); }
  bool number_unsigned(number_unsigned_t) override { return element(); }
  bool number_float(number_float_t, const string_t&) override { return element(); }
  bool string(string_t&) override { return element(); }
  bool binary(binary_t&) override { return element(); }
  bool start_object(std::size_t) override {
    element();
    open(true);
    return true;
  }
  bool key(string_t& key) override {
    if (!keys_.back().insert(key).second) throw JsonReadError("has the key '" + quote(key) + "' twice");
    if (top_level_keys_ != nullptr && depth_ == 1) top_level_keys_->push_back(key);
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    close();
    return true;
  }
  bool start_array(std::size_t) override {
    element();
    open(false);
    return true;
  }
  bool end_array() override {
    close();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  static constexpr std::size_t kObject = static_cast<std::size_t>(-1);
  void open(bool object) {
    if (depth_ >= kMaxJsonDepth) throw JsonReadError("is nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    ++depth_;
    if (object) keys_.emplace_back();
    elements_.push_back(object ? kObject : 0);
  }
  void close() {
    --depth_;
    elements_.pop_back();
  }
  /// A value: counted against the limit when it is an array's element.
  bool element() {
    if (array_limit_.max_elements == 0 || elements_.empty() || elements_.back() == kObject) return true;
    if (++elements_.back() > array_limit_.max_elements) {
      throw JsonReadError("has an array of more than " + std::to_string(array_limit_.max_elements) + " elements" +
                          (array_limit_.why.empty() ? "" : " (" + array_limit_.why + ")"));
    }
    return true;
  }
  std::vector<std::string>* top_level_keys_;
  const JsonArrayLimit& array_limit_;
  std::vector<std::set<std::string>> keys_;  // one per open object
  std::vector<std::size_t> elements_;        // per open container: an array's elements so far, or kObject
  int depth_ = 0;
};

}  // namespace

std::string quote(std::string_view text, std::size_t limit) {
  std::string out;
  const std::size_t n = std::min(text.size(), limit);
  out.reserve(n + 24);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    out += (c < 0x20 || c == 0x7F) ? '?' : static_cast<char>(c);
  }
  if (text.size() > limit) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string quote_json(const Json& value) {
  // Depth is bounded by the parser, so dump() cannot recurse deeply; its
  // length is bounded by what is quoted.
  try {
    return quote(value.dump());
  } catch (const nlohmann::json::exception&) {
    return "(not printable)";
  }
}

std::string line_error(const JsonReadError& error) {
  if (error.column() > 0) return "invalid JSON at column " + std::to_string(error.column()) + ": " + error.detail();
  if (!error.detail().empty()) return "invalid JSON: " + error.detail();
  const std::string what = error.what();
  const bool about_text = what.rfind("is ", 0) == 0 || what.rfind("has ", 0) == 0 || what.rfind("holds ", 0) == 0;
  return about_text ? "the line " + what : what;
}

Json parse_untrusted_json(std::string_view text, std::vector<std::string>* top_level_keys,
                          const JsonArrayLimit& array_limit) {
  if (const std::size_t nul = text.find('\0'); nul != std::string_view::npos) {
    throw JsonReadError("holds a NUL byte at offset " + std::to_string(nul) + " (JSON text never holds one)");
  }
  try {
    StructureCheck check(top_level_keys, array_limit);
    (void)Json::sax_parse(text.begin(), text.end(), &check);  // false at a syntax error: the parse below names it
    return Json::parse(text.begin(), text.end());
  } catch (const JsonReadError&) {
    throw;
  } catch (const nlohmann::json::parse_error& e) {
    throw JsonReadError("is not valid JSON (at column " + std::to_string(e.byte) + ": " + clean(e) + ")", e.byte,
                        clean(e));
  } catch (const nlohmann::json::exception& e) {
    throw JsonReadError("is not valid JSON (" + clean(e) + ")", 0, clean(e));
  }
}

const Json& json_field(const Json& object, const char* key) {
  if (!object.is_object()) throw JsonReadError(std::string("expected an object, got ") + object.type_name());
  const auto it = object.find(key);
  if (it == object.end()) throw JsonReadError(std::string("missing key \"") + key + "\"");
  return *it;
}

std::int64_t json_integer(const Json& object, const char* key, std::int64_t min, std::int64_t max) {
  const Json& v = json_field(object, key);
  std::int64_t value = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw JsonReadError(std::string("\"") + key + "\" is " + quote_json(v) + ", out of range");
    }
    value = static_cast<std::int64_t>(u);
  } else if (v.is_number_integer()) {
    value = v.get<std::int64_t>();
  } else {
    throw JsonReadError(std::string("\"") + key + "\" must be an integer, got " + quote_json(v));
  }
  if (value < min || value > max) {
    throw JsonReadError(std::string("\"") + key + "\" is " + std::to_string(value) + ", outside [" +
                        std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return value;
}

double json_number(const Json& object, const char* key, bool null_is_nan) {
  const Json& v = json_field(object, key);
  if (null_is_nan && v.is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!v.is_number()) throw JsonReadError(std::string("\"") + key + "\" must be a number, got " + quote_json(v));
  const double value = v.get<double>();
  if (!std::isfinite(value)) throw JsonReadError(std::string("\"") + key + "\" is not finite");
  return value;
}

const std::string& json_string(const Json& object, const char* key) {
  const Json& v = json_field(object, key);
  if (!v.is_string()) throw JsonReadError(std::string("\"") + key + "\" must be a string, got " + v.type_name());
  return v.get_ref<const std::string&>();
}

}  // namespace riftco_transformer::detail
