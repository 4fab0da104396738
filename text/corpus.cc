#include "text/corpus.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace tessel::text {
namespace {

namespace fs = std::filesystem;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

std::string trimmed(const std::string& line) {
  size_t begin = 0, end = line.size();
  while (begin < end && is_space(line[begin])) ++begin;
  while (end > begin && is_space(line[end - 1])) --end;
  return line.substr(begin, end - begin);
}

// Applies backspaces: each erases the whole UTF-8 character before it on the line.
std::string apply_backspaces(const std::string& line) {
  if (line.find('\b') == std::string::npos) return line;
  std::string out;
  for (char c : line) {
    if (c != '\b') {
      out.push_back(c);
      continue;
    }
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) out.pop_back();
    if (!out.empty()) out.pop_back();
  }
  return out;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

// Groups lines into documents: a line for which `is_separator` holds ends the current one.
template <typename IsSeparator>
std::vector<Document> group_lines(const std::vector<std::string>& lines, const std::string& source,
                                  IsSeparator is_separator) {
  std::vector<Document> documents;
  Document current;
  auto flush = [&] {
    if (!current.segments.empty()) documents.push_back(std::move(current));
    current = Document();
  };
  for (size_t i = 0; i < lines.size(); ++i) {
    if (is_separator(lines[i])) {
      flush();
      continue;
    }
    std::string segment = trimmed(apply_backspaces(lines[i]));
    if (segment.empty()) continue;
    if (current.segments.empty()) current.source = source + ":" + std::to_string(i + 1);
    current.segments.push_back(std::move(segment));
  }
  flush();
  return documents;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSEL_CHECK(in.good(), "Corpus: cannot open '", path, "'");
  std::ostringstream contents;
  contents << in.rdbuf();
  TESSEL_CHECK(!in.bad(), "Corpus: error while reading '", path, "'");
  return contents.str();
}

// Text files of a directory, in name order: no extension or ".txt", no links, nothing hidden.
std::vector<std::string> text_files_in(const std::string& directory) {
  std::vector<std::string> files;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(directory, error)) {
    const fs::path& path = entry.path();
    const std::string name = path.filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (entry.is_symlink() || !entry.is_regular_file()) continue;
    const std::string extension = path.extension().string();
    if (!extension.empty() && extension != ".txt") continue;
    files.push_back(path.string());
  }
  TESSEL_CHECK(!error, "Corpus: cannot list directory '", directory, "': ", error.message());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::vector<Document> Corpus::parse(const std::string& text, const std::string& source) {
  const std::vector<std::string> lines = split_lines(text);
  const bool fortune_format =
      std::any_of(lines.begin(), lines.end(), [](const std::string& line) { return line == "%"; });
  if (fortune_format) {
    return group_lines(lines, source, [](const std::string& line) { return line == "%"; });
  }
  auto is_blank = [](const std::string& line) { return trimmed(line).empty(); };
  const bool has_blank_line = std::any_of(lines.begin(), lines.end(), is_blank);
  if (has_blank_line) return group_lines(lines, source, is_blank);
  // No paragraphs: every line is a document of its own.
  std::vector<Document> documents;
  for (size_t i = 0; i < lines.size(); ++i) {
    std::string segment = trimmed(apply_backspaces(lines[i]));
    if (segment.empty()) continue;
    documents.push_back({{std::move(segment)}, source + ":" + std::to_string(i + 1)});
  }
  return documents;
}

Corpus Corpus::load(const std::vector<std::string>& paths) {
  TESSEL_CHECK(!paths.empty(), "Corpus: no path given");
  std::vector<Document> documents;
  std::ostringstream all_paths;
  for (size_t p = 0; p < paths.size(); ++p) {
    const std::string& path = paths[p];
    all_paths << (p ? ", " : "") << "'" << path << "'";
    std::error_code error;
    const fs::file_status status = fs::status(path, error);
    TESSEL_CHECK(fs::exists(status), "Corpus: '", path, "' does not exist");
    std::vector<std::string> files;
    if (fs::is_directory(status)) {
      files = text_files_in(path);
    } else {
      files.push_back(path);
    }
    for (const auto& file : files) {
      for (auto& document : parse(read_file(file), file)) documents.push_back(std::move(document));
    }
  }
  TESSEL_CHECK(!documents.empty(), "Corpus: no text found in ", all_paths.str(),
               " (expected text files, or a directory of them such as ", kFortunesDir,
               " from Debian's fortunes package)");
  return Corpus(std::move(documents));
}

std::vector<std::string> Corpus::texts() const {
  std::vector<std::string> texts;
  texts.reserve(documents_.size());
  for (const auto& document : documents_) {
    std::string text;
    for (const auto& segment : document.segments) {
      if (!text.empty()) text.push_back('\n');
      text += segment;
    }
    texts.push_back(std::move(text));
  }
  return texts;
}

int64_t Corpus::num_segments() const {
  int64_t count = 0;
  for (const auto& document : documents_) count += static_cast<int64_t>(document.segments.size());
  return count;
}

CorpusSplit Corpus::split(int64_t every) const {
  TESSEL_CHECK(every >= 2,
               "Corpus::split: every must be >= 2 (one document in `every` is held out), got ",
               every);
  CorpusSplit result;
  std::vector<Document> train, held_out;
  for (size_t i = 0; i < documents_.size(); ++i) {
    auto& target = (static_cast<int64_t>(i) % every == every - 1) ? held_out : train;
    target.push_back(documents_[i]);
  }
  return {Corpus(std::move(train)), Corpus(std::move(held_out))};
}

}  // namespace tessel::text
