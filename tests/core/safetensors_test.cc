#include "core/safetensors.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "tests/testing.h"

namespace tessel {
namespace {

using testing::all_close;
using testing::bitwise_equal;
using testing::load_golden;
using testing::throws_error;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "/" + name; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string length_prefix(uint64_t length) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return bytes;
}

// A file made by hand: the 8-byte length of `header`, `header`, then `data`.
std::string hand_made(const std::string& header, const std::string& data) {
  return length_prefix(header.size()) + header + data;
}

// A header with one F32 entry, for the corruption cases below.
std::string one_entry(const std::string& name, const std::string& dtype, const std::string& shape,
                      const std::string& offsets) {
  return "{\"" + name + "\": {\"dtype\": \"" + dtype + "\", \"shape\": " + shape +
         ", \"data_offsets\": " + offsets + "}}";
}

std::map<std::string, Tensor> parse(const std::string& bytes) {
  return parse_safetensors(bytes, "bad.safetensors");
}

TEST(Safetensors, RoundTripsEveryDTypeWithValuesAndShapes) {
  std::vector<std::pair<std::string, Tensor>> tensors = {
      {"f32", tensor({1.5f, -2.0f, 3.25f, 0.0f, 1e-30f, -7.0f}, {2, 3})},
      {"f64", from_vector<double>({1.0 / 3.0, -1e300, 2.5}, {3})},
      {"bf16", from_vector<float>({1.0f, -0.15625f, 256.0f, 3.0f}, {2, 2}, DType::kBFloat16)},
      {"f16", from_vector<float>({0.5f, -1.0f, 65504.0f}, {3, 1}, DType::kFloat16)},
      {"i32", from_vector<int32_t>({-5, 123456, 0, 7}, {4})},
      {"i64", from_vector<int64_t>({int64_t{1} << 40, -1}, {1, 2})},
      {"u8", from_vector<uint8_t>({0, 128, 255}, {3})},
      {"bool", from_vector<bool>({true, false, false, true, true}, {5})},
      {"scalar", from_vector<float>({4.5f}, {})},
      {"empty", from_vector<float>({}, {0, 4})},
  };
  const std::string path = temp_path("every_dtype.safetensors");
  save_safetensors(path, tensors);
  auto loaded = load_safetensors(path);
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    ASSERT_EQ(loaded.count(name), 1u) << name;
    const Tensor& actual = loaded.at(name);
    EXPECT_TRUE(bitwise_equal(actual, expected)) << name;
    EXPECT_EQ(actual.sizes(), expected.sizes()) << name;
    EXPECT_EQ(actual.dtype(), expected.dtype()) << name;
    EXPECT_TRUE(actual.is_contiguous()) << name;
    EXPECT_EQ(actual.device(), Device::cpu()) << name;
  }
  EXPECT_EQ(loaded.at("bool").to_vector<bool>(),
            (std::vector<bool>{true, false, false, true, true}));
  EXPECT_EQ(loaded.at("i64").to_vector<int64_t>(), (std::vector<int64_t>{int64_t{1} << 40, -1}));
  EXPECT_EQ(loaded.at("bf16").to_vector<float>(),
            (std::vector<float>{1.0f, -0.15625f, 256.0f, 3.0f}));
}

TEST(Safetensors, NonContiguousTensorsAreWrittenInRowMajorOrder) {
  Tensor base = tensor({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor transposed = make_view(base, {3, 2}, {1, 3}, 0);
  Tensor column_with_offset = make_view(base, {2}, {3}, 1);  // base[:, 1]
  Tensor expanded = make_view(base, {2, 3}, {0, 1}, 3);      // row 1 repeated
  Tensor doubles = from_vector<double>({1, 2, 3, 4, 5, 6, 7, 8}, {2, 2, 2});
  Tensor permuted = make_view(doubles, {2, 2, 2}, {1, 4, 2}, 0);
  Tensor bools = from_vector<bool>({true, false, true, true}, {2, 2});
  Tensor bools_t = make_view(bools, {2, 2}, {1, 2}, 0);

  const std::string path = temp_path("strided.safetensors");
  save_safetensors(path, {{"transposed", transposed},
                          {"column", column_with_offset},
                          {"expanded", expanded},
                          {"permuted", permuted},
                          {"bools_t", bools_t}});
  auto loaded = load_safetensors(path);
  EXPECT_EQ(loaded.at("transposed").to_vector<float>(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_EQ(loaded.at("transposed").sizes(), (Shape{3, 2}));
  EXPECT_EQ(loaded.at("column").to_vector<float>(), (std::vector<float>{2, 5}));
  EXPECT_EQ(loaded.at("expanded").to_vector<float>(), (std::vector<float>{4, 5, 6, 4, 5, 6}));
  EXPECT_EQ(loaded.at("permuted").to_vector<double>(), permuted.to_vector<double>());
  EXPECT_EQ(loaded.at("bools_t").to_vector<bool>(), (std::vector<bool>{true, true, false, true}));
  // Exactly the bytes needed: 6 + 2 + 6 floats, 8 doubles, 4 bools.
  auto bytes = read_file(path);
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i)
    header_length = (header_length << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(bytes.size() - 8 - header_length, 14 * 4 + 8 * 8 + 4u);
}

TEST(Safetensors, MetadataRoundTripsAndHeaderIsPaddedTo8Bytes) {
  const std::string path = temp_path("metadata.safetensors");
  save_safetensors(path, {{"w", tensor({1, 2, 3}, {3})}},
                   {{"step", "10"}, {"format", "pt"}, {"note", "quotes \" and \\ survive"}});
  SafetensorsMetadata metadata;
  auto loaded = load_safetensors(path, &metadata);
  EXPECT_EQ(metadata.size(), 3u);
  EXPECT_EQ(metadata.at("step"), "10");
  EXPECT_EQ(metadata.at("format"), "pt");
  EXPECT_EQ(metadata.at("note"), "quotes \" and \\ survive");

  const auto bytes = read_file(path);
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i)
    header_length = (header_length << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ((8 + header_length) % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  EXPECT_EQ(bytes.size(), 8 + header_length + 12);
}

TEST(Safetensors, TensorsWithoutMetadataLeaveMetadataEmpty) {
  const std::string path = temp_path("no_metadata.safetensors");
  save_safetensors(path, {{"w", tensor({1}, {1})}});
  SafetensorsMetadata metadata = {{"stale", "value"}};
  load_safetensors(path, &metadata);
  EXPECT_TRUE(metadata.empty());
}

TEST(Safetensors, AnEmptyListOfTensorsIsAValidFile) {
  const std::string path = temp_path("nothing.safetensors");
  save_safetensors(path, {});
  EXPECT_TRUE(load_safetensors(path).empty());
}

TEST(Safetensors, ReadsAFileWrittenByPyTorchWithKnownValues) {
  SafetensorsMetadata metadata;
  auto golden = load_safetensors("tests/golden/safetensors_from_python.safetensors", &metadata);
  EXPECT_EQ(metadata.at("format"), "pt");
  EXPECT_EQ(metadata.at("source"), "torch");
  ASSERT_EQ(golden.size(), 10u);

  EXPECT_EQ(golden.at("weight").sizes(), (Shape{2, 3}));
  EXPECT_EQ(golden.at("weight").to_vector<float>(),
            (std::vector<float>{-1.0f, 0.0f, 1.0f, -0.5f, 0.5f, 1.5f}));
  EXPECT_EQ(golden.at("double").to_vector<double>(), (std::vector<double>{1.0 / 3.0, -2.5, 1e100}));
  EXPECT_EQ(golden.at("half").dtype(), DType::kFloat16);
  EXPECT_EQ(golden.at("half").to_vector<float>(),
            (std::vector<float>{0.5f, -1.0f, 2.0f, 65504.0f}));
  EXPECT_EQ(golden.at("bfloat").dtype(), DType::kBFloat16);
  EXPECT_EQ(golden.at("bfloat").to_vector<float>(), (std::vector<float>{1.0f, -0.15625f, 256.0f}));
  EXPECT_EQ(golden.at("index").to_vector<int64_t>(),
            (std::vector<int64_t>{0, -1, int64_t{1} << 40, 7}));
  EXPECT_EQ(golden.at("int").to_vector<int32_t>(), (std::vector<int32_t>{-5, 123456}));
  EXPECT_EQ(golden.at("bytes").to_vector<uint8_t>(), (std::vector<uint8_t>{0, 128, 255}));
  EXPECT_EQ(golden.at("mask").sizes(), (Shape{2, 2}));
  EXPECT_EQ(golden.at("mask").to_vector<bool>(), (std::vector<bool>{true, false, false, true}));
  EXPECT_EQ(golden.at("scalar").sizes(), Shape{});
  EXPECT_EQ(golden.at("scalar").item<float>(), 3.25f);
  EXPECT_EQ(golden.at("empty").sizes(), (Shape{0, 4}));
}

TEST(Safetensors, ParseIsTheSameAsLoad) {
  const std::string path = temp_path("parse.safetensors");
  save_safetensors(path, {{"a", tensor({1, 2}, {2})}, {"b", from_vector<int64_t>({3}, {1})}});
  auto parsed = parse_safetensors(read_file(path), "in memory");
  EXPECT_TRUE(bitwise_equal(parsed.at("a"), tensor({1, 2}, {2})));
  EXPECT_TRUE(bitwise_equal(parsed.at("b"), from_vector<int64_t>({3}, {1})));
}

// Corrupt files: each gives an Error naming the source and the problem.

TEST(SafetensorsErrors, FileShorterThanTheLengthPrefix) {
  EXPECT_TRUE(throws_error([] { parse(std::string("abc")); }, "'bad.safetensors'"));
  EXPECT_TRUE(throws_error([] { parse(std::string("abc")); }, "shorter than the 8-byte header"));
  EXPECT_TRUE(throws_error([] { parse(std::string()); }, "file is 0 bytes"));
}

TEST(SafetensorsErrors, HeaderLengthPastTheEndOfTheFile) {
  EXPECT_TRUE(throws_error([] { parse(length_prefix(1000) + "{}"); },
                           "header length 1000 runs past the end of the file (10 bytes"));
}

TEST(SafetensorsErrors, HeaderLengthAboveTheLimit) {
  EXPECT_TRUE(throws_error([] { parse(length_prefix(uint64_t{1} << 40) + "{}"); },
                           "exceeds the limit of 100000000 bytes"));
  EXPECT_TRUE(throws_error([] { parse(length_prefix(~uint64_t{0}) + "{}"); }, "exceeds the limit"));
}

TEST(SafetensorsErrors, BadJson) {
  EXPECT_TRUE(throws_error([] { parse(hand_made("{\"a\": ", "")); }, "bad JSON header"));
  EXPECT_TRUE(throws_error([] { parse(hand_made("[1, 2]", "")); }, "not an object but array"));
}

TEST(SafetensorsErrors, EntryMissingAField) {
  EXPECT_TRUE(throws_error(
      [] { parse(hand_made(R"({"w": {"shape": [1], "data_offsets": [0, 4]}})", "abcd")); },
      "tensor 'w' is missing 'dtype'"));
  EXPECT_TRUE(throws_error(
      [] { parse(hand_made(R"({"w": {"dtype": "F32", "data_offsets": [0, 4]}})", "abcd")); },
      "tensor 'w' is missing 'shape'"));
  EXPECT_TRUE(
      throws_error([] { parse(hand_made(R"({"w": {"dtype": "F32", "shape": [1]}})", "abcd")); },
                   "tensor 'w' is missing 'data_offsets'"));
  EXPECT_TRUE(throws_error([] { parse(hand_made(R"({"w": 3})", "")); }, "is not a JSON object"));
}

TEST(SafetensorsErrors, MalformedFields) {
  EXPECT_TRUE(
      throws_error([] { parse(hand_made(one_entry("w", "F32", "[-1]", "[0, 4]"), "abcd")); },
                   "invalid shape [-1]"));
  EXPECT_TRUE(throws_error([] { parse(hand_made(one_entry("w", "F32", "7", "[0, 4]"), "abcd")); },
                           "shape that is not an array"));
  EXPECT_TRUE(throws_error([] { parse(hand_made(one_entry("w", "F32", "[1]", "[0]"), "abcd")); },
                           "invalid data_offsets [0]"));
  EXPECT_TRUE(throws_error([] { parse(hand_made(one_entry("w", "F32", "[1]", "[4, 0]"), "abcd")); },
                           "begin after end"));
  EXPECT_TRUE(throws_error(
      [] {
        parse(hand_made(R"({"w": {"dtype": 1, "shape": [1], "data_offsets": [0, 4]}})", "abcd"));
      },
      "non-string dtype"));
}

TEST(SafetensorsErrors, UnknownDType) {
  EXPECT_TRUE(
      throws_error([] { parse(hand_made(one_entry("w", "F8_E4M3", "[4]", "[0, 4]"), "abcd")); },
                   "tensor 'w' has unknown dtype 'F8_E4M3' (supported: F32, F64, BF16"));
}

TEST(SafetensorsErrors, ShapeTimesElementSizeDiffersFromTheOffsets) {
  EXPECT_TRUE(throws_error(
      [] { parse(hand_made(one_entry("w", "F32", "[2]", "[0, 4]"), "abcd")); },
      "tensor 'w' has shape [2] of F32 (8 bytes) but data_offsets [0, 4] span 4 bytes"));
  // The largest shape whose strides fit: 2^61 F32 elements are 2^63 bytes, not the 0 of the
  // offsets.
  EXPECT_TRUE(throws_error(
      [] { parse(hand_made(one_entry("w", "F32", "[2305843009213693952]", "[0, 0]"), "")); },
      "but data_offsets [0, 0] span 0 bytes"));
}

TEST(SafetensorsErrors, ShapesPastTheInt64RangeAreRejected) {
  // A size that overflows 64 bits must not wrap to a plausible value.
  EXPECT_TRUE(throws_error(
      [] {
        parse(
            hand_made(one_entry("w", "F32", "[4294967296, 4294967296, 4294967296]", "[0, 0]"), ""));
      },
      "non-zero dimensions multiply past 2^63 - 1"));
  // No bytes, but its strides would overflow int64.
  EXPECT_TRUE(throws_error(
      [] {
        parse(hand_made(
            one_entry("w", "F32", "[4611686018427387904, 4611686018427387904, 0]", "[0, 0]"), ""));
      },
      "non-zero dimensions multiply past 2^63 - 1"));
}

TEST(SafetensorsErrors, OffsetsOutOfRange) {
  EXPECT_TRUE(throws_error([] { parse(hand_made(one_entry("w", "F32", "[2]", "[0, 8]"), "abcd")); },
                           "data_offsets [0, 8] out of range: the data section holds 4 bytes"));
}

TEST(SafetensorsErrors, OverlappingOffsets) {
  const std::string header = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                             R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  EXPECT_TRUE(throws_error([&] { parse(hand_made(header, std::string(8, '\0'))); },
                           "tensor 'b' data_offsets [4, 8] overlap tensor 'a'"));
  const std::string same = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                           R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  EXPECT_TRUE(throws_error([&] { parse(hand_made(same, std::string(4, '\0'))); }, "overlap"));
}

TEST(SafetensorsErrors, HolesInTheData) {
  const std::string gap = R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                          R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})";
  EXPECT_TRUE(throws_error([&] { parse(hand_made(gap, std::string(12, '\0'))); },
                           "hole in the data: bytes [4, 8) belong to no tensor"));
  EXPECT_TRUE(throws_error(
      [] { parse(hand_made(one_entry("w", "F32", "[1]", "[4, 8]"), std::string(8, '\0'))); },
      "hole in the data: bytes [0, 4)"));
  EXPECT_TRUE(throws_error(
      [] { parse(hand_made(one_entry("w", "F32", "[1]", "[0, 4]"), std::string(6, '\0'))); },
      "hole in the data: bytes [4, 6) at the end of the file"));
}

TEST(SafetensorsErrors, DuplicateNames) {
  const std::string header = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                             R"( "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
  EXPECT_TRUE(throws_error([&] { parse(hand_made(header, std::string(8, '\0'))); },
                           "duplicate tensor name 'w'"));
}

TEST(SafetensorsErrors, BadMetadata) {
  EXPECT_TRUE(throws_error([] { parse(hand_made(R"({"__metadata__": {"step": 10}})", "")); },
                           "metadata 'step' is not a string"));
  EXPECT_TRUE(throws_error([] { parse(hand_made(R"({"__metadata__": [1]})", "")); },
                           "'__metadata__' is not an object"));
}

TEST(SafetensorsErrors, BoolBytesOtherThanZeroOrOne) {
  EXPECT_TRUE(throws_error(
      [] { parse(hand_made(one_entry("m", "BOOL", "[2]", "[0, 2]"), std::string("\x01\x02", 2))); },
      "BOOL tensor 'm' holds byte value 2"));
}

TEST(SafetensorsErrors, NothingIsReturnedOnError) {
  SafetensorsMetadata metadata = {{"kept", "yes"}};
  const std::string header =
      R"({"__metadata__": {"a": "b"}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
  EXPECT_TRUE(throws_error(
      [&] { parse_safetensors(hand_made(header, std::string(6, '\0')), "x", &metadata); }, "hole"));
  EXPECT_EQ(metadata, (SafetensorsMetadata{{"kept", "yes"}}));
}

TEST(SafetensorsErrors, LoadNamesTheFile) {
  const std::string path = temp_path("truncated.safetensors");
  save_safetensors(path, {{"w", tensor({1, 2, 3, 4}, {4})}});
  std::string bytes = read_file(path);
  write_file(path, bytes.substr(0, bytes.size() - 3));
  EXPECT_TRUE(throws_error([&] { load_safetensors(path); }, path));
  EXPECT_TRUE(throws_error([&] { load_safetensors(path); }, "out of range"));
  EXPECT_TRUE(throws_error([] { load_safetensors(temp_path("does_not_exist.safetensors")); },
                           "cannot open"));
}

TEST(SafetensorsErrors, SaveRejectsBadInput) {
  const std::string path = temp_path("rejected.safetensors");
  Tensor w = tensor({1}, {1});
  EXPECT_TRUE(throws_error(
      [&] {
        save_safetensors(path, {{"w", w}, {"w", w}});
      },
      "duplicate tensor name 'w'"));
  EXPECT_TRUE(throws_error([&] { save_safetensors(path, {{"__metadata__", w}}); }, "reserved"));
  EXPECT_TRUE(throws_error([&] { save_safetensors(path, {{"u", Tensor()}}); }, "undefined"));
  EXPECT_TRUE(throws_error(
      [&] {
        save_safetensors("/nonexistent/dir/x.safetensors", {{"w", w}});
      },
      "cannot open '/nonexistent/dir/x.safetensors' for writing"));
}

}  // namespace
}  // namespace tessel
