// Type promotion: promote_types over every dtype pair (against a table written by PyTorch 2.11) and
// result_type's priority categories.
#include <string>

#include "test_util.h"

namespace kiln::test {
namespace {

constexpr DType kAll[kNumDTypes] = {DType::Bool, DType::U8,   DType::I8,  DType::I16, DType::U16, DType::I32,
                                    DType::U32,  DType::I64,  DType::U64, DType::F16, DType::BF16, DType::F32,
                                    DType::F64,  DType::C64,  DType::F8E4M3, DType::F8E5M2};

// torch.promote_types(row, column), generated with PyTorch 2.11 in the order of kAll:
//   "x"      PyTorch's result;
//   "np:x"   PyTorch refuses the pair (uint16/32/64 with other integer types, and with complex); kiln follows
//            NumPy's promote_types there, the value shown;
//   "c128"   PyTorch gives complex128, which kiln lacks: kiln throws;
//   "np:c128" both PyTorch refuses and NumPy would need complex128: kiln gives complex64, as for every other
//            integer with complex64;
//   "X"      PyTorch refuses (float8 with any other type): kiln throws too.
const char* const kTable[kNumDTypes][kNumDTypes] = {
    {"b", "u8", "i8", "i16", "np:u16", "i32", "np:u32", "i64", "np:u64", "f16", "bf16", "f32", "f64", "c64", "X", "X"},
    {"u8", "u8", "i16", "i16", "np:u16", "i32", "np:u32", "i64", "np:u64", "f16", "bf16", "f32", "f64", "c64", "X", "X"},
    {"i8", "i16", "i8", "i16", "np:i32", "i32", "np:i64", "i64", "np:f64", "f16", "bf16", "f32", "f64", "c64", "X", "X"},
    {"i16", "i16", "i16", "i16", "np:i32", "i32", "np:i64", "i64", "np:f64", "f16", "bf16", "f32", "f64", "c64", "X", "X"},
    {"np:u16", "np:u16", "np:i32", "np:i32", "u16", "np:i32", "np:u32", "np:i64", "np:u64", "f16", "bf16", "f32", "f64", "np:c64", "X", "X"},
    {"i32", "i32", "i32", "i32", "np:i32", "i32", "np:i64", "i64", "np:f64", "f16", "bf16", "f32", "f64", "c64", "X", "X"},
    {"np:u32", "np:u32", "np:i64", "np:i64", "np:u32", "np:i64", "u32", "np:i64", "np:u64", "f16", "bf16", "f32", "f64", "np:c128", "X", "X"},
    {"i64", "i64", "i64", "i64", "np:i64", "i64", "np:i64", "i64", "np:f64", "f16", "bf16", "f32", "f64", "c64", "X", "X"},
    {"np:u64", "np:u64", "np:f64", "np:f64", "np:u64", "np:f64", "np:u64", "np:f64", "u64", "f16", "bf16", "f32", "f64", "np:c128", "X", "X"},
    {"f16", "f16", "f16", "f16", "f16", "f16", "f16", "f16", "f16", "f16", "f32", "f32", "f64", "c64", "X", "X"},
    {"bf16", "bf16", "bf16", "bf16", "bf16", "bf16", "bf16", "bf16", "bf16", "f32", "bf16", "f32", "f64", "c64", "X", "X"},
    {"f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f64", "c64", "X", "X"},
    {"f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "c128", "X", "X"},
    {"c64", "c64", "c64", "c64", "np:c64", "c64", "np:c128", "c64", "np:c128", "c64", "c64", "c64", "c128", "c64", "X", "X"},
    {"X", "X", "X", "X", "X", "X", "X", "X", "X", "X", "X", "X", "X", "X", "e4m3", "X"},
    {"X", "X", "X", "X", "X", "X", "X", "X", "X", "X", "X", "X", "X", "X", "X", "e5m2"},
};

DType short_dtype(std::string s) {
  if (s == "b") return DType::Bool;
  if (s == "e4m3") return DType::F8E4M3;
  if (s == "e5m2") return DType::F8E5M2;
  return parse_dtype(s);
}

TEST(PromoteTypes, MatchesPyTorchTableAndNumPyWherePyTorchRefuses) {
  for (int i = 0; i < kNumDTypes; ++i) {
    for (int j = 0; j < kNumDTypes; ++j) {
      const DType a = kAll[i], b = kAll[j];
      std::string e = kTable[i][j];
      SCOPED_TRACE(std::string(dtype_name(a)) + " with " + dtype_name(b) + ": expected " + e);
      if (e == "X" || e == "c128") {
        EXPECT_THROW(promote_types(a, b), Error);
        continue;
      }
      if (e == "np:c128") e = "c64";
      if (e.rfind("np:", 0) == 0) e = e.substr(3);
      EXPECT_EQ(promote_types(a, b), short_dtype(e));
      // result_type of two tensors with dims is promote_types.
      EXPECT_EQ(result_type({empty({1}, a), empty({2}, b)}), short_dtype(e));
    }
  }
}

TEST(PromoteTypes, Float8MixErrorNamesBothTypes) {
  EXPECT_TRUE(throws_error([] { promote_types(DType::F8E4M3, DType::F32); }, {"float8_e4m3fn", "float32"}));
}

Tensor t1(DType t) { return empty({3}, t); }
Tensor t0(DType t) { return empty({}, t); }

TEST(ResultType, DimTensorsOutrankZeroDimWithinACategory) {
  EXPECT_EQ(result_type({t1(DType::U8), t0(DType::I64)}), DType::U8);
  EXPECT_EQ(result_type({t1(DType::F16), t0(DType::F64)}), DType::F16);
  EXPECT_EQ(result_type({t1(DType::I8), t0(DType::I32)}), DType::I8);
  EXPECT_EQ(result_type({t1(DType::Bool), t0(DType::I8)}), DType::I8);  // bool is raised to integer
}

TEST(ResultType, LowerPriorityOperandRaisesTheCategory) {
  // A 0-d float keeps its own dtype when it raises an integer tensor (c10 promotes the two).
  EXPECT_EQ(result_type({t1(DType::I32), t0(DType::F64)}), DType::F64);
  EXPECT_EQ(result_type({t1(DType::Bool), t0(DType::F16)}), DType::F16);
  EXPECT_EQ(result_type({t0(DType::I64), t0(DType::F16)}), DType::F16);
  EXPECT_EQ(result_type({t0(DType::I32), t0(DType::I64)}), DType::I64);
  EXPECT_EQ(result_type({t1(DType::I32), t0(DType::C64)}), DType::C64);
}

TEST(ResultType, ScalarsCountByCategoryOnly) {
  EXPECT_EQ(result_type({t1(DType::I32)}, {2.5}), DType::F32);  // a float Scalar is the default float
  EXPECT_EQ(result_type({t1(DType::F16)}, {2.5}), DType::F16);
  EXPECT_EQ(result_type({t1(DType::Bool)}, {1}), DType::I64);
  EXPECT_EQ(result_type({t1(DType::U8)}, {-1}), DType::U8);
  EXPECT_EQ(result_type({t1(DType::I8)}, {1000}), DType::I8);
  EXPECT_EQ(result_type({t1(DType::Bool)}, {true}), DType::Bool);
  EXPECT_EQ(result_type({t0(DType::I32)}, {2.5}), DType::F32);
  EXPECT_EQ(result_type({t0(DType::Bool)}, {2}), DType::I64);
  EXPECT_EQ(result_type({t1(DType::I32)}, {Complex64(1.f, 1.f)}), DType::C64);
  EXPECT_EQ(result_type({}, {1, 2.5}), DType::F32);
  EXPECT_EQ(result_type({}, {1}), DType::I64);
  // A 0-d tensor outranks a Scalar.
  EXPECT_EQ(result_type({t0(DType::I16)}, {7}), DType::I16);
  EXPECT_EQ(result_type({t0(DType::F64)}, {7.5}), DType::F64);
}

TEST(ResultType, NeedsAnOperand) {
  EXPECT_TRUE(throws_error([] { result_type({}, {}); }, {"result_type"}));
}

}  // namespace
}  // namespace kiln::test
