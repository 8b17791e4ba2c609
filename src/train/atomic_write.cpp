// Temporary file + rename, so a reader never sees half a plot.
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "plot_layout.hpp"
#include "riftco_transformer/errors.hpp"

namespace riftco_transformer::plot_detail {

void write_file_atomically(const std::filesystem::path& path, const std::string& bytes) {
  static std::atomic<unsigned> counter{0};
  std::filesystem::path temp = path;
  temp += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  const auto fail = [&](const std::string& what) {
    std::error_code ignored;
    std::filesystem::remove(temp, ignored);
    throw Error("[plot] " + path.string() + ": " + what);
  };
  std::FILE* file = std::fopen(temp.c_str(), "wb");
  if (file == nullptr) fail("cannot create " + temp.filename().string());
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), file) == bytes.size() && std::fflush(file) == 0 &&
                       ::fsync(::fileno(file)) == 0;
  if (std::fclose(file) != 0 || !written) fail("write failed");
  std::error_code ec;
  std::filesystem::rename(temp, path, ec);
  if (ec) fail("cannot rename the temporary file into place: " + ec.message());
}

}  // namespace riftco_transformer::plot_detail
