// kiln's scalar conversions (convert<>() and Tensor::to()) bit for bit against PyTorch's CPU backend, from
// the table scripts/make_conversion_table.py wrote (tests/data/conversions.json), plus exhaustive checks
// of every f16 and bf16 pattern.
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/dispatch.h"
#include "test_util.h"

namespace kiln {
namespace {

const nlohmann::json& table() {
  static const nlohmann::json j = [] {
    std::ifstream f(KILN_TEST_DATA_DIR "/conversions.json");
    if (!f) throw std::runtime_error("cannot open " KILN_TEST_DATA_DIR "/conversions.json");
    return nlohmann::json::parse(f);
  }();
  return j;
}
const nlohmann::json& cpu() { return table().at("cpu"); }

std::vector<uint64_t> u64s(const nlohmann::json& j) { return j.get<std::vector<uint64_t>>(); }

double f64_from_bits(uint64_t b) {
  double d;
  std::memcpy(&d, &b, 8);
  return d;
}
uint64_t f64_bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

template <class S>
uint64_t bits_of(S v) {
  if constexpr (std::is_same_v<S, float>) return f32_to_bits(v);
  else if constexpr (std::is_same_v<S, double>) return f64_bits(v);
  else if constexpr (is_reduced_float_v<S>) return v.x;
  else if constexpr (std::is_same_v<S, bool>) return v ? 1 : 0;
  else return static_cast<uint64_t>(v) & (sizeof(S) == 8 ? ~0ull : ((1ull << (8 * sizeof(S))) - 1));
}


// Checks convert<To>(from) and Tensor::to() for every input against PyTorch's bits.
template <class From, class To>
void check_table(const std::vector<From>& inputs, const char* key, DType to_dtype) {
  SCOPED_TRACE(key);
  const auto want = u64s(cpu().at(key));
  ASSERT_EQ(want.size(), inputs.size());
  int bad = 0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const uint64_t got = bits_of(convert<To>(inputs[i]));
    if (got != want[i] && ++bad <= 10)
      ADD_FAILURE() << "convert: input bits 0x" << std::hex << bits_of(inputs[i]) << " -> 0x" << got
                    << ", torch 0x" << want[i];
  }
  const auto tb = test::raw_bits(from_vector<From>(inputs).to(to_dtype));
  int tbad = 0;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (tb[i] != want[i] && ++tbad <= 10)
      ADD_FAILURE() << "Tensor::to: input bits 0x" << std::hex << bits_of(inputs[i]) << " -> 0x" << tb[i]
                    << ", torch 0x" << want[i];
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(tbad, 0);
}

std::vector<float> f32_inputs() {
  std::vector<float> v;
  for (uint64_t b : u64s(cpu().at("f32_inputs"))) v.push_back(f32_from_bits(static_cast<uint32_t>(b)));
  return v;
}
std::vector<double> f64_inputs(const char* key) {
  std::vector<double> v;
  for (uint64_t b : u64s(cpu().at(key))) v.push_back(f64_from_bits(b));
  return v;
}

TEST(Conversion, Float8DecodesLikeTorch) {
  std::vector<Float8_e4m3fn> e4;
  std::vector<Float8_e5m2> e5;
  for (int i = 0; i < 256; ++i) {
    e4.emplace_back(static_cast<uint8_t>(i), FromBits{});
    e5.emplace_back(static_cast<uint8_t>(i), FromBits{});
  }
  check_table<Float8_e4m3fn, float>(e4, "e4m3_to_f32", DType::F32);
  check_table<Float8_e5m2, float>(e5, "e5m2_to_f32", DType::F32);
}

TEST(Conversion, F32ToHalfBFloatAndFloat8LikeTorch) {
  const auto x = f32_inputs();
  check_table<float, Half>(x, "f32_to_f16", DType::F16);
  check_table<float, BFloat16>(x, "f32_to_bf16", DType::BF16);
  check_table<float, Float8_e4m3fn>(x, "f32_to_e4m3", DType::F8E4M3);
  check_table<float, Float8_e5m2>(x, "f32_to_e5m2", DType::F8E5M2);
}

TEST(Conversion, F64RoundsLikeTorchIncludingDoubleRounding) {
  const auto d = f64_inputs("f64_inputs");
  check_table<double, float>(d, "f64_to_f32", DType::F32);
  check_table<double, Half>(d, "f64_to_f16", DType::F16);
  check_table<double, BFloat16>(d, "f64_to_bf16", DType::BF16);
  check_table<double, Float8_e4m3fn>(d, "f64_to_e4m3", DType::F8E4M3);
}

TEST(Conversion, FloatToIntegerOutOfRangeLikeTorch) {
  const auto d = f64_inputs("float_to_int_inputs");
  std::vector<float> f(d.begin(), d.end());
  const auto& t = cpu().at("float_to_int");
  auto run = [&](auto tag, const std::string& name, DType dt) {
    using To = typename decltype(tag)::type;
    for (const char* src : {"f32", "f64"}) {
      const std::string key = std::string(src) + "_to_" + name;
      SCOPED_TRACE(key);
      if (!t.at(key).is_array()) continue;  // torch refused this cast
      const auto want = u64s(t.at(key));
      for (size_t i = 0; i < d.size(); ++i) {
        const uint64_t got = src[1] == '3' ? bits_of(convert<To>(f[i])) : bits_of(convert<To>(d[i]));
        EXPECT_EQ(got, want[i]) << "input " << d[i];
      }
      const Tensor in = src[1] == '3' ? from_vector<float>(f) : from_vector<double>(d);
      EXPECT_EQ(test::raw_bits(in.to(dt)), want);
    }
  };
  run(TypeTag<uint8_t>{}, "u8", DType::U8);
  run(TypeTag<int8_t>{}, "i8", DType::I8);
  run(TypeTag<int16_t>{}, "i16", DType::I16);
  run(TypeTag<uint16_t>{}, "u16", DType::U16);
  run(TypeTag<int32_t>{}, "i32", DType::I32);
  run(TypeTag<uint32_t>{}, "u32", DType::U32);
  run(TypeTag<int64_t>{}, "i64", DType::I64);
  run(TypeTag<uint64_t>{}, "u64", DType::U64);
  run(TypeTag<bool>{}, "bool", DType::Bool);
}

// The CUDA backend converts on the device with the same definitions: the same bits as the CPU table (kiln
// follows PyTorch's CPU where PyTorch's own CUDA backend differs: NaN payloads, float->int overflow).
TEST(Conversion, CudaConvertsLikeTheCpuTable) {
  KILN_REQUIRE_CUDA();
  const Device gpu = cuda_device(0);
  auto check = [&](const Tensor& in, const char* key, DType dt) {
    SCOPED_TRACE(key);
    const auto want = u64s(cpu().at(key));
    const auto got = test::raw_bits(in.to(gpu).to(dt).to(kCPU));
    ASSERT_EQ(got.size(), want.size());
    int bad = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (got[i] != want[i] && ++bad <= 10) ADD_FAILURE() << "element " << i << ": 0x" << std::hex << got[i] << ", torch 0x" << want[i];
    EXPECT_EQ(bad, 0);
  };
  const Tensor x = from_vector<float>(f32_inputs());
  check(x, "f32_to_f16", DType::F16);
  check(x, "f32_to_bf16", DType::BF16);
  check(x, "f32_to_e4m3", DType::F8E4M3);
  check(x, "f32_to_e5m2", DType::F8E5M2);
  const Tensor d = from_vector<double>(f64_inputs("f64_inputs"));
  check(d, "f64_to_f32", DType::F32);
  check(d, "f64_to_f16", DType::F16);
  check(d, "f64_to_bf16", DType::BF16);
  check(d, "f64_to_e4m3", DType::F8E4M3);
  std::vector<uint8_t> codes(256);
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  check(from_vector<uint8_t>(codes).view_as_dtype(DType::F8E4M3), "e4m3_to_f32", DType::F32);
  check(from_vector<uint8_t>(codes).view_as_dtype(DType::F8E5M2), "e5m2_to_f32", DType::F32);
  const Tensor oor = from_vector<double>(f64_inputs("float_to_int_inputs"));
  const auto& t = cpu().at("float_to_int");
  for (auto [name, dt] : std::vector<std::pair<std::string, DType>>{
           {"i32", DType::I32}, {"u32", DType::U32}, {"i64", DType::I64}, {"u8", DType::U8}, {"i16", DType::I16}}) {
    const std::string key = "f64_to_" + name;
    if (!t.at(key).is_array()) continue;
    EXPECT_EQ(test::raw_bits(oor.to(gpu).to(dt).to(kCPU)), u64s(t.at(key))) << key;
  }
}

// Every f16 and bf16 pattern decodes to the f32 the format defines (computed independently here from
// sign, exponent and mantissa), and converting that f32 back gives the same pattern (NaNs stay NaN).
TEST(Conversion, AllHalfAndBFloat16PatternsDecodeExactly) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const int sign = (b >> 15) ? -1 : 1;
    // f16
    {
      const int e = (b >> 10) & 0x1F, m = b & 0x3FF;
      const float got = convert<float>(Half(static_cast<uint16_t>(b), FromBits{}));
      if (e == 31 && m != 0) {
        ASSERT_TRUE(std::isnan(got)) << b;
      } else {
        const double want = e == 31 ? sign * INFINITY
                            : e == 0 ? sign * std::ldexp(m, -24)
                                     : sign * std::ldexp(1024 + m, e - 25);
        ASSERT_EQ(f32_to_bits(got), f32_to_bits(static_cast<float>(want))) << "f16 0x" << std::hex << b;
        ASSERT_EQ(convert<Half>(got).x, b);
      }
    }
    // bf16
    {
      const int e = (b >> 7) & 0xFF, m = b & 0x7F;
      const float got = convert<float>(BFloat16(static_cast<uint16_t>(b), FromBits{}));
      if (e == 255 && m != 0) {
        ASSERT_TRUE(std::isnan(got)) << b;
      } else {
        const double want = e == 255 ? sign * INFINITY
                            : e == 0 ? sign * std::ldexp(m, -133)
                                     : sign * std::ldexp(128 + m, e - 134);
        ASSERT_EQ(f32_to_bits(got), f32_to_bits(static_cast<float>(want))) << "bf16 0x" << std::hex << b;
        ASSERT_EQ(convert<BFloat16>(got).x, b);
      }
    }
  }
  // Through tensors too.
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  const Tensor h = from_vector<uint16_t>(all).view_as_dtype(DType::F16).to(DType::F32);
  const auto hv = h.to_vector<float>();
  for (uint32_t b = 0; b < 65536; ++b)
    ASSERT_EQ(f32_to_bits(hv[b]), f32_to_bits(f16_bits_to_f32(static_cast<uint16_t>(b))));
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// Tensor::to between f32 and f16 / bf16 on contiguous tensors large enough for the chunked, threaded, vectorised
// conversion (cpu/copy.cpp): every element as the scalar conversion gives it, bit for bit, for every 16-bit
// pattern (twice over) and for random f32 bit patterns (NaNs, infinities, subnormals and ties among them).
TEST(Conversion, BulkTensorConversionsEqualTheScalarOnes) {
  std::vector<uint16_t> pat(2 * 65536);
  for (size_t i = 0; i < pat.size(); ++i) pat[i] = static_cast<uint16_t>(i);
  std::mt19937_64 gen(test::rng()());
  std::vector<float> f(200003);
  for (float& v : f) v = f32_from_bits(static_cast<uint32_t>(gen()));
  for (int k = 0; k < 4096; ++k) f[static_cast<size_t>(k)] = f32_from_bits(static_cast<uint32_t>(0x38000000u + (k << 12)));  // ties
  const Tensor ft = from_vector<float>(f);
  for (const DType d : {DType::F16, DType::BF16}) {
    SCOPED_TRACE(dtype_name(d));
    Tensor h = empty({static_cast<int64_t>(pat.size())}, d);
    std::memcpy(h.data_ptr(), pat.data(), pat.size() * 2);
    const auto wide = test::raw_bits(h.to(DType::F32));
    const auto narrow = test::raw_bits(ft.to(d));
    int bad = 0;
    for (size_t i = 0; i < pat.size(); ++i) {
      const float want = d == DType::F16 ? convert<float>(Half(pat[i], FromBits{})) : convert<float>(BFloat16(pat[i], FromBits{}));
      if (wide[i] != f32_to_bits(want) && ++bad <= 10) ADD_FAILURE() << "widen 0x" << std::hex << pat[i] << " -> 0x" << wide[i];
    }
    for (size_t i = 0; i < f.size(); ++i) {
      const uint64_t want = d == DType::F16 ? convert<Half>(f[i]).x : convert<BFloat16>(f[i]).x;
      if (narrow[i] != want && ++bad <= 10)
        ADD_FAILURE() << "narrow 0x" << std::hex << f32_to_bits(f[i]) << " -> 0x" << narrow[i] << ", want 0x" << want;
    }
    EXPECT_EQ(bad, 0);
  }
}

}  // namespace
}  // namespace kiln
