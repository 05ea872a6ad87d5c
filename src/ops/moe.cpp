// grouped_mm, the MoE router and the MoE block: argument checks, dtype rules, dispatch. The CPU path of
// grouped_mm runs each group through mm (OpenBLAS) on f32 copies; the expert loop is src/cpu/moe.cpp.
#include <algorithm>
#include <vector>

#include "core/dispatch.h"
#include "cpu/fp8_dot.h"
#include "cpu/moe.h"
#include "kiln/nn.h"
#if KILN_HAVE_CUDA
#include "cuda/fp8.h"
#include "cuda/moe.h"
#include "cuda/quant.h"
#endif

namespace kiln {

namespace {

constexpr DTypeSet kMoeTypes = dset(DType::F32, DType::F16, DType::BF16);

// The grouped dim's offsets, checked: non-decreasing, within [0, extent].
std::vector<int64_t> read_offsets(const Tensor& offs, int64_t extent, const char* what) {
  const Tensor o = offs.contiguous();
  std::vector<int64_t> ends(static_cast<size_t>(o.numel()));
  int64_t prev = 0;
  for (int64_t g = 0; g < o.numel(); ++g) {
    const int64_t v = o.data<const int32_t>()[g];
    KILN_CHECK(v >= prev && v <= extent, "grouped_mm: offs[", g, "] = ", v, " is invalid: offsets must be ",
               "non-decreasing cumulative ends within [0, ", extent, "] (the ", what, "); offs[", g - 1, "] = ", prev);
    ends[static_cast<size_t>(g)] = prev = v;
  }
  return ends;
}

}  // namespace

Tensor grouped_mm(const Tensor& a, const Tensor& b, const std::optional<Tensor>& offs, std::optional<DType> out_dtype) {
  KILN_CHECK(a.defined() && b.defined(), "grouped_mm: undefined input");
  KILN_CHECK((a.dim() == 2 || a.dim() == 3) && (b.dim() == 2 || b.dim() == 3), "grouped_mm: a and b must be 2-d or ",
             "3-d, got a ", a.meta(), ", b ", b.meta());
  KILN_CHECK(a.dtype() == b.dtype() && (dset(a.dtype()) & kMoeTypes), "grouped_mm: a and b must share one dtype of ",
             dtype_set_str(kMoeTypes), ", got a ", a.meta(), ", b ", b.meta());
  KILN_CHECK(a.device() == b.device(), "grouped_mm: a ", a.meta(), " and b ", b.meta(), " are on different devices");
  const DType od = out_dtype.value_or(a.dtype());
  KILN_CHECK(od == a.dtype() || od == DType::F32, "grouped_mm: out_dtype must be the inputs' dtype or f32, got ",
             dtype_name(od));
  const bool batched = a.dim() == 3 && b.dim() == 3;
  if (batched) {
    KILN_CHECK(!offs, "grouped_mm: 3-d x 3-d takes no offs (groups are the leading dim)");
    KILN_CHECK(a.size(0) == b.size(0) && a.size(2) == b.size(1), "grouped_mm: a ", a.meta(), " and b ", b.meta(),
               " must be [G, M, K] and [G, K, N]");
  } else {
    KILN_CHECK(offs.has_value(), "grouped_mm: offs is required when a or b is 2-d (a ", a.meta(), ", b ", b.meta(), ")");
    KILN_CHECK(offs->dim() == 1 && offs->dtype() == DType::I32 && offs->numel() >= 1, "grouped_mm: offs must be a ",
               "non-empty 1-d int32 tensor, got ", offs->meta());
    KILN_CHECK(offs->device() == a.device(), "grouped_mm: offs ", offs->meta(), " must be on the inputs' device ",
               a.device().str());
  }
  const int64_t G = batched ? a.size(0) : offs->numel();
  Shape out_shape;
  if (batched) {
    out_shape = {G, a.size(1), b.size(2)};
  } else if (a.dim() == 2 && b.dim() == 3) {
    KILN_CHECK(b.size(0) == G && a.size(1) == b.size(1), "grouped_mm: 2-d x 3-d needs a [M, K], b [G, K, N] with G = ",
               "offs' length ", G, ", got a ", a.meta(), ", b ", b.meta());
    out_shape = {a.size(0), b.size(2)};
  } else if (a.dim() == 3 && b.dim() == 2) {
    KILN_CHECK(a.size(0) == G && a.size(2) == b.size(0), "grouped_mm: 3-d x 2-d needs a [G, M, K], b [K, N] with G = ",
               "offs' length ", G, ", got a ", a.meta(), ", b ", b.meta());
    out_shape = {a.size(1), b.size(1)};
  } else {
    KILN_CHECK(a.size(1) == b.size(0), "grouped_mm: 2-d x 2-d needs a [M, K], b [K, N], got a ", a.meta(), ", b ", b.meta());
    out_shape = {G, a.size(0), b.size(1)};
  }
#if KILN_HAVE_CUDA
  if (a.is_cuda()) {
    Tensor out = empty(out_shape, od, a.device());
    cuda::grouped_mm(out, a, b, offs ? &*offs : nullptr);
    return out;
  }
#endif
  // f32 copies, one mm per group, rows/columns past the last offset stay 0.
  const Tensor af = a.to(DType::F32), bf = b.to(DType::F32);
  Tensor out = zeros(out_shape, DType::F32, a.device());
  if (batched) {
    for (int64_t g = 0; g < G; ++g) out.select(0, g).copy_(mm(af.select(0, g), bf.select(0, g)));
  } else if (a.dim() == 2 && b.dim() == 3) {
    const auto ends = read_offsets(*offs, a.size(0), "rows of a");
    for (int64_t g = 0, start = 0; g < G; start = ends[static_cast<size_t>(g)], ++g)
      if (ends[static_cast<size_t>(g)] > start)
        out.slice(0, start, ends[static_cast<size_t>(g)]).copy_(mm(af.slice(0, start, ends[static_cast<size_t>(g)]), bf.select(0, g)));
  } else if (a.dim() == 3) {
    const auto ends = read_offsets(*offs, b.size(1), "columns of b");
    for (int64_t g = 0, start = 0; g < G; start = ends[static_cast<size_t>(g)], ++g)
      if (ends[static_cast<size_t>(g)] > start)
        out.slice(1, start, ends[static_cast<size_t>(g)]).copy_(mm(af.select(0, g), bf.slice(1, start, ends[static_cast<size_t>(g)])));
  } else {
    const auto ends = read_offsets(*offs, a.size(1), "K dim");
    for (int64_t g = 0, start = 0; g < G; start = ends[static_cast<size_t>(g)], ++g)
      if (ends[static_cast<size_t>(g)] > start)
        out.select(0, g).copy_(mm(af.slice(1, start, ends[static_cast<size_t>(g)]), bf.slice(0, start, ends[static_cast<size_t>(g)])));
  }
  return out.to(od);
}

MoeRouting moe_route(const Tensor& x, const Tensor& router_weight, int64_t top_k, bool norm_topk_prob) {
  KILN_CHECK(x.dim() == 2 && router_weight.dim() == 2 && router_weight.size(1) == x.size(1), "moe_route: x must be ",
             "[T, H] and router_weight [E, H], got x ", x.meta(), ", router_weight ", router_weight.meta());
  const int64_t E = router_weight.size(0);
  KILN_CHECK(top_k >= 1 && top_k <= E && top_k <= 64, "moe_route: top_k must be in [1, min(E, 64)] (E = ", E,
             "), got ", top_k);
  KILN_CHECK(router_weight.dtype() == x.dtype() && router_weight.device() == x.device(), "moe_route: router_weight ",
             router_weight.meta(), " must match x ", x.meta(), " in dtype and device");
#if KILN_HAVE_CUDA
  if (x.is_cuda()) return cuda::moe_route(x, router_weight, top_k, norm_topk_prob);
#endif
  // As Hugging Face's Qwen3-MoE router: logits in x's dtype, softmax in f32, top-k, renormalise, cast.
  const Tensor logits = linear(x, router_weight);
  const Tensor probs = softmax(logits, -1, DType::F32);
  auto [values, indices] = topk(probs, top_k);
  if (norm_topk_prob) values = div(values, sum(values, {-1}, true));
  return MoeRouting{values.to(x.dtype()), indices.to(DType::I32)};
}

Tensor moe_forward(const Tensor& x, const Tensor& router_weight, const Tensor& gate_up, const Tensor& down,
                   int64_t top_k, bool norm_topk_prob) {
  KILN_CHECK(x.dim() == 2, "moe_forward: x must be [T, H], got ", x.meta());
  KILN_CHECK(dset(x.dtype()) & kMoeTypes, "moe_forward: x must be ", dtype_set_str(kMoeTypes), ", got ", x.meta());
  const int64_t H = x.size(1);
  KILN_CHECK(gate_up.dim() == 3 && down.dim() == 3 && gate_up.size(2) == H && down.size(1) == H &&
                 gate_up.size(0) == down.size(0) && gate_up.size(1) == 2 * down.size(2),
             "moe_forward: experts must be gate_up [E, 2I, H] and down [E, H, I] for H = ", H, ", got gate_up ",
             gate_up.meta(), ", down ", down.meta());
  KILN_CHECK(router_weight.dim() == 2 && router_weight.size(0) == gate_up.size(0), "moe_forward: router_weight ",
             router_weight.meta(), " must be [E, H] with E = ", gate_up.size(0));
  for (const Tensor* t : {&router_weight, &gate_up, &down})
    KILN_CHECK(t->dtype() == x.dtype() && t->device() == x.device(), "moe_forward: ", t->meta(),
               " must match x ", x.meta(), " in dtype and device");
  KILN_CHECK(top_k >= 1 && top_k <= gate_up.size(0) && top_k <= 64, "moe_forward: top_k must be in [1, min(E, 64)] (E = ",
             gate_up.size(0), "), got ", top_k);
#if KILN_HAVE_CUDA
  if (x.is_cuda()) return cuda::moe_forward(x, router_weight, gate_up, down, top_k, norm_topk_prob);
#endif
  const MoeRouting r = moe_route(x, router_weight, top_k, norm_topk_prob);
  Tensor out = empty(x.sizes(), x.dtype(), x.device());
  cpu::moe_experts(out, x.contiguous(), r.experts.contiguous(), r.weights.contiguous(), gate_up.contiguous(),
                   down.contiguous());
  return out;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_fp8_experts(const char* op, const Fp8Experts& e) {
  KILN_CHECK(e.block_n >= 1 && e.block_k >= 1, op, ": FP8 blocks must be positive, got ", e.block_n, " x ", e.block_k);
  KILN_CHECK(e.gate_up.dim() == 3 && e.down.dim() == 3 && e.gate_up.size(0) == e.down.size(0) &&
                 e.gate_up.size(2) == e.down.size(1) && e.gate_up.size(1) == 2 * e.down.size(2),
             op, ": FP8 experts must be gate_up [E, 2I, H] and down [E, H, I], got gate_up ", e.gate_up.meta(), ", down ",
             e.down.meta());
  for (const Tensor* v : {&e.gate_up, &e.down})
    KILN_CHECK(v->dtype() == DType::F8E4M3, op, ": FP8 expert values must be float8_e4m3fn, got ", v->meta());
  auto check_scales = [&](const Tensor& v, const Tensor& sc, const char* name) {
    const Shape want{v.size(0), ceil_div(v.size(1), e.block_n), ceil_div(v.size(2), e.block_k)};
    KILN_CHECK(sc.dtype() == DType::F32 && sc.sizes() == want, op, ": ", name, " scales must be f32 [", want[0], ", ",
               want[1], ", ", want[2], "] for ", v.meta(), " in ", e.block_n, " x ", e.block_k, " blocks, got ",
               sc.meta());
    KILN_CHECK(sc.device() == v.device(), op, ": ", name, " scales ", sc.meta(), " are not on the values' device ",
               v.device().str());
  };
  check_scales(e.gate_up, e.gate_up_scales, "gate_up");
  check_scales(e.down, e.down_scales, "down");
  KILN_CHECK(e.down.device() == e.gate_up.device(), op, ": gate_up ", e.gate_up.meta(), " and down ", e.down.meta(),
             " are on different devices");
}

// One expert stack [E, R, K] dequantised (value x scale of its block, in f32, rounded once to dtype: on CUDA
// written in dtype directly, so a 16-bit stack never exists in f32 as well).
Tensor dequantize_stack(const Tensor& v, const Tensor& sc, int64_t bn, int64_t bk, DType dtype = DType::F32) {
  const int64_t E = v.size(0), R = v.size(1), K = v.size(2);
#if KILN_HAVE_CUDA
  if (v.is_cuda()) {
    Tensor out = empty({E, R, K}, dtype, v.device());
    if (E == 0 || R == 0 || K == 0) return out;
    if (R % bn == 0 && v.is_contiguous() && sc.is_contiguous()) {
      // Rows of all experts in one launch: flat row m = e R + r has scale row m / bn = e R / bn + r / bn.
      cuda::dequantize_fp8(v.view({E * R, K}), sc, sc.size(2), 1, bn, bk, out.view({E * R, K}));
    } else {
      for (int64_t e = 0; e < E; ++e) {
        const Tensor s = sc.select(0, e);
        cuda::dequantize_fp8(v.select(0, e), s, s.stride(0), s.stride(1), bn, bk, out.select(0, e));
      }
    }
    return out;
  }
#endif
  Tensor out = empty({E, R, K}, DType::F32, v.device());
  const Tensor vc = v.contiguous(), s = sc.contiguous();
  const uint8_t* vp = static_cast<const uint8_t*>(vc.data_ptr());
  float* o = out.data<float>();
  const float* sp = s.data<const float>();
  const int64_t sr = s.size(1), sk = s.size(2);
#pragma omp parallel for schedule(static) if (E * R * K >= (1 << 16))
  for (int64_t er = 0; er < E * R; ++er) {
    const int64_t e = er / R, r = er % R;
    for (int64_t b = 0, k0 = 0; k0 < K; ++b, k0 += bk)
      cpu::fp8_dequantize_row(vp + er * K + k0, std::min(bk, K - k0), false, sp[(e * sr + r / bn) * sk + b],
                              o + er * K + k0);
  }
  return out.to(dtype);
}

}  // namespace

std::pair<Tensor, Tensor> dequantize_fp8_experts(const Fp8Experts& e, DType dtype) {
  check_fp8_experts("dequantize_fp8_experts", e);
  KILN_CHECK(dset(dtype) & kMoeTypes, "dequantize_fp8_experts: dtype must be ", dtype_set_str(kMoeTypes), ", got ",
             dtype_name(dtype));
  return {dequantize_stack(e.gate_up, e.gate_up_scales, e.block_n, e.block_k, dtype),
          dequantize_stack(e.down, e.down_scales, e.block_n, e.block_k, dtype)};
}

Tensor moe_forward(const Tensor& x, const Tensor& router_weight, const Fp8Experts& experts, int64_t top_k,
                   bool norm_topk_prob) {
  const char* op = "moe_forward";
  check_fp8_experts(op, experts);
  KILN_CHECK(x.dim() == 2, op, ": x must be [T, H], got ", x.meta());
  KILN_CHECK(dset(x.dtype()) & kMoeTypes, op, ": x must be ", dtype_set_str(kMoeTypes), ", got ", x.meta());
  const int64_t H = x.size(1), E = experts.gate_up.size(0);
  KILN_CHECK(experts.gate_up.size(2) == H, op, ": FP8 experts gate_up ", experts.gate_up.meta(), " do not match x ",
             x.meta(), " (H = ", H, ")");
  KILN_CHECK(router_weight.dim() == 2 && router_weight.size(0) == E && router_weight.size(1) == H, op,
             ": router_weight ", router_weight.meta(), " must be [E, H] = [", E, ", ", H, "]");
  KILN_CHECK(router_weight.dtype() == x.dtype() && router_weight.device() == x.device(), op, ": router_weight ",
             router_weight.meta(), " must match x ", x.meta(), " in dtype and device");
  KILN_CHECK(experts.gate_up.device() == x.device(), op, ": FP8 experts ", experts.gate_up.meta(),
             " are not on x's device ", x.device().str());
  KILN_CHECK(top_k >= 1 && top_k <= E && top_k <= 64, op, ": top_k must be in [1, min(E, 64)] (E = ", E, "), got ",
             top_k);
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    Tensor out = cuda::moe_forward_fp8(x, router_weight, experts, top_k, norm_topk_prob);
    if (out.defined()) return out;
    auto [gu, dn] = dequantize_fp8_experts(experts, x.dtype());
    return cuda::moe_forward(x, router_weight, gu, dn, top_k, norm_topk_prob);
  }
#endif
  // CPU reference: the routing as moe_forward's (x's dtype), the experts' real values (code x block scale) on f32
  // activations, in f32; only the selected experts are read, in place.
  const MoeRouting r = moe_route(x, router_weight, top_k, norm_topk_prob);
  Tensor out = empty(x.sizes(), DType::F32, x.device());
  cpu::moe_experts_fp8(out, x.to(DType::F32).contiguous(), r.experts.contiguous(),
                       r.weights.to(DType::F32).contiguous(), experts.gate_up.contiguous(),
                       experts.gate_up_scales.contiguous(), experts.down.contiguous(), experts.down_scales.contiguous(),
                       experts.block_n, experts.block_k);
  return out.to(x.dtype());
}

Tensor moe_forward(const Tensor& x, const Tensor& router_weight, const BlockExperts& experts, int64_t top_k,
                   bool norm_topk_prob) {
  const char* op = "moe_forward";
  KILN_CHECK(x.dim() == 2, op, ": x must be [T, H], got ", x.meta());
  KILN_CHECK(dset(x.dtype()) & kMoeTypes, op, ": x must be ", dtype_set_str(kMoeTypes), ", got ", x.meta());
  const int64_t T = x.size(0), H = x.size(1), E = experts.num_experts;
  KILN_CHECK(E >= 1, op, ": num_experts must be positive, got ", E);
  const int64_t gu_rows = out_features(experts.gate_up), dn_rows = out_features(experts.down);
  KILN_CHECK(gu_rows % (2 * E) == 0 && in_features(experts.gate_up) == H && dn_rows == E * H, op,
             ": block experts must be gate_up [E x 2I, H] and down [E x H, I] with E = ", E, " and H = ", H, ", got ",
             format_name(experts.gate_up), " gate_up of ", gu_rows, " x ", in_features(experts.gate_up), " and ",
             format_name(experts.down), " down of ", dn_rows, " x ", in_features(experts.down));
  const int64_t I = gu_rows / (2 * E);
  KILN_CHECK(in_features(experts.down) == I, op, ": down's K = ", in_features(experts.down), " must be I = ", I);
  KILN_CHECK(router_weight.dim() == 2 && router_weight.size(0) == E && router_weight.size(1) == H, op,
             ": router_weight ", router_weight.meta(), " must be [E, H] = [", E, ", ", H, "]");
  KILN_CHECK(router_weight.dtype() == x.dtype() && router_weight.device() == x.device(), op, ": router_weight ",
             router_weight.meta(), " must match x ", x.meta(), " in dtype and device");
  KILN_CHECK(top_k >= 1 && top_k <= E && top_k <= 64, op, ": top_k must be in [1, min(E, 64)] (E = ", E, "), got ",
             top_k);
  for (const BlockWeight* w : {&experts.gate_up, &experts.down}) {
    const Tensor& v = std::visit([](const auto& b) -> const Tensor& {
      if constexpr (requires { b.values; }) return b.values;
      else return b.blocks;
    }, *w);
    KILN_CHECK(v.device() == x.device(), op, ": block experts ", v.meta(), " are not on x's device ", x.device().str());
  }
  if (T == 0) return empty({0, H}, x.dtype(), x.device());
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    // One token: the grouped int8 kernels on the blocks.
    if (T == 1) {
      auto stack = [](const BlockWeight& w) {
        return std::visit([](const auto& b) {
          using W = std::decay_t<decltype(b)>;
          if constexpr (std::is_same_v<W, Q8Weight>) return cuda::QuantStack{cuda::QuantFormat::Q8_0, b.values, b.scales};
          else if constexpr (std::is_same_v<W, Q4Weight>) return cuda::QuantStack{cuda::QuantFormat::Q4_0, b.values, b.scales};
          else if constexpr (std::is_same_v<W, Q4KWeight>) return cuda::QuantStack{cuda::QuantFormat::Q4_K, b.blocks, Tensor()};
          else if constexpr (std::is_same_v<W, Q5KWeight>) return cuda::QuantStack{cuda::QuantFormat::Q5_K, b.blocks, Tensor()};
          else return cuda::QuantStack{cuda::QuantFormat::Q6_K, b.blocks, Tensor()};
        }, w);
      };
      const MoeRouting r = moe_route(x, router_weight, top_k, norm_topk_prob);
      return cuda::moe_block_experts_one(x, r.weights, r.experts, stack(experts.gate_up), stack(experts.down), E);
    }
  }
#endif
  // Each expert hit on the rows of its tokens (the routing read back to the host: on CUDA a synchronisation,
  // which a graph capture refuses).
  const MoeRouting r = moe_route(x, router_weight, top_k, norm_topk_prob);
  const Tensor ex = r.experts.cpu().contiguous(), wt = r.weights.to(DType::F32).contiguous();
  const int32_t* ep = ex.data<const int32_t>();
  // rows[e]: the tokens routed to expert e; at[t * k + j]: token t's row in its j-th expert's output.
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(E));
  std::vector<int64_t> at(static_cast<size_t>(T * top_k));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < top_k; ++j) {
      auto& list = rows[static_cast<size_t>(ep[t * top_k + j])];
      at[static_cast<size_t>(t * top_k + j)] = static_cast<int64_t>(list.size());
      list.push_back(t);
    }
  std::vector<Tensor> y(static_cast<size_t>(E));  // f32 [rows, H] per expert hit
  for (int64_t e = 0; e < E; ++e) {
    const auto& list = rows[static_cast<size_t>(e)];
    if (list.empty()) continue;
    const Tensor xs = T == 1 ? x : index_select(x, 0, from_vector<int64_t>(list).to(x.device()));
    const Tensor h = silu_and_mul(linear(xs, narrow_rows(experts.gate_up, e * 2 * I, 2 * I)));
    y[static_cast<size_t>(e)] = linear(h, narrow_rows(experts.down, e * H, H)).to(DType::F32);
  }
  // out[t] = sum over j of w[t, j] y(t, j), in f32: the rows gathered from the experts' outputs.
  std::vector<Tensor> hit;
  std::vector<int64_t> start(static_cast<size_t>(E), 0), idx(static_cast<size_t>(T * top_k));
  int64_t n = 0;
  for (int64_t e = 0; e < E; ++e) {
    start[static_cast<size_t>(e)] = n;
    if (!y[static_cast<size_t>(e)].defined()) continue;
    hit.push_back(y[static_cast<size_t>(e)]);
    n += y[static_cast<size_t>(e)].size(0);
  }
  for (int64_t i = 0; i < T * top_k; ++i)
    idx[static_cast<size_t>(i)] = start[static_cast<size_t>(ep[i])] + at[static_cast<size_t>(i)];
  const Tensor rows_y = index_select(cat(hit, 0), 0, from_vector<int64_t>(idx).to(x.device())).view({T, top_k, H});
  return sum(mul(rows_y, wt.view({T, top_k, 1})), {1}).to(x.dtype());
}

}  // namespace kiln
