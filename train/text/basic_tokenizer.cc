#include "train/text/basic_tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace tessel::text {
namespace {

struct CodePointRange {
  char32_t first;
  char32_t last;
};

// Non-ASCII code points of Unicode 14.0 general category P (Pc Pd Ps Pe Pi Pf Po), sorted.
constexpr CodePointRange kPunctuationRanges[] = {
    {0xA1, 0xA1},       {0xA7, 0xA7},       {0xAB, 0xAB},       {0xB6, 0xB7},
    {0xBB, 0xBB},       {0xBF, 0xBF},       {0x37E, 0x37E},     {0x387, 0x387},
    {0x55A, 0x55F},     {0x589, 0x58A},     {0x5BE, 0x5BE},     {0x5C0, 0x5C0},
    {0x5C3, 0x5C3},     {0x5C6, 0x5C6},     {0x5F3, 0x5F4},     {0x609, 0x60A},
    {0x60C, 0x60D},     {0x61B, 0x61B},     {0x61D, 0x61F},     {0x66A, 0x66D},
    {0x6D4, 0x6D4},     {0x700, 0x70D},     {0x7F7, 0x7F9},     {0x830, 0x83E},
    {0x85E, 0x85E},     {0x964, 0x965},     {0x970, 0x970},     {0x9FD, 0x9FD},
    {0xA76, 0xA76},     {0xAF0, 0xAF0},     {0xC77, 0xC77},     {0xC84, 0xC84},
    {0xDF4, 0xDF4},     {0xE4F, 0xE4F},     {0xE5A, 0xE5B},     {0xF04, 0xF12},
    {0xF14, 0xF14},     {0xF3A, 0xF3D},     {0xF85, 0xF85},     {0xFD0, 0xFD4},
    {0xFD9, 0xFDA},     {0x104A, 0x104F},   {0x10FB, 0x10FB},   {0x1360, 0x1368},
    {0x1400, 0x1400},   {0x166E, 0x166E},   {0x169B, 0x169C},   {0x16EB, 0x16ED},
    {0x1735, 0x1736},   {0x17D4, 0x17D6},   {0x17D8, 0x17DA},   {0x1800, 0x180A},
    {0x1944, 0x1945},   {0x1A1E, 0x1A1F},   {0x1AA0, 0x1AA6},   {0x1AA8, 0x1AAD},
    {0x1B5A, 0x1B60},   {0x1B7D, 0x1B7E},   {0x1BFC, 0x1BFF},   {0x1C3B, 0x1C3F},
    {0x1C7E, 0x1C7F},   {0x1CC0, 0x1CC7},   {0x1CD3, 0x1CD3},   {0x2010, 0x2027},
    {0x2030, 0x2043},   {0x2045, 0x2051},   {0x2053, 0x205E},   {0x207D, 0x207E},
    {0x208D, 0x208E},   {0x2308, 0x230B},   {0x2329, 0x232A},   {0x2768, 0x2775},
    {0x27C5, 0x27C6},   {0x27E6, 0x27EF},   {0x2983, 0x2998},   {0x29D8, 0x29DB},
    {0x29FC, 0x29FD},   {0x2CF9, 0x2CFC},   {0x2CFE, 0x2CFF},   {0x2D70, 0x2D70},
    {0x2E00, 0x2E2E},   {0x2E30, 0x2E4F},   {0x2E52, 0x2E5D},   {0x3001, 0x3003},
    {0x3008, 0x3011},   {0x3014, 0x301F},   {0x3030, 0x3030},   {0x303D, 0x303D},
    {0x30A0, 0x30A0},   {0x30FB, 0x30FB},   {0xA4FE, 0xA4FF},   {0xA60D, 0xA60F},
    {0xA673, 0xA673},   {0xA67E, 0xA67E},   {0xA6F2, 0xA6F7},   {0xA874, 0xA877},
    {0xA8CE, 0xA8CF},   {0xA8F8, 0xA8FA},   {0xA8FC, 0xA8FC},   {0xA92E, 0xA92F},
    {0xA95F, 0xA95F},   {0xA9C1, 0xA9CD},   {0xA9DE, 0xA9DF},   {0xAA5C, 0xAA5F},
    {0xAADE, 0xAADF},   {0xAAF0, 0xAAF1},   {0xABEB, 0xABEB},   {0xFD3E, 0xFD3F},
    {0xFE10, 0xFE19},   {0xFE30, 0xFE52},   {0xFE54, 0xFE61},   {0xFE63, 0xFE63},
    {0xFE68, 0xFE68},   {0xFE6A, 0xFE6B},   {0xFF01, 0xFF03},   {0xFF05, 0xFF0A},
    {0xFF0C, 0xFF0F},   {0xFF1A, 0xFF1B},   {0xFF1F, 0xFF20},   {0xFF3B, 0xFF3D},
    {0xFF3F, 0xFF3F},   {0xFF5B, 0xFF5B},   {0xFF5D, 0xFF5D},   {0xFF5F, 0xFF65},
    {0x10100, 0x10102}, {0x1039F, 0x1039F}, {0x103D0, 0x103D0}, {0x1056F, 0x1056F},
    {0x10857, 0x10857}, {0x1091F, 0x1091F}, {0x1093F, 0x1093F}, {0x10A50, 0x10A58},
    {0x10A7F, 0x10A7F}, {0x10AF0, 0x10AF6}, {0x10B39, 0x10B3F}, {0x10B99, 0x10B9C},
    {0x10EAD, 0x10EAD}, {0x10F55, 0x10F59}, {0x10F86, 0x10F89}, {0x11047, 0x1104D},
    {0x110BB, 0x110BC}, {0x110BE, 0x110C1}, {0x11140, 0x11143}, {0x11174, 0x11175},
    {0x111C5, 0x111C8}, {0x111CD, 0x111CD}, {0x111DB, 0x111DB}, {0x111DD, 0x111DF},
    {0x11238, 0x1123D}, {0x112A9, 0x112A9}, {0x1144B, 0x1144F}, {0x1145A, 0x1145B},
    {0x1145D, 0x1145D}, {0x114C6, 0x114C6}, {0x115C1, 0x115D7}, {0x11641, 0x11643},
    {0x11660, 0x1166C}, {0x116B9, 0x116B9}, {0x1173C, 0x1173E}, {0x1183B, 0x1183B},
    {0x11944, 0x11946}, {0x119E2, 0x119E2}, {0x11A3F, 0x11A46}, {0x11A9A, 0x11A9C},
    {0x11A9E, 0x11AA2}, {0x11C41, 0x11C45}, {0x11C70, 0x11C71}, {0x11EF7, 0x11EF8},
    {0x11FFF, 0x11FFF}, {0x12470, 0x12474}, {0x12FF1, 0x12FF2}, {0x16A6E, 0x16A6F},
    {0x16AF5, 0x16AF5}, {0x16B37, 0x16B3B}, {0x16B44, 0x16B44}, {0x16E97, 0x16E9A},
    {0x16FE2, 0x16FE2}, {0x1BC9F, 0x1BC9F}, {0x1DA87, 0x1DA8B}, {0x1E95E, 0x1E95F}};

// Unicode 14.0 categories Cf (format) and Co (private use), sorted.
constexpr CodePointRange kFormatRanges[] = {
    {0xAD, 0xAD},       {0x600, 0x605},     {0x61C, 0x61C},     {0x6DD, 0x6DD},
    {0x70F, 0x70F},     {0x890, 0x891},     {0x8E2, 0x8E2},     {0x180E, 0x180E},
    {0x200B, 0x200F},   {0x202A, 0x202E},   {0x2060, 0x2064},   {0x2066, 0x206F},
    {0xE000, 0xF8FF},   {0xFEFF, 0xFEFF},   {0xFFF9, 0xFFFB},   {0x110BD, 0x110BD},
    {0x110CD, 0x110CD}, {0x13430, 0x13438}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A},
    {0xE0001, 0xE0001}, {0xE0020, 0xE007F}, {0xF0000, 0xFFFFD}, {0x100000, 0x10FFFD}};

template <size_t N>
bool in_ranges(const CodePointRange (&ranges)[N], char32_t c) {
  auto after = std::upper_bound(
      std::begin(ranges), std::end(ranges), c,
      [](char32_t value, const CodePointRange& range) { return value < range.first; });
  return after != std::begin(ranges) && c <= std::prev(after)->last;
}

// Base ASCII letter of U+00C0..U+017F when its NFD form is that letter plus combining marks;
// '.' where there is no such decomposition (Æ, Ø, ß, Đ, Ł, Œ, ...).
constexpr char kLatinBaseLetters[] =
    "AAAAAA.CEEEEIIII"   // U+00C0
    ".NOOOOO..UUUUY.."   // U+00D0
    "aaaaaa.ceeeeiiii"   // U+00E0
    ".nooooo..uuuuy.y"   // U+00F0
    "AaAaAaCcCcCcCcDd"   // U+0100
    "..EeEeEeEeEeGgGg"   // U+0110
    "GgGgHh..IiIiIiIi"   // U+0120
    "I...JjKk.LlLlLl."   // U+0130
    "...NnNnNn...OoOo"   // U+0140
    "Oo..RrRrRrSsSsSs"   // U+0150
    "SsTtTt..UuUuUuUu"   // U+0160
    "UuUuWwYyYZzZzZz.";  // U+0170
static_assert(sizeof(kLatinBaseLetters) == 0x180 - 0xC0 + 1, "one entry per code point");

bool is_combining_mark(char32_t c) {
  return (c >= 0x300 && c <= 0x36F) || (c >= 0x1AB0 && c <= 0x1AFF) ||
         (c >= 0x1DC0 && c <= 0x1DFF) || (c >= 0x20D0 && c <= 0x20FF) ||
         (c >= 0xFE20 && c <= 0xFE2F);
}

}  // namespace

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encode_utf8(const std::u32string& code_points) {
  std::string out;
  out.reserve(code_points.size());
  for (char32_t c : code_points) append_utf8(out, c);
  return out;
}

std::u32string decode_utf8(const std::string& text) {
  std::u32string out;
  out.reserve(text.size());
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const size_t size = text.size();
  size_t i = 0;
  while (i < size) {
    const unsigned char lead = bytes[i];
    if (lead < 0x80) {
      out.push_back(lead);
      ++i;
      continue;
    }
    int length = 0;
    char32_t value = 0;
    char32_t smallest = 0;  // below this the sequence is overlong
    if ((lead & 0xE0) == 0xC0) {
      length = 2, value = lead & 0x1F, smallest = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3, value = lead & 0x0F, smallest = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4, value = lead & 0x07, smallest = 0x10000;
    } else {
      ++i;  // a stray continuation byte or an invalid lead byte
      continue;
    }
    int taken = 1;
    while (taken < length && i + taken < size && (bytes[i + taken] & 0xC0) == 0x80) {
      value = (value << 6) | (bytes[i + taken] & 0x3F);
      ++taken;
    }
    if (taken == length && value >= smallest && value <= 0x10FFFF &&
        !(value >= 0xD800 && value <= 0xDFFF)) {
      out.push_back(value);
    }
    // A truncated sequence drops only the bytes read so far; the next byte starts afresh.
    i += taken;
  }
  return out;
}

bool is_whitespace(char32_t c) {
  return c == ' ' || (c >= '\t' && c <= '\r') || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_control(char32_t c) {
  if (is_whitespace(c)) return false;
  if (c < 0x20 || (c >= 0x7F && c <= 0x9F)) return true;
  return in_ranges(kFormatRanges, c);
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
           (c >= 123 && c <= 126);
  }
  return in_ranges(kPunctuationRanges, c);
}

bool is_cjk(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

char32_t to_lower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 0x20;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x130) return 'i';  // İ: the dot is an accent in NFD
    if (c == 0x178) return 0xFF;
    if ((c <= 0x137 || (c >= 0x14A && c <= 0x177)) && c % 2 == 0) return c + 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) && c % 2 == 1) return c + 1;
    return c;
  }
  // Greek capitals (U+03A2 is unassigned) and the accented ones.
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 0x20;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 0x25;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 0x3F;
  // Cyrillic: Ѐ..Џ and А..Я.
  if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  if (c >= 0x410 && c <= 0x42F) return c + 0x20;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 0x20;  // full-width Ａ..Ｚ
  return c;
}

char32_t strip_accent(char32_t c) {
  if (c >= 0xC0 && c < 0x180) {
    const char base = kLatinBaseLetters[c - 0xC0];
    return base == '.' ? c : static_cast<char32_t>(base);
  }
  return is_combining_mark(c) ? 0 : c;
}

std::vector<std::u32string> BasicTokenizer::tokenize_code_points(const std::string& text) const {
  std::vector<std::u32string> tokens;
  std::u32string current;
  auto flush = [&] {
    if (!current.empty()) tokens.push_back(std::move(current));
    current.clear();
  };
  for (char32_t c : decode_utf8(text)) {
    // Cleaning: NUL, the replacement character and control characters go; whitespace splits.
    if (c == 0 || c == 0xFFFD || is_control(c)) continue;
    if (is_whitespace(c)) {
      flush();
      continue;
    }
    if (options_.split_cjk && is_cjk(c)) {
      flush();
      tokens.push_back(std::u32string(1, c));
      continue;
    }
    if (options_.lower_case) c = to_lower(c);
    if (options_.strip_accents) {
      c = strip_accent(c);
      if (c == 0) continue;
    }
    if (is_punctuation(c)) {
      flush();
      tokens.push_back(std::u32string(1, c));
      continue;
    }
    current.push_back(c);
  }
  flush();
  return tokens;
}

std::vector<std::string> BasicTokenizer::tokenize(const std::string& text) const {
  std::vector<std::string> tokens;
  for (const auto& token : tokenize_code_points(text)) tokens.push_back(encode_utf8(token));
  return tokens;
}

}  // namespace tessel::text
