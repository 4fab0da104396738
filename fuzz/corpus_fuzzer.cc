// Text files for the corpus reader (fortune format with "%" lines, paragraphs, or one document
// per line, with backspaces and CRLF): Corpus::parse and Corpus::load must return documents of
// non-empty, trimmed, single-line segments or throw tessel::Error.
#include <string>
#include <vector>

#include "fuzz/harness.h"
#include "text/corpus.h"

namespace tessel::fuzz {
namespace {

bool is_trim_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

void check_documents(const std::vector<text::Document>& documents) {
  for (const text::Document& document : documents) {
    TESSEL_FUZZ_CHECK(!document.segments.empty(), "a document without segments from ",
                      document.source);
    TESSEL_FUZZ_CHECK(!document.source.empty(), "a document without a source");
    for (const std::string& segment : document.segments) {
      TESSEL_FUZZ_CHECK(!segment.empty(), "an empty segment in ", document.source);
      TESSEL_FUZZ_CHECK(!is_trim_space(segment.front()) && !is_trim_space(segment.back()),
                        "segment '", segment, "' is not trimmed");
      TESSEL_FUZZ_CHECK(segment.find('\n') == std::string::npos, "segment '", segment,
                        "' spans lines");
      TESSEL_FUZZ_CHECK(segment.find('\b') == std::string::npos, "segment '", segment,
                        "' keeps a backspace");
    }
  }
}

}  // namespace
}  // namespace tessel::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessel;
  const std::string input = fuzz::as_string(data, size);
  fuzz::expect_only_tessel_errors([&] {
    const std::vector<text::Document> documents = text::Corpus::parse(input, "fuzz input");
    fuzz::check_documents(documents);
    const std::string path = fuzz::write_scratch_file("fortunes", input);
    const text::Corpus corpus = text::Corpus::load({path});  // throws when there is no document
    TESSEL_FUZZ_CHECK(corpus.size() == static_cast<int64_t>(documents.size()), corpus.size(),
                      " documents loaded, ", documents.size(), " parsed");
    const text::CorpusSplit split = corpus.split(2);
    TESSEL_FUZZ_CHECK(split.train.size() + split.held_out.size() == corpus.size(),
                      "the split lost documents");
    TESSEL_FUZZ_CHECK(corpus.texts().size() == documents.size(), "texts() lost documents");
  });
  return 0;
}
