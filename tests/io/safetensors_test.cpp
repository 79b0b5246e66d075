// safetensors: the writer's bytes as the format lays them out, round trips for every dtype,
// the atomic write, and each malformed file the reader must refuse (truncated, header length
// past the end, bad JSON, overlapping, gapped or out-of-range offsets, unknown dtype, a size
// that does not fit the shape), each with a message naming the file and the problem.

#include "meshtrain/io/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "support/temp_dir.h"

namespace meshtrain {
namespace {

using meshtrain::testing::TempDir;

std::vector<char> floats(std::initializer_list<float> v) {
  std::vector<char> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A file of header `json` (8-byte length first, unpadded) followed by `data_bytes` zero bytes.
void write_raw(const std::string& path, const std::string& json, size_t data_bytes,
               int64_t length_delta = 0) {
  std::ofstream out(path, std::ios::binary);
  const uint64_t n = json.size() + static_cast<uint64_t>(length_delta);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << json << std::string(data_bytes, '\0');
}

std::string open_error(const std::string& path) {
  try {
    SafetensorsFile::open(path);
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, HeaderIsLengthThenPaddedJsonThenData) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("b", SafeDType::F32, {2, 2}, floats({1, 2, 3, 4}));
  w.add("a", SafeDType::F32, {1}, floats({5}));
  w.set_metadata({{"format", "pt"}});
  const std::string path = dir.file("m.safetensors");
  w.write(path);
  const std::string bytes = slurp(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 20);
  const std::string json = bytes.substr(8, n);
  EXPECT_NE(json.find("\"b\":{\"data_offsets\":[0,16],\"dtype\":\"F32\",\"shape\":[2,2]}"), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"a\":{\"data_offsets\":[16,20]"), std::string::npos) << json;
  EXPECT_NE(json.find("\"__metadata__\":{\"format\":\"pt\"}"), std::string::npos) << json;
  float first = 0;
  std::memcpy(&first, bytes.data() + 8 + n, 4);
  EXPECT_EQ(first, 1.0f);
  // Nothing of the temporary name is left.
  EXPECT_EQ(
      std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()),
      1);
}

TEST(Safetensors, RoundTripsEveryDtype) {
  TempDir dir;
  SafetensorsWriter w;
  w.add("f32", SafeDType::F32, {3}, floats({1.5f, -2.0f, 1e-3f}));
  const uint16_t f16[] = {0x3c00, 0xc000, 0x0001, 0x7c00};  // 1, -2, smallest subnormal, inf
  w.add("f16", SafeDType::F16, {2, 2},
        std::vector<char>(reinterpret_cast<const char*>(f16), reinterpret_cast<const char*>(f16) + 8));
  const float src[] = {1.0f, 3.14159f, -0.0f};
  const std::vector<uint16_t> bf = f32_to_bf16(src, 3);
  w.add("bf16", SafeDType::BF16, {3},
        std::vector<char>(reinterpret_cast<const char*>(bf.data()),
                          reinterpret_cast<const char*>(bf.data()) + 6));
  w.add("empty", SafeDType::F32, {0, 4}, {});
  w.set_metadata({{"step", "7"}});
  const std::string path = dir.file("m.safetensors");
  w.write(path);

  const SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 4u);
  EXPECT_EQ(f.metadata().at("step"), "7");
  const SafetensorsEntry* e = f.find("f32");
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(f.read_f32(*e), (std::vector<float>{1.5f, -2.0f, 1e-3f}));
  const std::vector<float> h = f.read_f32(*f.find("f16"));
  EXPECT_EQ(h[0], 1.0f);
  EXPECT_EQ(h[1], -2.0f);
  EXPECT_EQ(h[2], std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(h[3]));
  EXPECT_EQ(f.find("f16")->shape_string(), "(2, 2)");
  const std::vector<float> b = f.read_f32(*f.find("bf16"));
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_NEAR(b[1], 3.14159f, 0.01f);
  EXPECT_TRUE(std::signbit(b[2]));
  EXPECT_EQ(f.find("empty")->numel(), 0);
  EXPECT_EQ(f.find("missing"), nullptr);
}

TEST(Safetensors, WriteReplacesAtomically) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  SafetensorsWriter one;
  one.add("x", SafeDType::F32, {1}, floats({1}));
  one.write(path);
  SafetensorsWriter two;
  two.add("y", SafeDType::F32, {2}, floats({2, 3}));
  two.write(path);
  const SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 1u);
  EXPECT_EQ(f.tensors()[0].name, "y");
  // A directory that cannot be written: the error names it, the old file is left as it was.
  SafetensorsWriter bad;
  bad.add("z", SafeDType::F32, {1}, floats({4}));
  EXPECT_THROW(bad.write(dir.file("no/such/dir/m.safetensors")), SafetensorsError);
}

TEST(Safetensors, WriterRefusesInconsistentTensors) {
  SafetensorsWriter w;
  EXPECT_THROW(w.add("x", SafeDType::F32, {3}, floats({1, 2})), std::invalid_argument);
  EXPECT_THROW(w.add("__metadata__", SafeDType::F32, {1}, floats({1})), std::invalid_argument);
  w.add("x", SafeDType::F32, {1}, floats({1}));
  EXPECT_THROW(w.add("x", SafeDType::F32, {1}, floats({1})), std::invalid_argument);
}

TEST(Safetensors, RefusesTruncatedFiles) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  EXPECT_NE(open_error(path).find("shorter than the 8-byte header length"), std::string::npos)
      << open_error(path);
  EXPECT_EQ(open_error(path).rfind(path, 0), 0u);  // starts with the file's path
  // A valid file cut short inside its data.
  SafetensorsWriter w;
  w.add("x", SafeDType::F32, {4}, floats({1, 2, 3, 4}));
  w.write(path);
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 4);
  EXPECT_NE(open_error(path).find("past the end of the data"), std::string::npos) << open_error(path);
  EXPECT_EQ(open_error(dir.file("absent.safetensors")).find("cannot open"),
            dir.file("absent.safetensors").size() + 2);
}

TEST(Safetensors, RefusesHeaderLengthBeyondTheFile) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  write_raw(path, "{}", 0, 1000);
  EXPECT_NE(open_error(path).find("header length 1002 runs past the end of the file (10 bytes"),
            std::string::npos)
      << open_error(path);
}

TEST(Safetensors, RefusesBadJson) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  write_raw(path, "{\"x\": {\"dtype\": ", 0);
  EXPECT_NE(open_error(path).find("the header is not valid JSON"), std::string::npos) << open_error(path);
  write_raw(path, "[1, 2]", 0);
  EXPECT_NE(open_error(path).find("not an object of tensors"), std::string::npos) << open_error(path);
  // A number past a double's range is nlohmann's out_of_range, not a parse_error (found by
  // safetensors_fuzz: it ended the program).
  write_raw(path, R"({"x": 7e7777777})", 0);
  EXPECT_NE(open_error(path).find("the header is not valid JSON"), std::string::npos) << open_error(path);
  write_raw(path, R"({"x": {"dtype": "F32", "shape": [1]}})", 4);
  EXPECT_NE(open_error(path).find("tensor 'x' has no 'data_offsets'"), std::string::npos) << open_error(path);
  write_raw(path, R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", 4);
  EXPECT_NE(open_error(path).find("expected an array of integers >= 0"), std::string::npos)
      << open_error(path);
  write_raw(path, R"({"__metadata__": {"k": 1}})", 0);
  EXPECT_NE(open_error(path).find("__metadata__ key 'k' is 1 (expected a string)"), std::string::npos)
      << open_error(path);
}

TEST(Safetensors, RefusesOverlappingGappedAndOutOfRangeOffsets) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  write_raw(path, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                      "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
            12);
  EXPECT_NE(open_error(path).find("tensor 'b' has data_offsets [4, 12), overlapping the tensor before it"),
            std::string::npos)
      << open_error(path);
  write_raw(path, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                      "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
            12);
  EXPECT_NE(open_error(path).find("leaving a gap after byte 4"), std::string::npos) << open_error(path);
  write_raw(path, R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  EXPECT_NE(open_error(path).find("past the end of the data (8 bytes"), std::string::npos)
      << open_error(path);
  write_raw(path, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8);
  EXPECT_NE(open_error(path).find("the tensors cover 4 bytes of data but the file has 8"), std::string::npos)
      << open_error(path);
  write_raw(path, R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8);
  EXPECT_NE(open_error(path).find("spans 8 bytes (data_offsets [0,8]) but shape (3,) of F32 needs 12"),
            std::string::npos)
      << open_error(path);
  write_raw(path, R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}})", 4);
  EXPECT_NE(open_error(path).find("expected [begin, end], 0 <= begin <= end"), std::string::npos)
      << open_error(path);
  // A shape whose byte count overflows 64 bits must not wrap around to a small size.
  write_raw(path, R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
  EXPECT_NE(open_error(path).find("needs more than 2^64"), std::string::npos) << open_error(path);
}

TEST(Safetensors, RefusesUnknownDtypes) {
  TempDir dir;
  const std::string path = dir.file("t.safetensors");
  write_raw(path, R"({"a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8);
  EXPECT_NE(open_error(path).find("tensor 'a' has dtype \"F64\", which this reader does not accept "
                                  "(accepted: F32, F16, BF16 or F8_E4M3)"),
            std::string::npos)
      << open_error(path);
  // fp8 of the other format (e5m2): refused by the tensor's name, as every unknown dtype.
  write_raw(path, R"({"w": {"dtype": "F8_E5M2", "shape": [2], "data_offsets": [0, 2]}})", 2);
  EXPECT_NE(open_error(path).find(path + ": tensor 'w' has dtype \"F8_E5M2\", which this reader does not accept"),
            std::string::npos)
      << open_error(path);
}

TEST(Safetensors, ReadsFp8E4m3CodesButNotAsFloats) {
  TempDir dir;
  const std::string path = dir.file("f8.safetensors");
  SafetensorsWriter w;
  w.add("w", SafeDType::F8_E4M3, {2, 3}, {0x38, 0x7E, 0x01, char(0xB8), 0x00, 0x40});
  w.write(path);
  const SafetensorsFile f = SafetensorsFile::open(path);
  const SafetensorsEntry& e = *f.find("w");
  EXPECT_EQ(e.dtype, SafeDType::F8_E4M3);
  EXPECT_EQ(e.end - e.begin, 6u);  // one byte an element
  EXPECT_EQ(f.read_raw(e), std::vector<char>({0x38, 0x7E, 0x01, char(0xB8), 0x00, 0x40}));
  // Its codes are numbers only with their block scales (families/hf/hf_fp8.h).
  try {
    f.read_f32(e);
    FAIL() << "F8_E4M3 read as floats";
  } catch (const SafetensorsError& err) {
    EXPECT_NE(std::string(err.what()).find(path + ": tensor 'w' is F8_E4M3, whose codes are values only with the "
                                                  "block scales"),
              std::string::npos)
        << err.what();
  }
  write_raw(path, R"({"a": {"dtype": 3, "shape": [1], "data_offsets": [0, 4]}})", 4);
  EXPECT_NE(open_error(path).find("has dtype 3"), std::string::npos) << open_error(path);
}

}  // namespace
}  // namespace meshtrain
