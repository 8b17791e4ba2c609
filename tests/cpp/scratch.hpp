#pragma once
// Scratch folders and whole-file reads for tests that write files. Every
// folder carries the process id, so two suites running at once (release and
// ASan, two checkouts) never remove each other's files.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace rt_test {

/// An empty folder <tmp>/riftco_<prefix>_<pid>_<name> (removed first if left over).
inline std::filesystem::path fresh_dir(const std::string& prefix, const std::string& name) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("riftco_" + prefix + "_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

/// dir/corpus.txt: 200 short lines of text for tiny pretraining runs.
inline std::filesystem::path write_corpus(const std::filesystem::path& dir) {
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox " + std::to_string(i % 7) + " jumps over the lazy dog.\n";
  std::ofstream(dir / "corpus.txt") << text;
  return dir / "corpus.txt";
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace rt_test
