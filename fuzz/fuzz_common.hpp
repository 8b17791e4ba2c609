#pragma once
// Shared by the libFuzzer harnesses: the loaders read paths, so each input
// is written to a per-process file first. Only the library's typed errors
// may escape a loader; anything else (a crash, a sanitizer report, another
// exception type, a hang) is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace rt_fuzz {

inline const std::filesystem::path& input_path(const char* name) {
  static const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("riftco_fuzz_" + std::to_string(::getpid()) + "_" + name);
  return path;
}

inline const std::filesystem::path& write_input(const char* name, const std::uint8_t* data, std::size_t size) {
  const std::filesystem::path& path = input_path(name);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) std::abort();  // the harness itself failed: not a finding in the library
  return path;
}

}  // namespace rt_fuzz
