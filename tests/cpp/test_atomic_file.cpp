// Atomic writes of any valid file name: the temporary ".<name>.tmp.<pid>.<n>"
// beside the target once ran past NAME_MAX (255 bytes) for names over ~228.
#include <filesystem>
#include <gtest/gtest.h>

#include "../../src/io/atomic_file.hpp"
#include "riftco_transformer/atomic_file.hpp"
#include "riftco_transformer/model_state.hpp"
#include "scratch.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  return names;
}

TEST(AtomicFile, EveryValidFileNameCanBeWritten) {
  const fs::path dir = rt_test::fresh_dir("atomic", "long_names");
  std::string euro;  // 3-byte characters: a cut must not split one
  while (euro.size() + 3 <= 254) euro += "\xE2\x82\xAC";
  for (const std::string& name : {std::string(255, 'n'), std::string(242, 'm'), "a" + euro}) {
    ASSERT_LE(name.size(), 255U);
    const fs::path target = dir / name;
    write_file_atomically(target, "first");
    write_file_atomically(target, "second");  // replacing works too
    EXPECT_EQ(rt_test::read_file(target), "second");
    write_safetensors(target, {{"x", Tensor::scalar(2.0F)}});
    EXPECT_EQ(read_safetensors(target).tensors.at(0).second.item(), 2.0F);
    EXPECT_EQ(names_in(dir), std::vector<std::string>{name});  // no temporary left
    // The staging name (multi-file replacement) fits, stays beside the target and starts with its name.
    const std::string staged = detail::staging_path(target).filename().string();
    EXPECT_LE(staged.size(), 255U);
    EXPECT_EQ(detail::staging_path(target).parent_path(), dir);
    EXPECT_EQ(staged.compare(0, 101, "." + name.substr(0, 100)), 0) << staged;
    fs::remove(target);
  }
  fs::remove_all(dir);
}

}  // namespace
