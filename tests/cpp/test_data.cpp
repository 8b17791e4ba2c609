// Training data (tokenizer, text files, datasets, chat JSONL) and the
// loss-curve plot files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "riftco_transformer/data.hpp"
#include "riftco_transformer/plot.hpp"

using namespace riftco_transformer;
namespace fs = std::filesystem;

namespace {

// A fresh folder per test, removed afterwards.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() /
            ("riftco_data_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_" + info->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  fs::path write(const std::string& name, const std::string& bytes) const {
    const fs::path p = path_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }

 private:
  fs::path path_;
};

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `f`, expects exception E whose message contains every needle.
template <class E, class F>
void expect_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no exception; expected one containing '" << *needles.begin() << "'";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  }
}

}  // namespace

// ---------------------------------------------------------------- tokenizer

TEST(ByteTokenizer, RoundTripsAsciiAndMultiByteUtf8) {
  const ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 256);
  const std::string text = "h\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82\n";  // "héllo, 世界 🙂"
  const std::vector<std::int32_t> ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 'h');
  EXPECT_EQ(ids[1], 0xC3);
  EXPECT_EQ(ids[2], 0xA9);
  for (const std::int32_t id : ids) EXPECT_TRUE(id >= 0 && id < 256);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_TRUE(tok.encode("").empty());
  EXPECT_EQ(tok.decode({}), "");
}

TEST(ByteTokenizer, DecodeNamesTheBadIdAndItsPosition) {
  const ByteTokenizer tok;
  const std::vector<std::int32_t> high = {104, 105, 300, 1};
  expect_error<ValueError>([&] { (void)tok.decode(high); }, {"[ByteTokenizer::decode]", "id 300", "position 2"});
  const std::vector<std::int32_t> negative = {-1};
  expect_error<ValueError>([&] { (void)tok.decode(negative); }, {"id -1", "position 0"});
}

TEST(Utf8, FindsTheFirstInvalidSequence) {
  EXPECT_EQ(first_invalid_utf8("plain \xC3\xA9 \xF0\x9F\x99\x82"), std::nullopt);
  EXPECT_EQ(first_invalid_utf8("ab\xC0\xAF"), 2U);              // overlong '/'
  EXPECT_EQ(first_invalid_utf8("x\xE0\x80\xAF"), 1U);           // overlong 3-byte
  EXPECT_EQ(first_invalid_utf8("\xED\xA0\x80"), 0U);            // surrogate
  EXPECT_EQ(first_invalid_utf8("ok\xF4\x90\x80\x80"), 2U);      // above U+10FFFF
  EXPECT_EQ(first_invalid_utf8("abc\xE2\x82"), 3U);             // truncated at the end
  EXPECT_EQ(first_invalid_utf8("\x80"), 0U);                    // lone continuation
  EXPECT_EQ(first_invalid_utf8("\xC3\xA9\xC3("), 2U);           // bad continuation
  EXPECT_EQ(first_invalid_utf8(std::string("a\0b", 3)), std::nullopt);
}

// ------------------------------------------------------------ text files

TEST(DefaultCorpus, LoadsTheFortunesPackage) {
  if (!fs::is_directory(default_corpus_dir())) {
    GTEST_SKIP() << default_corpus_dir() << " is absent: run scripts/setup.sh (Debian package 'fortunes')";
  }
  const std::string corpus = load_default_corpus();
  EXPECT_GT(corpus.size(), 1'000'000U);
  EXPECT_EQ(first_invalid_utf8(corpus), std::nullopt);
  std::istringstream lines(corpus);
  std::string line;
  std::size_t separators = 0, blank = 0;
  while (std::getline(lines, line)) {
    separators += line == "%";
    blank += line.empty();
  }
  EXPECT_EQ(separators, 0U);
  EXPECT_GT(blank, 1000U);  // the separators became blank lines
}

TEST(DefaultCorpus, ReadsPlainFilesSortedAndTurnsSeparatorsIntoBlankLines) {
  TempDir dir;
  dir.write("b", "third\n%\n");
  dir.write("a", "first line\nsecond line\n%\n\n%\nsecond\r\n%\r\n");
  dir.write("a.dat", "\xFF\xFE binary index");        // skipped: extension
  fs::create_symlink(dir.path() / "a", dir.path() / "a.u8");  // skipped: link
  fs::create_directory(dir.path() / "off");
  dir.write("off/c", "offensive\n%\n");  // skipped: folder
  EXPECT_EQ(load_fortune_corpus(dir.path()), "first line\nsecond line\n\nsecond\n\nthird\n\n");
}

TEST(DefaultCorpus, MissingFilesGiveAnInstallHint) {
  TempDir dir;
  expect_error<DataError>([&] { (void)load_fortune_corpus(dir.path() / "nope"); },
                          {"[data] ", "nope", "run scripts/setup.sh (Debian package 'fortunes')"});
  dir.write("only.dat", "x");
  expect_error<DataError>([&] { (void)load_fortune_corpus(dir.path()); },
                          {"no fortune files", "run scripts/setup.sh (Debian package 'fortunes')"});
}

TEST(TextFile, LoadsValidUtf8) {
  TempDir dir;
  const fs::path p = dir.write("ok.txt", "caf\xC3\xA9\n");
  EXPECT_EQ(load_text_file(p), "caf\xC3\xA9\n");
}

TEST(TextFile, RejectsMissingEmptyDirectoryAndInvalidUtf8) {
  TempDir dir;
  const fs::path missing = dir.path() / "missing.txt";
  expect_error<DataError>([&] { (void)load_text_file(missing); }, {"[data] " + missing.string() + ": ", "does not exist"});
  const fs::path empty = dir.write("empty.txt", "");
  expect_error<DataError>([&] { (void)load_text_file(empty); }, {empty.string(), "empty"});
  expect_error<DataError>([&] { (void)load_text_file(dir.path()); }, {dir.path().string(), "not a regular file"});
  const fs::path bad = dir.write("bad.txt", "hello \xC3\xA9 w\xFForld");
  expect_error<DataError>([&] { (void)load_text_file(bad); }, {bad.string(), "invalid UTF-8 at byte offset 10"});
}

// ------------------------------------------------------------ TextDataset

TEST(TextDataset, SplitsByPositionWithTheLastFractionForValidation) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>('a' + i % 26);
  const TextDataset ds(text);
  EXPECT_EQ(ds.train_tokens(), 900);
  EXPECT_EQ(ds.validation_tokens(), 100);
  const std::vector<std::int32_t> all = ByteTokenizer{}.encode(text);
  const auto val = ds.tokens(Split::Validation);
  EXPECT_TRUE(std::equal(val.begin(), val.end(), all.end() - 100, all.end()));
  const auto train = ds.tokens(Split::Train);
  EXPECT_TRUE(std::equal(train.begin(), train.end(), all.begin(), all.begin() + 900));

  EXPECT_EQ(TextDataset("0123456789", {}, 0.25).validation_tokens(), 2);  // floor(2.5)
  EXPECT_EQ(TextDataset("0123456789", {}, 0.0).validation_tokens(), 0);
  for (const double bad : {-0.1, 1.0, std::nan("")}) {
    expect_error<ValueError>([&] { TextDataset("abc", {}, bad); }, {"[TextDataset]", "validation_fraction"});
  }
}

TEST(TextDataset, WindowsFollowTheDocumentedDrawsAndShiftTargetsByOne) {
  std::string text;
  Random gen(7);
  for (int i = 0; i < 5000; ++i) text += static_cast<char>(32 + gen.below(90));
  const TextDataset ds(text);
  for (const Split split : {Split::Train, Split::Validation}) {
    const auto stream = ds.tokens(split);
    const std::int64_t B = 4, T = 16;
    Random random(42), replay(42);
    const TokenBatch batch = ds.sample_batch(random, B, T, split);
    ASSERT_EQ(batch.batch, B);
    ASSERT_EQ(batch.seq_len, T);
    ASSERT_EQ(batch.tokens.size(), static_cast<std::size_t>(B * T));
    ASSERT_EQ(batch.targets.size(), static_cast<std::size_t>(B * T));
    for (std::int64_t b = 0; b < B; ++b) {
      const std::size_t s = replay.below(static_cast<std::uint32_t>(stream.size() - T));
      for (std::int64_t t = 0; t < T; ++t) {
        const std::size_t i = static_cast<std::size_t>(b * T + t);
        EXPECT_EQ(batch.tokens[i], stream[s + static_cast<std::size_t>(t)]);
        EXPECT_EQ(batch.targets[i], stream[s + static_cast<std::size_t>(t) + 1]);
        if (t + 1 < T) {
          EXPECT_EQ(batch.targets[i], batch.tokens[i + 1]);
        }
      }
    }
    EXPECT_EQ(random.state(), replay.state());
  }
}

TEST(TextDataset, SameRandomStateGivesTheSameBatch) {
  const TextDataset ds(std::string(3000, 'x') + "the quick brown fox jumps over the lazy dog, again and again");
  Random a(3), b(3), c(4);
  const TokenBatch x = ds.sample_batch(a, 8, 32);
  const TokenBatch y = ds.sample_batch(b, 8, 32);
  EXPECT_EQ(x.tokens, y.tokens);
  EXPECT_EQ(x.targets, y.targets);
  const TokenBatch z = ds.sample_batch(c, 8, 32);
  EXPECT_EQ(z.tokens.size(), x.tokens.size());
}

TEST(TextDataset, ValidationWindowsStayInsideTheValidationTail) {
  const TextDataset ds(std::string(90, 'a') + std::string(10, 'b'));
  Random random(1);
  const TokenBatch val = ds.sample_batch(random, 16, 9, Split::Validation);  // 10 tokens: one window
  for (const std::int32_t id : val.tokens) EXPECT_EQ(id, 'b');
  for (const std::int32_t id : val.targets) EXPECT_EQ(id, 'b');
  const TokenBatch train = ds.sample_batch(random, 16, 20, Split::Train);
  for (const std::int32_t id : train.targets) EXPECT_EQ(id, 'a');  // no window crosses the boundary
}

TEST(TextDataset, TooShortSplitsAndBadShapesThrow) {
  const TextDataset ds(std::string(100, 'z'));
  Random random(0);
  expect_error<DataError>([&] { (void)ds.sample_batch(random, 1, 10, Split::Validation); },
                          {"[data] validation split has 10 tokens", "seq_len 10 needs at least 11"});
  expect_error<DataError>([&] { (void)ds.sample_batch(random, 1, 90, Split::Train); }, {"train split has 90 tokens"});
  expect_error<ValueError>([&] { (void)ds.sample_batch(random, 0, 4); }, {"batch 0"});
  expect_error<ValueError>([&] { (void)ds.sample_batch(random, 2, -1); }, {"seq_len -1"});
  const TextDataset none("abcdef", {}, 0.0);
  expect_error<DataError>([&] { (void)none.sample_batch(random, 1, 1, Split::Validation); }, {"has 0 tokens"});
}

// ------------------------------------------------------------ ChatDataset

TEST(ChatDataset, MasksExactlyThePromptPositions) {
  const ChatDataset ds = ChatDataset::parse(R"({"prompt": "ab", "response": "cde"})"
                                            "\n"
                                            R"({"prompt": "\u00e9?", "response": "ok"})",
                                            "mem");
  ASSERT_EQ(ds.size(Split::Train), 2);
  EXPECT_EQ(ds.size(Split::Validation), 0);
  const ChatExample& a = ds.examples(Split::Train)[0];
  EXPECT_EQ(a.tokens, (std::vector<std::int32_t>{'a', 'b', 'c', 'd'}));
  EXPECT_EQ(a.targets, (std::vector<std::int32_t>{kIgnoreTarget, 'c', 'd', 'e'}));
  EXPECT_EQ(a.prompt_tokens, 2);
  EXPECT_EQ(a.line, 1);
  const ChatExample& b = ds.examples(Split::Train)[1];  // "é?" is 3 bytes: positions 0, 1 masked
  EXPECT_EQ(b.tokens, (std::vector<std::int32_t>{0xC3, 0xA9, '?', 'o'}));
  EXPECT_EQ(b.targets, (std::vector<std::int32_t>{kIgnoreTarget, kIgnoreTarget, 'o', 'k'}));
  EXPECT_EQ(b.line, 2);
  EXPECT_EQ(ds.max_length(), 4);
}

TEST(ChatDataset, BatchesPadAndTruncateWithTheDocumentedDraws) {
  const ChatDataset ds = ChatDataset::parse("{\"prompt\": \"Q\", \"response\": \"yes\"}\n"
                                            "{\"prompt\": \"long prompt\", \"response\": \"no\"}\n",
                                            "mem");
  Random random(5), replay(5);
  // T = 11: "long prompt" is cut (12 tokens) but keeps its first target (at
  // position 10), so both examples are drawn (one below(2) per row).
  const std::int64_t B = 6, T = 11;
  const TokenBatch batch = ds.sample_batch(random, B, T);
  ASSERT_EQ(batch.tokens.size(), static_cast<std::size_t>(B * T));
  for (std::int64_t b = 0; b < B; ++b) {
    const ChatExample& ex = ds.examples(Split::Train)[replay.below(2)];
    for (std::int64_t t = 0; t < T; ++t) {
      const auto i = static_cast<std::size_t>(b * T + t);
      const auto k = static_cast<std::size_t>(t);
      EXPECT_EQ(batch.tokens[i], k < ex.tokens.size() ? ex.tokens[k] : 0);
      EXPECT_EQ(batch.targets[i], k < ex.targets.size() ? ex.targets[k] : kIgnoreTarget);
    }
  }
  Random again(5);
  EXPECT_EQ(ds.sample_batch(again, B, T).targets, batch.targets);
}

TEST(ChatDataset, EveryTenthExampleIsValidation) {
  std::string text;
  for (int i = 0; i < 25; ++i) text += "{\"prompt\": \"p" + std::to_string(i) + "\", \"response\": \"r\"}\n";
  const ChatDataset ds = ChatDataset::parse(text, "mem");
  ASSERT_EQ(ds.size(Split::Validation), 2);
  EXPECT_EQ(ds.size(Split::Train), 23);
  EXPECT_EQ(ds.examples(Split::Validation)[0].line, 10);
  EXPECT_EQ(ds.examples(Split::Validation)[1].line, 20);

  const ChatDataset small = ChatDataset::parse("{\"prompt\": \"p\", \"response\": \"r\"}", "mem");
  Random random(0);
  expect_error<DataError>([&] { (void)small.sample_batch(random, 1, 4, Split::Validation); },
                          {"validation split has no examples"});
}

TEST(ChatDataset, MalformedLinesNameTheirLineNumber) {
  const std::string ok = "{\"prompt\": \"p\", \"response\": \"r\"}\n";
  const struct {
    std::string text;
    std::string line;
    std::string what;
  } cases[] = {
      {ok + "{\"prompt\": \"p\",\n", "line 2: ", "invalid JSON at column"},
      {ok + ok + "not json\n", "line 3: ", "invalid JSON"},
      {"{\"prompt\": \"p\"}\n", "line 1: ", "missing key \"response\""},
      {ok + "{\"response\": \"r\"}\n", "line 2: ", "missing key \"prompt\""},
      {"{\"prompt\": 5, \"response\": \"r\"}\n", "line 1: ", "\"prompt\" must be a string, got number"},
      {"{\"prompt\": \"p\", \"response\": null}\n", "line 1: ", "\"response\" must be a string, got null"},
      {"[\"p\", \"r\"]\n", "line 1: ", "expected an object, got array"},
      {"{\"prompt\": \"\", \"response\": \"r\"}\n", "line 1: ", "\"prompt\" is empty"},
      {"\n  \n" + ok + "{bad\n", "line 4: ", "invalid JSON"},  // blank lines count
      {"{\"prompt\": \"p\xFF\", \"response\": \"r\"}\n", "line 1: ", "invalid JSON"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    expect_error<DataError>([&] { (void)ChatDataset::parse(c.text, "mem.jsonl"); },
                            {"[data] mem.jsonl: " + c.line, c.what});
  }
  expect_error<DataError>([&] { (void)ChatDataset::parse("", "mem.jsonl"); }, {"[data] mem.jsonl: no examples"});
  expect_error<DataError>([&] { (void)ChatDataset::parse("\n \n", "mem.jsonl"); }, {"no examples"});
}

TEST(ChatDataset, LoadNamesThePath) {
  TempDir dir;
  const fs::path bad = dir.write("chat.jsonl", "{\"prompt\": \"p\", \"response\": \"r\"}\n{\"prompt\": 1}\n");
  expect_error<DataError>([&] { (void)ChatDataset::load(bad); }, {"[data] " + bad.string() + ": line 2: "});
  const fs::path empty = dir.write("empty.jsonl", "");
  expect_error<DataError>([&] { (void)ChatDataset::load(empty); }, {empty.string(), "no examples"});
  expect_error<DataError>([&] { (void)ChatDataset::load(dir.path() / "nope.jsonl"); }, {"nope.jsonl", "does not exist"});
}

TEST(ChatDataset, ShippedExampleFileLoads) {
  const ChatDataset ds = ChatDataset::load(fs::path(RIFTCO_SOURCE_DIR) / "data" / "chat_example.jsonl");
  EXPECT_GE(ds.size(Split::Train) + ds.size(Split::Validation), 50);
  EXPECT_GE(ds.size(Split::Validation), 5);
  for (const Split split : {Split::Train, Split::Validation}) {
    for (const ChatExample& ex : ds.examples(split)) {
      ASSERT_EQ(ex.tokens.size(), ex.targets.size());
      const auto masked = std::count(ex.targets.begin(), ex.targets.end(), kIgnoreTarget);
      EXPECT_EQ(masked, ex.prompt_tokens - 1) << "line " << ex.line;
    }
  }
  Random random(1);
  const TokenBatch batch = ds.sample_batch(random, 4, ds.max_length());
  EXPECT_EQ(batch.tokens.size(), static_cast<std::size_t>(4 * ds.max_length()));
}

// ------------------------------------------------------------------ plots

namespace {

std::vector<CurveSeries> two_curves() {
  CurveSeries train{"train", {}, 0xD62728};
  CurveSeries val{"validation", {}, 0x1F77B4};
  for (int step = 0; step <= 200; step += 2) train.points.emplace_back(step, 5.5 * std::exp(-step / 60.0) + 1.0);
  for (int step = 0; step <= 200; step += 50) val.points.emplace_back(step, 5.0 * std::exp(-step / 70.0) + 1.3);
  return {train, val};
}

}  // namespace

TEST(Plot, SvgHandlesEmptyFlatAndNonFiniteSeries) {
  TempDir dir;
  const double nan = std::nan("");
  const std::vector<CurveSeries> odd = {{"empty", {}, 0x00AA00},
                                        {"flat", {{0, 2.0}, {10, 2.0}, {20, nan}, {30, 2.0}}, 0x9467BD}};
  write_loss_curve_svg(dir.path() / "odd.svg", odd, "odd");
  const std::string svg = read_bytes(dir.path() / "odd.svg");
  std::size_t polylines = 0;
  for (std::size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++polylines;
  EXPECT_EQ(polylines, 2U) << "the NaN breaks the flat line in two";
  EXPECT_NE(svg.find("<circle"), std::string::npos) << "a lone finite point is marked";
  EXPECT_EQ(svg.find("nan"), std::string::npos);
  write_loss_curve_svg(dir.path() / "none.svg", {}, "");
  EXPECT_NE(read_bytes(dir.path() / "none.svg").find("</svg>"), std::string::npos);
}

TEST(Plot, SvgHasAPolylinePerSeries) {
  TempDir dir;
  const fs::path p = dir.path() / "loss.svg";
  write_loss_curve_svg(p, two_curves(), "loss <train> & val");
  const std::string svg = read_bytes(p);
  EXPECT_EQ(svg.rfind("<?xml", 0), 0U);
  EXPECT_NE(svg.find("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"640\" height=\"400\""), std::string::npos);
  std::size_t polylines = 0;
  for (std::size_t at = svg.find("<polyline"); at != std::string::npos; at = svg.find("<polyline", at + 1)) ++polylines;
  EXPECT_EQ(polylines, 2U);
  EXPECT_NE(svg.find("stroke=\"#D62728\""), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#1F77B4\""), std::string::npos);
  EXPECT_NE(svg.find("loss &lt;train&gt; &amp; val"), std::string::npos);
  EXPECT_NE(svg.find(">validation</text>"), std::string::npos);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(Plot, BadColourAndUnwritablePathThrow) {
  TempDir dir;
  const std::vector<CurveSeries> bad = {{"x", {{0, 1}}, 0x1000000}};
  expect_error<ValueError>([&] { write_loss_curve_svg(dir.path() / "a.svg", bad, "t"); }, {"[plot]", "0x1000000"});
  const fs::path nowhere = dir.path() / "missing" / "a.svg";
  expect_error<Error>([&] { write_loss_curve_svg(nowhere, two_curves(), "t"); }, {"[save] " + nowhere.string()});
  EXPECT_FALSE(fs::exists(dir.path() / "a.svg"));
}
