// Reading whole files without blocking on FIFOs, and cleaning up the
// temporaries of interrupted atomic writes (atomic_file.hpp).
#include <algorithm>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

#include "riftco_transformer/atomic_file.hpp"

namespace riftco_transformer {
namespace {

struct Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

/// The pid of ".<name>.tmp.<pid>.<n>", or 0 when `name` is not such a file.
pid_t temporary_owner(const std::string& name) {
  if (name.size() < 8 || name[0] != '.') return 0;
  const std::size_t last_dot = name.rfind('.');
  if (last_dot == std::string::npos || last_dot + 1 == name.size()) return 0;
  const std::size_t pid_dot = name.rfind('.', last_dot - 1);
  if (pid_dot == std::string::npos || pid_dot < 5 || name.compare(pid_dot - 4, 4, ".tmp") != 0) return 0;
  auto all_digits = [&](std::size_t from, std::size_t to) {
    if (from >= to) return false;
    for (std::size_t i = from; i < to; ++i) {
      if (name[i] < '0' || name[i] > '9') return false;
    }
    return true;
  };
  if (!all_digits(pid_dot + 1, last_dot) || !all_digits(last_dot + 1, name.size())) return 0;
  long pid = 0;
  const auto r = std::from_chars(name.data() + pid_dot + 1, name.data() + last_dot, pid);
  if (r.ec != std::errc() || pid <= 0 || pid > 0x7FFFFFFF) return 0;
  return static_cast<pid_t>(pid);
}

}  // namespace

std::optional<std::string> read_regular_file(const std::filesystem::path& path, std::string& out,
                                             std::uint64_t max_bytes) {
  Descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (file.fd < 0) {
    const int error = errno;
    if (error == ENOENT) return std::string("file does not exist");
    return "cannot open: " + std::string(std::strerror(error));  // e.g. "Too many levels of symbolic links"
  }
  struct stat info {};
  if (::fstat(file.fd, &info) != 0) return "cannot stat: " + std::string(std::strerror(errno));
  if (!S_ISREG(info.st_mode)) return std::string("not a regular file");
  const auto size = static_cast<std::uint64_t>(info.st_size);
  if (size > max_bytes) {
    return "the file is " + std::to_string(size) + " bytes, over the " + std::to_string(max_bytes) + "-byte limit";
  }
  const int flags = ::fcntl(file.fd, F_GETFL);
  if (flags >= 0) ::fcntl(file.fd, F_SETFL, flags & ~O_NONBLOCK);
  out.assign(static_cast<std::size_t>(size), '\0');
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(file.fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return "read error: " + std::string(std::strerror(errno));
    if (n == 0) break;  // the file shrank while being read
    done += static_cast<std::size_t>(n);
  }
  out.resize(done);
  return std::nullopt;
}

int remove_stale_temporaries(const std::filesystem::path& directory, std::span<const std::string_view> names) {
  int removed = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(directory, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const pid_t owner = temporary_owner(name);
    if (owner == 0) continue;
    std::error_code type_error;
    if (!std::filesystem::is_regular_file(it->symlink_status(type_error)) || type_error) continue;
    if (names.size() != 0) {
      const std::string_view base = std::string_view(name).substr(1, name.rfind(".tmp." + std::to_string(owner) + ".") - 1);
      if (std::find(names.begin(), names.end(), base) == names.end()) continue;
    }
    const bool alive = owner == ::getpid() || ::kill(owner, 0) == 0 || errno == EPERM;
    if (alive) continue;
    std::error_code remove_error;
    if (std::filesystem::remove(it->path(), remove_error)) ++removed;
  }
  return removed;
}

}  // namespace riftco_transformer
