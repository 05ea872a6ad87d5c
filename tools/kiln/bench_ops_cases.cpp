// The case table of `kiln bench ops`: the decode-time shapes of the models kiln targets (Llama 3, Qwen 2.5,
// Qwen 3 at 0.5B-70B sizes), and torch.linalg on batches of small matrices and a few larger ones.
//
// Adding cases (attention, MoE, FP8, ...): write a builder like linear_case below that fills name, bytes,
// copy_bytes (and max_copies if the op is slow) and a `make` that allocates one copy of fresh random inputs
// and returns the call; then add its rows to op_cases(). Add the same case, with the same name and bytes, to
// CASES in bench/torch_ops.py (the PyTorch side); `kiln bench ops --list` and `bench/torch_ops.py --list`
// must print identical tables (tools/kiln/CMakeLists.txt tests that when Python is present).
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "bench_ops.h"
#include "kiln/linalg.h"
#include "kiln/nn.h"
#include "kiln/ops.h"
#include "kiln/runtime.h"

namespace kiln::cli {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Compact decimal for sampling parameters in names: 0.7 -> "0.7", 1 -> "1".
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

const char* dtype_tag(DType d) {
  switch (d) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F64: return "f64";
    case DType::C64: return "c64";
    default: return "other";
  }
}

int64_t nb(int64_t numel, DType d) { return numel * static_cast<int64_t>(itemsize(d)); }

// Fresh normal(0, std) values on the device: never zeros, never the same buffer twice.
Tensor rnd(const Shape& shape, DType d, Device dev, double std = 1.0) {
  Tensor t = empty(shape, d, dev);
  normal_(t, 0.0, std);
  return t;
}

// A model's weight: marked constant (Storage::set_constant) once written, as the engine marks its own, so the
// one-row products stream it as they do in a decode step (starting while the kernel before them ends).
Tensor weight(Tensor t) {
  mark_constant(t);
  return t;
}

constexpr DType kBF16 = DType::BF16;
constexpr double kEps = 1e-6;

// y[M, N] = x[M, K] @ w[N, K]^T (+ b[N]), bf16. Many copies for small weights: each call's weight comes
// from HBM, as in a model whose layers together are far larger than L2.
OpCase linear_case(int64_t m, int64_t k, int64_t n, bool bias) {
  OpCase c;
  c.name = "linear/bf16/M" + str(m) + "/K" + str(k) + "/N" + str(n) + (bias ? "/bias" : "");
  c.copy_bytes = nb(m * k + n * k + (bias ? n : 0), kBF16);
  c.bytes = c.copy_bytes + nb(m * n, kBF16);
  c.max_copies = 2048;
  c.make = [=](Device dev) -> BenchCall {
    Tensor x = rnd({m, k}, kBF16, dev), w = weight(rnd({n, k}, kBF16, dev, 0.02));
    std::optional<Tensor> b;
    if (bias) b = weight(rnd({n}, kBF16, dev, 0.02));
    return [x, w, b] { (void)linear(x, w, b); };
  };
  return c;
}

// softmax / log_softmax over the last dim of [rows, cols], output in the input dtype.
OpCase softmax_case(bool log, DType d, int64_t rows, int64_t cols) {
  OpCase c;
  c.name = std::string(log ? "log_softmax/" : "softmax/") + dtype_tag(d) + "/" + str(rows) + "x" + str(cols);
  c.copy_bytes = nb(rows * cols, d);
  c.bytes = 2 * c.copy_bytes;
  c.make = [=](Device dev) -> BenchCall {
    Tensor x = rnd({rows, cols}, d, dev, 4.0);
    if (log) return [x] { (void)log_softmax(x, -1); };
    return [x] { (void)softmax(x, -1); };
  };
  return c;
}

// rms_norm of [rows, d] bf16 with weight [d] (rows = 1: the hidden state of one token; rows = heads, d = 128:
// Qwen 3's per-head q/k norm).
OpCase rms_norm_case(int64_t rows, int64_t d) {
  OpCase c;
  c.name = "rms_norm/bf16/" + str(rows) + "x" + str(d);
  c.copy_bytes = nb(rows * d + d, kBF16);
  c.bytes = c.copy_bytes + nb(rows * d, kBF16);
  c.make = [=](Device dev) -> BenchCall {
    Tensor x = rnd({rows, d}, kBF16, dev), w = rnd({d}, kBF16, dev);
    return [x, w] { (void)rms_norm(x, w, kEps); };
  };
  return c;
}

// residual += x; out = rms_norm(residual): reads x, residual and weight, writes residual and out. The
// residual grows by x each call (a few hundred calls per copy keep it far from bf16's range).
OpCase add_rms_norm_case(int64_t rows, int64_t d) {
  OpCase c;
  c.name = "add_rms_norm/bf16/" + str(rows) + "x" + str(d);
  c.copy_bytes = nb(2 * rows * d + d, kBF16);
  c.bytes = c.copy_bytes + nb(2 * rows * d, kBF16);
  c.make = [=](Device dev) -> BenchCall {
    Tensor x = rnd({rows, d}, kBF16, dev), res = rnd({rows, d}, kBF16, dev), w = rnd({d}, kBF16, dev);
    return [x, res, w]() mutable { (void)add_rms_norm(x, res, w, kEps); };
  };
  return c;
}

// rope_ in place on q [T, Hq, D] and k [T, Hk, D] bf16 at i64 positions, inv_freq precomputed (theta 1e6)
// as a model does once at load. Reads and writes q and k, reads positions and inv_freq.
OpCase rope_case(int64_t t, int64_t hq, int64_t hk, int64_t d) {
  OpCase c;
  c.name = "rope/bf16/T" + str(t) + "/Hq" + str(hq) + "/Hk" + str(hk) + "/D" + str(d);
  c.copy_bytes = nb(t * (hq + hk) * d, kBF16) + nb(t, DType::I64) + nb(d / 2, DType::F32);
  c.bytes = c.copy_bytes + nb(t * (hq + hk) * d, kBF16);
  c.make = [=](Device dev) -> BenchCall {
    Tensor q = rnd({t, hq, d}, kBF16, dev), k = rnd({t, hk, d}, kBF16, dev);
    Tensor pos = randint(0, 32768, {t}, DType::I64, dev);
    Tensor inv_freq = rope_inv_freq(d, 1e6, dev);
    return [q, k, pos, inv_freq]() mutable { rope_(q, k, pos, inv_freq); };
  };
  return c;
}

// silu(gate_up[:, :I]) * gate_up[:, I:] for one token, bf16.
// The graph-replayed cost of launching one tiny kernel (a 1-element fill): the "launch latency" term of the
// issue's bound for the small decode ops (bytes once at copy speed + this).
OpCase launch_case() {
  OpCase c;
  c.name = "launch/bf16/fill1";
  c.copy_bytes = 2;
  c.bytes = 2;
  c.make = [](Device dev) -> BenchCall {
    Tensor x = rnd({1}, kBF16, dev);
    return [x]() mutable { x.fill_(1.0); };
  };
  return c;
}

OpCase silu_and_mul_case(int64_t inter) {
  OpCase c;
  c.name = "silu_and_mul/bf16/M1/I" + str(inter);
  c.copy_bytes = nb(2 * inter, kBF16);
  c.bytes = c.copy_bytes + nb(inter, kBF16);
  c.make = [=](Device dev) -> BenchCall {
    Tensor x = rnd({1, 2 * inter}, kBF16, dev);
    return [x] { (void)silu_and_mul(x); };
  };
  return c;
}

// FP8 (e4m3) operands with f32 scales around 1e-2 (checkpoint-like magnitudes).
Tensor rnd_scales(const Shape& shape, Device dev) {
  Tensor t = empty(shape, DType::F32, dev);
  uniform_(t, 0.005, 0.02);
  return t;
}

// linear(x, Fp8Weight): x [M, K] bf16, weight [N, K] e4m3 with 128 x 128 block scales (DeepSeek-V3 / Qwen FP8
// checkpoints), output bf16. Compare with linear/bf16 at the same shape: half the weight bytes.
OpCase linear_fp8_case(int64_t m, int64_t k, int64_t n) {
  OpCase c;
  c.name = "linear_fp8/e4m3/M" + str(m) + "/K" + str(k) + "/N" + str(n);
  const int64_t scales = ((n + 127) / 128) * ((k + 127) / 128);
  c.copy_bytes = nb(m * k, kBF16) + n * k + nb(scales, DType::F32);
  c.bytes = c.copy_bytes + nb(m * n, kBF16);
  c.max_copies = 2048;
  c.make = [=](Device dev) -> BenchCall {
    Tensor x = rnd({m, k}, kBF16, dev);
    Fp8Weight w{weight(rnd({n, k}, kBF16, dev, 50.0).to(DType::F8E4M3)),
                weight(rnd_scales({(n + 127) / 128, (k + 127) / 128}, dev)), ScaleRecipe::BlockWise, 128, 128};
    return [x, w] { (void)linear(x, w); };
  };
  return c;
}

// GGUF super-blocks of `bytes` per 256 values, [n, k / 256 x bytes] on the host: random bytes (every code and
// scale valid) with the f16 factors at byte offsets `factors` of each block (Q5_K's d and dmin, Q6_K's d) set
// to 1e-4, so that the values stay within about 0.1.
Tensor random_super_blocks(int64_t n, int64_t k, int64_t bytes, std::initializer_list<int64_t> factors) {
  Tensor b = empty({n, k / 256 * bytes}, DType::U8);
  uint8_t* p = b.data<uint8_t>();
  std::mt19937_64 rng(static_cast<uint64_t>(n * 31 + k));
  for (int64_t i = 0; i < b.numel(); ++i) p[i] = static_cast<uint8_t>(rng());
  const uint16_t d = f32_to_f16_bits(1e-4f);
  for (int64_t i = 0; i < n * (k / 256); ++i)
    for (const int64_t at : factors) std::memcpy(p + i * bytes + at, &d, 2);
  return b;
}

// linear(x, Q8Weight | Q4KWeight | Q5KWeight | Q6KWeight): x [M, K] bf16, the weight quantised on the host from
// N(0, 0.02) values (Q5_K, Q6_K, which kiln does not quantise to: random blocks), output bf16. Compare with
// linear/bf16 at the same shape: 1.0625 (q8_0), 0.5625 (q4_k), 0.6875 (q5_k), 0.8203 (q6_k) bytes a weight,
// not 2.
OpCase linear_quant_case(const std::string& fmt, int64_t m, int64_t k, int64_t n) {
  OpCase c;
  c.name = "linear_" + fmt + "/bf16/M" + str(m) + "/K" + str(k) + "/N" + str(n);
  const int64_t super = fmt == "q4_k" ? 144 : fmt == "q5_k" ? 176 : fmt == "q6_k" ? 210 : 0;
  c.copy_bytes = nb(m * k, kBF16) + (super ? n * k / 256 * super : n * k + n * k / 32 * 2);
  c.bytes = c.copy_bytes + nb(m * n, kBF16);
  c.max_copies = 512;
  c.make = [=](Device dev) -> BenchCall {
    Tensor x = rnd({m, k}, kBF16, dev);
    if (fmt == "q5_k") {
      const Q5KWeight q{weight(random_super_blocks(n, k, 176, {0, 2}).to(dev))};
      return [x, q] { (void)linear(x, q); };
    }
    if (fmt == "q6_k") {
      const Q6KWeight q{weight(random_super_blocks(n, k, 210, {208}).to(dev))};
      return [x, q] { (void)linear(x, q); };
    }
    const Tensor w = rnd({n, k}, DType::F32, kCPU, 0.02);
    if (fmt == "q4_k") {
      const Q4KWeight q{weight(quantize_q4_k(w).blocks.to(dev))};
      return [x, q] { (void)linear(x, q); };
    }
    const Q8Weight q0 = quantize_q8_0(w);
    const Q8Weight q{weight(q0.values.to(dev)), weight(q0.scales.to(dev))};
    return [x, q] { (void)linear(x, q); };
  };
  return c;
}

// scaled_mm(a [M, K] e4m3, b = W^T with W [N, K] e4m3, tensor- or row-wise f32 scales) -> bf16, as
// torch._scaled_mm(a, W.t(), ...). Compare with linear/bf16 at the same (M, K, N).
OpCase scaled_mm_case(ScaleRecipe r, int64_t m, int64_t k, int64_t n) {
  OpCase c;
  const bool row = r == ScaleRecipe::RowWise;
  c.name = std::string("scaled_mm/e4m3/") + (row ? "row" : "tensor") + "/M" + str(m) + "/K" + str(k) + "/N" + str(n);
  c.copy_bytes = m * k + n * k + nb(row ? m + n : 2, DType::F32);
  c.bytes = c.copy_bytes + nb(m * n, kBF16);
  c.max_copies = 2048;
  c.make = [=](Device dev) -> BenchCall {
    Tensor a = rnd({m, k}, kBF16, dev, 50.0).to(DType::F8E4M3);
    Tensor w = weight(rnd({n, k}, kBF16, dev, 50.0).to(DType::F8E4M3));
    Tensor sa = rnd_scales(row ? Shape{m, 1} : Shape{1}, dev), sb = weight(rnd_scales(row ? Shape{1, n} : Shape{1}, dev));
    return [a, w, sa, sb, r] { (void)scaled_mm(a, w.t(), sa, sb, r, std::nullopt, kBF16); };
  };
  return c;
}

// One token from f32 logits [1, V] (Hugging Face samples from f32 logits). Logits are normal with std 4, so
// that a few hundred tokens hold most of the probability, as in a language model's output. Capped at 64
// copies: these ops are slow enough that L2 residency of the 0.5 MB of logits hardly matters, and PyTorch's
// sort-based top-p would otherwise take minutes.
OpCase sample_case(int64_t vocab, double temperature, int64_t top_k, double top_p) {
  OpCase c;
  std::string variant;
  if (temperature == 0) {
    variant = "greedy";
  } else {
    variant = "t" + num(temperature);
    if (top_k > 0) variant += "_k" + str(top_k);
    if (top_p < 1) variant += "_p" + num(top_p);
  }
  c.name = "sample/f32/1x" + str(vocab) + "/" + variant;
  c.copy_bytes = nb(vocab, DType::F32);
  c.bytes = c.copy_bytes + nb(1, DType::I64);
  c.max_copies = 64;
  c.make = [=](Device dev) -> BenchCall {
    Tensor logits = rnd({1, vocab}, DType::F32, dev, 4.0);
    SamplingParams p;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    return [logits, p] { (void)sample(logits, p); };
  };
  return c;
}

// Decode attention of one new token over a bf16 KV cache of L positions: q [1, Hq, 1, D], k/v caches
// [1, Hkv, L, D] (full: the length on the device is L). Moves the whole cache once.
OpCase decode_attention_case(int64_t hq, int64_t hkv, int64_t d, int64_t l) {
  OpCase c;
  c.name = "decode_attention/bf16/Hq" + str(hq) + "/Hkv" + str(hkv) + "/D" + str(d) + "/L" + str(l);
  c.copy_bytes = nb(hq * d + 2 * hkv * l * d, kBF16) + nb(1, DType::I32);
  c.bytes = c.copy_bytes + nb(hq * d, kBF16);
  c.make = [=](Device dev) -> BenchCall {
    Tensor q = rnd({1, hq, 1, d}, kBF16, dev), k = rnd({1, hkv, l, d}, kBF16, dev), v = rnd({1, hkv, l, d}, kBF16, dev);
    Tensor lengths = full({1}, l, DType::I32, dev);
    return [q, k, v, lengths] { (void)decode_attention(q, k, v, lengths); };
  };
  return c;
}

// Mixture-of-experts shapes (E experts, hidden H, expert intermediate I), top-8 routing as Qwen3-MoE.
struct MoeShape {
  int64_t e, h, i;
};
constexpr int64_t kMoeTopk = 8;

std::string moe_shape_tag(const MoeShape& m) {
  return "E" + str(m.e) + "_H" + str(m.h) + "_I" + str(m.i);
}

// grouped_mm (2d x 3d, the MoE form) of T tokens routed to 8 experts each: a [8T, K] sorted by expert,
// b = w.transpose(-2, -1) for expert weights w [E, N, K] (gate_up: N = 2I, K = H; down: N = H, K = I), offs
// int32 cumulative ends. T = 1 (decode): the 8 rows in 8 different experts; each copy takes a disjoint set
// of experts of one shared weight tensor (copy i: experts i, i + E/8, ...), so consecutive calls read
// different experts, as consecutive layers would. T > 1 (prefill): 8T / E rows per expert (every expert
// busy). bytes = the selected experts' weights + a + out + offs.
OpCase grouped_mm_case(const MoeShape& m, int64_t t, bool gate_up) {
  const int64_t n = gate_up ? 2 * m.i : m.h, k = gate_up ? m.h : m.i;
  const int64_t rows = t * kMoeTopk;
  const int64_t used = t == 1 ? kMoeTopk : m.e;
  OpCase c;
  c.name = "grouped_mm/bf16/T" + str(t) + "/" + moe_shape_tag(m) + (gate_up ? "/gate_up" : "/down");
  c.bytes = nb(used * n * k + rows * k + rows * n, kBF16) + nb(m.e, DType::I32);
  c.copy_bytes = nb(used * n * k + rows * k, kBF16) + nb(m.e, DType::I32);
  c.max_copies = t == 1 ? static_cast<int>(m.e / kMoeTopk) : 256;
  struct Shared {
    Tensor w;
    int64_t next = 0;
  };
  auto shared = std::make_shared<Shared>();
  c.make = [=](Device dev) -> BenchCall {
    if (!shared->w.defined()) shared->w = rnd({m.e, n, k}, kBF16, dev, 0.02);
    std::vector<int32_t> ends(static_cast<size_t>(m.e));
    if (t == 1) {
      const int64_t set = shared->next++ % (m.e / kMoeTopk), stride = m.e / kMoeTopk;
      int32_t r = 0;
      for (int64_t e = 0; e < m.e; ++e) ends[static_cast<size_t>(e)] = r += (e % stride == set) ? 1 : 0;
    } else {
      for (int64_t e = 0; e < m.e; ++e) ends[static_cast<size_t>(e)] = static_cast<int32_t>((e + 1) * rows / m.e);
    }
    Tensor a = rnd({rows, k}, kBF16, dev), offs = from_vector<int32_t>(ends).to(dev);
    Tensor b = shared->w.transpose(1, 2);
    return [a, b, offs] { (void)grouped_mm(a, b, offs); };
  };
  return c;
}

// The MoE block of one token over FP8 experts (e4m3, 128 x 128 block scales; bf16 x and router): compare with
// moe/bf16/T1 at the same shape (PyTorch side: gather, dequantise and bmm the selected experts). bytes = the router, the 8 selected experts' FP8 values and scales, x, out.
OpCase moe_fp8_case(const MoeShape& m) {
  const int64_t expert = 3 * m.i * m.h;
  const int64_t expert_scales = ((2 * m.i + 127) / 128) * ((m.h + 127) / 128) + ((m.h + 127) / 128) * ((m.i + 127) / 128);
  OpCase c;
  c.name = "moe/e4m3/T1/" + moe_shape_tag(m) + "/top" + str(kMoeTopk);
  c.copy_bytes = nb(m.e * m.h + m.h, kBF16) + kMoeTopk * (expert + nb(expert_scales, DType::F32));
  c.bytes = c.copy_bytes + nb(m.h, kBF16);
  c.max_copies = 64;
  struct Shared {
    Tensor router;
    Fp8Experts e;
  };
  auto shared = std::make_shared<Shared>();
  c.make = [=](Device dev) -> BenchCall {
    if (!shared->router.defined()) {
      shared->router = rnd({m.e, m.h}, kBF16, dev, 0.02);
      shared->e = Fp8Experts{rnd({m.e, 2 * m.i, m.h}, kBF16, dev, 50.0).to(DType::F8E4M3),
                             rnd_scales({m.e, (2 * m.i + 127) / 128, (m.h + 127) / 128}, dev),
                             rnd({m.e, m.h, m.i}, kBF16, dev, 50.0).to(DType::F8E4M3),
                             rnd_scales({m.e, (m.h + 127) / 128, (m.i + 127) / 128}, dev), 128, 128};
    }
    Tensor x = rnd({1, m.h}, kBF16, dev);
    const Shared s = *shared;
    return [x, s] { (void)moe_forward(x, s.router, s.e, kMoeTopk, true); };
  };
  return c;
}

// Causal prefill of L tokens, bf16, grouped heads: q [1, Hq, L, D], k/v [1, Hkv, L, D]. FLOPs (for TFLOP/s):
// 2 * 2 * Hq * D * L * (L + 1) / 2.
OpCase prefill_attention_case(int64_t hq, int64_t hkv, int64_t d, int64_t l) {
  OpCase c;
  c.name = "sdpa_prefill/bf16/Hq" + str(hq) + "/Hkv" + str(hkv) + "/D" + str(d) + "/L" + str(l) + "/causal";
  c.copy_bytes = nb((hq + 2 * hkv) * l * d, kBF16);
  c.bytes = c.copy_bytes + nb(hq * l * d, kBF16);
  c.max_copies = 16;
  c.make = [=](Device dev) -> BenchCall {
    Tensor q = rnd({1, hq, l, d}, kBF16, dev), k = rnd({1, hkv, l, d}, kBF16, dev), v = rnd({1, hkv, l, d}, kBF16, dev);
    return [q, k, v] { (void)scaled_dot_product_attention(q, k, v, std::nullopt, true, std::nullopt, true); };
  };
  return c;
}

// The sparse MoE block (router linear, softmax f32, top-8, renormalise, gate_up with SiLU-mul, down,
// weighted combine) for T tokens of random hidden states; weights shared by the copies. bytes = the
// router, the experts the tokens select (8 for one token, all E for 512) + x + out.
OpCase moe_case(const MoeShape& m, int64_t t) {
  const int64_t used = t == 1 ? kMoeTopk : m.e;
  const int64_t expert = 3 * m.i * m.h;
  OpCase c;
  c.name = "moe/bf16/T" + str(t) + "/" + moe_shape_tag(m) + "/top" + str(kMoeTopk);
  c.copy_bytes = nb(m.e * m.h + used * expert + t * m.h, kBF16);
  c.bytes = c.copy_bytes + nb(t * m.h, kBF16);
  c.max_copies = 64;
  struct Shared {
    Tensor router, gate_up, down;
  };
  auto shared = std::make_shared<Shared>();
  c.make = [=](Device dev) -> BenchCall {
    if (!shared->router.defined()) {
      shared->router = rnd({m.e, m.h}, kBF16, dev, 0.02);
      shared->gate_up = rnd({m.e, 2 * m.i, m.h}, kBF16, dev, 0.02);
      shared->down = rnd({m.e, m.h, m.i}, kBF16, dev, 0.02);
    }
    Tensor x = rnd({t, m.h}, kBF16, dev);
    const Shared s = *shared;
    return [x, s] { (void)moe_forward(x, s.router, s.gate_up, s.down, kMoeTopk, true); };
  };
  return c;
}

// Normal entries plus n I (well-conditioned; complex: both parts normal); `spd`: M M^T + n I instead.
Tensor well_conditioned(const Shape& shape, DType d, Device dev, bool spd) {
  const int64_t n = shape.back();
  Tensor a = empty(shape, d, dev);
  if (d == DType::C64) {
    Tensor parts = view_as_real(a);
    normal_(parts);
  } else {
    normal_(a);
  }
  if (spd) a = matmul(a, a.transpose(-2, -1));
  return add(a, mul(eye(n, std::nullopt, d, dev), Scalar(static_cast<double>(n))));
}

// kiln::linalg's `op` ("inv", "inv_ex", "det", "solve" with one right-hand vector, "lu_factor", "cholesky") on
// `shape` [..., n, n]; bench/linalg.py's shapes and the issue's. The plain forms (inv, solve, lu_factor, cholesky)
// read info on the host to raise, as torch.linalg's do: eager time only (OpCase::graph). bytes: A (and b) read,
// the results written (inv_ex: with info; lu_factor: LU and the int32 pivots).
OpCase linalg_case(const std::string& op, DType d, const Shape& shape) {
  const int64_t n = shape.back(), mats = checked_numel(shape) / (n * n);
  std::string dims;
  for (const int64_t v : shape) dims += (dims.empty() ? "" : "x") + str(v);
  OpCase c;
  c.name = "linalg/" + op + "/" + dtype_tag(d) + "/" + dims + (op == "solve" ? "/rhs1" : "");
  const int64_t a_bytes = nb(mats * n * n, d);
  c.copy_bytes = a_bytes + (op == "solve" ? nb(mats * n, d) : 0);
  int64_t out = a_bytes;
  if (op == "inv_ex") out += nb(mats, DType::I32);
  if (op == "det") out = nb(mats, d);
  if (op == "solve") out = nb(mats * n, d);
  if (op == "lu_factor") out += nb(mats * n, DType::I32);
  c.bytes = c.copy_bytes + out;
  c.graph = op == "inv_ex" || op == "det";
  c.make = [=](Device dev) -> BenchCall {
    const Tensor a = well_conditioned(shape, d, dev, op == "cholesky");
    if (op == "inv") return [a] { (void)linalg::inv(a); };
    if (op == "inv_ex") return [a] { (void)linalg::inv_ex(a); };
    if (op == "det") return [a] { (void)linalg::det(a); };
    if (op == "lu_factor") return [a] { (void)linalg::lu_factor(a); };
    if (op == "cholesky") return [a] { (void)linalg::cholesky(a); };
    const Tensor b = rnd(Shape(shape.begin(), shape.end() - 1), d, dev);
    return [a, b] { (void)linalg::solve(a, b); };
  };
  return c;
}

// ---- torch.nn.functional's counting, padding, dropout, convolution, norms and losses -----------------------

std::string dims(const Shape& shape) {
  std::string out;
  for (const int64_t v : shape) out += (out.empty() ? "" : "x") + str(v);
  return out;
}

// bincount of n int64 values in [0, bins) into `bins` int64 counts. Both sides read the input's maximum to size
// the output (a host synchronisation): eager time only.
OpCase bincount_case(int64_t n, int64_t bins) {
  OpCase c;
  c.name = "bincount/i64/" + str(n) + "/bins" + str(bins);
  c.copy_bytes = nb(n, DType::I64);
  c.bytes = c.copy_bytes + nb(bins, DType::I64);
  c.graph = false;
  c.make = [=](Device dev) -> BenchCall {
    const Tensor x = randint(0, bins, {n}, DType::I64, dev);
    return [x, bins] { (void)bincount(x, std::nullopt, bins); };
  };
  return c;
}

// pad of the last three dims of a 5-D tensor by p on every side (a video VAE pads so before its convolutions).
OpCase pad_case(const std::string& mode, DType d, const Shape& shape, int64_t p) {
  OpCase c;
  c.name = "pad/" + mode + "/" + dtype_tag(d) + "/" + dims(shape) + "/p" + str(p);
  int64_t in = 1, out = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    in *= shape[i];
    out *= shape[i] + (i + 3 >= shape.size() ? 2 * p : 0);
  }
  c.copy_bytes = nb(in, d);
  c.bytes = c.copy_bytes + nb(out, d);
  c.make = [=](Device dev) -> BenchCall {
    const Tensor x = rnd(shape, d, dev);
    return [x, mode, p] { (void)pad(x, std::vector<int64_t>(6, p), mode); };
  };
  return c;
}

// dropout in training: reads x, writes the output. Eager time only (each call draws a new mask).
OpCase dropout_case(DType d, int64_t n, double p) {
  OpCase c;
  c.name = "dropout/" + std::string(dtype_tag(d)) + "/" + str(n) + "/p" + num(p);
  c.copy_bytes = nb(n, d);
  c.bytes = 2 * c.copy_bytes;
  c.graph = false;
  c.make = [=](Device dev) -> BenchCall {
    const Tensor x = rnd({n}, d, dev);
    return [x, p] { (void)dropout(x, p, true); };
  };
  return c;
}

// conv2d / conv3d, stride 1, with bias: input [N, C, *spatial], weight [C_out, C, *kernel], padding per dim.
OpCase conv_case(DType d, const Shape& x_shape, const Shape& w_shape, const Shape& padding) {
  OpCase c;
  const size_t sd = w_shape.size() - 2;
  std::string pads;
  for (const int64_t v : padding) pads += str(v);
  c.name = "conv" + str(static_cast<int64_t>(sd)) + "d/" + dtype_tag(d) + "/" + dims(x_shape) + "/w" + dims(w_shape) +
           "/p" + pads;
  int64_t out = x_shape[0] * w_shape[0];
  for (size_t i = 0; i < sd; ++i) out *= x_shape[2 + i] + 2 * padding[i] - w_shape[2 + i] + 1;
  c.copy_bytes = nb(checked_numel(x_shape) + checked_numel(w_shape) + w_shape[0], d);
  c.bytes = c.copy_bytes + nb(out, d);
  c.max_copies = 16;
  c.make = [=](Device dev) -> BenchCall {
    const Tensor x = rnd(x_shape, d, dev), w = weight(rnd(w_shape, d, dev, 0.02)), b = weight(rnd({w_shape[0]}, d, dev, 0.02));
    return [x, w, b, padding] { (void)conv(x, w, b, {1}, padding); };
  };
  return c;
}

// layer_norm over the last dim (weight and bias in x's dtype), group_norm (weight and bias [C]), batch_norm with
// f32 running statistics, weight and bias (eval: normalised by them; train: by the batch's, which update them).
OpCase norm_case(const std::string& op, DType d, const Shape& shape, int64_t groups = 0, bool training = false) {
  OpCase c;
  const int64_t n = checked_numel(shape), ch = op == "layer_norm" ? shape.back() : shape[1];
  c.name = op + "/" + dtype_tag(d) + "/" + dims(shape);
  if (op == "group_norm") c.name += "/G" + str(groups);
  if (op == "batch_norm") c.name += training ? "/train" : "/eval";
  const int64_t params = op == "batch_norm" ? nb(4 * ch, DType::F32) : nb(2 * ch, d);
  c.copy_bytes = nb(n, d) + params;
  c.bytes = c.copy_bytes + nb(n, d) + (op == "batch_norm" && training ? nb(2 * ch, DType::F32) : 0);
  c.make = [=](Device dev) -> BenchCall {
    const Tensor x = rnd(shape, d, dev);
    if (op == "layer_norm") {
      const Tensor w = rnd({ch}, d, dev), b = rnd({ch}, d, dev);
      return [x, w, b, ch] { (void)layer_norm(x, {ch}, w, b); };
    }
    if (op == "group_norm") {
      const Tensor w = rnd({ch}, d, dev), b = rnd({ch}, d, dev);
      return [x, w, b, groups] { (void)group_norm(x, groups, w, b); };
    }
    const Tensor w = rnd({ch}, DType::F32, dev), b = rnd({ch}, DType::F32, dev), mean = rnd({ch}, DType::F32, dev, 0.1);
    Tensor var = empty({ch}, DType::F32, dev);
    uniform_(var, 0.5, 2.0);
    return [x, w, b, mean, var, training] { (void)batch_norm(x, mean, var, w, b, training); };
  };
  return c;
}

// cross_entropy of [N, V] logits against int64 class indices, mean over N (a language model's training loss).
OpCase cross_entropy_case(DType d, int64_t n, int64_t v) {
  OpCase c;
  c.name = "cross_entropy/" + std::string(dtype_tag(d)) + "/" + str(n) + "x" + str(v);
  c.copy_bytes = nb(n * v, d) + nb(n, DType::I64);
  c.bytes = c.copy_bytes + nb(1, d);
  c.max_copies = 4;
  c.make = [=](Device dev) -> BenchCall {
    const Tensor x = rnd({n, v}, d, dev, 2.0), t = randint(0, v, {n}, DType::I64, dev);
    return [x, t] { (void)cross_entropy(x, t); };
  };
  return c;
}

}  // namespace

std::vector<OpCase> op_cases() {
  std::vector<OpCase> cases;
  cases.push_back(launch_case());
  // (K, N) of the linear layers of Qwen 2.5/3 0.5B-32B and Llama 3 8B/70B (q/k/v/o, gate/up, down, lm_head).
  constexpr int64_t kLinear[][2] = {
      {2048, 4096},  {2048, 512},    {4096, 2048}, {2048, 128},   {2048, 151936}, {4096, 4096}, {4096, 1024},
      {4096, 14336}, {14336, 4096},  {4096, 128256}, {5120, 5120}, {5120, 1024},  {5120, 25600}, {25600, 5120},
      {3584, 3584},  {3584, 512},    {3584, 18944}, {18944, 3584}, {1024, 1024},  {896, 896},    {896, 128},
      {896, 4864},   {4864, 896},    {8192, 8192},  {8192, 1024}, {8192, 28672}, {28672, 8192}};
  for (const auto& kn : kLinear) {
    cases.push_back(linear_case(1, kn[0], kn[1], false));
    cases.push_back(linear_case(1, kn[0], kn[1], true));
  }
  // A few rows: speculative decoding and small batches.
  // (K, N) of the FP8 GEMM benchmark (the (N, K) = (4096, 4096), (4096, 14336), (8192, 28672) as weights
  // [N, K]).
  constexpr int64_t kScaledMm[][2] = {{4096, 4096}, {14336, 4096}, {28672, 8192}};
  constexpr int64_t kLinearBatched[][2] = {{4096, 4096}, {4096, 14336}, {2048, 151936}, {14336, 4096}};
  for (const int64_t m : {2, 4, 16})
    for (const auto& kn : kLinearBatched) cases.push_back(linear_case(m, kn[0], kn[1], false));
  // The bf16 counterparts of the scaled_mm shapes below that the rows above lack.
  cases.push_back(linear_case(16, 28672, 8192, false));
  for (const int64_t m : {4096, 8192})
    for (const auto& kn : kScaledMm) cases.push_back(linear_case(m, kn[0], kn[1], false));

  // Quantised weights at Qwen3-8B's decode shapes (q/k/v, o, gate/up, down, lm_head) and a few rows.
  constexpr int64_t kQuant[][2] = {{4096, 6144}, {4096, 4096}, {4096, 24576}, {12288, 4096}, {4096, 151936}};
  for (const char* fmt : {"q4_k", "q8_0", "q5_k", "q6_k"})
    for (const int64_t m : {1, 4})
      for (const auto& kn : kQuant) cases.push_back(linear_quant_case(fmt, m, kn[0], kn[1]));

  // FP8 decode linear on every decode shape; scaled_mm tensor- and row-wise.
  for (const auto& kn : kLinear) cases.push_back(linear_fp8_case(1, kn[0], kn[1]));
  for (const ScaleRecipe r : {ScaleRecipe::TensorWise, ScaleRecipe::RowWise})
    for (const int64_t m : {1, 16, 4096, 8192})
      for (const auto& kn : kScaledMm) cases.push_back(scaled_mm_case(r, m, kn[0], kn[1]));

  constexpr int64_t kSoftmax[][2] = {{1, 128256}, {1, 151936}, {4, 128256}, {64, 32000}};
  for (const bool log : {false, true})
    for (const DType d : {DType::F32, DType::BF16})
      for (const auto& rc : kSoftmax) cases.push_back(softmax_case(log, d, rc[0], rc[1]));

  for (const int64_t d : {2048, 4096, 5120, 8192}) cases.push_back(rms_norm_case(1, d));
  cases.push_back(rms_norm_case(32, 128));  // q-norm, 32 heads
  cases.push_back(rms_norm_case(8, 128));   // k-norm, 8 heads
  for (const int64_t d : {2048, 4096, 5120, 8192}) cases.push_back(add_rms_norm_case(1, d));

  constexpr int64_t kRope[][4] = {{1, 32, 8, 128}, {1, 16, 8, 128}, {1, 64, 8, 128}, {512, 32, 8, 128}};
  for (const auto& r : kRope) cases.push_back(rope_case(r[0], r[1], r[2], r[3]));

  for (const int64_t i : {6144, 12288, 14336, 18944, 25600}) cases.push_back(silu_and_mul_case(i));

  for (const int64_t v : {151936, 128256}) {
    cases.push_back(sample_case(v, 0.0, 0, 1.0));
    cases.push_back(sample_case(v, 0.7, 20, 0.8));
    cases.push_back(sample_case(v, 1.0, 0, 0.9));
  }

  constexpr int64_t kHeads[][3] = {{32, 4, 128}, {32, 8, 128}, {64, 8, 128}};
  for (const auto& h : kHeads)
    for (const int64_t l : {512, 2048, 8192, 32768}) cases.push_back(decode_attention_case(h[0], h[1], h[2], l));
  // A 64-channel head (Qwen2-0.5B: 14 query heads over 2 KV heads).
  for (const int64_t l : {512, 2048, 8192, 32768}) cases.push_back(decode_attention_case(14, 2, 64, l));
  for (const auto& h : kHeads)
    for (const int64_t l : {512, 2048, 8192}) cases.push_back(prefill_attention_case(h[0], h[1], h[2], l));
  // Qwen3-30B-A3B (128 experts, I 768), Qwen1.5-MoE-like (64, 1408), a 256-expert layer (512).
  constexpr MoeShape kMoe[] = {{128, 2048, 768}, {64, 2048, 1408}, {256, 2048, 512}};
  for (const int64_t t : {1, 512, 4096})
    for (const MoeShape& m : kMoe)
      for (const bool gate_up : {true, false}) cases.push_back(grouped_mm_case(m, t, gate_up));
  for (const int64_t t : {1, 512})
    for (const MoeShape& m : kMoe) cases.push_back(moe_case(m, t));
  for (const MoeShape& m : kMoe) cases.push_back(moe_fp8_case(m));

  constexpr DType kF32 = DType::F32, kF64 = DType::F64, kC64 = DType::C64;
  cases.push_back(linalg_case("inv", kF32, {65536, 4, 4}));
  cases.push_back(linalg_case("inv_ex", kF32, {65536, 4, 4}));
  cases.push_back(linalg_case("inv", kF32, {16384, 16, 16}));
  cases.push_back(linalg_case("inv_ex", kF32, {16384, 16, 16}));
  cases.push_back(linalg_case("det", kF32, {65536, 4, 4}));
  cases.push_back(linalg_case("det", kF64, {4096, 8, 8}));
  cases.push_back(linalg_case("solve", kF32, {65536, 4, 4}));
  cases.push_back(linalg_case("lu_factor", kC64, {1024, 64, 64}));
  cases.push_back(linalg_case("lu_factor", kC64, {64, 64}));
  cases.push_back(linalg_case("lu_factor", kC64, {128, 128}));
  cases.push_back(linalg_case("lu_factor", kC64, {64, 128, 128}));
  cases.push_back(linalg_case("lu_factor", kF32, {64, 64}));
  cases.push_back(linalg_case("cholesky", kF64, {1024, 1024}));

  cases.push_back(bincount_case(4 << 20, 1000));
  cases.push_back(pad_case("reflect", kBF16, {1, 128, 16, 256, 256}, 1));
  cases.push_back(pad_case("constant", kBF16, {1, 128, 16, 256, 256}, 1));
  cases.push_back(dropout_case(kBF16, 64 << 20, 0.1));
  // Stable Diffusion's UNet (its first level at 512 x 512) and VAE decoder (at 1024 x 1024 output); a Wan 2.x
  // video VAE's causal conv3d on 720p latents (time already padded by 2 in front, as its decoder does).
  cases.push_back(conv_case(kBF16, {2, 320, 64, 64}, {320, 320, 3, 3}, {1, 1}));
  cases.push_back(conv_case(kBF16, {1, 512, 128, 128}, {512, 512, 3, 3}, {1, 1}));
  cases.push_back(conv_case(kBF16, {1, 384, 6, 90, 160}, {384, 384, 3, 3, 3}, {0, 1, 1}));
  cases.push_back(conv_case(kF32, {2, 320, 64, 64}, {320, 320, 3, 3}, {1, 1}));
  cases.push_back(norm_case("layer_norm", kBF16, {4096, 4096}));
  cases.push_back(norm_case("group_norm", kBF16, {1, 512, 128, 128}, 32));
  cases.push_back(norm_case("group_norm", kBF16, {1, 384, 4, 90, 160}, 32));
  cases.push_back(norm_case("batch_norm", kBF16, {32, 256, 56, 56}, 0, false));
  cases.push_back(norm_case("batch_norm", kBF16, {32, 256, 56, 56}, 0, true));
  cases.push_back(cross_entropy_case(kBF16, 4096, 151936));
  return cases;
}

}  // namespace kiln::cli
