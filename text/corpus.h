// Corpus: documents of text segments read from files or directories; by default Debian's
// `fortunes` (entries between lines holding only "%"), with a deterministic held-out split.
//   Corpus corpus = Corpus::load({kFortunesDir});
//   CorpusSplit split = corpus.split(20);  // every 20th document held out
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessel::text {

constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// A document is a list of segments, the sentence-like units next-sentence prediction pairs up.
struct Document {
  std::vector<std::string> segments;
  std::string source;  // "path:line" of its first line, for messages
};

class Corpus;
struct CorpusSplit;

class Corpus {
 public:
  Corpus() = default;
  explicit Corpus(std::vector<Document> documents) : documents_(std::move(documents)) {}

  // Reads each path: a directory contributes its regular files whose names have no extension
  // or end in ".txt", in name order (so ".dat" indexes, ".u8" links, hidden files and
  // sub-directories are skipped, as are symbolic links); a file named directly is always read.
  // A file holding any line that is exactly "%" is in fortune format: each entry between such
  // lines is a document and its non-blank lines are its segments. Any other file is plain
  // text: blank-line-separated paragraphs are documents and their lines are segments; a file
  // with no blank line at all has one document per line. Backspaces erase the character
  // before them (the overstrike some fortunes use), and segments are trimmed of surrounding
  // whitespace. Throws tessel::Error naming the path when a path does not exist or cannot be read,
  // and naming all the paths when they hold no document at all.
  static Corpus load(const std::vector<std::string>& paths);
  static Corpus load_fortunes() { return load({kFortunesDir}); }
  // One file's text in the formats above; `source` names it in Document::source.
  static std::vector<Document> parse(const std::string& text, const std::string& source);

  int64_t size() const { return static_cast<int64_t>(documents_.size()); }
  bool empty() const { return documents_.empty(); }
  const std::vector<Document>& documents() const { return documents_; }
  const Document& operator[](int64_t index) const { return documents_[index]; }
  // Each document's segments joined by newlines (for VocabBuilder::add_text).
  std::vector<std::string> texts() const;
  int64_t num_segments() const;

  // Deterministic: document i is held out when i % every == every - 1 (every 20th, by default
  // 5%); the rest, in order, is the training part. Throws when `every` < 2.
  CorpusSplit split(int64_t every = 20) const;

 private:
  std::vector<Document> documents_;
};

struct CorpusSplit {
  Corpus train;
  Corpus held_out;
};

}  // namespace tessel::text
