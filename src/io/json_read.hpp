#pragma once
// Reading untrusted JSON (file headers, metadata, JSON Lines): one parser
// that refuses what would crash or mislead a reader, and checked accessors
// whose errors name the field. Callers add the file and line.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace riftco_transformer::detail {

// Objects are std::maps: a parse is O(n log n) in the keys (ordered_json
// searched its keys linearly on every insert: a 1.5 MB safetensors header
// of 100k entries took 8 s, 200k over 20). Where a file's key order matters
// (safetensors entries), parse_untrusted_json reports its top-level keys in
// order; writers that keep an order use nlohmann::ordered_json themselves.
using Json = nlohmann::json;

/// Deeper nesting is refused while parsing (nothing we read nests beyond 3).
inline constexpr int kMaxJsonDepth = 64;
/// What an error message quotes of an untrusted string, at most.
inline constexpr std::size_t kMaxQuotedBytes = 80;

/// A JSON text or field that cannot be used; what() says why, without the
/// file (the caller adds "[load] <path>: " or "[data] <path>: line N: ").
/// what() is a phrase that follows the thing read: "is not valid JSON (...)",
/// "has the key 'k' twice", "missing key \"k\"", "\"k\" must be an integer, ...".
class JsonReadError : public std::runtime_error {
 public:
  explicit JsonReadError(const std::string& what, std::size_t column = 0, std::string detail = "")
      : std::runtime_error(what), column_(column), detail_(std::move(detail)) {}
  /// For a text that is not JSON: the parser's words, and for a syntax
  /// error the 1-based byte column (0 otherwise).
  std::size_t column() const { return column_; }
  const std::string& detail() const { return detail_; }

 private:
  std::size_t column_;
  std::string detail_;
};

/// `text` for an error message: whole when short, else its first bytes and
/// "... (N bytes)". Control bytes are shown as '?'.
std::string quote(std::string_view text, std::size_t limit = kMaxQuotedBytes);
/// quote() of a JSON value's compact text (never dumps a large value whole).
std::string quote_json(const Json& value);

/// A JsonReadError about one line of a JSON Lines file, for a message
/// "<file>: line N: <this>": "invalid JSON at column C: ...", "the line has
/// the key 'k' twice", "\"k\" must be a string, got number".
std::string line_error(const JsonReadError& error);

/// A bound on the length of every array in a text, checked in the first
/// pass, before a document is built (a 100 MB array costs gigabytes as one).
struct JsonArrayLimit {
  std::size_t max_elements = 0;  // 0: no bound
  std::string why;               // said in the error, in parentheses
};

/// Parses untrusted JSON. Refuses: NUL bytes anywhere (a C reader would stop
/// there), nesting deeper than kMaxJsonDepth, the same key twice in one
/// object, an array longer than `array_limit` allows, numbers outside
/// double's range (1e999), invalid UTF-8, trailing bytes. Every failure is a
/// JsonReadError; no nlohmann exception escapes. `top_level_keys` (optional)
/// receives the top-level object's keys in the order the text has them.
Json parse_untrusted_json(std::string_view text, std::vector<std::string>* top_level_keys = nullptr,
                          const JsonArrayLimit& array_limit = {});

/// Checked accessors on an object: the field must exist and have the type.
/// Errors: JsonReadError "field 'key': ...".
const Json& json_field(const Json& object, const char* key);
/// An integer in [min, max]; a float (1e300, 2.5) is refused, never converted.
std::int64_t json_integer(const Json& object, const char* key, std::int64_t min, std::int64_t max);
/// Any finite number, or null when `null_is_nan` (NaN is written as null).
double json_number(const Json& object, const char* key, bool null_is_nan = false);
const std::string& json_string(const Json& object, const char* key);

}  // namespace riftco_transformer::detail
