// torch.nn.functional's normalisation, dropout, embedding, losses and pad, and torch.bincount / histc
// (kiln/nn.h), with torch's argument order; the deprecated size_average / reduce arguments are refused.
#include "kiln_py.h"

namespace kiln::py {

namespace {
void no_legacy(nb::handle size_average, nb::handle reduce, const char* op) {
  if (!size_average.is_none() || !reduce.is_none())
    throw Error(str(op, ": size_average and reduce are deprecated in torch and not supported: use reduction="));
}
// An int or a sequence of ints (torch's spatial arguments).
Shape ints(nb::handle h, const char* what) {
  if (PyLong_Check(h.ptr()) && !PyBool_Check(h.ptr())) return Shape{int_arg(h, what)};
  return shape_args(nb::make_tuple(h), what);
}

void bind_conv(nb::module_& F, int nsp) {
  const std::string conv = str("conv", nsp, "d"), convt = str("conv_transpose", nsp, "d");
  F.def(conv.c_str(), [nsp](const Tensor& x, const Tensor& w, std::optional<Tensor> b, nb::handle stride, nb::handle padding,
                            nb::handle dilation, int64_t groups) {
    KILN_CHECK(w.dim() == nsp + 2, "conv", nsp, "d: the weight must have ", nsp + 2, " dims [C_out, C_in / groups, k...], got ",
               w.meta());
    ConvPadding p = nb::isinstance<nb::str>(padding) ? ConvPadding(nb::cast<std::string>(padding))
                                                     : ConvPadding(ints(padding, "padding"));
    const Shape s = ints(stride, "stride"), d = ints(dilation, "dilation");
    nb::gil_scoped_release release;
    return kiln::conv(x, w, b, s, p, d, groups);
  }, nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(), nb::arg("stride") = 1, nb::arg("padding") = 0,
     nb::arg("dilation") = 1, nb::arg("groups") = 1);
  F.def(convt.c_str(), [nsp](const Tensor& x, const Tensor& w, std::optional<Tensor> b, nb::handle stride,
                             nb::handle padding, nb::handle output_padding, int64_t groups, nb::handle dilation) {
    KILN_CHECK(w.dim() == nsp + 2, "conv_transpose", nsp, "d: the weight must have ", nsp + 2,
               " dims [C_in, C_out / groups, k...], got ", w.meta());
    const Shape s = ints(stride, "stride"), p = ints(padding, "padding"), op = ints(output_padding, "output_padding"),
                d = ints(dilation, "dilation");
    nb::gil_scoped_release release;
    return conv_transpose(x, w, b, s, p, op, groups, d);
  }, nb::arg("input"), nb::arg("weight"), nb::arg("bias") = nb::none(), nb::arg("stride") = 1, nb::arg("padding") = 0,
     nb::arg("output_padding") = 0, nb::arg("groups") = 1, nb::arg("dilation") = 1);
  F.def(str("max_pool", nsp, "d").c_str(), [nsp](const Tensor& x, nb::handle k, nb::handle stride, nb::handle padding,
                                                 nb::handle dilation, bool ceil_mode, bool return_indices) {
    KILN_CHECK(!return_indices, "max_pool: return_indices=True is not supported");
    std::optional<Shape> s;
    if (!stride.is_none()) s = ints(stride, "stride");
    const Shape kk = ints(k, "kernel_size"), p = ints(padding, "padding"), d = ints(dilation, "dilation");
    nb::gil_scoped_release release;
    return max_pool(x, nsp, kk, s, p, d, ceil_mode);
  }, nb::arg("input"), nb::arg("kernel_size"), nb::arg("stride").none() = nb::none(), nb::arg("padding") = 0,
     nb::arg("dilation") = 1, nb::arg("ceil_mode") = false, nb::arg("return_indices") = false);
  F.def(str("avg_pool", nsp, "d").c_str(), [nsp](const Tensor& x, nb::handle k, nb::handle stride, nb::handle padding,
                                                 bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor) {
    std::optional<Shape> s;
    if (!stride.is_none()) s = ints(stride, "stride");
    const Shape kk = ints(k, "kernel_size"), p = ints(padding, "padding");
    nb::gil_scoped_release release;
    return avg_pool(x, nsp, kk, s, p, ceil_mode, count_include_pad, divisor);
  }, nb::arg("input"), nb::arg("kernel_size"), nb::arg("stride").none() = nb::none(), nb::arg("padding") = 0,
     nb::arg("ceil_mode") = false, nb::arg("count_include_pad") = true, nb::arg("divisor_override") = nb::none());
  F.def(str("adaptive_avg_pool", nsp, "d").c_str(), [nsp](const Tensor& x, nb::handle output_size) {
    Shape o = ints(output_size, "output_size");
    if (o.size() == 1) o.assign(static_cast<size_t>(nsp), o[0]);
    nb::gil_scoped_release release;
    return adaptive_avg_pool(x, o);
  }, nb::arg("input"), nb::arg("output_size"));
}

}  // namespace

void bind_functional(nb::module_& m, nb::module_& F) {
  for (int nsp : {1, 2, 3}) bind_conv(F, nsp);
  F.def("interpolate", [](const Tensor& x, nb::handle size, nb::handle scale, std::string_view mode,
                          std::optional<bool> align_corners, nb::handle recompute) {
    KILN_CHECK(recompute.is_none() || !nb::cast<bool>(recompute), "interpolate: recompute_scale_factor is not supported");
    std::optional<Shape> sz;
    std::optional<std::vector<double>> sc;
    if (!size.is_none()) sz = ints(size, "size");
    if (!scale.is_none()) {
      if (PyFloat_Check(scale.ptr()) || PyLong_Check(scale.ptr())) sc = std::vector<double>{nb::cast<double>(scale)};
      else sc = nb::cast<std::vector<double>>(scale);
    }
    nb::gil_scoped_release release;
    return interpolate(x, sz, sc, mode, align_corners);
  }, nb::arg("input"), nb::arg("size").none() = nb::none(), nb::arg("scale_factor").none() = nb::none(),
     nb::arg("mode") = "nearest", nb::arg("align_corners") = nb::none(), nb::arg("recompute_scale_factor").none() = nb::none(),
     "Resizes the spatial dims: nearest, or linear / bilinear / trilinear.");
  F.def("layer_norm", &layer_norm, nb::arg("input"), nb::arg("normalized_shape"), nb::arg("weight") = nb::none(),
        nb::arg("bias") = nb::none(), nb::arg("eps") = 1e-5, release_gil());
  F.def("group_norm", &group_norm, nb::arg("input"), nb::arg("num_groups"), nb::arg("weight") = nb::none(),
        nb::arg("bias") = nb::none(), nb::arg("eps") = 1e-5, release_gil());
  F.def("batch_norm", &batch_norm, nb::arg("input"), nb::arg("running_mean").none(), nb::arg("running_var").none(),
        nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(), nb::arg("training") = false,
        nb::arg("momentum") = 0.1, nb::arg("eps") = 1e-5, release_gil(),
        "Batch normalisation; training updates running_mean / running_var in place (momentum, unbiased variance).");
  F.def("instance_norm", &instance_norm, nb::arg("input"), nb::arg("running_mean") = nb::none(),
        nb::arg("running_var") = nb::none(), nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(),
        nb::arg("use_input_stats") = true, nb::arg("momentum") = 0.1, nb::arg("eps") = 1e-5, release_gil());
  F.def("dropout", [](Tensor& x, double p, bool training, bool inplace, std::optional<Generator*> g) {
    return inplace ? dropout_(x, p, training, g ? *g : nullptr) : dropout(x, p, training, g ? *g : nullptr);
  }, nb::arg("input"), nb::arg("p") = 0.5, nb::arg("training") = true, nb::arg("inplace") = false, nb::kw_only(),
     nb::arg("generator") = nb::none(), release_gil(),
     "Zeroes each element with probability p and scales the rest by 1 / (1 - p); the mask follows the "
     "generator's Philox stream on every device.");
  F.def("alpha_dropout", [](const Tensor& x, double p, bool training, bool inplace, std::optional<Generator*> g) {
    KILN_CHECK(!inplace, "alpha_dropout: inplace=True is not supported");
    return alpha_dropout(x, p, training, g ? *g : nullptr);
  }, nb::arg("input"), nb::arg("p") = 0.5, nb::arg("training") = false, nb::arg("inplace") = false, nb::kw_only(),
     nb::arg("generator") = nb::none(), release_gil());
  F.def("embedding", [](const Tensor& input, const Tensor& weight, std::optional<int64_t>, std::optional<double> max_norm) {
    KILN_CHECK(!max_norm, "embedding: max_norm (which rewrites the weight) is not supported");
    return embedding(input, weight);
  }, nb::arg("input"), nb::arg("weight"), nb::arg("padding_idx") = nb::none(), nb::arg("max_norm") = nb::none(),
     release_gil());
  F.def("mse_loss", [](const Tensor& a, const Tensor& b, nb::handle sa, nb::handle r, std::string_view reduction) {
    no_legacy(sa, r, "mse_loss");
    return mse_loss(a, b, reduction);
  }, nb::arg("input"), nb::arg("target"), nb::arg("size_average").none() = nb::none(), nb::arg("reduce").none() = nb::none(),
     nb::arg("reduction") = "mean", release_gil());
  F.def("l1_loss", [](const Tensor& a, const Tensor& b, nb::handle sa, nb::handle r, std::string_view reduction) {
    no_legacy(sa, r, "l1_loss");
    return l1_loss(a, b, reduction);
  }, nb::arg("input"), nb::arg("target"), nb::arg("size_average").none() = nb::none(), nb::arg("reduce").none() = nb::none(),
     nb::arg("reduction") = "mean", release_gil());
  F.def("smooth_l1_loss", [](const Tensor& a, const Tensor& b, nb::handle sa, nb::handle r, std::string_view reduction,
                             double beta) {
    no_legacy(sa, r, "smooth_l1_loss");
    return smooth_l1_loss(a, b, reduction, beta);
  }, nb::arg("input"), nb::arg("target"), nb::arg("size_average").none() = nb::none(), nb::arg("reduce").none() = nb::none(),
     nb::arg("reduction") = "mean", nb::arg("beta") = 1.0, release_gil());
  F.def("nll_loss", [](const Tensor& a, const Tensor& t, std::optional<Tensor> w, nb::handle sa, int64_t ignore_index,
                       nb::handle r, std::string_view reduction) {
    no_legacy(sa, r, "nll_loss");
    return nll_loss(a, t, w, ignore_index, reduction);
  }, nb::arg("input"), nb::arg("target"), nb::arg("weight") = nb::none(), nb::arg("size_average").none() = nb::none(),
     nb::arg("ignore_index") = -100, nb::arg("reduce").none() = nb::none(), nb::arg("reduction") = "mean", release_gil());
  F.def("cross_entropy", [](const Tensor& a, const Tensor& t, std::optional<Tensor> w, nb::handle sa, int64_t ignore_index,
                            nb::handle r, std::string_view reduction, double smoothing) {
    no_legacy(sa, r, "cross_entropy");
    return cross_entropy(a, t, w, ignore_index, reduction, smoothing);
  }, nb::arg("input"), nb::arg("target"), nb::arg("weight") = nb::none(), nb::arg("size_average").none() = nb::none(),
     nb::arg("ignore_index") = -100, nb::arg("reduce").none() = nb::none(), nb::arg("reduction") = "mean",
     nb::arg("label_smoothing") = 0.0, release_gil(),
     "log_softmax over dim 1 and the negative log-likelihood of class-index targets (or class probabilities).");
  F.def("pad", [](const Tensor& x, const std::vector<int64_t>& p, std::string_view mode, std::optional<double> value) {
    return pad(x, p, mode, value.value_or(0.0));
  }, nb::arg("input"), nb::arg("pad"), nb::arg("mode") = "constant", nb::arg("value") = nb::none(), release_gil(),
     "Pads the trailing dims: (left, right) of the last dim first; negative values crop.");
  m.def("bincount", &bincount, nb::arg("input"), nb::arg("weights") = nb::none(), nb::arg("minlength") = 0, release_gil());
  m.def("histc", &histc, nb::arg("input"), nb::arg("bins") = 100, nb::arg("min") = 0.0, nb::arg("max") = 0.0,
        release_gil());
  m.def("dropout", [](const Tensor& x, double p, bool train) { return dropout(x, p, train); }, nb::arg("input"),
        nb::arg("p"), nb::arg("train"), release_gil());
}

}  // namespace kiln::py
