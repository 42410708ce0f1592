// safetensors validation: every malformed header is a clear error naming the thing, never a crash.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "format/safetensors.h"

using namespace dq;

namespace {

std::vector<uint8_t> image(const std::string& header, size_t data_bytes, uint64_t claimed_len = UINT64_MAX) {
  std::vector<uint8_t> b(8 + header.size() + data_bytes, 0);
  uint64_t n = claimed_len == UINT64_MAX ? header.size() : claimed_len;
  for (int i = 0; i < 8; ++i) b[i] = uint8_t(n >> (8 * i));
  std::memcpy(b.data() + 8, header.data(), header.size());
  for (size_t i = 0; i < data_bytes; ++i) b[8 + header.size() + i] = uint8_t(i);
  return b;
}

std::string parse_error(const std::vector<uint8_t>& b) {
  try {
    SafetensorsFile::parse(b.data(), b.size(), "t.safetensors");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR(bytes, ...)                                        \
  do {                                                                  \
    std::string msg = parse_error(bytes);                               \
    ASSERT_FALSE(msg.empty()) << "expected an error";                   \
    EXPECT_NE(msg.find("t.safetensors"), std::string::npos) << msg;     \
    for (const char* part : {__VA_ARGS__}) EXPECT_NE(msg.find(part), std::string::npos) << msg; \
  } while (0)

}  // namespace

TEST(Safetensors, ParsesValidFile) {
  auto b = image(R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"__metadata__":{"format":"mlx"}})", 22);
  auto f = SafetensorsFile::parse(b.data(), b.size(), "t.safetensors");
  ASSERT_EQ(f->tensors().size(), 2u);
  const TensorInfo* a = f->find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->dtype, DType::F32);
  EXPECT_EQ(a->shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(a->nbytes, 16u);
  EXPECT_EQ(a->data, b.data() + 8 + (b.size() - 8 - 22));
  EXPECT_EQ(f->find("b")->data[0], 16);  // byte 16 of the data buffer
  EXPECT_EQ(f->metadata().at("format"), "mlx");
  EXPECT_EQ(f->find("c"), nullptr);
}

TEST(Safetensors, ScalarAndEmptyTensors) {
  auto b = image(R"({"s":{"dtype":"F32","shape":[],"data_offsets":[0,4]},"e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]}})", 4);
  auto f = SafetensorsFile::parse(b.data(), b.size(), "t.safetensors");
  EXPECT_EQ(f->find("s")->numel(), 1);
  EXPECT_EQ(f->find("e")->numel(), 0);
}

TEST(Safetensors, TruncatedFiles) {
  std::vector<uint8_t> tiny = {1, 2, 3};
  EXPECT_ERROR(tiny, "truncated", "3 bytes");
  auto b = image(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 16);
  b.resize(b.size() - 5);  // cut into the data
  EXPECT_ERROR(b, "'a'", "data_offsets [0, 16]", "truncated");
}

TEST(Safetensors, HeaderLengthPastTheEnd) {
  auto b = image(R"({})", 0, 1000);
  EXPECT_ERROR(b, "header length 1000", "past the end");
  auto huge = image(R"({})", 0, uint64_t(1) << 62);
  EXPECT_ERROR(huge, "exceeds the limit");
}

TEST(Safetensors, MalformedJson) {
  EXPECT_ERROR(image(R"({"a":)", 0), "not valid JSON");
  EXPECT_ERROR(image(R"([1,2])", 0), "must be a JSON object");
  EXPECT_ERROR(image("{\"a\":\xff}", 0), "not valid JSON");
}

TEST(Safetensors, BadEntries) {
  EXPECT_ERROR(image(R"({"a":[1]})", 0), "'a'", "must be an object");
  EXPECT_ERROR(image(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "'a'", "dtype");
  EXPECT_ERROR(image(R"({"a":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}})", 4), "'a'", "unknown dtype 'Q9'");
  EXPECT_ERROR(image(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "'a'", "non-negative");
  EXPECT_ERROR(image(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4), "'a'", "non-negative");
  EXPECT_ERROR(image(R"({"a":{"dtype":"F32","shape":"x","data_offsets":[0,4]}})", 4), "'a'", "shape");
  EXPECT_ERROR(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4), "'a'", "data_offsets");
  EXPECT_ERROR(image(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4), "'a'", "begin after end");
  EXPECT_ERROR(image(R"({"__metadata__":{"k":1}})", 0), "__metadata__['k']", "string");
}

TEST(Safetensors, SizeMustMatchDtypeTimesShape) {
  EXPECT_ERROR(image(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "'a'", "needs 12 bytes", "hold 8");
  EXPECT_ERROR(image(R"({"a":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,16]}})", 16), "'a'", "needs 8 bytes");
}

TEST(Safetensors, OverflowingShapes) {
  EXPECT_ERROR(image(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", 4), "'a'",
               "too large");
  EXPECT_ERROR(image(R"({"a":{"dtype":"F64","shape":[1099511627776,1099511627776],"data_offsets":[0,8]}})", 8),
               "'a'");
}

TEST(Safetensors, OffsetsOutOfRangeOrOverlapping) {
  EXPECT_ERROR(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 8), "'a'", "run past");
  EXPECT_ERROR(image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
               "overlap", "'a'", "'b'");
}

TEST(Safetensors, WriteThenRead) {
  std::string path = std::string(::testing::TempDir()) + "/rt.safetensors";
  float v[3] = {1.5f, -2.0f, 3.25f};
  uint16_t h[2] = {0x3f80, 0x4000};
  write_safetensors(path, {{"v", DType::F32, {3}, v, sizeof v}, {"h", DType::BF16, {2, 1}, h, sizeof h}}, {{"k", "x"}});
  auto f = SafetensorsFile::open(path);
  ASSERT_NE(f->find("v"), nullptr);
  EXPECT_EQ(std::memcmp(f->find("v")->data, v, sizeof v), 0);
  EXPECT_EQ(f->find("h")->shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(f->metadata().at("k"), "x");
}

TEST(Safetensors, MissingFileNamesThePath) {
  try {
    SafetensorsFile::open("/nonexistent/dir/x.safetensors");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/x.safetensors"), std::string::npos);
  }
}
