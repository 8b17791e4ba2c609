#pragma once
// Replacing a file atomically (io layer): the bytes go to a temporary file
// beside the target, which is fsynced and renamed over it, then the directory
// is fsynced. A reader sees the old file or the new one, never half of one.
#include <filesystem>
#include <string_view>

namespace riftco_transformer {

/// On failure the temporary file is removed, the target is untouched and a
/// ModelStateError "[save] <path>: ..." is thrown.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

}  // namespace riftco_transformer
