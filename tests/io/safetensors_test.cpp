// safetensors: round trips, the reference writer's exact bytes, sharded checkpoints, and hostile files.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "kiln/io.h"
#include "kiln/ops.h"
#include "test_util.h"

namespace kiln {
namespace {

using test::rng;
using test::throws_error;
namespace fs = std::filesystem;

// A fresh directory per test, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "kiln_st_XXXXXX").string();
    KILN_CHECK(::mkdtemp(tmpl.data()) != nullptr, "mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

std::vector<uint8_t> tensor_bytes(const Tensor& t) {
  const Tensor c = t.cpu().contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return std::vector<uint8_t>(p, p + c.nbytes());
}

// A tensor of random bytes (bools 0/1) of any dtype.
Tensor random_bytes(const Shape& shape, DType dtype) {
  Tensor t = empty(shape, dtype);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(rng()() & (dtype == DType::Bool ? 1 : 255));
  return t;
}

// A file from a header text and `data_bytes` bytes of data (value i % 251).
std::vector<uint8_t> make_file(const std::string& header, size_t data_bytes, std::optional<uint64_t> n = {}) {
  std::vector<uint8_t> b(8);
  const uint64_t len = n.value_or(header.size());
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(len >> (8 * i));
  b.insert(b.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) b.push_back(static_cast<uint8_t>(i % 251));
  return b;
}

SafetensorsHeader parse(const std::vector<uint8_t>& b, const std::string& source = "test.safetensors") {
  return parse_safetensors_header(b.data(), b.size(), source);
}

const std::vector<DType> kAllDTypes = {DType::Bool, DType::U8,   DType::I8,  DType::I16,    DType::U16,   DType::I32,
                                       DType::U32,  DType::I64,  DType::U64, DType::F16,    DType::BF16,  DType::F32,
                                       DType::F64,  DType::C64,  DType::F8E4M3, DType::F8E5M2};

// ---- round trips -----------------------------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDTypeAndShape) {
  TempDir dir;
  NamedTensors in;
  const std::vector<Shape> shapes = {{}, {0}, {7}, {3, 5}, {2, 0, 3}, {2, 3, 5, 1}};
  int k = 0;
  for (DType dt : kAllDTypes)
    for (const Shape& s : shapes) in.emplace_back(str("t", k++, ".", dtype_name(dt)), random_bytes(s, dt));
  // Non-contiguous inputs are written as their row-major contents.
  in.emplace_back("transposed", random_bytes({5, 7}, DType::F32).t());
  in.emplace_back("sliced", random_bytes({9, 6}, DType::BF16).slice(0, 1, 8, 3).slice(1, 1, 5));
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "ünïcode \"quoted\"\n"}};
  const std::string path = dir.file("rt.safetensors");
  save_safetensors(path, in, meta);

  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.entries().size(), in.size());
  for (const auto& [name, t] : in) {
    SCOPED_TRACE(name);
    const Tensor g = f.get(name);
    EXPECT_EQ(g.dtype(), t.dtype());
    EXPECT_EQ(g.sizes(), t.sizes());
    EXPECT_TRUE(g.is_cpu());
    EXPECT_TRUE(g.is_contiguous());
    EXPECT_EQ(tensor_bytes(g), tensor_bytes(t));
    // Written by kiln: every tensor is aligned to its item size in the file, so it is a view.
    EXPECT_EQ(reinterpret_cast<uintptr_t>(g.data_ptr()) % g.itemsize(), 0u);
  }
  // The in-memory serializer gives the same bytes as the file writer.
  std::ifstream is(path, std::ios::binary);
  const std::vector<uint8_t> on_disk((std::istreambuf_iterator<char>(is)), std::istreambuf_iterator<char>());
  EXPECT_EQ(serialize_safetensors(in, meta), on_disk);
}

TEST(Safetensors, RoundTripValuesThroughOps) {
  TempDir dir;
  const Tensor a = test::random_tensor({17, 33}, DType::F32);
  const Tensor b = test::random_tensor({4, 9}, DType::BF16);
  save_safetensors(dir.file("v.safetensors"), {{"a", a}, {"b", b}});
  const Checkpoint c = Checkpoint::open(dir.file("v.safetensors"));
  EXPECT_TRUE(test::all_close(c.get("a"), a, test::Tolerance{0, 0}));
  EXPECT_TRUE(test::all_close(c.get("b"), b, test::Tolerance{0, 0}));
  EXPECT_TRUE(test::all_close(c.get("b", kCPU, DType::F32), b.to(DType::F32), test::Tolerance{0, 0}));
  EXPECT_EQ(c.names(), (std::vector<std::string>{"a", "b"}));
}

// The byte-exact outputs the reference writer's own tests expect.
TEST(Safetensors, WriterMatchesReferenceBytes) {
  const Tensor x = from_vector<float>({0, 1, 2, 3, 4, 5}, Shape{1, 2, 3});
  const std::string h1 = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(h1.size(), 64u);
  auto want1 = make_file(h1, 0);
  const auto d1 = tensor_bytes(x);
  want1.insert(want1.end(), d1.begin(), d1.end());
  EXPECT_EQ(serialize_safetensors({{"attn.0", x}}), want1);
  EXPECT_EQ(want1[0], 64);
  // Padded with spaces to a multiple of 8 (here 7 of them) so the f32 data is aligned.
  const std::string h2 = R"({"attn0":{"dtype":"F32","shape":[1,1,2,3],"data_offsets":[0,24]}})";
  auto want2 = make_file(h2 + std::string(7, ' '), 0);
  const auto d2 = tensor_bytes(x);
  want2.insert(want2.end(), d2.begin(), d2.end());
  EXPECT_EQ(serialize_safetensors({{"attn0", x.view({1, 1, 2, 3})}}), want2);
  EXPECT_EQ(want2[0], 72);
  // No tensors, with and without metadata.
  EXPECT_EQ(serialize_safetensors({}), (std::vector<uint8_t>{8, 0, 0, 0, 0, 0, 0, 0, '{', '}', 32, 32, 32, 32, 32, 32}));
  EXPECT_EQ(serialize_safetensors({}, {{"framework", "pt"}}),
            make_file(std::string(R"({"__metadata__":{"framework":"pt"}})") + std::string(5, ' '), 0));
}

TEST(Safetensors, WriterSortsByAlignmentThenName) {
  const NamedTensors in = {{"a", random_bytes({3}, DType::U8)},   {"b", random_bytes({3}, DType::F32)},
                           {"c", random_bytes({3}, DType::BF16)}, {"B", random_bytes({3}, DType::F32)},
                           {"e", random_bytes({1}, DType::I64)},  {"f", random_bytes({2}, DType::F8E4M3)},
                           {"g", random_bytes({2}, DType::Bool)}, {"h", random_bytes({1}, DType::C64)},
                           {"i", random_bytes({1}, DType::F64)}};
  const auto bytes = serialize_safetensors(in);
  const SafetensorsHeader h = parse(bytes);
  std::vector<std::string> order;
  for (const auto& e : h.tensors) order.push_back(e.name);
  EXPECT_EQ(order, (std::vector<std::string>{"e", "i", "h", "B", "b", "c", "f", "a", "g"}));
  EXPECT_EQ(h.header_bytes % 8, 0u);
}

TEST(Safetensors, WriterRejectsBadNames) {
  const Tensor t = zeros({2});
  EXPECT_TRUE(throws_error([&] { serialize_safetensors({{"x", t}, {"x", t}}); }, {"'x'", "twice"}));
  EXPECT_TRUE(throws_error([&] { serialize_safetensors({{"__metadata__", t}}); }, {"reserved"}));
  EXPECT_TRUE(throws_error([&] { serialize_safetensors({{"bad\xff", t}}); }, {"UTF-8"}));
  EXPECT_TRUE(throws_error([&] { serialize_safetensors({{"x", Tensor()}}); }, {"undefined"}));
  // Control characters and quotes are escaped and read back.
  const std::string odd = "a\"b\\c\n\x01/é";
  const auto b = serialize_safetensors({{odd, t}});
  EXPECT_EQ(parse(b).tensors.at(0).name, odd);
}

// ---- mapping ------------------------------------------------------------------------------------------------

TEST(Safetensors, TensorsAreViewsThatOutliveTheFileObject) {
  TempDir dir;
  const Tensor a = test::random_tensor({64, 3}, DType::F32);
  const std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"a", a}});
  Tensor g1, g2;
  {
    const SafetensorsFile f = SafetensorsFile::open(path);
    g1 = f.get("a");
    g2 = f.get("a");
    EXPECT_EQ(g1.data_ptr(), g2.data_ptr());  // the mapping, not copies
    EXPECT_TRUE(f.contains("a"));
    EXPECT_FALSE(f.contains("b"));
    EXPECT_TRUE(throws_error([&] { f.get("b"); }, {path, "'b'"}));
  }
  fs::remove(path);  // the mapping holds the file's pages
  EXPECT_TRUE(test::all_close(g1, a, test::Tolerance{0, 0}));
}

TEST(Safetensors, WritingToAViewLeavesTheFileUnchanged) {
  TempDir dir;
  const Tensor a = test::random_tensor({100}, DType::F32);
  const std::string path = dir.file("w.safetensors");
  save_safetensors(path, {{"a", a}});
  {
    Tensor g = SafetensorsFile::open(path).get("a");
    g.fill_(7.0);
    EXPECT_EQ(g.to_vector<float>()[50], 7.0f);
  }
  EXPECT_TRUE(test::all_close(SafetensorsFile::open(path).get("a"), a, test::Tolerance{0, 0}));
}

TEST(Safetensors, OpenErrorsNameThePath) {
  TempDir dir;
  write_bytes(dir.file("empty.safetensors"), {});
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(dir.file("empty.safetensors")); },
                           {"empty.safetensors", "shorter than"}));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(dir.file("missing.safetensors")); },
                           {"missing.safetensors", "cannot open"}));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile::open(dir.file("")); }, {"not a regular file"}));
  EXPECT_TRUE(throws_error([&] { SafetensorsFile().entries(); }, {"before open"}));
}

TEST(Safetensors, MisalignedTensorIsCopiedAligned) {
  // A header of odd length (valid, though the usual writers pad the header to 8 bytes): the f32 data starts at an odd
  // address in the mapping.
  const std::string h = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  ASSERT_NE((8 + h.size()) % 4, 0u);
  TempDir dir;
  auto b = make_file(h, 0);
  const float v[2] = {1.5f, -2.25f};
  b.insert(b.end(), reinterpret_cast<const uint8_t*>(v), reinterpret_cast<const uint8_t*>(v) + 8);
  write_bytes(dir.file("odd.safetensors"), b);
  const Tensor g = SafetensorsFile::open(dir.file("odd.safetensors")).get("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(g.data_ptr()) % 4, 0u);
  EXPECT_EQ(g.to_vector<float>(), (std::vector<float>{1.5f, -2.25f}));
}

TEST(Safetensors, EmptyFileOfTensorsAndZeroSized) {
  const auto b = make_file(R"({"z":{"dtype":"F16","shape":[0,4],"data_offsets":[0,0]},)"
                           R"("s":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})", 8);
  const auto keep = std::make_shared<std::vector<uint8_t>>(b);
  const SafetensorsFile f = SafetensorsFile::from_memory(keep->data(), keep->size(), keep, "mem");
  EXPECT_EQ(f.get("z").sizes(), (Shape{0, 4}));
  EXPECT_EQ(f.get("s").dim(), 0);
  EXPECT_EQ(f.names(), (std::vector<std::string>{"z", "s"}));
  const auto meta_null = make_file(R"({"__metadata__":null})", 0);  // the reference reads null as none
  EXPECT_TRUE(parse(meta_null).metadata.empty());
}

// ---- sharded checkpoints -----------------------------------------------------------------------------------

struct Shards {
  TempDir dir;
  Tensor a = test::random_tensor({5, 3}, DType::F32), b = test::random_tensor({4}, DType::BF16),
         c = test::random_int_tensor({6}, DType::I64, -100, 100);
  Shards() {
    save_safetensors(dir.file("model-00001-of-00002.safetensors"), {{"a", a}, {"b", b}});
    save_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"c", c}});
  }
  void index(const std::string& text) {
    std::ofstream(dir.file("model.safetensors.index.json")) << text;
  }
  static std::string good() {
    return R"({"metadata":{"total_size":100},"weight_map":{"a":"model-00001-of-00002.safetensors",)"
           R"("b":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})";
  }
};

TEST(Checkpoint, ShardedByDirectoryAndByIndex) {
  Shards s;
  s.index(Shards::good());
  for (const std::string& p : {s.dir.file(""), s.dir.file("model.safetensors.index.json")}) {
    const Checkpoint c = Checkpoint::open(p);
    EXPECT_EQ(c.names(), (std::vector<std::string>{"a", "b", "c"}));
    EXPECT_EQ(c.files().size(), 2u);
    EXPECT_TRUE(test::all_close(c.get("a"), s.a, test::Tolerance{0, 0}));
    EXPECT_TRUE(test::all_close(c.get("b"), s.b, test::Tolerance{0, 0}));
    EXPECT_EQ(c.get("c").to_vector<int64_t>(), s.c.to_vector<int64_t>());
    EXPECT_EQ(c.entry("b").dtype, DType::BF16);
    EXPECT_EQ(c.load_all().size(), 3u);
    EXPECT_TRUE(throws_error([&] { c.get("d"); }, {"no tensor named 'd'"}));
  }
}

TEST(Checkpoint, SingleFileDirectory) {
  TempDir dir;
  save_safetensors(dir.file("model.safetensors"), {{"w", ones({2, 2})}});
  EXPECT_EQ(Checkpoint::open(dir.file("")).names(), (std::vector<std::string>{"w"}));
  TempDir empty_dir;
  EXPECT_TRUE(throws_error([&] { Checkpoint::open(empty_dir.file("")); }, {"neither"}));
}

TEST(Checkpoint, IndexErrors) {
  Shards s;
  const std::string idx = s.dir.file("model.safetensors.index.json");
  auto open_with = [&](const std::string& text) {
    s.index(text);
    return Checkpoint::open(idx);
  };
  // A listed tensor missing from its shard; a shard tensor missing from the map; one in the wrong shard.
  EXPECT_TRUE(throws_error([&] {
    open_with(R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
              R"("c":"model-00002-of-00002.safetensors","d":"model-00002-of-00002.safetensors"}})");
  }, {"'d'", "does not hold it"}));
  EXPECT_TRUE(throws_error([&] {
    open_with(R"({"weight_map":{"a":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}})");
  }, {"'b'", "does not list"}));
  EXPECT_TRUE(throws_error([&] {
    open_with(R"({"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors",)"
              R"("c":"model-00002-of-00002.safetensors"}})");
  }, {"'b'"}));
  // Paths out of the checkpoint, duplicates, a missing map, deep nesting, missing shard files.
  EXPECT_TRUE(throws_error([&] { open_with(R"({"weight_map":{"a":"../model-00001-of-00002.safetensors"}})"); },
                           {"not a plain file name"}));
  EXPECT_TRUE(throws_error([&] { open_with(R"({"weight_map":{"a":"/etc/passwd"}})"); }, {"not a plain file name"}));
  EXPECT_TRUE(throws_error([&] { open_with(R"({"weight_map":{"a":"x","a":"y"}})"); }, {"duplicate key \"a\"", "weight_map"}));
  EXPECT_TRUE(throws_error([&] { open_with(R"({"weight_map":{"a":1}})"); }, {"'a'", "not a string"}));
  EXPECT_TRUE(throws_error([&] { open_with(R"({"metadata":{}})"); }, {"weight_map"}));
  EXPECT_TRUE(throws_error([&] { open_with(std::string("{\"weight_map\":{}}\0junk", 22)); }, {"NUL"}));
  EXPECT_TRUE(throws_error([&] { open_with("{\"metadata\":" + std::string(1000000, '[')); }, {"deeper than"}));
  EXPECT_TRUE(throws_error([&] { open_with(R"({"weight_map":{"a":"nope.safetensors"}})"); }, {"nope.safetensors",
                                                                                              "cannot open"}));
}

// ---- hostile files ------------------------------------------------------------------------------------------

const std::string kGood = R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                          R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]}})";

TEST(SafetensorsHostile, ValidBaseline) {
  const SafetensorsHeader h = parse(make_file(kGood, 32));
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "w");
  EXPECT_EQ(h.tensors[1].shape, (Shape{4}));
}

TEST(SafetensorsHostile, EveryTruncationIsAnError) {
  const auto full = make_file(kGood, 32);
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse(cut), Error) << n;
  }
  EXPECT_TRUE(throws_error([&] { parse({1, 2, 3}); }, {"test.safetensors", "shorter than"}));
}

TEST(SafetensorsHostile, HeaderLength) {
  EXPECT_TRUE(throws_error([&] { parse(make_file(kGood, 32, 100'000'001)); }, {"above the limit"}));
  EXPECT_TRUE(throws_error([&] { parse(make_file(kGood, 32, UINT64_MAX)); }, {"above the limit"}));
  EXPECT_TRUE(throws_error([&] { parse(make_file(kGood, 0, kGood.size() + 1)); }, {"past the end"}));
  EXPECT_TRUE(throws_error([&] { parse(make_file("", 0)); }, {"start with '{'"}));
  // A length that cuts the JSON short, or takes data bytes into it.
  EXPECT_TRUE(throws_error([&] { parse(make_file(kGood, 32, kGood.size() - 1)); }, {"invalid JSON"}));
  EXPECT_THROW(parse(make_file(kGood, 32, kGood.size() + 1)), Error);
}

struct Case {
  std::string header;
  size_t data;
  std::vector<std::string> parts;
};

TEST(SafetensorsHostile, StructureAndValues) {
  const std::vector<Case> cases = {
      // offsets
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[2],"data_offsets":[8,160]}})",
       16, {"'v'", "past the end"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12, {"'w'", "gap"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})",
       20, {"'v'", "gap"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, {"'v'", "overlap"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, {"'w'", "end before"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 9, {"trailing bytes"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})", 8, {"'w'", "past the end"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8,16]}})", 8, {"'w'", "more than 2"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, {"'w'", "1 values"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":["0","8"]}})", 8, {"'w'", "unsigned integers"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})", 8, {"'w'", "not an unsigned integer"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})", 8, {"'w'", "negative"}},
      // shapes and sizes
      {R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, {"'w'", "needs 12 bytes"}},
      {R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,8]}})", 8, {"'w'", "needs 4 bytes"}},
      {R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, {"'w'", "negative"}},
      {R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}})", 8,
       {"'w'", "2^64"}},
      {R"({"w":{"dtype":"U8","shape":[4294967296,2147483648],"data_offsets":[0,8]}})", 8, {"'w'", "2^63"}},
      {R"({"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,8]}})", 8, {"'w'", "2^64 bytes"}},
      {R"({"w":{"dtype":"U8","shape":[9223372036854775808],"data_offsets":[0,8]}})", 8, {"'w'", "above the largest"}},
      {R"({"w":{"dtype":"U8","shape":[1e30],"data_offsets":[0,8]}})", 8, {"'w'", "not an unsigned integer"}},
      {R"({"w":{"dtype":"U8","shape":[99999999999999999999999],"data_offsets":[0,8]}})", 8, {"'w'"}},
      {R"({"w":{"dtype":"U8","shape":2,"data_offsets":[0,2]}})", 2, {"'w'", "shape must be an array"}},
      {R"({"w":{"dtype":"U8","shape":[[2]],"data_offsets":[0,2]}})", 2, {"'w'", "shape must hold"}},
      // dtypes
      {R"({"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8, {"'w'", "unknown dtype 'F33'"}},
      {R"({"w":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", 8, {"'w'", "unknown dtype 'f32'"}},
      {R"({"w":{"dtype":"F8_E8M0","shape":[2],"data_offsets":[0,2]}})", 2, {"'w'", "F8_E8M0", "not support"}},
      {R"({"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1, {"'w'", "F4", "not support"}},
      {R"({"w":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8, {"'w'", "dtype must be a string"}},
      // fields
      {R"({"w":{"dtype":"F32","shape":[2]}})", 0, {"'w'", "missing field data_offsets"}},
      {R"({"w":{"shape":[2],"data_offsets":[0,8]}})", 8, {"'w'", "missing field dtype"}},
      {R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8, {"'w'", "unknown field 'extra'"}},
      {R"({"w":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8, {"'w'", "duplicate field"}},
      {R"({"w":[1,2]})", 0, {"'w'", "must be an object"}},
      {R"({"w":"F32"})", 0, {"'w'", "must be an object"}},
      // duplicates (nlohmann and serde would keep the last silently)
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
       2, {"duplicate key 'w'"}},
      {R"({"__metadata__":{"a":"1"},"__metadata__":{"b":"2"}})", 0, {"duplicate key '__metadata__'"}},
      {R"({"__metadata__":{"a":"1","a":"2"}})", 0, {"duplicate key 'a' in __metadata__"}},
      // metadata
      {R"({"__metadata__":{"a":1}})", 0, {"__metadata__", "'a'", "must be a string"}},
      {R"({"__metadata__":{"a":{"b":"c"}}})", 0, {"__metadata__", "must be a string"}},
      {R"({"__metadata__":{"a":null}})", 0, {"__metadata__", "must be a string"}},
      {R"({"__metadata__":["a"]})", 0, {"__metadata__ must be an object"}},
      {R"({"__metadata__":"x"})", 0, {"__metadata__ must be an object"}},
      // not an object / not JSON
      {R"([1,2])", 0, {"start with '{'"}},
      {R"( {})", 0, {"start with '{'"}},
      {R"({"w":})", 0, {"invalid JSON"}},
      {R"({} x)", 0, {"invalid JSON"}},
      {R"({}{})", 0, {"invalid JSON"}},
      {std::string("{}\0\0\0\0", 6), 0, {"invalid JSON", "NUL"}},  // nlohmann stops at a NUL
      {std::string("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}\0{\"x\":1}", 61), 1, {"NUL"}},
      {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},})", 1, {"invalid JSON"}},
      {R"({"a\ud800":{}})", 0, {"invalid JSON"}},  // a lone surrogate escape
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    std::vector<std::string> parts = c.parts;
    parts.push_back("'test.safetensors'");  // every error names the file
    try {
      parse(make_file(c.header, c.data));
      ADD_FAILURE() << "did not throw";
    } catch (const Error& e) {
      for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what() << " lacks " << p;
    }
  }
}

TEST(SafetensorsHostile, NotUtf8) {
  for (const std::string bad : {"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"}) {
    const std::string h = "{\"w" + bad + "\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
    EXPECT_TRUE(throws_error([&] { parse(make_file(h, 1)); }, {"UTF-8", "test.safetensors"}));
  }
  // Valid multi-byte names are fine.
  const std::string h = "{\"w\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  EXPECT_EQ(parse(make_file(h, 1)).tensors.at(0).name, "w\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80");
}

TEST(SafetensorsHostile, DeepNestingDoesNotRecurse) {
  for (const std::string& open : {std::string("["), std::string("{\"a\":")}) {
    std::string h = "{\"w\":";
    for (int i = 0; i < 1000000; ++i) h += open;
    EXPECT_TRUE(throws_error([&] { parse(make_file(h, 0)); }, {"test.safetensors"}));
  }
  std::string h = "{\"__metadata__\":{\"a\":";
  for (int i = 0; i < 1000000; ++i) h += "[";
  EXPECT_TRUE(throws_error([&] { parse(make_file(h, 0)); }, {"must be a string"}));
}

TEST(SafetensorsHostile, RankLimit) {
  std::string shape = "[";
  for (size_t i = 0; i <= kSafetensorsMaxRank; ++i) shape += i ? ",1" : "1";
  shape += "]";
  EXPECT_TRUE(throws_error([&] { parse(make_file(R"({"w":{"dtype":"U8","shape":)" + shape +
                                                 R"(,"data_offsets":[0,1]}})", 1)); },
                           {"'w'", "more than 64 dims"}));
}

// Random corruptions of a valid file either parse to a consistent header or throw kiln::Error; a parsed
// header's tensors always lie inside the file.
TEST(SafetensorsHostile, RandomMutations) {
  const auto base = serialize_safetensors({{"a", random_bytes({3, 4}, DType::F32)},
                                           {"b", random_bytes({5}, DType::BF16)},
                                           {"c", random_bytes({2, 2}, DType::I64)}},
                                          {{"k", "v"}});
  std::uniform_int_distribution<size_t> pos(0, base.size() - 1);
  int parsed = 0;
  for (int it = 0; it < 20000; ++it) {
    auto b = base;
    const int flips = 1 + static_cast<int>(rng()() % 4);
    for (int f = 0; f < flips; ++f) {
      const size_t p = pos(rng());
      switch (rng()() % 3) {
        case 0: b[p] = static_cast<uint8_t>(rng()()); break;
        case 1: b[p] = "{}[]\",:0123456789-e."[rng()() % 20]; break;
        default: b.resize(p); break;
      }
      if (b.empty()) break;
    }
    try {
      const SafetensorsHeader h = parse(b);
      ++parsed;
      for (const auto& e : h.tensors) ASSERT_LE(h.data_offset + e.end, b.size());
    } catch (const Error&) {
    }
  }
  EXPECT_GT(parsed, 0);  // some flips land in data bytes
}

// Every input of the fuzz corpus (seeds, what the fuzzer kept, and any crash it found) parses or throws
// kiln::Error; accepted ones are read in full.
TEST(SafetensorsHostile, FuzzCorpusRegression) {
  const fs::path dir = fs::path(KILN_TEST_DATA_DIR) / ".." / ".." / "fuzz" / "corpus" / "safetensors";
  ASSERT_TRUE(fs::is_directory(dir)) << dir;
  int files = 0, accepted = 0;
  for (const auto& de : fs::directory_iterator(dir)) {
    std::ifstream is(de.path(), std::ios::binary);
    const auto bytes = std::make_shared<std::vector<uint8_t>>((std::istreambuf_iterator<char>(is)),
                                                              std::istreambuf_iterator<char>());
    ++files;
    try {
      const SafetensorsFile f = SafetensorsFile::from_memory(bytes->data(), bytes->size(), bytes, de.path().string());
      for (const auto& e : f.entries()) EXPECT_EQ(tensor_bytes(f.get(e.name)).size(), e.nbytes());
      ++accepted;
    } catch (const Error&) {
    }
    try {
      parse_safetensors_index(std::string_view(reinterpret_cast<const char*>(bytes->data()), bytes->size()), "x");
    } catch (const Error&) {
    }
  }
  EXPECT_GE(files, 9);
  EXPECT_GE(accepted, 7);  // the valid seeds
}

// ---- GPU -----------------------------------------------------------------------------------------------------

TEST(SafetensorsCuda, LoadToDeviceMatchesFile) {
  KILN_REQUIRE_CUDA();
  TempDir dir;
  // 24 MiB of f32 goes through the pinned staging path; the small ones go direct.
  const Tensor big = test::random_tensor({6 * 1024 + 3, 1024}, DType::F32);
  const Tensor small = test::random_tensor({7, 5}, DType::BF16);
  const Tensor fp8 = random_bytes({33, 17}, DType::F8E4M3);
  save_safetensors(dir.file("g.safetensors"), {{"big", big}, {"small", small}, {"fp8", fp8}});
  const Checkpoint c = Checkpoint::open(dir.file("g.safetensors"));
  const Device gpu(DeviceType::CUDA, 0);
  const Tensor g = c.get("big", gpu);
  EXPECT_TRUE(g.is_cuda());
  EXPECT_EQ(tensor_bytes(g), tensor_bytes(big));
  EXPECT_EQ(tensor_bytes(c.get("small", gpu)), tensor_bytes(small));
  EXPECT_EQ(tensor_bytes(c.get("fp8", gpu)), tensor_bytes(fp8));
  // Converted on the device after the transfer.
  EXPECT_TRUE(test::all_close(c.get("small", gpu, DType::F32).cpu(), small.to(DType::F32), test::Tolerance{0, 0}));
  // Writing a device tensor reads it back to the host.
  save_safetensors(dir.file("back.safetensors"), {{"big", g}});
  EXPECT_EQ(tensor_bytes(SafetensorsFile::open(dir.file("back.safetensors")).get("big")), tensor_bytes(big));
}

}  // namespace
}  // namespace kiln
