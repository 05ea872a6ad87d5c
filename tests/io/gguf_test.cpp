// GGUF (kiln/gguf.h): a file of every readable type written by llama.cpp's gguf-py, dequantised against
// gguf-py's own reference (scripts/make_gguf_reference.py); metadata of every value type; and hostile files:
// every truncation, random corruption, and each rule of the header broken on purpose.
#include "kiln/gguf.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <fstream>
#include <iterator>
#include <random>

#include "kiln/io.h"
#include "kiln/ops.h"
#include "test_util.h"

namespace kiln {
namespace {

const std::string kDir = std::string(KILN_TEST_DATA_DIR) + "/gguf/";

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

GgufFile from_bytes(const std::vector<uint8_t>& b) {
  auto copy = std::make_shared<std::vector<uint8_t>>(b);
  return GgufFile::from_memory(copy->data(), copy->size(), copy, "test");
}

TEST(Gguf, EveryTypeDequantisesAsGgmlDoes) {
  const GgufFile f = GgufFile::open(kDir + "types.gguf");
  const SafetensorsFile ref = SafetensorsFile::open(kDir + "types.ref.safetensors");
  EXPECT_EQ(f.header().version, 3u);
  EXPECT_EQ(f.header().tensors.size(), ref.entries().size());
  for (const auto& e : ref.entries()) {
    SCOPED_TRACE(e.name);
    const Tensor expected = ref.get(e.name);
    const Tensor got = f.get(e.name);
    ASSERT_EQ(got.sizes(), expected.sizes());
    const double scale = amax(abs(expected)).item<double>();
    EXPECT_LE(amax(abs(sub(got, expected))).item<double>(), 1e-6 * scale);
    EXPECT_EQ(f.get(e.name, DType::BF16).dtype(), DType::BF16);
    // Read in the dtype it is stored in: its bytes unchanged (no f32 round trip); in another, the same values.
    const GgufTensorInfo& info = f.info(e.name);
    for (const DType d : {DType::F32, DType::F16, DType::BF16}) {
      const Tensor g = f.get(e.name, d);
      ASSERT_EQ(g.dtype(), d);
      EXPECT_TRUE(test::equal(g.to(DType::F32), got.to(d).to(DType::F32)));
      const bool as_stored = (info.type == 0 && d == DType::F32) || (info.type == 1 && d == DType::F16) ||
                             (info.type == 30 && d == DType::BF16);
      if (as_stored) {
        EXPECT_EQ(static_cast<uint64_t>(g.nbytes()), info.nbytes);
        EXPECT_EQ(std::memcmp(g.data_ptr(), f.raw(e.name).data_ptr(), static_cast<size_t>(g.nbytes())), 0);
      }
    }
  }
  EXPECT_EQ(gguf_type_name(f.info("t.q4_k").type), "Q4_K");
  EXPECT_TRUE(test::throws_error([&] { f.get("missing"); }, {"types.gguf", "no tensor 'missing'"}));
}

// raw(): a tensor's stored bytes, one row per row of its shape, as they lie in the file.
TEST(Gguf, RawGivesTheStoredBytesByRow) {
  const std::vector<uint8_t> bytes = read_bytes(kDir + "types.gguf");
  const GgufFile f = GgufFile::open(kDir + "types.gguf");
  for (const auto& [name, rows, row_bytes] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"t.f32", 3, 20}, {"t.q8_0", 3, 68}, {"t.q4_k", 2, 144}, {"t.q6_k", 3, 210}}) {
    SCOPED_TRACE(name);
    const Tensor r = f.raw(name);
    ASSERT_EQ(r.dtype(), DType::U8);
    ASSERT_EQ(r.sizes(), Shape({rows, row_bytes}));
    const GgufTensorInfo& info = f.info(name);
    EXPECT_EQ(std::memcmp(r.data<uint8_t>(), bytes.data() + info.offset, static_cast<size_t>(rows * row_bytes)), 0);
  }
  EXPECT_TRUE(test::throws_error([&] { f.raw("missing"); }, {"types.gguf", "no tensor 'missing'"}));
}

TEST(Gguf, MetadataOfEveryValueType) {
  const GgufFile f = GgufFile::open(kDir + "types.gguf");
  const auto& m = f.metadata();
  EXPECT_EQ(m.at("test.u32").as_int(), 4000000000);
  EXPECT_EQ(m.at("test.i32").as_int(), -7);
  EXPECT_EQ(m.at("test.f32").as_double(), 0.25);
  EXPECT_EQ(m.at("test.f64").as_double(), -1.5e300);
  EXPECT_EQ(m.at("test.bool").as_int(), 1);
  EXPECT_EQ(m.at("test.string").as_string(), "kiln \xE2\x9C\x93");
  ASSERT_EQ(m.at("test.strings").as_array().size(), 3u);
  EXPECT_EQ(m.at("test.strings").as_array()[1].as_string(), "bc");
  EXPECT_EQ(m.at("test.ints").as_array()[2].as_int(), 3);
  EXPECT_EQ(m.at("general.architecture").as_string(), "llama");
  EXPECT_TRUE(test::throws_error([&] { m.at("test.u64").as_int(); }, {"does not fit int64"}));
  EXPECT_TRUE(test::throws_error([&] { m.at("test.string").as_int(); }, {"expected an integer"}));
}

// Cut anywhere before the end of the last tensor's data: an error. Cut in the padding after it: the same file.
TEST(Gguf, EveryTruncationIsAnError) {
  const std::vector<uint8_t> b = read_bytes(kDir + "types.gguf");
  const GgufFile whole = from_bytes(b);  // kept: the loop below reads its header
  uint64_t end = 0;
  for (const auto& t : whole.header().tensors) end = std::max(end, t.offset + t.nbytes);
  for (size_t n = 0; n < b.size(); ++n) {
    const std::vector<uint8_t> cut(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
    if (n < end) {
      EXPECT_THROW(from_bytes(cut), Error) << n;
    } else {
      EXPECT_EQ(from_bytes(cut).header().tensors.size(), whole.header().tensors.size()) << n;
    }
  }
}

TEST(Gguf, CorruptedFilesAreErrorsOrReadable) {
  const std::vector<uint8_t> b = read_bytes(kDir + "types.gguf");
  std::mt19937 rng(3);
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> c = b;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) c[rng() % c.size()] = static_cast<uint8_t>(rng());
    try {
      const GgufFile f = from_bytes(c);
      ++accepted;
      for (const auto& t : f.header().tensors) {
        try {
          (void)f.get(t.name);
        } catch (const Error&) {
        }
      }
    } catch (const Error&) {
    }
  }
  EXPECT_GT(accepted, 0);  // flips inside the tensor data leave a valid file
}

// A hand-made header: the pieces in order, each a test of one rule.
struct Builder {
  std::vector<uint8_t> b;
  template <class T>
  Builder& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Builder& text(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Builder& start(uint32_t version, uint64_t tensors, uint64_t kv) {
    return put<uint32_t>(0x46554747u).put(version).put(tensors).put(kv);
  }
  Builder& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    text(name).put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) put(d);
    return put(type).put(offset);
  }
  Builder& pad_to(size_t n) {
    b.resize(n, 0);
    return *this;
  }
};

TEST(Gguf, EveryHeaderRuleIsChecked) {
  auto err = [](const Builder& x, std::initializer_list<std::string> words) {
    return test::throws_error([&] { from_bytes(x.b); }, words);
  };
  EXPECT_TRUE(err(Builder().put<uint32_t>(0x12345678).put<uint32_t>(3).put<uint64_t>(0).put<uint64_t>(0), {"not a GGUF file"}));
  EXPECT_TRUE(err(Builder().start(1, 0, 0), {"version 1"}));
  EXPECT_TRUE(err(Builder().start(3, uint64_t{1} << 40, 0), {"tensors"}));
  EXPECT_TRUE(err(Builder().start(3, 0, 1).text("k").put<uint32_t>(9).put<uint32_t>(4).put<uint64_t>(uint64_t{1} << 50),
                  {"array of"}));
  EXPECT_TRUE(err(Builder().start(3, 0, 1).text("k").put<uint32_t>(77), {"unknown type 77"}));
  EXPECT_TRUE(err(Builder().start(3, 0, 1).text("k").put<uint32_t>(7).put<uint8_t>(2), {"a bool of value 2"}));
  EXPECT_TRUE(err(Builder().start(3, 0, 2).text("k").put<uint32_t>(4).put<uint32_t>(1).text("k").put<uint32_t>(4).put<uint32_t>(1),
                  {"appears twice"}));
  EXPECT_TRUE(err(Builder().start(3, 0, 1).text("general.alignment").put<uint32_t>(4).put<uint32_t>(24), {"power of two"}));
  EXPECT_TRUE(err(Builder().start(3, 0, 1).text("k").put<uint32_t>(8).put<uint64_t>(uint64_t{1} << 60), {"string of"}));
  EXPECT_TRUE(err(Builder().start(3, 1, 0).tensor("t", {1, 1, 1, 1, 1}, 0, 0), {"rank 5"}));
  EXPECT_TRUE(err(Builder().start(3, 1, 0).tensor("t", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0), {"2^62"}));
  EXPECT_TRUE(err(Builder().start(3, 1, 0).tensor("t", {33}, 8, 0).pad_to(4096), {"not whole Q8_0 blocks of 32"}));
  EXPECT_TRUE(err(Builder().start(3, 1, 0).tensor("t", {4}, 0, 3).pad_to(4096), {"not a multiple of the alignment"}));
  EXPECT_TRUE(err(Builder().start(3, 1, 0).tensor("t", {1024}, 0, 0).pad_to(200), {"runs past the end"}));
  EXPECT_TRUE(err(Builder().start(3, 2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad_to(4096), {"overlap"}));
  EXPECT_TRUE(err(Builder().start(3, 2, 0).tensor("a", {8}, 0, 0).tensor("a", {8}, 0, 32).pad_to(4096), {"appears twice"}));
  // A type kiln lists but cannot read (Q2_K) parses, and get() names it; an unknown type is listed as such.
  const GgufFile f = from_bytes(Builder().start(3, 2, 0).tensor("q2", {256}, 10, 0).tensor("x", {4}, 99, 96).pad_to(4096).b);
  EXPECT_TRUE(test::throws_error([&] { f.get("q2"); }, {"'q2'", "Q2_K", "cannot read"}));
  EXPECT_TRUE(test::throws_error([&] { f.get("x"); }, {"type 99"}));
  EXPECT_TRUE(test::throws_error([] { GgufFile::open(kDir + "missing.gguf"); }, {"gguf file", "cannot open"}));
}

}  // namespace
}  // namespace kiln
