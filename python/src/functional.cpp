// torch.nn.functional's normalisation, dropout, embedding, losses and pad, and torch.bincount / histc
// (kiln/nn.h), with torch's argument order; the deprecated size_average / reduce arguments are refused.
#include "kiln_py.h"

namespace kiln::py {

namespace {
void no_legacy(nb::handle size_average, nb::handle reduce, const char* op) {
  if (!size_average.is_none() || !reduce.is_none())
    throw Error(str(op, ": size_average and reduce are deprecated in torch and not supported: use reduction="));
}
}  // namespace

void bind_functional(nb::module_& m, nb::module_& F) {
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
