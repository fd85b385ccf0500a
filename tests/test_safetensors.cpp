// safetensors: round trips (f32, f64, i64, metadata), the byte layout PyTorch reads, Module
// save/load with every mismatch reported at once, and corrupt or truncated files (errors, never
// crashes).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "remat/nn.h"

using namespace remat;
namespace fs = std::filesystem;

namespace {

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("remat_safetensors_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file from a header text and a data section.
std::string make_file(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

std::string f32_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.to_vector() == b.to_vector();
}

nn::GPTConfig tiny_config(uint64_t seed) {
  return nn::GPTConfig{.vocab = 7, .layers = 2, .width = 4, .heads = 2, .seq = 3, .dtype = DType::f32, .seed = seed};
}

// Expects load_safetensors to throw remat::Error mentioning `fragment`.
void expect_load_error(const std::string& path, const std::string& fragment) {
  try {
    nn::load_safetensors(path);
    ADD_FAILURE() << "no error for " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

}  // namespace

TEST_F(Safetensors, RoundTripDtypesShapesMetadata) {
  Tensor f32 = randn({3, 4}, DType::f32, RngState{1, 0});
  Tensor f64 = randn({2, 1, 3}, DType::f64, RngState{2, 0});
  Tensor i64 = from_indices({-5, 0, 7, 1ll << 40}, {4});
  Tensor scalar = scalar_tensor(2.5, DType::f64);
  Tensor empty = zeros({0, 3});
  Tensor transposed = randn({3, 5}, DType::f32, RngState{3, 0}).transpose(0, 1);  // not contiguous
  nn::Metadata meta{{"format", "pt"}, {"step", "100"}, {"note", "ünïcødé \"quoted\""}};
  const std::string file = path("round.safetensors");
  nn::save_safetensors(file,
                       {{"a.f32", f32}, {"b.f64", f64}, {"c.i64", i64}, {"scalar", scalar}, {"empty", empty},
                        {"t", transposed}},
                       meta);
  nn::SafetensorsFile loaded = nn::load_safetensors(file);
  EXPECT_EQ(loaded.metadata, meta);
  ASSERT_EQ(loaded.tensors.size(), 6u);
  EXPECT_TRUE(same_values(loaded.tensors.at("a.f32"), f32));
  EXPECT_TRUE(same_values(loaded.tensors.at("b.f64"), f64));
  EXPECT_TRUE(same_values(loaded.tensors.at("c.i64"), i64));
  EXPECT_TRUE(same_values(loaded.tensors.at("scalar"), scalar));
  EXPECT_TRUE(same_values(loaded.tensors.at("empty"), empty));
  EXPECT_TRUE(same_values(loaded.tensors.at("t"), transposed));
  EXPECT_EQ(loaded.tensors.at("a.f32").storage()->tag(), memory::Tag::other);
  // no metadata: the file has no "__metadata__" entry, and loads with empty metadata
  nn::save_safetensors(path("plain.safetensors"), {{"x", f32}});
  EXPECT_TRUE(nn::load_safetensors(path("plain.safetensors")).metadata.empty());
  EXPECT_EQ(read_bytes(path("plain.safetensors")).find("__metadata__"), std::string::npos);
}

TEST_F(Safetensors, ByteLayoutIsTheSafetensorsFormat) {
  Tensor a = from_vector(std::vector<float>{1.0f, -2.0f, 3.5f}, {3});
  Tensor b = from_indices({9, 10}, {1, 2});
  nn::save_safetensors(path("layout.safetensors"), {{"a", a}, {"b", b}}, {{"k", "v"}});
  std::string bytes = read_bytes(path("layout.safetensors"));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);  // padded with spaces
  ASSERT_EQ(bytes.size(), 8 + n + 12 + 16);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["__metadata__"]["k"], "v");
  EXPECT_EQ(header["a"]["dtype"], "F32");
  EXPECT_EQ(header["a"]["shape"], nlohmann::json::array({3}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::array({0, 12}));
  EXPECT_EQ(header["b"]["dtype"], "I64");
  EXPECT_EQ(header["b"]["shape"], nlohmann::json::array({1, 2}));
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json::array({12, 28}));
  float af[3];
  std::memcpy(af, bytes.data() + 8 + n, 12);
  EXPECT_EQ(af[1], -2.0f);
  int64_t bi[2];
  std::memcpy(bi, bytes.data() + 8 + n + 12, 16);
  EXPECT_EQ(bi[1], 10);
}

TEST_F(Safetensors, ReadsAHandWrittenFile) {
  // as Python's safetensors writes it: keys in any order, unpadded header, F64 after F32
  const std::string header =
      R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"__metadata__":{"format":"pt"},)"
      R"("s":{"dtype":"F64","shape":[],"data_offsets":[16,24]}})";
  double s = 0.25;
  std::string data = f32_bytes({1, 2, 3, 4}) + std::string(reinterpret_cast<const char*>(&s), 8);
  write_bytes(path("hand.safetensors"), make_file(header, data));
  nn::SafetensorsFile f = nn::load_safetensors(path("hand.safetensors"));
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.tensors.at("w").to_vector(), (std::vector<double>{1, 2, 3, 4}));
  EXPECT_EQ(f.tensors.at("w").shape(), (Shape{2, 2}));
  EXPECT_EQ(f.tensors.at("s").shape(), Shape{});
  EXPECT_EQ(f.tensors.at("s").item(), 0.25);
}

TEST_F(Safetensors, ModuleSaveLoadRoundTrip) {
  nn::GPT a(tiny_config(1));
  nn::GPT b(tiny_config(2));
  ASSERT_FALSE(same_values(a.parameter("wte.weight"), b.parameter("wte.weight")));
  a.save(path("gpt.safetensors"), {{"layers", "2"}});
  auto versions_before = b.parameter("lm_head.weight").storage()->version();
  nn::Metadata meta = b.load(path("gpt.safetensors"));
  EXPECT_EQ(meta.at("layers"), "2");
  for (const auto& [name, p] : a.named_parameters()) EXPECT_TRUE(same_values(p, b.parameter(name))) << name;
  // loaded in place: same tensors, still parameters requiring grad, versions bumped
  Tensor w = b.parameter("lm_head.weight");
  EXPECT_GT(w.storage()->version(), versions_before);
  EXPECT_EQ(w.storage()->tag(), memory::Tag::parameter);
  EXPECT_TRUE(w.requires_grad());
}

TEST_F(Safetensors, ModuleLoadReportsEveryProblemAndChangesNothing) {
  nn::GPT model(tiny_config(1));
  nn::NamedTensors tensors = model.named_parameters();
  nn::NamedTensors edited;
  for (auto& [name, t] : tensors) {
    if (name == "wpe.weight") continue;                                           // missing
    if (name == "ln_f.bias") {
      edited.emplace_back(name, zeros({5}));                                     // wrong shape
    } else if (name == "blocks.0.ln1.weight") {
      edited.emplace_back(name, zeros(t.shape(), DType::f64));                   // wrong dtype
    } else {
      edited.emplace_back(name, zeros(t.shape()));                               // would overwrite
    }
  }
  edited.emplace_back("blocks.7.extra", zeros({2}));                             // unexpected
  nn::save_safetensors(path("bad.safetensors"), edited);

  std::vector<std::vector<double>> before;
  for (const auto& p : model.parameters()) before.push_back(p.to_vector());
  try {
    model.load(path("bad.safetensors"));
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("4 problems"), std::string::npos) << m;
    EXPECT_NE(m.find("missing \"wpe.weight\""), std::string::npos) << m;
    EXPECT_NE(m.find("\"ln_f.bias\" is f32 [5]"), std::string::npos) << m;
    EXPECT_NE(m.find("\"blocks.0.ln1.weight\" is f64 [4]"), std::string::npos) << m;
    EXPECT_NE(m.find("unexpected \"blocks.7.extra\""), std::string::npos) << m;
    EXPECT_NE(m.find("bad.safetensors"), std::string::npos) << m;
  }
  auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].to_vector(), before[i]) << i;
}

TEST_F(Safetensors, EveryTruncationIsAnError) {
  nn::GPT model(tiny_config(1));
  model.save(path("full.safetensors"), {{"a", "b"}});
  const std::string bytes = read_bytes(path("full.safetensors"));
  std::vector<std::vector<double>> before;
  for (const auto& p : model.parameters()) before.push_back(p.to_vector());
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  // every length up to 24, then every 13th through the header, then every 97th through the data
  for (size_t length = 0; length < bytes.size(); length += (length < 24 ? 1 : length < 8 + n ? 13 : 97)) {
    write_bytes(path("cut.safetensors"), bytes.substr(0, length));
    EXPECT_THROW(nn::load_safetensors(path("cut.safetensors")), Error) << "length " << length;
    EXPECT_THROW(model.load(path("cut.safetensors")), Error) << "length " << length;
  }
  // an extra trailing byte is an error too
  write_bytes(path("long.safetensors"), bytes + "x");
  expect_load_error(path("long.safetensors"), "trailing");
  auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].to_vector(), before[i]);
}

TEST_F(Safetensors, CorruptHeadersAreErrors) {
  const std::string p = path("corrupt.safetensors");
  const std::string data8 = f32_bytes({1, 2});
  auto entry = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
  };
  struct Case {
    std::string bytes;
    std::string fragment;
  };
  std::vector<Case> cases = {
      {"", "fewer than the 8-byte"},
      {"abc", "fewer than the 8-byte"},
      {le64(1ull << 62) + "{}", "exceeds"},
      {le64(100) + "{}", "exceeds"},
      {make_file("", ""), "not valid JSON"},
      {make_file("not json", data8), "not valid JSON"},
      {make_file("{\"x\":", data8), "not valid JSON"},
      {make_file("[1, 2]", ""), "not a JSON object"},
      {make_file(R"({"x": 5})", data8), "not an object"},
      {make_file(R"({"x": {"shape": [2], "data_offsets": [0, 8]}})", data8), "no \"dtype\""},
      {make_file(R"({"x": {"dtype": "F32", "data_offsets": [0, 8]}})", data8), "no \"shape\""},
      {make_file(R"({"x": {"dtype": "F32", "shape": [2]}})", data8), "no \"data_offsets\""},
      {make_file("{\"x\":" + entry("F8_E4M3", "[8]", "[0,8]") + "}", data8), "F8_E4M3"},
      {make_file("{\"x\":" + entry("BF16", "[3]", "[0,8]") + "}", data8), "BF16 [3] needs 6"},
      {make_file("{\"x\":" + entry("F32", "[-2]", "[0,8]") + "}", data8), "shape"},
      {make_file("{\"x\":" + entry("F32", "[2.5]", "[0,8]") + "}", data8), "shape"},
      {make_file("{\"x\":" + entry("F32", "\"2\"", "[0,8]") + "}", data8), "shape"},
      {make_file("{\"x\":" + entry("F32", "[1,1,1,1,1,1,2]", "[0,8]") + "}", data8), "rank 7"},
      {make_file("{\"x\":" + entry("F32", "[4294967296,4294967296,4294967296]", "[0,8]") + "}", data8), "too large"},
      {make_file("{\"x\":" + entry("F32", "[2]", "[8,0]") + "}", data8), "out of range"},
      {make_file("{\"x\":" + entry("F32", "[2]", "[0,16]") + "}", data8), "out of range"},
      {make_file("{\"x\":" + entry("F32", "[2]", "[0]") + "}", data8), "data_offsets"},
      {make_file("{\"x\":" + entry("F32", "[2]", "[0,-8]") + "}", data8), "data_offsets"},
      {make_file("{\"x\":" + entry("F32", "[3]", "[0,8]") + "}", data8), "needs 12"},
      {make_file("{\"x\":" + entry("F32", "[1]", "[0,4]") + "}", data8), "trailing"},
      {make_file("{\"x\":" + entry("F32", "[1]", "[4,8]") + "}", data8), "belong to no tensor"},
      {make_file("{\"x\":" + entry("F32", "[2]", "[0,8]") + ",\"y\":" + entry("F32", "[1]", "[4,8]") + "}", data8),
       "overlaps"},
      {make_file(R"({"__metadata__": {"a": 1}})", ""), "not a string"},
      {make_file(R"({"__metadata__": [1]})", ""), "not an object"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.fragment);
    write_bytes(p, c.bytes);
    expect_load_error(p, c.fragment);
  }
  expect_load_error(path("does-not-exist.safetensors"), "cannot read");
}

TEST_F(Safetensors, RandomHeaderCorruptionNeverCrashes) {
  nn::GPT model(tiny_config(1));
  model.save(path("full.safetensors"));
  const std::string bytes = read_bytes(path("full.safetensors"));
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  const std::string replacements = "0123456789{}[]\":,- x\x01\xff";
  uint64_t rng = 12345;
  int loaded = 0, rejected = 0;
  for (int trial = 0; trial < 150; ++trial) {
    std::string corrupt = bytes;
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    const size_t at = (rng >> 33) % (8 + n);
    corrupt[at] = replacements[(rng >> 20) % replacements.size()];
    write_bytes(path("fuzz.safetensors"), corrupt);
    try {
      nn::load_safetensors(path("fuzz.safetensors"));
      ++loaded;  // a harmless change (e.g. a digit of a float in padding)
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(loaded + rejected, 150);
}

TEST_F(Safetensors, AtomicWriteAndSaveErrors) {
  Tensor a = randn({2, 2});
  const std::string file = path("w.safetensors");
  nn::save_safetensors(file, {{"a", a}});
  nn::save_safetensors(file, {{"b", a}});  // overwrites
  EXPECT_EQ(nn::load_safetensors(file).tensors.count("b"), 1u);
  EXPECT_THROW(nn::save_safetensors(path("missing-dir/w.safetensors"), {{"a", a}}), Error);
  EXPECT_FALSE(fs::exists(path("missing-dir")));
  EXPECT_THROW(nn::save_safetensors(path("x.safetensors"), {{"a", a}, {"a", a}}), Error);
  EXPECT_THROW(nn::save_safetensors(path("x.safetensors"), {{"__metadata__", a}}), Error);
  EXPECT_THROW(nn::save_safetensors(path("x.safetensors"), {{"", a}}), Error);
  EXPECT_THROW(nn::save_safetensors(path("x.safetensors"), {{"u", Tensor()}}), Error);
  // only the one target file is left: no temporary files
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(dir_)) files.push_back(e.path().filename().string());
  EXPECT_EQ(files, std::vector<std::string>{"w.safetensors"});
}

// ---- hostile headers (issue 11): nesting, repeated keys, strict integers, stride overflow

TEST_F(Safetensors, DeeplyNestedHeaderIsAnErrorNotAStackOverflow) {
  // 100,000 nested arrays in "shape" (then in "data_offsets") overflowed the stack when the
  // message printed them; the parser now refuses the 4th level as soon as it reads it.
  nn::GPT model(tiny_config(1));
  std::vector<std::vector<double>> before;
  for (const auto& p : model.parameters()) before.push_back(p.to_vector());
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string entries[] = {
      R"({"x":{"dtype":"F32","shape":)" + deep + R"(,"data_offsets":[0,8]}})",
      R"({"x":{"dtype":"F32","shape":[2],"data_offsets":)" + deep + "}}",
      R"({"__metadata__":{"a":)" + deep + "}}",
      deep,
  };
  for (const std::string& header : entries) {
    const std::string bytes = make_file(header, f32_bytes({1, 2}));
    write_bytes(path("deep.safetensors"), bytes);
    expect_load_error(path("deep.safetensors"), "more than 3 levels deep");
    try {
      nn::parse_safetensors(bytes, "deep-in-memory");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("parse_safetensors(\"deep-in-memory\")"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("levels deep"), std::string::npos) << e.what();
    }
    EXPECT_THROW(model.load(path("deep.safetensors")), Error);
  }
  auto params = model.parameters();
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].to_vector(), before[i]) << i;
}

TEST_F(Safetensors, RepeatedKeysAreErrors) {
  // JSON parsers usually keep the last of two equal keys; a weight file must not say two things.
  const std::string x = R"("x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})";
  const std::string data8 = f32_bytes({1, 2});
  const std::pair<std::string, std::string> cases[] = {
      {"{" + x + "," + R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "\"x\" twice"},
      {R"({"x":{"dtype":"F32","dtype":"F64","shape":[2],"data_offsets":[0,8]}})", "\"dtype\" twice"},
      {R"({"x":{"dtype":"F32","shape":[2],"shape":[1],"data_offsets":[0,8]}})", "\"shape\" twice"},
      {R"({"__metadata__":{"k":"a","k":"b"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "\"k\" twice"},
      {R"({"__metadata__":{},"__metadata__":{},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
       "\"__metadata__\" twice"},
  };
  for (const auto& [header, fragment] : cases) {
    SCOPED_TRACE(header);
    write_bytes(path("dup.safetensors"), make_file(header, data8));
    expect_load_error(path("dup.safetensors"), fragment);
  }
}

TEST_F(Safetensors, SizesAndOffsetsAreStrictIntegers) {
  const std::string data8 = f32_bytes({1, 2});
  auto file = [&](const std::string& shape, const std::string& offsets) {
    return make_file(R"({"weight":{"dtype":"F32","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}}", data8);
  };
  const std::pair<std::string, std::string> cases[] = {
      {file("[2.0]", "[0,8]"), "not an integer"},
      {file("[2e0]", "[0,8]"), "not an integer"},
      {file("[-0]", "[0,8]"), "not an integer"},
      {file("[true]", "[0,8]"), "not an integer"},
      {file("[null]", "[0,8]"), "not an integer"},
      {file("[18446744073709551616]", "[0,8]"), "not an integer"},  // above 2^64: a double to the parser
      {file("[9223372036854775808]", "[0,8]"), "not an integer"},   // 2^63: fits uint64, not int64
      {file("[2]", "[0.0,8]"), "data_offsets"},
      {file("[2]", "[0,8e0]"), "data_offsets"},
      {file("[2]", "[0,8,9]"), "data_offsets"},
      {file("[2]", "[\"0\",\"8\"]"), "data_offsets"},
      {file("[2]", "{\"begin\":0}"), "data_offsets"},
      // a zero size does not hide an overflow of the other sizes (their product is a stride)
      {file("[0,4611686018427387904,4611686018427387904]", "[0,0]"), "too large"},
      {file("[4611686018427387904,4,0]", "[0,0]"), "too large"},
  };
  for (const auto& [bytes, fragment] : cases) {
    write_bytes(path("ints.safetensors"), bytes);
    try {
      nn::load_safetensors(path("ints.safetensors"));
      ADD_FAILURE() << "no error for " << bytes.substr(8);
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(fragment), std::string::npos) << m;
      EXPECT_NE(m.find("ints.safetensors"), std::string::npos) << m;  // names the file
      EXPECT_NE(m.find("\"weight\""), std::string::npos) << m;        // and the tensor
    }
  }
  // a zero-size tensor whose other sizes are representable is fine
  write_bytes(path("zero.safetensors"), make_file(R"({"z":{"dtype":"F64","shape":[0,1048576,1048576],"data_offsets":[0,0]}})", ""));
  EXPECT_EQ(nn::load_safetensors(path("zero.safetensors")).tensors.at("z").shape(), (Shape{0, 1048576, 1048576}));
}

TEST_F(Safetensors, HeaderAbove100MBIsRefusedBeforeParsing) {
  // a header of 100,000,001 bytes inside a file big enough to hold it
  const uint64_t n = 100000001;
  std::string bytes = le64(n) + std::string(n, ' ');
  try {
    nn::parse_safetensors(bytes, "big");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exceeds the limit of 100000000 bytes"), std::string::npos) << e.what();
  }
}

TEST_F(Safetensors, ParseFromMemoryMatchesTheFile) {
  Tensor a = randn({3, 4}, DType::f32, RngState{5, 0});
  Tensor b = from_indices({1, 2, 3}, {3});
  nn::save_safetensors(path("m.safetensors"), {{"a", a}, {"b", b}}, {{"k", "v"}});
  const std::string bytes = read_bytes(path("m.safetensors"));
  nn::SafetensorsFile f = nn::parse_safetensors(bytes);
  EXPECT_EQ(f.metadata.at("k"), "v");
  EXPECT_TRUE(same_values(f.tensors.at("a"), a));
  EXPECT_TRUE(same_values(f.tensors.at("b"), b));
  EXPECT_EQ(f.tensors.at("a").name(), "a");
  // every truncation of the bytes is an error naming the buffer
  for (size_t length = 0; length < bytes.size(); length += 7) {
    try {
      nn::parse_safetensors(std::string_view(bytes).substr(0, length), "cut");
      ADD_FAILURE() << "no error at length " << length;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("parse_safetensors(\"cut\"): ", 0), 0u) << e.what();
    }
  }
}

TEST_F(Safetensors, NonRegularFilesAreErrors) {
  expect_load_error(dir_.string(), "not a regular file");
  expect_load_error(path("missing.safetensors"), "no such file");
}

// F16 and BF16 tensors (as PyTorch and Hugging Face save them) are read as f16 and bf16 tensors, or
// with widen_16bit_floats as f32 tensors of the same values.
TEST_F(Safetensors, ReadsF16AndBF16AsThemselvesOrWidenedToF32) {
  auto entry = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets + "}";
  };
  auto le16 = [](std::initializer_list<uint16_t> values) {
    std::string out;
    for (uint16_t v : values) out += std::string{static_cast<char>(v & 0xff), static_cast<char>(v >> 8)};
    return out;
  };
  // F16: 1, -2.5, 65504 (largest), 2^-24 (smallest subnormal), 2^-14 (smallest normal), -0, inf, NaN
  const std::string f16 = le16({0x3C00, 0xC100, 0x7BFF, 0x0001, 0x0400, 0x8000, 0x7C00, 0x7E00});
  // BF16: 1, -2.5, 3.140625, 1e38-ish (0x7E96), -inf
  const std::string bf16 = le16({0x3F80, 0xC020, 0x4049, 0x7E96, 0xFF80, 0x0000});
  const std::string header = "{\"a\":" + entry("F16", "[2,4]", "[0,16]") + ",\"b\":" + entry("BF16", "[6]", "[16,28]") + "}";
  write_bytes(path("half.safetensors"), make_file(header, f16 + bf16));
  for (const bool widen : {false, true}) {
    SCOPED_TRACE(widen ? "widened" : "as stored");
    nn::SafetensorsFile f = nn::load_safetensors(path("half.safetensors"), {.widen_16bit_floats = widen});
    const Tensor& a = f.tensors.at("a");
    EXPECT_EQ(a.dtype(), widen ? DType::f32 : DType::f16);
    EXPECT_EQ(a.shape(), (Shape{2, 4}));
    std::vector<double> v = a.to_vector();
    EXPECT_EQ(v[0], 1.0);
    EXPECT_EQ(v[1], -2.5);
    EXPECT_EQ(v[2], 65504.0);
    EXPECT_EQ(v[3], std::ldexp(1.0, -24));
    EXPECT_EQ(v[4], std::ldexp(1.0, -14));
    EXPECT_EQ(v[5], 0.0);
    EXPECT_TRUE(std::signbit(v[5]));
    EXPECT_EQ(v[6], INFINITY);
    EXPECT_TRUE(std::isnan(v[7]));
    const Tensor& b = f.tensors.at("b");
    EXPECT_EQ(b.dtype(), widen ? DType::f32 : DType::bf16);
    std::vector<double> w = b.to_vector();
    EXPECT_EQ(w[0], 1.0);
    EXPECT_EQ(w[1], -2.5);
    EXPECT_EQ(w[2], 3.140625);
    uint32_t bits = 0x7E960000u;
    float big;
    std::memcpy(&big, &bits, sizeof big);
    EXPECT_EQ(w[3], static_cast<double>(big));
    EXPECT_EQ(w[4], -INFINITY);
    EXPECT_EQ(w[5], 0.0);
  }
}
