#include "text/corpus.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing.h"

namespace tessel::text {
namespace {

namespace fs = std::filesystem;
using tessel::testing::throws_error;

// A fresh, empty directory under the test's temporary folder.
std::string fresh_dir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base ? base : fs::temp_directory_path().string()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

void write_file(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary);
  out << contents;
}

TEST(Corpus, ReadsFortuneFilesAndSkipsIndexesAndLinks) {
  const std::string dir = fresh_dir("fortunes_small");
  write_file(dir + "/animals",
             "The cat sat.\nOn the mat.\n%\nA dog barks.\n%\n\t\t-- Anonymous\n%\n%\n");
  write_file(dir + "/zen", "One hand claps.\n%\nNo mind.\n");
  write_file(dir + "/animals.dat", std::string("\x00\x00\x00\x02\x00\x00\x00\x03%\xff", 10));
  fs::create_symlink("animals", dir + "/animals.u8");
  write_file(dir + "/.hidden", "secret\n%\n");
  fs::create_directories(dir + "/off");
  write_file(dir + "/off/rude", "not read\n%\n");

  const Corpus corpus = Corpus::load({dir});
  ASSERT_EQ(corpus.size(), 5);
  EXPECT_EQ(corpus[0].segments, (std::vector<std::string>{"The cat sat.", "On the mat."}));
  EXPECT_EQ(corpus[1].segments, (std::vector<std::string>{"A dog barks."}));
  EXPECT_EQ(corpus[2].segments, (std::vector<std::string>{"-- Anonymous"}));
  EXPECT_EQ(corpus[3].segments, (std::vector<std::string>{"One hand claps."}));
  EXPECT_EQ(corpus[4].segments, (std::vector<std::string>{"No mind."}));
  EXPECT_EQ(corpus[0].source, dir + "/animals:1");
  EXPECT_EQ(corpus[4].source, dir + "/zen:3");
  EXPECT_EQ(corpus.num_segments(), 6);
  EXPECT_EQ(corpus.texts()[0], "The cat sat.\nOn the mat.");
}

TEST(Corpus, ReadsPlainTextByParagraphsOrLines) {
  const std::string dir = fresh_dir("plain_text");
  write_file(dir + "/book.txt",
             "First sentence.\nSecond sentence.\n\n  \nNext paragraph.\r\nStill it.\n\n");
  write_file(dir + "/lines.txt", "line one\nline two\n\nline three\n");
  write_file(dir + "/list", "alpha\nbeta\ngamma\n");
  write_file(dir + "/notes.md", "skipped: not a text extension\n");

  const auto paragraphs = Corpus::load({dir + "/book.txt"});
  ASSERT_EQ(paragraphs.size(), 2);
  EXPECT_EQ(paragraphs[0].segments,
            (std::vector<std::string>{"First sentence.", "Second sentence."}));
  EXPECT_EQ(paragraphs[1].segments, (std::vector<std::string>{"Next paragraph.", "Still it."}));

  const auto lines = Corpus::load({dir + "/list"});
  ASSERT_EQ(lines.size(), 3);
  EXPECT_EQ(lines[2].segments, (std::vector<std::string>{"gamma"}));

  // A directory: book.txt, lines.txt and list, in name order; notes.md is skipped.
  EXPECT_EQ(Corpus::load({dir}).size(), 2 + 2 + 3);
  // Several paths add up.
  EXPECT_EQ(Corpus::load({dir + "/list", dir + "/book.txt"}).size(), 5);
}

TEST(Corpus, BackspacesEraseTheCharacterBefore) {
  const auto documents = Corpus::parse("a *___\b\b\bnot* b\n%\nb\xC3\xA9\bx\n", "mem");
  ASSERT_EQ(documents.size(), 2u);
  EXPECT_EQ(documents[0].segments[0], "a *not* b");
  EXPECT_EQ(documents[1].segments[0], "bx");
}

TEST(Corpus, HeldOutSplitIsEveryNthDocument) {
  std::vector<Document> documents;
  for (int i = 0; i < 100; ++i) documents.push_back({{"doc " + std::to_string(i)}, "mem"});
  const Corpus corpus(documents);
  const CorpusSplit split = corpus.split(20);
  ASSERT_EQ(split.held_out.size(), 5);
  ASSERT_EQ(split.train.size(), 95);
  EXPECT_EQ(split.held_out[0].segments[0], "doc 19");
  EXPECT_EQ(split.held_out[4].segments[0], "doc 99");
  EXPECT_EQ(split.train[19].segments[0], "doc 20");
  const CorpusSplit again = corpus.split(20);
  EXPECT_EQ(again.train.texts(), split.train.texts());
  EXPECT_TRUE(throws_error([&] { corpus.split(1); }, "every must be >= 2"));
}

TEST(Corpus, EmptyCorpusNamesThePaths) {
  const std::string dir = fresh_dir("empty_corpus");
  write_file(dir + "/blank", "\n\n   \n%\n%\n");
  write_file(dir + "/index.dat", "binary");
  EXPECT_TRUE(throws_error([&] { Corpus::load({dir}); }, "no text found in '" + dir + "'"));
  const std::string empty_file = dir + "/empty.txt";
  write_file(empty_file, "");
  EXPECT_TRUE(throws_error(
      [&] {
        Corpus::load({empty_file, dir + "/blank"});
      },
      "'" + empty_file + "', '" + dir + "/blank'"));
}

TEST(Corpus, MissingPathIsAClearError) {
  EXPECT_TRUE(throws_error([] { Corpus::load({"/no/such/fortunes"}); },
                           "'/no/such/fortunes' does not exist"));
  EXPECT_TRUE(throws_error([] { Corpus::load({}); }, "no path given"));
}

TEST(Corpus, ReadsDebianFortunesWhenInstalled) {
  if (!fs::is_directory(kFortunesDir)) GTEST_SKIP() << kFortunesDir << " is not installed";
  const Corpus corpus = Corpus::load_fortunes();
  EXPECT_GT(corpus.size(), 1000);
  for (const auto& document : corpus.documents()) {
    ASSERT_FALSE(document.segments.empty()) << document.source;
    for (const auto& segment : document.segments) {
      ASSERT_FALSE(segment.empty()) << document.source;
      ASSERT_NE(segment, "%") << document.source;
      ASSERT_EQ(segment.find('\b'), std::string::npos) << document.source;
    }
    ASSERT_EQ(document.source.find(".dat"), std::string::npos) << document.source;
    ASSERT_EQ(document.source.find(".u8"), std::string::npos) << document.source;
  }
  const CorpusSplit split = corpus.split();
  EXPECT_EQ(split.train.size() + split.held_out.size(), corpus.size());
  EXPECT_GT(split.held_out.size(), 50);
}

}  // namespace
}  // namespace tessel::text
