#pragma once
// The JSON header of a safetensors file: encoding (with offsets) and the
// validating parser. Shared by the safetensors reader/writer and model state.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "riftco_transformer/tensor.hpp"

namespace riftco_transformer {
struct TensorFile;
}

namespace riftco_transformer::detail {

/// Header lengths above this are refused before anything is allocated.
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = std::uint64_t{100} << 20;

/// Tensors of more dimensions are refused (PyTorch's limit); so is any longer
/// array in a header, before the header's JSON document is built.
inline constexpr std::size_t kMaxShapeDimensions = 64;

/// Element types a header may declare. Model-state files are F32 only; the
/// Hugging Face importer also reads F16 and BF16 (converted to float32).
enum class StoredDtype : std::uint8_t { F32, F16, BF16 };

struct SafetensorsEntry {
  std::string name;
  Shape shape;
  StoredDtype dtype = StoredDtype::F32;
  std::uint64_t begin = 0;  // byte offsets relative to the data section
  std::uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // data-section order; ties keep header order
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;  // absolute file offset of the data section
};

/// Throws ModelStateError "[load] <path>: <what>".
[[noreturn]] void load_error(const std::filesystem::path& path, const std::string& what);
/// Throws ModelStateError "[save] <path>: <what>".
[[noreturn]] void save_error(const std::filesystem::path& path, const std::string& what);

/// The JSON header for `tensors` stored back to back in the given order,
/// padded with spaces to a multiple of 8 bytes. Validates names and tensors
/// (errors name `path` as "[save] <path>: ...").
std::string encode_safetensors_header(const std::filesystem::path& path,
                                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                                      const std::map<std::string, std::string>& metadata);

/// Parses and validates `text` for a data section of `data_size` bytes:
/// JSON object, entries, dtypes, shapes, offsets, full coverage, metadata.
/// `data_start` is left 0 for the caller to fill in.
/// `accept_half` also accepts F16 and BF16 entries (otherwise only F32).
SafetensorsHeader parse_safetensors_header(const std::filesystem::path& path, std::string_view text,
                                           std::uint64_t data_size, bool accept_half = false);

/// Opens `path` and reads and validates its header only (no tensor data).
SafetensorsHeader read_safetensors_header(const std::filesystem::path& path);

/// Refuses (throws) a header before any tensor data is read.
using HeaderCheck = std::function<void(const SafetensorsHeader&)>;

/// read_safetensors, calling `check` (when set) on the validated header before
/// any tensor data is allocated or read, from the same open file: a loader
/// refuses a wrong format, schema, dimensions or tensor layout without
/// allocating what a (possibly sparse) file claims. `accept_half`: as for
/// parse_safetensors_header, F16/BF16 converted exactly to float32.
TensorFile read_safetensors_checked(const std::filesystem::path& path, const HeaderCheck& check,
                                    bool accept_half = false);

/// read_safetensors_checked with F16 and BF16 tensors accepted too.
TensorFile read_safetensors_as_f32(const std::filesystem::path& path, const HeaderCheck& check = {});

/// The (name, shape) of each entry, in the header's data-section order.
std::vector<std::pair<std::string, Shape>> tensor_layout(const SafetensorsHeader& header);

/// Refuses (load_error naming `path`) a file whose tensors are not exactly
/// `expected` by name and shape, in any order; `owner` names who expects
/// them in messages ("the model", "the run").
void check_tensor_layout(const std::filesystem::path& path,
                         const std::vector<std::pair<std::string, Shape>>& actual,
                         const std::vector<std::pair<std::string, Shape>>& expected, const std::string& owner);

}  // namespace riftco_transformer::detail
