// safetensors files: round trip, exact layout, every validation failure, and
// atomic replacement. tests/python/test_safetensors_reader.py reads what the
// SafetensorsInterop tests write with an independent reader.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <nlohmann/json.hpp>

#include "../../src/io/safetensors_header.hpp"
#include "riftco_transformer/model_state.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string u64_le(std::uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<char>((value >> (8 * i)) & 0xFF);
  return bytes;
}

/// A raw file: length prefix, `header` as given (no padding), `data_bytes` zero bytes.
std::string raw_file(const std::string& header, std::size_t data_bytes) {
  return u64_le(header.size()) + header + std::string(data_bytes, '\0');
}

float from_bits(std::uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

/// The tensors the interop tests and the Python reader agree on (keep in sync
/// with expected_tensors() in tests/python/test_safetensors_reader.py).
NamedTensors interop_tensors() {
  std::vector<float> embedding(12), cube(12);
  for (int i = 0; i < 12; ++i) embedding[i] = static_cast<float>(i - 5) * 0.25F;
  for (int i = 0; i < 12; ++i) cube[i] = static_cast<float>(i) * 1.5F - 7.0F;
  const float inf = std::numeric_limits<float>::infinity();
  return {
      {"embedding.weight", Tensor::from_data({3, 4}, embedding)},
      {"blocks.0.norm", Tensor::from_data({4}, {1.0F, -0.0F, from_bits(0x00000001), std::numeric_limits<float>::max()})},
      {"special", Tensor::from_data({5}, {inf, -inf, from_bits(0x7FC00000), 1.0F / 3.0F, -2.5F})},
      {"scalar", Tensor::scalar(42.5F)},
      {"empty", Tensor::zeros({0, 3})},
      {"cube", Tensor::from_data({2, 3, 2}, cube)},
  };
}

const std::map<std::string, std::string> kInteropMetadata = {{"format", "riftco.test"}, {"note", "h\xC3\xA9llo \xE2\x9C\x93"}};

void expect_same_tensors(const NamedTensors& expected, const NamedTensors& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(expected[i].first, actual[i].first) << "position " << i;
    EXPECT_EQ(expected[i].second.shape(), actual[i].second.shape()) << expected[i].first;
    EXPECT_TRUE(bit_equal(expected[i].second, actual[i].second)) << expected[i].first;
  }
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = std::string(info->test_suite_name()) + "_" + info->name();
    for (char& c : name) {
      if (c == '/') c = '_';  // parameterized test names
    }
    dir_ = fs::temp_directory_path() / ("riftco_safetensors_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
    fs::remove_all(dir_);
  }

  /// Every entry of the test directory except `keep` (leftover temp files).
  std::vector<std::string> other_files(const std::set<std::string>& keep) const {
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const std::string name = entry.path().filename().string();
      if (!keep.count(name)) names.push_back(name);
    }
    return names;
  }

  fs::path dir_;
};

}  // namespace

// ---- round trip and layout -------------------------------------------------

TEST_F(SafetensorsTest, RoundTripIsBitExactAndKeepsOrder) {
  const NamedTensors tensors = interop_tensors();  // names deliberately unsorted
  const std::map<std::string, std::string> metadata = {
      {"note", "h\xC3\xA9llo \xE2\x9C\x93"}, {"empty", ""}, {"json", "{\"a\": [1, 2]}"}};
  const fs::path path = dir_ / "state.safetensors";
  write_safetensors(path, tensors, metadata);
  const TensorFile file = read_safetensors(path);
  expect_same_tensors(tensors, file.tensors);
  EXPECT_EQ(file.metadata, metadata);
  EXPECT_TRUE(std::isnan(file.tensors[2].second.at({2})));
}

TEST_F(SafetensorsTest, EmptyTensorsKeepTheirPlace) {
  const NamedTensors tensors = {{"e1", Tensor::zeros({0})},
                                {"e2", Tensor::zeros({2, 0, 3})},
                                {"x", Tensor::from_data({2}, {1.0F, 2.0F})},
                                {"e3", Tensor::zeros({0, 4})},
                                {"y", Tensor::scalar(-1.0F)},
                                {"e0", Tensor::zeros({0})}};
  const fs::path path = dir_ / "empties.safetensors";
  write_safetensors(path, tensors);
  const TensorFile file = read_safetensors(path);
  expect_same_tensors(tensors, file.tensors);
  EXPECT_TRUE(file.metadata.empty());
}

TEST_F(SafetensorsTest, NoTensorsAndNoMetadata) {
  const fs::path path = dir_ / "nothing.safetensors";
  write_safetensors(path, {});
  EXPECT_EQ(read_bytes(path), u64_le(8) + "{}      ");
  const TensorFile file = read_safetensors(path);
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_TRUE(file.metadata.empty());
}

TEST_F(SafetensorsTest, LayoutIsSafetensors) {
  const NamedTensors tensors = {{"b", Tensor::from_data({2, 2}, {1.0F, 2.0F, 3.0F, 4.0F})},
                                {"a", Tensor::from_data({3}, {-1.0F, 0.5F, 8.0F})}};
  const fs::path path = dir_ / "layout.safetensors";
  write_safetensors(path, tensors, {{"k", "v"}});
  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8U);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  EXPECT_EQ(n % 8, 0U);
  ASSERT_EQ(bytes.size(), 8 + n + 7 * sizeof(float));
  const std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_EQ(header.find_last_not_of(' '), header.rfind('}'));  // padded with spaces only
  const auto json = nlohmann::json::parse(header);
  EXPECT_EQ(json["__metadata__"], nlohmann::json({{"k", "v"}}));
  EXPECT_EQ(json["b"], nlohmann::json::parse(R"({"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})"));
  EXPECT_EQ(json["a"], nlohmann::json::parse(R"({"dtype":"F32","shape":[3],"data_offsets":[16,28]})"));
  // The exact text: metadata first, then the tensors in the given order,
  // each entry's keys as written since the first release (the header is
  // now written entry by entry instead of built as an object).
  EXPECT_EQ(header.substr(0, header.rfind('}') + 1),
            R"({"__metadata__":{"k":"v"},"b":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
            R"("a":{"dtype":"F32","shape":[3],"data_offsets":[16,28]}})");
  const float expected[] = {1.0F, 2.0F, 3.0F, 4.0F, -1.0F, 0.5F, 8.0F};
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, expected, sizeof(expected)), 0);
}

TEST_F(SafetensorsTest, ReadsFilesFromOtherWriters) {
  // Header order differs from data order, no padding, an extra entry key
  // (ignored, as the reference reader does), no metadata.
  const std::string header =
      R"({"second":{"dtype":"F32","shape":[1],"data_offsets":[4,8],"note":1},)"
      R"("first":{"dtype":"F32","shape":[],"data_offsets":[0,4]}})";
  std::string file = u64_le(header.size()) + header;
  const float values[] = {3.0F, -4.0F};
  file.append(reinterpret_cast<const char*>(values), sizeof(values));
  const fs::path path = dir_ / "other.safetensors";
  write_bytes(path, file);
  const TensorFile result = read_safetensors(path);
  expect_same_tensors({{"first", Tensor::scalar(3.0F)}, {"second", Tensor::from_data({1}, {-4.0F})}}, result.tensors);
}

TEST_F(SafetensorsTest, OverwriteReplacesTheFileAndLeavesNoTemporaryFiles) {
  const fs::path path = dir_ / "state.safetensors";
  write_safetensors(path, {{"x", Tensor::full({100}, 1.0F)}});
  write_safetensors(path, {{"y", Tensor::scalar(2.0F)}});
  expect_same_tensors({{"y", Tensor::scalar(2.0F)}}, read_safetensors(path).tensors);
  EXPECT_EQ(other_files({"state.safetensors"}), std::vector<std::string>{});
}

// ---- every validation failure ----------------------------------------------

struct BadFile {
  const char* name;
  std::string bytes;
  const char* message;  // a substring of the error after "[load] <path>: "
};
void PrintTo(const BadFile& f, std::ostream* os) { *os << f.name; }

std::string entry(const std::string& name, const std::string& shape, std::uint64_t begin, std::uint64_t end) {
  return "\"" + name + R"(":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":[)" + std::to_string(begin) +
         "," + std::to_string(end) + "]}";
}

std::vector<BadFile> bad_files() {
  const std::string a = entry("a", "[2]", 0, 8);
  return {
      {"Empty", "", "shorter than the 8-byte header length"},
      {"FiveBytes", std::string("\x01\x00\x00\x00\x00", 5), "file is 5 bytes, shorter than the 8-byte header length"},
      {"HeaderLongerThanFile", u64_le(64) + "{}", "larger than the rest of the file"},
      {"HeaderAbsurd", u64_le(std::uint64_t{1} << 40) + "{}", "over the 100 MiB limit"},
      {"HeaderJustOverLimit", u64_le((std::uint64_t{100} << 20) + 1) + "{}", "over the 100 MiB limit"},
      {"HeaderMaxU64", u64_le(std::numeric_limits<std::uint64_t>::max()) + "{}", "over the 100 MiB limit"},
      {"NotJson", raw_file("{\"a\": ", 0), "header is not valid JSON"},
      {"NotUtf8", raw_file("{\"\xFF\":{}}", 0), "header is not valid JSON"},
      {"NotObject", raw_file("[1, 2]  ", 0), "header is not a JSON object"},
      {"DuplicateTensor", raw_file("{" + a + "," + a + "}", 8), "header has the key 'a' twice"},
      {"EntryNotObject", raw_file(R"({"a": 3})", 0), "tensor 'a': entry is not a JSON object"},
      {"MissingDtype", raw_file(R"({"a":{"shape":[],"data_offsets":[0,4]}})", 4), "tensor 'a': missing \"dtype\""},
      {"MissingShape", raw_file(R"({"a":{"dtype":"F32","data_offsets":[0,4]}})", 4), "tensor 'a': missing \"shape\""},
      {"MissingOffsets", raw_file(R"({"a":{"dtype":"F32","shape":[]}})", 4), "tensor 'a': missing \"data_offsets\""},
      {"DtypeF16", raw_file(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})", 4),
       "tensor 'a': dtype 'F16' is not supported (only F32)"},
      {"DtypeNotString", raw_file(R"({"a":{"dtype":32,"shape":[],"data_offsets":[0,4]}})", 4),
       "tensor 'a': \"dtype\" is not a string"},
      {"ShapeNotArray", raw_file("{" + entry("a", "2", 0, 8) + "}", 8), "tensor 'a': \"shape\" is not an array"},
      {"ShapeNegative", raw_file("{" + entry("a", "[-2]", 0, 8) + "}", 8), "has a negative dimension"},
      {"ShapeFloat", raw_file("{" + entry("a", "[2.0]", 0, 8) + "}", 8), "has a non-integer dimension"},
      {"ShapeOverflowInt64", raw_file("{" + entry("a", "[9223372036854775808]", 0, 8) + "}", 8),
       "has a dimension that is too large"},
      {"ShapeProductOverflow", raw_file("{" + entry("a", "[4294967296,4294967296]", 0, 8) + "}", 8), "is too large"},
      {"OffsetsNotPair", raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
       "\"data_offsets\" must be [begin, end]"},
      {"OffsetsNegative", raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8),
       "\"data_offsets\" must be [begin, end]"},
      {"OffsetsReversed", raw_file("{" + entry("a", "[0]", 8, 0) + "}", 8), "data_offsets [8, 0) end before they begin"},
      {"OffsetsWrongSize", raw_file("{" + entry("a", "[3]", 0, 8) + "}", 8),
       "tensor 'a': data_offsets [0, 8) hold 8 bytes but shape (3,) needs 12"},
      {"OffsetsPastData", raw_file("{" + entry("a", "[2]", 4, 12) + "}", 8),
       "tensor 'a': data_offsets [4, 12) run past the data section (8 bytes)"},
      {"Overlap", raw_file("{" + a + "," + entry("b", "[2]", 4, 12) + "}", 12),
       "tensor 'b' at [4, 12) overlaps tensor 'a' at [0, 8)"},
      {"EmptyInsideAnother", raw_file("{" + a + "," + entry("e", "[0]", 4, 4) + "}", 8), "tensor 'e' at [4, 4) overlaps"},
      {"Hole", raw_file("{" + a + "," + entry("b", "[1]", 12, 16) + "}", 16),
       "bytes [8, 12) of the data section belong to no tensor"},
      {"HoleAtStart", raw_file("{" + entry("a", "[1]", 4, 8) + "}", 8), "bytes [0, 4) of the data section"},
      {"TrailingBytes", raw_file("{" + a + "}", 11), "3 trailing bytes after the tensors"},
      {"DataWithoutTensors", raw_file("{}", 4), "4 trailing bytes"},
      {"MetadataNotObject", raw_file(R"({"__metadata__":"x"})", 0), "\"__metadata__\" is not a JSON object"},
      {"MetadataNotString", raw_file(R"({"__metadata__":{"k":"v","n":1}})", 0),
       "\"__metadata__\" value of 'n' is not a string"},
      {"MetadataDuplicateKey", raw_file(R"({"__metadata__":{"k":"v","k":"w"}})", 0), "header has the key 'k' twice"},
  };
}

class SafetensorsBadFile : public SafetensorsTest, public ::testing::WithParamInterface<BadFile> {};

TEST_P(SafetensorsBadFile, IsRefusedWithAPreciseMessage) {
  const fs::path path = dir_ / "bad.safetensors";
  write_bytes(path, GetParam().bytes);
  try {
    read_safetensors(path);
    FAIL() << "no error";
  } catch (const ModelStateError& e) {
    const std::string prefix = "[load] " + path.string() + ": ";
    const std::string message = e.what();
    EXPECT_EQ(message.rfind(prefix, 0), 0U) << message;
    EXPECT_NE(message.find(GetParam().message), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SafetensorsBadFile, ::testing::ValuesIn(bad_files()),
                         [](const ::testing::TestParamInfo<BadFile>& info) { return info.param.name; });

/// Expects read_safetensors(path) to throw ModelStateError "[load] <path>: ...<part>...".
void expect_load_error(const fs::path& path, const std::string& part) {
  try {
    read_safetensors(path);
    ADD_FAILURE() << "no error";
  } catch (const ModelStateError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("[load] " + path.string() + ": ", 0), 0U) << message;
    EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

// The header's entries are read in the file's order although the parsed
// object is a std::map (a linear parse): the first bad entry of the file is
// the one named, and 100,000 entries load (they took 48 s: the callback
// parser searched the whole object at every entry's end).
TEST_F(SafetensorsTest, EntriesAreReadInTheFilesOrderAndManyLoad) {
  const fs::path bad = dir_ / "two_bad.safetensors";
  write_bytes(bad, raw_file(R"({"z":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},)"
                            R"("a":{"dtype":"I8","shape":[1],"data_offsets":[1,2]}})",
                            2));
  expect_load_error(bad, "tensor 'z': dtype 'I8' is not supported");
  NamedTensors many;
  for (int i = 0; i < 100000; ++i) many.emplace_back("t" + std::to_string(99999 - i), Tensor::zeros({0}));
  const fs::path path = dir_ / "many.safetensors";
  write_safetensors(path, many);
  const TensorFile file = read_safetensors(path);
  ASSERT_EQ(file.tensors.size(), many.size());
  EXPECT_EQ(file.tensors.front().first, "t99999");  // all at offset 0: the file's order decides
  EXPECT_EQ(file.tensors.back().first, "t0");
}

TEST_F(SafetensorsTest, CorruptedGoodFilesAreRefused) {
  const fs::path path = dir_ / "state.safetensors";
  write_safetensors(path, interop_tensors(), kInteropMetadata);
  const std::string good = read_bytes(path);

  write_bytes(path, good.substr(0, good.size() - 4));  // truncated data
  expect_load_error(path, "run past the data section");
  write_bytes(path, good.substr(0, 20));  // truncated header
  expect_load_error(path, "larger than the rest of the file");
  write_bytes(path, good + "xyz");  // appended bytes
  expect_load_error(path, "3 trailing bytes");

  std::string flipped = good;
  flipped[8] = '[';  // header no longer a JSON object or valid JSON
  write_bytes(path, flipped);
  expect_load_error(path, "header is not valid JSON");

  std::string f16 = good;
  const std::size_t at = f16.find("\"F32\"");
  ASSERT_NE(at, std::string::npos);
  f16.replace(at, 5, "\"F16\"");
  write_bytes(path, f16);
  expect_load_error(path, "dtype 'F16' is not supported");
}

TEST_F(SafetensorsTest, MissingPathAndDirectoryAreRefused) {
  expect_load_error(dir_ / "absent.safetensors", "cannot open");
  expect_load_error(dir_, "not a regular file");
}

// ---- failed writes leave the old target untouched and no temporary files ----

/// Expects write_safetensors to throw ModelStateError "[save] <path>: ...<part>...".
void expect_save_error(const fs::path& path, const NamedTensors& tensors, const std::string& part) {
  try {
    write_safetensors(path, tensors, {});
    ADD_FAILURE() << "no error";
  } catch (const ModelStateError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("[save] " + path.string() + ": ", 0), 0U) << message;
    EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

TEST_F(SafetensorsTest, InvalidArgumentsFailBeforeTouchingTheTarget) {
  const fs::path path = dir_ / "state.safetensors";
  write_safetensors(path, interop_tensors(), kInteropMetadata);
  const std::string before = read_bytes(path);
  const Tensor x = Tensor::scalar(1.0F);
  expect_save_error(path, {{"a", x}, {"a", x}}, "tensor name 'a' appears twice");
  expect_save_error(path, {{"", x}}, "a tensor name is empty");
  expect_save_error(path, {{"__metadata__", x}}, "'__metadata__' is reserved");
  expect_save_error(path, {{"u", Tensor()}}, "tensor 'u' is undefined");
  expect_save_error(path, {{"bad\xFF", x}}, "not valid UTF-8");
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(other_files({"state.safetensors"}), std::vector<std::string>{});
}

// A shape has at most 64 dimensions (PyTorch's limit), and any longer array
// in a header is refused by the structure pass, before a JSON document is
// built: a 100 MB header of one 50M-entry shape cost 2.3 GB.
TEST_F(SafetensorsTest, ShapesOfMoreThan64DimensionsAreRefusedBeforeTheHeaderIsBuilt) {
  auto ones = [](std::size_t n) {
    std::string dims;
    for (std::size_t i = 0; i < n; ++i) dims += i == 0 ? "1" : ",1";
    return dims;
  };
  const fs::path path = dir_ / "dims.safetensors";
  write_bytes(path, raw_file(R"({"t":{"dtype":"F32","shape":[)" + ones(64) + R"(],"data_offsets":[0,4]}})", 4));
  EXPECT_EQ(read_safetensors(path).tensors.at(0).second.shape().size(), 64U);
  write_bytes(path, raw_file(R"({"t":{"dtype":"F32","shape":[)" + ones(65) + R"(],"data_offsets":[0,4]}})", 4));
  expect_load_error(path, "header has an array of more than 64 elements (a tensor shape has at most 64 dimensions)");
  const std::string huge = R"({"t":{"dtype":"F32","shape":[)" + ones(10'000'000) + R"(],"data_offsets":[0,4]}})";
  try {
    (void)detail::parse_safetensors_header(path, huge, 4);
    ADD_FAILURE() << "a 10M-dimension shape was accepted";
  } catch (const ModelStateError& e) {
    EXPECT_NE(std::string(e.what()).find("more than 64 elements"), std::string::npos) << e.what();
  }
  // Nor is a file written that could not be read back.
  write_bytes(path, raw_file(R"({"t":{"dtype":"F32","shape":[)" + ones(64) + R"(],"data_offsets":[0,4]}})", 4));
  expect_save_error(path, {{"t", Tensor::zeros(Shape(65, 1))}}, "has 65 dimensions, more than the limit of 64");
  EXPECT_EQ(read_safetensors(path).tensors.at(0).second.shape().size(), 64U);  // the old file, untouched
}

TEST_F(SafetensorsTest, WritingOverADirectoryFails) {
  const fs::path path = dir_ / "taken";
  fs::create_directory(path);
  expect_save_error(path, {{"x", Tensor::scalar(1.0F)}}, "the target is a directory");
  EXPECT_TRUE(fs::is_directory(path));
  EXPECT_TRUE(fs::is_empty(path));
  EXPECT_EQ(other_files({"taken"}), std::vector<std::string>{});
}

TEST_F(SafetensorsTest, WritingIntoAMissingDirectoryFails) {
  expect_save_error(dir_ / "missing" / "state.safetensors", {{"x", Tensor::scalar(1.0F)}},
                    "cannot create a temporary file");
  EXPECT_EQ(other_files({}), std::vector<std::string>{});
}

TEST_F(SafetensorsTest, WritingIntoAReadOnlyDirectoryFails) {
  const fs::path path = dir_ / "state.safetensors";
  write_safetensors(path, interop_tensors());
  const std::string before = read_bytes(path);
  fs::permissions(dir_, fs::perms::owner_read | fs::perms::owner_exec);
  if (::access(dir_.c_str(), W_OK) == 0) {
    GTEST_SKIP() << "this user (root?) may write into read-only directories; see WriteFailingMidwayLeavesTargetUntouched";
  }
  expect_save_error(path, {{"x", Tensor::scalar(1.0F)}}, "cannot create a temporary file");
  fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add);
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(other_files({"state.safetensors"}), std::vector<std::string>{});
}

/// Lowers the file-size limit (RLIMIT_FSIZE) so write(2) fails with EFBIG
/// part-way through, even for root; restores it and SIGXFSZ on destruction.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    ::getrlimit(RLIMIT_FSIZE, &saved_);
    previous_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lowered = saved_;
    lowered.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &lowered);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, previous_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit saved_{};
  void (*previous_handler_)(int) = nullptr;
};

TEST_F(SafetensorsTest, WriteFailingMidwayLeavesTargetUntouched) {
  const fs::path path = dir_ / "state.safetensors";
  write_safetensors(path, interop_tensors(), kInteropMetadata);
  const std::string before = read_bytes(path);
  {
    const FileSizeLimit limit(4096);
    expect_save_error(path, {{"big", Tensor::full({1 << 18}, 3.0F)}}, "cannot write");  // 1 MiB
  }
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(other_files({"state.safetensors"}), std::vector<std::string>{});
  expect_same_tensors(interop_tensors(), read_safetensors(path).tensors);
}

// ---- files for the independent Python reader (tests/python) -----------------

TEST(SafetensorsInterop, WritesFileForIndependentReader) {
  const char* out = std::getenv("RIFTCO_SAFETENSORS_OUT");
  if (out == nullptr) GTEST_SKIP() << "set RIFTCO_SAFETENSORS_OUT (tests/python/test_safetensors_reader.py does)";
  write_safetensors(out, interop_tensors(), kInteropMetadata);
}

TEST(SafetensorsInterop, RewritesFileFromIndependentWriter) {
  const char* in = std::getenv("RIFTCO_SAFETENSORS_IN");
  const char* out = std::getenv("RIFTCO_SAFETENSORS_OUT");
  if (in == nullptr || out == nullptr) {
    GTEST_SKIP() << "set RIFTCO_SAFETENSORS_IN and _OUT (tests/python/test_safetensors_reader.py does)";
  }
  const TensorFile file = read_safetensors(in);
  write_safetensors(out, file.tensors, file.metadata);
}
