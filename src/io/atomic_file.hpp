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

/// A fresh name ".<name>.tmp.<pid>.<n>" beside `target` (remove_stale_temporaries()
/// removes it once this process is gone): where a file waits before
/// rename_staged_files() puts it in place.
std::filesystem::path staging_path(const std::filesystem::path& target);

struct StagedFile {
  std::filesystem::path staged, target;  // both in one directory
};

/// Several files replaced together, as far as POSIX allows: each complete,
/// synced staged file is renamed over its target in order, then the
/// directory is synced. An old target that a later rename could still undo
/// is kept first as a hard link; when a rename fails, the targets already
/// replaced get their old files back (or are removed where there were
/// none), every staged file is removed, and a ModelStateError naming the
/// target is thrown. Only a crash between two renames can leave a mix.
void rename_staged_files(std::span<const StagedFile> files);

}  // namespace riftco_transformer::detail
