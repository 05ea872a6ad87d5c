// dtype properties, names, parse_dtype, and promote_types for all 256 pairs against PyTorch 2.11's table
// (tests/data/conversions.json); where PyTorch refuses, NumPy's rule (unsigned mixes) or an error (float8).
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace kiln {
namespace {

using test::throws_error;

// numpy.promote_types for the integer pairs PyTorch 2.11 refuses (generated with NumPy).
struct NumpyPair {
  const char *a, *b, *result;
};
const NumpyPair kNumpyPairs[] = {
{"bool", "uint16", "uint16"},
{"bool", "uint32", "uint32"},
{"bool", "uint64", "uint64"},
{"uint8", "uint16", "uint16"},
{"uint8", "uint32", "uint32"},
{"uint8", "uint64", "uint64"},
{"int8", "uint16", "int32"},
{"int8", "uint32", "int64"},
{"int8", "uint64", "float64"},
{"int16", "uint16", "int32"},
{"int16", "uint32", "int64"},
{"int16", "uint64", "float64"},
{"uint16", "bool", "uint16"},
{"uint16", "uint8", "uint16"},
{"uint16", "int8", "int32"},
{"uint16", "int16", "int32"},
{"uint16", "int32", "int32"},
{"uint16", "uint32", "uint32"},
{"uint16", "int64", "int64"},
{"uint16", "uint64", "uint64"},
{"int32", "uint16", "int32"},
{"int32", "uint32", "int64"},
{"int32", "uint64", "float64"},
{"uint32", "bool", "uint32"},
{"uint32", "uint8", "uint32"},
{"uint32", "int8", "int64"},
{"uint32", "int16", "int64"},
{"uint32", "uint16", "uint32"},
{"uint32", "int32", "int64"},
{"uint32", "int64", "int64"},
{"uint32", "uint64", "uint64"},
{"int64", "uint16", "int64"},
{"int64", "uint32", "int64"},
{"int64", "uint64", "float64"},
{"uint64", "bool", "uint64"},
{"uint64", "uint8", "uint64"},
{"uint64", "int8", "float64"},
{"uint64", "int16", "float64"},
{"uint64", "uint16", "uint64"},
{"uint64", "int32", "float64"},
{"uint64", "uint32", "uint64"},
{"uint64", "int64", "float64"}
};

TEST(DType, PromoteTypesMatchesTorchForAllPairs) {
  std::ifstream f(KILN_TEST_DATA_DIR "/conversions.json");
  ASSERT_TRUE(f.good());
  const auto table = nlohmann::json::parse(f).at("promote_types");
  int checked = 0;
  for (int i = 0; i < kNumDTypes; ++i) {
    for (int j = 0; j < kNumDTypes; ++j) {
      const DType a = static_cast<DType>(i), b = static_cast<DType>(j);
      const std::string key = std::string(dtype_name(a)) + "," + dtype_name(b);
      SCOPED_TRACE(key);
      const std::string want = table.at(key).get<std::string>();
      if (want == "error") {
        if (is_float8(a) || is_float8(b)) {
          EXPECT_TRUE(throws_error([&] { promote_types(a, b); }, {"promote_types", "float8", dtype_name(a)}));
        } else if (is_complex(a) || is_complex(b)) {
          // complex64 with u16/u32/u64: kiln stays in complex64 (NumPy would widen; kiln has no c128).
          EXPECT_EQ(promote_types(a, b), DType::C64);
        } else {
          bool found = false;
          for (const auto& p : kNumpyPairs) {
            if (key == std::string(p.a) + "," + p.b) {
              EXPECT_EQ(dtype_name(promote_types(a, b)), std::string(p.result));
              found = true;
            }
          }
          EXPECT_TRUE(found) << "no NumPy expectation for " << key;
        }
      } else if (want == "complex128") {
        // kiln has no complex128: complex64 with float64 is an error naming the reason.
        EXPECT_TRUE(throws_error([&] { promote_types(a, b); }, {"promote_types", "complex128"}));
      } else {
        EXPECT_EQ(dtype_name(promote_types(a, b)), want);
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 256);
}

TEST(DType, NamesItemsizesAndCategories) {
  const struct {
    DType t;
    const char* name;
    size_t size;
    bool floating, complex, integral, is_unsigned;
  } rows[] = {
      {DType::Bool, "bool", 1, false, false, false, true},   {DType::U8, "uint8", 1, false, false, true, true},
      {DType::I8, "int8", 1, false, false, true, false},     {DType::I16, "int16", 2, false, false, true, false},
      {DType::U16, "uint16", 2, false, false, true, true},   {DType::I32, "int32", 4, false, false, true, false},
      {DType::U32, "uint32", 4, false, false, true, true},   {DType::I64, "int64", 8, false, false, true, false},
      {DType::U64, "uint64", 8, false, false, true, true},   {DType::F16, "float16", 2, true, false, false, false},
      {DType::BF16, "bfloat16", 2, true, false, false, false}, {DType::F32, "float32", 4, true, false, false, false},
      {DType::F64, "float64", 8, true, false, false, false}, {DType::C64, "complex64", 8, false, true, false, false},
      {DType::F8E4M3, "float8_e4m3fn", 1, true, false, false, false},
      {DType::F8E5M2, "float8_e5m2", 1, true, false, false, false},
  };
  for (const auto& r : rows) {
    SCOPED_TRACE(r.name);
    EXPECT_STREQ(dtype_name(r.t), r.name);
    EXPECT_EQ(itemsize(r.t), r.size);
    EXPECT_EQ(is_floating(r.t), r.floating);
    EXPECT_EQ(is_complex(r.t), r.complex);
    EXPECT_EQ(is_integral(r.t, false), r.integral);
    EXPECT_EQ(is_integral(r.t, true), r.integral || r.t == DType::Bool);
    EXPECT_EQ(is_unsigned(r.t), r.is_unsigned);
    EXPECT_EQ(is_float8(r.t), r.t == DType::F8E4M3 || r.t == DType::F8E5M2);
    EXPECT_EQ(parse_dtype(r.name), r.t);
    EXPECT_EQ(parse_dtype(std::string("torch.") + r.name), r.t);
  }
}

TEST(DType, ParseShortFormsAndAliases) {
  EXPECT_EQ(parse_dtype("f32"), DType::F32);
  EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_dtype("u8"), DType::U8);
  EXPECT_EQ(parse_dtype("i64"), DType::I64);
  EXPECT_EQ(parse_dtype("c64"), DType::C64);
  EXPECT_EQ(parse_dtype("half"), DType::F16);
  EXPECT_EQ(parse_dtype("double"), DType::F64);
  EXPECT_EQ(parse_dtype("long"), DType::I64);
  EXPECT_EQ(parse_dtype("fp8_e4m3"), DType::F8E4M3);
  EXPECT_EQ(parse_dtype("e5m2"), DType::F8E5M2);
  EXPECT_TRUE(throws_error([] { parse_dtype("float128"); }, {"unknown dtype", "float128", "float32"}));
  EXPECT_TRUE(throws_error([] { parse_dtype(""); }, {"unknown dtype"}));
}

}  // namespace
}  // namespace kiln
