#pragma once
// Replace a file atomically: write a temporary file beside it, fsync it,
// rename it over the target, fsync the directory.
#include <cstddef>
#include <filesystem>
#include <span>

namespace riftco_transformer::detail {

/// Writes the concatenation of `pieces` to `path`. On any failure before the
/// rename the temporary file is removed, the target is untouched, and a
/// ModelStateError "[save] <path>: ..." is thrown. The one failure after the
/// rename (syncing the directory) is reported too, though the new file is
/// already in place.
void write_file_atomically(const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces);

/// The checks write_file_atomically() makes on the target before writing
/// (a file name; not a directory, symlink, device, FIFO or socket): callers
/// that replace several files run them on every target first, so that a
/// refused second file does not leave the first one replaced.
void check_replaceable(const std::filesystem::path& path);

}  // namespace riftco_transformer::detail
