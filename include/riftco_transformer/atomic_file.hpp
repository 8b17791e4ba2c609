#pragma once
// Replacing a file atomically (io layer): the bytes go to a temporary file
// beside the target, which is fsynced and renamed over it, then the directory
// is fsynced. A reader sees the old file or the new one, never half of one.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace riftco_transformer {

/// On failure the temporary file is removed, the target is untouched and a
/// ModelStateError "[save] <path>: ..." is thrown.
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes);

/// Reads a whole regular file into `out`. A FIFO, device, socket or
/// directory is refused without blocking (the file is opened O_NONBLOCK and
/// checked before any read), as is a file over `max_bytes`. Returns the
/// reason on failure ("not a regular file", "cannot open: ..."), nullopt on
/// success: each caller throws its own error type.
std::optional<std::string> read_regular_file(const std::filesystem::path& path, std::string& out,
                                             std::uint64_t max_bytes = std::uint64_t{1} << 40);

/// Whether `a` and `b` name the same file or directory: equivalent() when
/// both exist (hard links and symlinks included), else the same
/// weakly_canonical path. Never throws. For refusing an output that is an input.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

/// Removes the temporary files that write_file_atomically() leaves behind
/// when a process is killed inside a save (".<name>.tmp.<pid>.<n>") in
/// `directory`, for processes that no longer run. Only regular files, and
/// with `names` non-empty only those whose <name> is one of them: a run's
/// output directory may be any directory, and a user's ".notes.txt.tmp.9.0",
/// symlink or FIFO of that shape was removed. Returns how many it removed;
/// never throws.
int remove_stale_temporaries(const std::filesystem::path& directory,
                             std::span<const std::string_view> names = {});

}  // namespace riftco_transformer
