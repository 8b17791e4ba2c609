// Reading text files: user data (`--data PATH`) and the default corpus,
// Debian's `fortunes` package.
#include <algorithm>
#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/data.hpp"

namespace riftco_transformer {
namespace fs = std::filesystem;

namespace {

const char* const kInstallHint = "run scripts/setup.sh (Debian package 'fortunes')";

[[noreturn]] void fail(const fs::path& path, const std::string& what) {
  throw DataError("[data] " + path.string() + ": " + what);
}

std::string read_all(const fs::path& path) {
  std::string text;
  if (const auto why = read_regular_file(path, text)) fail(path, *why);  // a FIFO never blocks
  return text;
}

void require_utf8(const fs::path& path, std::string_view text) {
  if (const auto offset = first_invalid_utf8(text)) {
    fail(path, "invalid UTF-8 at byte offset " + std::to_string(*offset));
  }
}

// A fortune file is fortunes separated by lines holding only "%". Appends
// each non-blank fortune followed by one empty line.
void append_fortunes(std::string_view file, std::string& out) {
  std::string fortune;
  const auto flush = [&] {
    while (!fortune.empty() && (fortune.back() == '\n' || fortune.back() == '\r')) fortune.pop_back();
    if (fortune.find_first_not_of(" \t\r\n") != std::string::npos) out += fortune + "\n\n";
    fortune.clear();
  };
  std::size_t pos = 0;
  while (pos < file.size()) {
    std::size_t end = file.find('\n', pos);
    if (end == std::string_view::npos) end = file.size();
    std::string_view line = file.substr(pos, end - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == "%") {
      flush();
    } else {
      fortune.append(line);
      fortune += '\n';
    }
    pos = end + 1;
  }
  flush();
}

}  // namespace

std::string load_text_file(const fs::path& path) {
  std::string text = read_all(path);  // says why: missing, a symlink loop, not a regular file, ...
  if (text.empty()) fail(path, "file is empty");
  require_utf8(path, text);
  return text;
}

fs::path default_corpus_dir() { return "/usr/share/games/fortunes"; }

std::string load_default_corpus() { return load_fortune_corpus(default_corpus_dir()); }

std::string load_fortune_corpus(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(dir, std::string("corpus directory not found; ") + kInstallHint);
  std::vector<fs::path> files;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_symlink() || !entry.is_regular_file()) continue;  // *.u8 links, `off/`
    if (entry.path().has_extension()) continue;                    // *.dat indexes, *.u8
    files.push_back(entry.path());
  }
  if (ec) fail(dir, "cannot list the corpus directory: " + ec.message());
  if (files.empty()) fail(dir, std::string("no fortune files found; ") + kInstallHint);
  std::sort(files.begin(), files.end());
  std::string corpus;
  for (const fs::path& file : files) {
    const std::string text = read_all(file);
    require_utf8(file, text);
    append_fortunes(text, corpus);
  }
  if (corpus.empty()) fail(dir, std::string("the fortune files hold no text; ") + kInstallHint);
  return corpus;
}

}  // namespace riftco_transformer
