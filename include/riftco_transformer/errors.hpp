#pragma once
// Typed errors. Every message starts with the operation in brackets, e.g.
// "[matmul] lhs (4, 8) and rhs (7, 3): inner dimensions differ".
#include <charconv>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace riftco_transformer {

/// Base of every error riftco throws on purpose. A NUL byte in the message
/// (from a user's text: a name, a path, an enum string) is written as the
/// two characters \0, so C's strlen and Python see the whole message.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(without_nul(message)) {}
  explicit Error(const char* message) : std::runtime_error(message) {}

 private:
  static std::string without_nul(const std::string& message) {
    if (message.find('\0') == std::string::npos) return message;
    std::string out;
    for (const char c : message) out += c == '\0' ? std::string("\\0") : std::string(1, c);
    return out;
  }
};

/// Shapes that do not fit the operation.
class ShapeError : public Error {
 public:
  using Error::Error;
};

/// Tensors on different backends, or a backend that is not built.
class BackendError : public Error {
 public:
  using Error::Error;
};

/// An argument outside its valid range (bad enum, bad index, bad config).
class ValueError : public Error {
 public:
  using Error::Error;
};

/// backward() found a parent whose version changed since the graph was built.
class StaleGraphError : public Error {
 public:
  using Error::Error;
};

/// backward() called in a way that cannot produce gradients (no seed for a
/// non-scalar output, output that does not require grad, ...).
class BackwardError : public Error {
 public:
  using Error::Error;
};

/// A collective between ranks failed (an MPI call's error, mismatched
/// buffer sizes, a rank out of range); the message names the collective, the
/// MPI call and the rank.
class CommunicationError : public Error {
 public:
  using Error::Error;
};

/// An optimizer step fused into the backward pass (Adam::backward_and_step)
/// failed after it had already updated some parameters: the model and the
/// optimizer's moments are part-way between two steps. The message names the
/// op, how many parameters were updated and the cause. Restore the model and
/// optimizer (e.g. from a training checkpoint) before training on. A fused
/// step that fails before updating any parameter throws the cause's own type
/// and changes nothing.
class PartialStepError : public Error {
 public:
  using Error::Error;
};

/// Memory a request could not get, with a message saying what wanted how
/// much. A std::bad_alloc, so what catches those still does (C's
/// RT_ERROR_OUT_OF_MEMORY, Python's MemoryError), now with the message.
class OutOfMemoryError : public std::bad_alloc {
 public:
  explicit OutOfMemoryError(const std::string& message) : message_(message) {}
  const char* what() const noexcept override { return message_.what(); }

 private:
  std::runtime_error message_;  // copies share the text without allocating
};

/// "(4, 8)" — used by every error message that carries a shape.
std::string shape_string(const std::vector<std::int64_t>& shape);

/// The shortest text that reads back as `value` ("1.0000001", "1e-45",
/// "inf"), for messages: std::to_string's six decimals made "must be in
/// (0, 1], got 1.000000" and "got 0.000000" for values it rounded.
inline std::string float_text(float value) {
  char buffer[32];
  const auto r = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, r.ptr);
}

}  // namespace riftco_transformer
