// The replay runner: a main for a fuzz target without libFuzzer (any compiler, no sanitizer
// needed). It runs the target over every file of its corpus folders, then over a bounded number of
// random mutations of them (deterministic for a given --seed), so `./tessel test` catches
// regressions in the parsers without clang.
//   bazel-bin/fuzz/idx_fuzzer fuzz/corpus/idx --dict=fuzz/dicts/idx.dict --mutations=2000
// On a crash (abort, segfault...) the input at fault is written to
// $TEST_UNDECLARED_OUTPUTS_DIR/crash-input (else ./crash-input) before the process dies.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/harness.h"

namespace {

namespace fs = std::filesystem;

struct Options {
  std::vector<std::string> corpus_dirs;
  std::string dict_path;
  long mutations = 1000;
  uint64_t seed = 1;
  double max_seconds = 5;
  size_t max_len = 1 << 16;
};

// ---- the input being run, for the crash handler (plain globals: read in a signal handler) ----

const char* g_current_data = nullptr;
size_t g_current_size = 0;
char g_crash_path[4096] = "crash-input";

void write_all(int fd, const char* data, size_t size) {
  while (size > 0) {
    const ssize_t written = ::write(fd, data, size);
    if (written <= 0) return;
    data += written;
    size -= static_cast<size_t>(written);
  }
}

// Only async-signal-safe calls: saves the input, then dies of the same signal.
void on_crash(int signal_number) {
  const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0 && g_current_data != nullptr) {
    write_all(fd, g_current_data, g_current_size);
    ::close(fd);
    const char note[] = "replay: the input at fault is saved as ";
    write_all(2, note, sizeof(note) - 1);
    write_all(2, g_crash_path, std::strlen(g_crash_path));
    write_all(2, "\n", 1);
  }
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

void install_crash_handler() {
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  if (outputs != nullptr && *outputs != '\0')
    std::snprintf(g_crash_path, sizeof(g_crash_path), "%s/crash-input", outputs);
  // SIGTERM: what Bazel sends a test that runs past its timeout (a hang is a finding too).
  for (int signal_number : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTERM})
    ::signal(signal_number, on_crash);
}

void run_one(const std::string& input) {
  g_current_data = input.data();
  g_current_size = input.size();
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
  g_current_data = nullptr;
}

// ---- inputs ----

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (!in) tessel::fuzz::fail("replay: cannot read " + path.string());
  return bytes.str();
}

// Every regular file under the folders, in path order.
std::vector<std::string> read_corpus(const std::vector<std::string>& dirs) {
  std::vector<fs::path> paths;
  for (const std::string& dir : dirs) {
    if (!fs::is_directory(dir)) tessel::fuzz::fail("replay: no corpus folder " + dir);
    for (const auto& entry : fs::recursive_directory_iterator(dir))
      if (entry.is_regular_file()) paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> inputs;
  for (const fs::path& path : paths) inputs.push_back(read_file(path));
  return inputs;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// libFuzzer's dictionary format: one `name="value"` (or `"value"`) per line, # comments, with
// the escapes \\ \" and \xAB.
std::vector<std::string> read_dictionary(const std::string& path) {
  std::vector<std::string> tokens;
  if (path.empty()) return tokens;
  std::istringstream lines(read_file(path));
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const size_t open = line.find('"');
    const size_t close = line.rfind('"');
    if (open == std::string::npos || close <= open)
      tessel::fuzz::fail("replay: " + path + ":" + std::to_string(number) + ": no quoted value");
    std::string token;
    for (size_t i = open + 1; i < close; ++i) {
      if (line[i] != '\\' || i + 1 >= close) {
        token.push_back(line[i]);
      } else if (line[i + 1] == 'x' && i + 3 < close && hex_digit(line[i + 2]) >= 0 &&
                 hex_digit(line[i + 3]) >= 0) {
        token.push_back(static_cast<char>(hex_digit(line[i + 2]) * 16 + hex_digit(line[i + 3])));
        i += 3;
      } else {
        token.push_back(line[++i]);
      }
    }
    tokens.push_back(token);
  }
  return tokens;
}

// ---- mutations ----

class Mutator {
 public:
  Mutator(uint64_t seed, const std::vector<std::string>& corpus,
          const std::vector<std::string>& dictionary, size_t max_len)
      : random_(seed), corpus_(corpus), dictionary_(dictionary), max_len_(max_len) {}

  // A random corpus input after one to four random edits.
  std::string next() {
    std::string input = corpus_.empty() ? std::string() : corpus_[below(corpus_.size())];
    const size_t edits = 1 + below(4);
    for (size_t i = 0; i < edits; ++i) edit(input);
    if (input.size() > max_len_) input.resize(max_len_);
    return input;
  }

 private:
  size_t below(size_t bound) { return bound == 0 ? 0 : random_() % bound; }
  char random_byte() { return static_cast<char>(random_() & 0xff); }

  std::string random_token() {
    if (!dictionary_.empty() && below(2) == 0) return dictionary_[below(dictionary_.size())];
    static const char* const kNumbers[] = {"0",          "-1",
                                           "1e308",      "4294967296",
                                           "2147483648", "9223372036854775807",
                                           "1e-320",     "18446744073709551616"};
    if (below(2) == 0) return kNumbers[below(sizeof(kNumbers) / sizeof(kNumbers[0]))];
    std::string bytes(1 + below(8), '\0');
    for (char& c : bytes) c = random_byte();
    return bytes;
  }

  void edit(std::string& input) {
    const size_t position = below(input.size() + 1);
    switch (below(9)) {
      case 0:  // flip a bit
        if (!input.empty()) input[below(input.size())] ^= static_cast<char>(1 << below(8));
        break;
      case 1:  // an extreme byte
        if (!input.empty()) {
          static const char kBytes[] = {'\0', '\x01', '\x7f', '\x80', '\xff', '\n', '"', '%'};
          input[below(input.size())] = kBytes[below(sizeof(kBytes))];
        }
        break;
      case 2:  // insert a token
        input.insert(position, random_token());
        break;
      case 3:  // overwrite with a token
        if (!input.empty()) {
          const std::string token = random_token();
          input.replace(position, std::min(token.size(), input.size() - position), token);
        }
        break;
      case 4:  // erase a range
        input.erase(position, below(std::min<size_t>(input.size() - position, 64) + 1));
        break;
      case 5:  // duplicate a range
        if (!input.empty()) {
          const size_t begin = below(input.size());
          const std::string copy = input.substr(begin, 1 + below(64));
          input.insert(position, copy);
        }
        break;
      case 6:  // truncate
        input.resize(position);
        break;
      case 7:  // splice with another input
        if (!corpus_.empty()) {
          const std::string& other = corpus_[below(corpus_.size())];
          input = input.substr(0, position) + other.substr(below(other.size() + 1));
        }
        break;
      default:  // change a run of digits to another number
        change_number(input, position);
        break;
    }
  }

  void change_number(std::string& input, size_t from) {
    const size_t begin = input.find_first_of("0123456789", from);
    if (begin == std::string::npos) return;
    const size_t end = input.find_first_not_of("0123456789", begin);
    const std::string tokens[] = {"0",
                                  "1",
                                  "2",
                                  "3",
                                  "255",
                                  "256",
                                  "65535",
                                  "4294967295",
                                  "4294967296",
                                  "9223372036854775807",
                                  "99999999999999999999"};
    const std::string& number = tokens[below(sizeof(tokens) / sizeof(tokens[0]))];
    input.replace(begin, (end == std::string::npos ? input.size() : end) - begin, number);
  }

  std::mt19937_64 random_;
  const std::vector<std::string>& corpus_;
  const std::vector<std::string>& dictionary_;
  size_t max_len_;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr,
               "replay: %s\nusage: replay CORPUS_DIR... [--dict=FILE] [--mutations=N] "
               "[--seed=N] [--max_seconds=S] [--max_len=BYTES]\n",
               message.c_str());
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      const size_t length = std::strlen(flag);
      return arg.compare(0, length, flag) == 0 ? arg.c_str() + length : nullptr;
    };
    if (const char* v = value("--dict=")) {
      options.dict_path = v;
    } else if (const char* v = value("--mutations=")) {
      options.mutations = std::strtol(v, nullptr, 10);
    } else if (const char* v = value("--seed=")) {
      options.seed = std::strtoull(v, nullptr, 10);
    } else if (const char* v = value("--max_seconds=")) {
      options.max_seconds = std::strtod(v, nullptr);
    } else if (const char* v = value("--max_len=")) {
      options.max_len = std::strtoull(v, nullptr, 10);
    } else if (arg.compare(0, 2, "--") == 0) {
      usage_error("unknown flag " + arg);
    } else {
      options.corpus_dirs.push_back(arg);
    }
  }
  if (options.corpus_dirs.empty()) usage_error("no corpus folder given");
  if (options.mutations < 0 || options.max_seconds <= 0 || options.max_len == 0)
    usage_error("--mutations, --max_seconds and --max_len must be positive");
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = parse_options(argc, argv);
  install_crash_handler();
  const std::vector<std::string> corpus = read_corpus(options.corpus_dirs);
  const std::vector<std::string> dictionary = read_dictionary(options.dict_path);
  if (corpus.empty()) tessel::fuzz::fail("replay: the corpus folders hold no file");

  for (const std::string& input : corpus) run_one(input);
  std::printf("replay: %zu corpus inputs ran\n", corpus.size());

  // The mutations stop at --max_seconds so that a slow (sanitized) build stays within its time.
  const auto start = std::chrono::steady_clock::now();
  Mutator mutator(options.seed, corpus, dictionary, options.max_len);
  long done = 0;
  for (; done < options.mutations; ++done) {
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (elapsed.count() > options.max_seconds) break;
    run_one(mutator.next());
  }
  std::printf("replay: %ld of %ld mutations ran (seed %llu)\n", done, options.mutations,
              static_cast<unsigned long long>(options.seed));
  return 0;
}
