#include "atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/model_state.hpp"

namespace riftco_transformer::detail {
namespace {

[[noreturn]] void save_error(const std::filesystem::path& path, const std::string& what, int error = 0) {
  std::string message = "[save] " + path.string() + ": " + what;
  if (error != 0) message += ": " + std::string(std::strerror(error));
  throw ModelStateError(message);
}

/// The most bytes of a target's name a temporary keeps: with the leading dot
/// and ".tmp.<pid>.<n>" (each number at most 10 digits) it fits NAME_MAX
/// (255), so every valid target name can be written.
constexpr std::size_t kTemporaryBaseBytes = 255 - 1 - std::char_traits<char>::length(".tmp..") - 2 * 10;

/// ".<name>.tmp.<pid>.<n>" beside `target`, n never repeating in a process;
/// a long <name> is cut to kTemporaryBaseBytes (at a UTF-8 character
/// boundary): the pid and n keep it unique, the prefix recognisable.
std::filesystem::path temporary_name(const std::filesystem::path& target, const std::filesystem::path& directory) {
  static std::atomic<unsigned> counter{0};
  std::string name = target.filename().string();
  if (name.size() > kTemporaryBaseBytes) {
    std::size_t cut = kTemporaryBaseBytes;
    while (cut > 0 && (static_cast<unsigned char>(name[cut]) & 0xC0U) == 0x80U) --cut;  // not inside a character
    name.resize(cut);
  }
  name.insert(0, 1, '.');
  name += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  return directory / name;
}

std::filesystem::path directory_of(const std::filesystem::path& path) {
  return path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
}

/// Owns the temporary file until it has been renamed over the target.
class TemporaryFile {
 public:
  TemporaryFile(const std::filesystem::path& target, const std::filesystem::path& directory) {
    for (int attempt = 0; attempt < 100; ++attempt) {
      path_ = temporary_name(target, directory);
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0 || errno != EEXIST) break;
    }
    if (fd_ < 0) {
      const int error = errno;
      save_error(target, "cannot create a temporary file in '" + directory.string() + "'", error);
    }
  }
  ~TemporaryFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!renamed_) ::unlink(path_.c_str());
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;

  const std::filesystem::path& path() const { return path_; }
  int fd() const { return fd_; }
  /// close(2) reports deferred write errors on some file systems.
  int close() {
    const int result = ::close(fd_);
    fd_ = -1;
    return result;
  }
  void mark_renamed() { renamed_ = true; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  bool renamed_ = false;
};

/// Closes a directory descriptor on every path out.
struct DirectoryHandle {
  int fd = -1;
  ~DirectoryHandle() {
    if (fd >= 0) ::close(fd);
  }
};

bool write_all(int fd, std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
  return true;
}

}  // namespace

void check_replaceable(const std::filesystem::path& path) {
  if (!path.has_filename()) save_error(path, "not a file name");
  std::error_code ec;
  const std::filesystem::file_status existing = std::filesystem::symlink_status(path, ec);
  if (std::filesystem::is_directory(existing)) save_error(path, "the target is a directory");
  if (std::filesystem::exists(existing) && !std::filesystem::is_regular_file(existing)) {
    // rename(2) would replace a device node, a FIFO or a symlink itself.
    save_error(path, "the target exists and is not a regular file (a symlink, device, FIFO or socket): "
                     "refusing to replace it");
  }
}

void write_file_atomically(const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces) {
  check_replaceable(path);
  const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");

  // Each failure below copies errno before building its message (building
  // the message may allocate and overwrite errno).
  TemporaryFile temporary(path, directory);
  const std::string temp_name = std::string("'").append(temporary.path().string()).append("'");
  for (const std::span<const std::byte> piece : pieces) {
    if (!write_all(temporary.fd(), piece)) {
      const int error = errno;
      save_error(path, "cannot write " + temp_name, error);
    }
  }
  if (::fsync(temporary.fd()) != 0) {
    const int error = errno;
    save_error(path, "cannot sync " + temp_name, error);
  }
  if (temporary.close() != 0) {
    const int error = errno;
    save_error(path, "cannot close " + temp_name, error);
  }

  // Opened before the rename so that, once the target is replaced, only the
  // directory sync itself can still fail.
  DirectoryHandle dir{::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd < 0) {
    const int error = errno;
    save_error(path, "cannot open directory '" + directory.string() + "'", error);
  }
  if (::rename(temporary.path().c_str(), path.c_str()) != 0) {
    const int error = errno;
    save_error(path, "cannot rename " + temp_name + " over the target", error);
  }
  temporary.mark_renamed();
  if (::fsync(dir.fd) != 0) {
    const int error = errno;
    save_error(path, "the file was replaced but syncing its directory failed", error);
  }
}

std::filesystem::path staging_path(const std::filesystem::path& target) {
  return temporary_name(target, directory_of(target));
}

void rename_staged_files(std::span<const StagedFile> files) {
  struct Replaced {
    std::filesystem::path target, backup;  // backup empty: the target did not exist
  };
  std::vector<Replaced> replaced;
  const auto fail = [&](const std::filesystem::path& target, const std::string& what, int error) {
    for (auto it = replaced.rbegin(); it != replaced.rend(); ++it) {
      if (it->backup.empty()) {
        ::unlink(it->target.c_str());
      } else {
        ::rename(it->backup.c_str(), it->target.c_str());
      }
    }
    for (const StagedFile& f : files) ::unlink(f.staged.c_str());  // renamed ones are gone already
    save_error(target, what + (replaced.empty() ? "" : "; the files replaced before it were put back"), error);
  };
  if (files.empty()) return;
  const std::filesystem::path directory = directory_of(files.front().target);
  DirectoryHandle dir{::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir.fd < 0) {
    const int error = errno;
    fail(files.front().target, "cannot open directory '" + directory.string() + "'", error);
  }
  for (std::size_t i = 0; i < files.size(); ++i) {
    const StagedFile& f = files[i];
    std::filesystem::path backup;
    std::error_code ec;
    if (i + 1 < files.size() && std::filesystem::exists(std::filesystem::symlink_status(f.target, ec))) {
      backup = staging_path(f.target);
      if (::link(f.target.c_str(), backup.c_str()) != 0) {
        const int error = errno;
        fail(f.target, "cannot keep the old file as '" + backup.string() + "'", error);
      }
    }
    if (::rename(f.staged.c_str(), f.target.c_str()) != 0) {
      const int error = errno;
      if (!backup.empty()) ::unlink(backup.c_str());
      fail(f.target, "cannot rename '" + f.staged.string() + "' over the target", error);
    }
    replaced.push_back({f.target, backup});
  }
  for (const Replaced& r : replaced) {
    if (!r.backup.empty()) ::unlink(r.backup.c_str());
  }
  if (::fsync(dir.fd) != 0) {
    const int error = errno;
    save_error(files.back().target, "the files were replaced but syncing their directory failed", error);
  }
}

}  // namespace riftco_transformer::detail

namespace riftco_transformer {

bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) {
  std::error_code ec;
  if (a.empty() || b.empty()) return false;
  if (std::filesystem::exists(a, ec) && std::filesystem::exists(b, ec)) {
    const bool same = std::filesystem::equivalent(a, b, ec);
    if (!ec) return same;
  }
  const auto canonical = [&ec](const std::filesystem::path& p) {
    std::filesystem::path c = std::filesystem::weakly_canonical(std::filesystem::absolute(p, ec), ec);
    if (!c.has_filename()) c = c.parent_path();  // "dir/" is "dir"
    return c;
  };
  const std::filesystem::path ca = canonical(a);
  if (ec) return false;
  const std::filesystem::path cb = canonical(b);
  return !ec && ca == cb;
}

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes) {
  const std::span<const std::byte> piece(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
  detail::write_file_atomically(path, std::span<const std::span<const std::byte>>(&piece, 1));
}

}  // namespace riftco_transformer
