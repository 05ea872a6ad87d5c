// Convolutions on the CPU through oneDNN (src/cpu/conv.h): the primitive chooses its own data layouts
// (format_tag::any: blocked layouts for the vector units), kiln's plain NC[D]HW tensors are reordered into and
// out of them, and the primitive runs on the OpenMP threads kiln's own kernels use (Debian's oneDNN is built
// on the same libgomp). oneDNN caches the primitives it creates, keyed by their descriptors.
#include <dnnl.hpp>
#include <unordered_map>

#include "cpu/conv.h"
#include "cpu/dnnl_context.h"

namespace kiln::cpu {

namespace {

dnnl::memory::format_tag plain(size_t rank) {
  using tag = dnnl::memory::format_tag;
  switch (rank) {
    case 3: return tag::abc;
    case 4: return tag::abcd;
    case 5: return tag::abcde;
    default: return tag::abcdef;
  }
}

dnnl::memory::dims dims_of(const Tensor& t) { return dnnl::memory::dims(t.sizes().begin(), t.sizes().end()); }

// `user` in the primitive's layout `want`: the same memory when the layouts agree, else a reordered copy.
dnnl::memory in_layout(dnnl::memory user, const dnnl::memory::desc& want, DnnlContext& c) {
  if (user.get_desc() == want) return user;
  dnnl::memory m(want, c.engine);
  dnnl::reorder(user, m).execute(c.stream, user, m);
  return m;
}

// One convolution-like primitive (Prim: convolution_forward or deconvolution_forward) over plain tensors:
// `wd` and `wtag` are oneDNN's logical weight dims and the plain layout the caller's weight has in them.
template <class Prim>
bool run(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y, const ConvParams& p, dnnl::algorithm algorithm,
         const dnnl::memory::dims& wd, dnnl::memory::format_tag wtag) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const DType t = x.dtype();
  if (t != DType::F32 && t != DType::BF16) return false;
  if (x.numel() == 0 || y.numel() == 0 || w.numel() == 0) return false;
  if (bias && bias->dtype() != DType::F32 && bias->dtype() != t) return false;
  const dt type = t == DType::F32 ? dt::f32 : dt::bf16;
  try {
    DnnlContext& c = dnnl_context();
    const size_t rank = static_cast<size_t>(x.dim());
    const dnnl::memory::dims xd = dims_of(x), yd = dims_of(y);
    dnnl::memory::dims dil(p.dilation.begin(), p.dilation.end());
    for (auto& v : dil) v -= 1;  // oneDNN counts the taps skipped
    const dnnl::memory::dims strides(p.stride.begin(), p.stride.end()), pl(p.pad_before.begin(), p.pad_before.end()),
        pr(p.pad_after.begin(), p.pad_after.end());
    const dnnl::memory::desc xmd(xd, type, tag::any), wmd(wd, type, tag::any), ymd(yd, type, tag::any);
    const dnnl::memory::desc bmd =
        bias ? dnnl::memory::desc({yd[1]}, bias->dtype() == DType::F32 ? dt::f32 : type, tag::a) : dnnl::memory::desc();
    const auto prop = dnnl::prop_kind::forward_inference;
    const auto desc = bias ? typename Prim::desc(prop, algorithm, xmd, wmd, bmd, ymd, strides, dil, pl, pr)
                           : typename Prim::desc(prop, algorithm, xmd, wmd, ymd, strides, dil, pl, pr);
    const typename Prim::primitive_desc pd(desc, c.engine);
    dnnl::memory ux({xd, type, plain(rank)}, c.engine, const_cast<void*>(x.data_ptr()));
    dnnl::memory uw({wd, type, wtag}, c.engine, const_cast<void*>(w.data_ptr()));
    dnnl::memory uy({yd, type, plain(rank)}, c.engine, y.data_ptr());
    dnnl::memory mx = in_layout(ux, pd.src_desc(), c), mw = in_layout(uw, pd.weights_desc(), c);
    const bool direct = pd.dst_desc() == uy.get_desc();
    dnnl::memory my = direct ? uy : dnnl::memory(pd.dst_desc(), c.engine);
    std::unordered_map<int, dnnl::memory> args = {{DNNL_ARG_SRC, mx}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, my}};
    if (bias) args.emplace(DNNL_ARG_BIAS, dnnl::memory(bmd, c.engine, const_cast<void*>(bias->data_ptr())));
    Prim(pd).execute(c.stream, args);
    if (!direct) dnnl::reorder(my, uy).execute(c.stream, my, uy);
    c.stream.wait();
    return true;
  } catch (const dnnl::error&) {
    return false;  // no implementation for this case (e.g. bf16 without AVX-512): the caller's own path
  }
}

}  // namespace

bool dnnl_conv(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y, const ConvParams& p) {
  // Weights: [O, I/g, k...], or with groups [g, O/g, I/g, k...] (the same bytes).
  dnnl::memory::dims wd = dims_of(w);
  if (p.groups > 1) {
    wd[0] /= p.groups;
    wd.insert(wd.begin(), p.groups);
  }
  return run<dnnl::convolution_forward>(x, w, bias, y, p, dnnl::algorithm::convolution_direct, wd, plain(wd.size()));
}

bool dnnl_conv_transpose(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& y, const ConvParams& p) {
  using tag = dnnl::memory::format_tag;
  // oneDNN's deconvolution weights are [O, I, k...] (grouped: [g, O/g, I/g, k...]); torch's conv_transpose
  // weight [I, O/g, k...] is the same data with the two channel dims swapped: a plain layout of its own.
  const size_t nsp = static_cast<size_t>(x.dim()) - 2;
  if (nsp < 1 || nsp > 3) return false;
  const int64_t g = p.groups, in = x.size(1), out = y.size(1);
  dnnl::memory::dims wd = g > 1 ? dnnl::memory::dims{g, out / g, in / g} : dnnl::memory::dims{out, in};
  for (size_t i = 0; i < nsp; ++i) wd.push_back(w.size(static_cast<int64_t>(2 + i)));
  static const tag swapped[] = {tag::bac, tag::bacd, tag::bacde}, swapped_grouped[] = {tag::acbd, tag::acbde, tag::acbdef};
  return run<dnnl::deconvolution_forward>(x, w, bias, y, p, dnnl::algorithm::deconvolution_direct, wd,
                                          g > 1 ? swapped_grouped[nsp - 1] : swapped[nsp - 1]);
}

std::string dnnl_description() {
  const dnnl_version_t* v = dnnl_version();
  return str("oneDNN ", v->major, ".", v->minor, ".", v->patch, " (", v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : "other threads", ")");
}

}  // namespace kiln::cpu
