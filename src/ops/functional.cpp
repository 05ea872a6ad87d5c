// torch.nn.functional's normalisation, dropout, embedding and loss functions, and bincount / histc
// (kiln/nn.h), composed from kiln's ops so that every backend runs them.
#include <cmath>
#include <limits>

#include "cpu/bincount.h"
#include "cpu/moments.h"
#include "cpu/random.h"
#include "kiln/nn.h"
#include "ops/generator_offset.h"
#if KILN_HAVE_CUDA
#include "cuda/loss.h"
#include "cuda/moments.h"
#include "cuda/random.h"
#endif

namespace kiln {

namespace {

bool half(DType t) { return t == DType::F16 || t == DType::BF16; }

// The dtype the statistics are computed in: f32 for half types, else the input's.
Tensor compute(const Tensor& x) { return half(x.dtype()) ? x.to(DType::F32) : x; }

void check_float(const Tensor& x, const char* op) {
  KILN_CHECK(is_floating(x.dtype()) && !is_float8(x.dtype()), op, ": expected a floating-point input (float16, bfloat16, "
             "float32 or float64), got ", x.meta());
}

// A per-channel tensor [C] shaped to broadcast against x [N, C, *].
Tensor channel_view(const Tensor& t, const Tensor& x) {
  Shape s(static_cast<size_t>(x.dim()), 1);
  s[1] = t.numel();
  return t.reshape(s);
}

void check_channels(const std::optional<Tensor>& t, int64_t c, const char* what, const char* op) {
  if (t) KILN_CHECK(t->dim() == 1 && t->size(0) == c, op, ": ", what, " must be [", c, "] (one per channel), got ", t->meta());
}

Tensor affine(Tensor y, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, const Tensor& x) {
  if (weight) y = mul(y, channel_view(compute(*weight), x));
  if (bias) y = add(y, channel_view(compute(*bias), x));
  return y;
}

std::vector<int64_t> spatial_dims(const Tensor& x) {
  std::vector<int64_t> d;
  for (int64_t i = 2; i < x.dim(); ++i) d.push_back(i);
  return d;
}

// The one-read statistics and one-pass normalisation (cpu/moments.h, cuda/moments.h) take contiguous, non-empty
// input whose weights and statistics are on its device; the rest composes kiln's ops.
bool native_norm(const Tensor& x, std::initializer_list<const std::optional<Tensor>*> others, const char* op) {
  for (const auto* t : others)
    if (*t) KILN_CHECK((*t)->device() == x.device(), op, ": expected every tensor on ", x.device().str(), ", got ",
                       (*t)->meta(), " with input ", x.meta());
  return x.is_contiguous() && x.numel() > 0;
}

// The backends' moments / normalize_rows / normalize_planes, by the input's device.
void norm_moments(const Tensor& x, int64_t sets, int64_t runs, int64_t len, int64_t set_stride, int64_t run_stride,
                  Tensor& mean, Tensor& var) {
#if KILN_HAVE_CUDA
  if (x.is_cuda()) return cuda::moments(x, sets, runs, len, set_stride, run_stride, mean, var);
#endif
  cpu::moments(x, sets, runs, len, set_stride, run_stride, mean, var);
}
void norm_rows(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b, double eps,
               Tensor& y) {
#if KILN_HAVE_CUDA
  if (x.is_cuda()) return cuda::normalize_rows(x, mean, var, w, b, eps, y);
#endif
  cpu::normalize_rows(x, mean, var, w, b, eps, y);
}
void norm_planes(const Tensor& x, const Tensor& mean, const Tensor& var, const Tensor& w, const Tensor& b, double eps,
                 int64_t channels, int64_t stat_div, bool per_channel, Tensor& y) {
#if KILN_HAVE_CUDA
  if (x.is_cuda()) return cuda::normalize_planes(x, mean, var, w, b, eps, channels, stat_div, per_channel, y);
#endif
  cpu::normalize_planes(x, mean, var, w, b, eps, channels, stat_div, per_channel, y);
}

DType acc_dtype(const Tensor& x) { return x.dtype() == DType::F64 ? DType::F64 : DType::F32; }

// A weight, bias or statistic as the native kernels read it: contiguous, 1-d, in the accumulation dtype.
Tensor as_acc(const std::optional<Tensor>& t, const Tensor& x) {
  return t ? t->to(acc_dtype(x)).contiguous().reshape({-1}) : Tensor();
}

Tensor reduce(const Tensor& loss, std::string_view reduction, const char* op) {
  if (reduction == "none") return loss;
  if (reduction == "sum") return sum(loss);
  KILN_CHECK(reduction == "mean", op, ": reduction must be 'mean', 'sum' or 'none', got '", reduction, "'");
  return mean(loss);
}

}  // namespace

// ---- Normalisation -------------------------------------------------------------------------------------------

Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, double eps) {
  check_float(x, "layer_norm");
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  KILN_CHECK(k >= 1 && k <= x.dim() && Shape(x.sizes().end() - k, x.sizes().end()) == normalized_shape,
             "layer_norm: normalized_shape ", normalized_shape, " must be the trailing dims of the input ", x.meta());
  for (const auto* t : {&weight, &bias})
    if (*t) KILN_CHECK((*t)->sizes() == normalized_shape, "layer_norm: weight and bias must have normalized_shape ",
                       normalized_shape, ", got ", (*t)->meta());
  if (native_norm(x, {&weight, &bias}, "layer_norm")) {
    const int64_t d = checked_numel(normalized_shape), rows = x.numel() / d;
    const Tensor w = as_acc(weight, x), b = as_acc(bias, x);
    Tensor y = empty(x.sizes(), x.dtype(), x.device());
#if KILN_HAVE_CUDA
    if (x.is_cuda() && cuda::layer_norm_rows(x.reshape({rows, d}), w, b, eps, y)) return y;
#endif
    Tensor mu = empty({rows}, acc_dtype(x), x.device()), var = empty({rows}, acc_dtype(x), x.device());
    norm_moments(x, rows, 1, d, d, 0, mu, var);
    norm_rows(x.reshape({rows, d}), mu, var, w, b, eps, y);
    return y;
  }
  std::vector<int64_t> dims;
  for (int64_t i = x.dim() - k; i < x.dim(); ++i) dims.push_back(i);
  const Tensor xf = compute(x);
  const Tensor mu = mean(xf, dims, true);
  const Tensor centred = sub(xf, mu);
  Tensor y = mul(centred, rsqrt(add(mean(mul(centred, centred), dims, true), Scalar(eps))));
  if (weight) y = mul(y, compute(*weight));
  if (bias) y = add(y, compute(*bias));
  return y.to(x.dtype());
}

Tensor group_norm(const Tensor& x, int64_t num_groups, const std::optional<Tensor>& weight,
                  const std::optional<Tensor>& bias, double eps) {
  check_float(x, "group_norm");
  KILN_CHECK(x.dim() >= 2, "group_norm: expected [N, C, *], got ", x.meta());
  const int64_t n = x.size(0), c = x.size(1);
  KILN_CHECK(num_groups > 0 && c % num_groups == 0, "group_norm: num_groups (", num_groups,
             ") must divide the channels (", c, ")");
  check_channels(weight, c, "weight", "group_norm");
  check_channels(bias, c, "bias", "group_norm");
  if (native_norm(x, {&weight, &bias}, "group_norm")) {
    const int64_t len = x.numel() / (n * num_groups);
    Tensor mu = empty({n * num_groups}, acc_dtype(x), x.device()), var = empty({n * num_groups}, acc_dtype(x), x.device());
    norm_moments(x, n * num_groups, 1, len, len, 0, mu, var);
    Tensor y = empty(x.sizes(), x.dtype(), x.device());
    norm_planes(x, mu, var, as_acc(weight, x), as_acc(bias, x), eps, c, c / num_groups, false, y);
    return y;
  }
  const Tensor xf = compute(x).reshape({n, num_groups, -1});
  const Tensor mu = mean(xf, {-1}, true);
  const Tensor centred = sub(xf, mu);
  const Tensor y = mul(centred, rsqrt(add(mean(mul(centred, centred), {-1}, true), Scalar(eps)))).reshape(x.sizes());
  return affine(y, weight, bias, x).to(x.dtype());
}

Tensor batch_norm(const Tensor& x, const std::optional<Tensor>& running_mean, const std::optional<Tensor>& running_var,
                  const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, bool training, double momentum,
                  double eps) {
  check_float(x, "batch_norm");
  KILN_CHECK(x.dim() >= 2, "batch_norm: expected [N, C, *], got ", x.meta());
  const int64_t c = x.size(1);
  check_channels(running_mean, c, "running_mean", "batch_norm");
  check_channels(running_var, c, "running_var", "batch_norm");
  check_channels(weight, c, "weight", "batch_norm");
  check_channels(bias, c, "bias", "batch_norm");
  const bool native = native_norm(x, {&running_mean, &running_var, &weight, &bias}, "batch_norm");
  const Tensor xf = native ? x : compute(x);
  Tensor mu, var;
  if (training) {
    const int64_t count = x.numel() / std::max<int64_t>(c, 1);
    KILN_CHECK(count > 1, "batch_norm: training needs more than one value per channel, got ", x.meta());
    if (native) {
      const int64_t plane = count / x.size(0);
      mu = empty({c}, acc_dtype(x), x.device());
      var = empty({c}, acc_dtype(x), x.device());
      norm_moments(x, c, x.size(0), plane, plane, c * plane, mu, var);
    } else {
      std::vector<int64_t> dims = {0};
      for (int64_t d : spatial_dims(x)) dims.push_back(d);
      mu = mean(xf, dims);
      var = kiln::var(xf, dims, /*correction=*/0);
    }
    if (running_mean) {
      Tensor rm = *running_mean;
      rm.copy_(add(mul(compute(rm), Scalar(1 - momentum)), mul(mu, Scalar(momentum))));
    }
    if (running_var) {
      Tensor rv = *running_var;
      const Tensor unbiased = mul(var, Scalar(double(count) / double(count - 1)));
      rv.copy_(add(mul(compute(rv), Scalar(1 - momentum)), mul(unbiased, Scalar(momentum))));
    }
  } else {
    KILN_CHECK(running_mean && running_var, "batch_norm: evaluation (training=false) needs running_mean and running_var");
    mu = native ? as_acc(running_mean, x) : compute(*running_mean);
    var = native ? as_acc(running_var, x) : compute(*running_var);
  }
  if (native) {
    Tensor y = empty(x.sizes(), x.dtype(), x.device());
    norm_planes(x, mu, var, as_acc(weight, x), as_acc(bias, x), eps, c, 1, true, y);
    return y;
  }
  const Tensor y = mul(sub(xf, channel_view(mu, x)), channel_view(rsqrt(add(var, Scalar(eps))), x));
  return affine(y, weight, bias, x).to(x.dtype());
}

Tensor instance_norm(const Tensor& x, const std::optional<Tensor>& running_mean, const std::optional<Tensor>& running_var,
                     const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, bool use_input_stats,
                     double momentum, double eps) {
  check_float(x, "instance_norm");
  KILN_CHECK(x.dim() >= 3, "instance_norm: expected [N, C, *spatial], got ", x.meta());
  const int64_t c = x.size(1);
  check_channels(running_mean, c, "running_mean", "instance_norm");
  check_channels(running_var, c, "running_var", "instance_norm");
  check_channels(weight, c, "weight", "instance_norm");
  check_channels(bias, c, "bias", "instance_norm");
  if (!use_input_stats) return batch_norm(x, running_mean, running_var, weight, bias, false, momentum, eps);
  // Without running statistics it is group_norm with a group per channel (one read for the statistics on CUDA).
  if (!running_mean && !running_var) return group_norm(x, c, weight, bias, eps);
  const Tensor xf = compute(x);
  const auto dims = spatial_dims(x);
  const Tensor mu = mean(xf, dims, true);
  const Tensor centred = sub(xf, mu);
  const Tensor var = mean(mul(centred, centred), dims, true);
  if (running_mean || running_var) {
    const int64_t count = xf.numel() / std::max<int64_t>(x.size(0) * c, 1);
    if (running_mean) {
      Tensor rm = *running_mean;
      rm.copy_(add(mul(compute(rm), Scalar(1 - momentum)), mul(mean(mu.reshape({x.size(0), c}), {0}), Scalar(momentum))));
    }
    if (running_var) {
      Tensor rv = *running_var;
      const Tensor unbiased = mul(mean(var.reshape({x.size(0), c}), {0}), Scalar(double(count) / double(std::max<int64_t>(count - 1, 1))));
      rv.copy_(add(mul(compute(rv), Scalar(1 - momentum)), mul(unbiased, Scalar(momentum))));
    }
  }
  const Tensor y = mul(centred, rsqrt(add(var, Scalar(eps))));
  return affine(y, weight, bias, x).to(x.dtype());
}

// ---- Dropout ---------------------------------------------------------------------------------------------------

namespace {
void check_p(double p, const char* op) {
  KILN_CHECK(p >= 0 && p <= 1, op, ": p must be in [0, 1], got ", p);
}
// The one-pass dropout kernel (ops/dropout_math.h): an element is kept where the f32 draw of the generator's
// stream is >= p (probability 1 - p), as rand(x.sizes()) >= p, and becomes x * ka + kb, else `drop`.
Tensor dropout_pass(const Tensor& input, double p, double ka, double kb, double drop, Generator* gen) {
  const Tensor x = input.contiguous();
  Tensor out = empty(x.sizes(), x.dtype(), x.device());
  const auto [seed, offset] = take_generator_offset(gen);
#if KILN_HAVE_CUDA
  if (x.is_cuda()) {
    cuda::dropout_apply(out, x, p, ka, kb, drop, seed, offset);
    return out;
  }
#endif
  cpu::dropout_apply(out, x, p, ka, kb, drop, seed, offset);
  return out;
}
}  // namespace

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  check_p(p, "dropout");
  if (!training || p == 0) return x;
  check_float(x, "dropout");
  if (p == 1) return zeros_like(x);
  return dropout_pass(x, p, 1.0 / (1.0 - p), 0.0, 0.0, gen);
}

Tensor& dropout_(Tensor& x, double p, bool training, Generator* gen) {
  check_p(p, "dropout_");
  if (!training || p == 0) return x;
  Tensor y = dropout(x, p, training, gen);
  return x.copy_(y);
}

Tensor alpha_dropout(const Tensor& x, double p, bool training, Generator* gen) {
  check_p(p, "alpha_dropout");
  if (!training || p == 0) return x;
  check_float(x, "alpha_dropout");
  if (p == 1) return zeros_like(x);
  // SELU's negative saturation -lambda * alpha; a and b keep zero mean and unit variance.
  const double alpha_p = -1.7580993408473766, q = 1 - p;
  const double a = 1.0 / std::sqrt(q + alpha_p * alpha_p * q * p), b = -a * alpha_p * p;
  // The dropped value computed as the kernel computes the kept ones: (alpha' * a) + b in the compute type.
  const bool f64 = x.dtype() == DType::F64;
  const double drop = f64 ? alpha_p * a + b : double(float(float(alpha_p) * float(a)) + float(b));
  return dropout_pass(x, p, a, b, drop, gen);
}

// ---- Embedding -----------------------------------------------------------------------------------------------

Tensor embedding(const Tensor& indices, const Tensor& weight) {
  KILN_CHECK(is_integral(indices.dtype(), false), "embedding: indices must be integers, got ", indices.meta());
  KILN_CHECK(weight.dim() == 2, "embedding: weight must be [num_embeddings, dim], got ", weight.meta());
  Shape out = indices.sizes();
  out.push_back(weight.size(1));
  return index_select(weight, 0, indices.reshape({-1})).reshape(out);
}

// ---- Losses ----------------------------------------------------------------------------------------------------

Tensor mse_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  check_float(input, "mse_loss");
  const Tensor d = sub(compute(input), compute(target));
  return reduce(mul(d, d), reduction, "mse_loss").to(input.dtype());
}

Tensor l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction) {
  check_float(input, "l1_loss");
  return reduce(abs(sub(compute(input), compute(target))), reduction, "l1_loss").to(input.dtype());
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, std::string_view reduction, double beta) {
  check_float(input, "smooth_l1_loss");
  KILN_CHECK(beta >= 0, "smooth_l1_loss: beta must be >= 0, got ", beta);
  const Tensor d = abs(sub(compute(input), compute(target)));
  if (beta == 0) return reduce(d, reduction, "smooth_l1_loss").to(input.dtype());
  const Tensor loss = where(lt(d, Scalar(beta)), mul(mul(d, d), Scalar(0.5 / beta)), sub(d, Scalar(0.5 * beta)));
  return reduce(loss, reduction, "smooth_l1_loss").to(input.dtype());
}

namespace {
// input [N, C, d...] (or [C]) and class-index target [N, d...] (or []): the picked log-probabilities, the per
// element class weights (0 where ignored), both target-shaped, in f32 / f64.
struct Picked {
  Tensor value, weight;
};
Picked pick(const Tensor& logp, const Tensor& target, const std::optional<Tensor>& class_weight, int64_t ignore_index,
            const char* op) {
  KILN_CHECK(target.dtype() == DType::I64 || target.dtype() == DType::I32 || target.dtype() == DType::U8, op,
             ": class-index targets must be integers, got ", target.meta());
  const bool unbatched = logp.dim() == 1;
  const Tensor in = unbatched ? logp.unsqueeze(0) : logp;
  const Tensor tg = (unbatched ? target.unsqueeze(0) : target).to(DType::I64);
  const int64_t c = in.size(1);
  Shape expect = in.sizes();
  expect.erase(expect.begin() + 1);
  KILN_CHECK(tg.sizes() == expect, op, ": target ", target.meta(), " must be the input ", logp.meta(),
             " without its class dim (dim 1)");
  if (class_weight) KILN_CHECK(class_weight->dim() == 1 && class_weight->size(0) == c, op, ": weight must be [", c,
                               "], got ", class_weight->meta());
  const Tensor ignored = eq(tg, Scalar(ignore_index));
  const Tensor safe = where(ignored, zeros_like(tg), tg);
  // A target outside [0, C) that is not ignore_index is an error (this reads the targets on the host).
  if (safe.numel()) {
    const int64_t lo = amin(safe).item<int64_t>(), hi = amax(safe).item<int64_t>();
    KILN_CHECK(lo >= 0 && hi < c, op, ": target ", lo < 0 ? lo : hi, " is out of bounds for ", c, " classes");
  }
  Picked p;
  p.value = gather(in, 1, safe.unsqueeze(1)).squeeze(1);
  Tensor w = class_weight ? index_select(compute(*class_weight), 0, safe.reshape({-1})).reshape(safe.sizes())
                          : ones(safe.sizes(), p.value.dtype(), p.value.device());
  p.weight = where(logical_not(ignored), w.to(p.value.dtype()), Scalar(0.0));
  if (unbatched) {
    p.value = p.value.squeeze(0);
    p.weight = p.weight.squeeze(0);
  }
  return p;
}

Tensor weighted_reduce(const Tensor& loss, const Tensor& weight, std::string_view reduction, const char* op) {
  if (reduction == "none") return loss;
  if (reduction == "sum") return sum(loss);
  KILN_CHECK(reduction == "mean", op, ": reduction must be 'mean', 'sum' or 'none', got '", reduction, "'");
  return div(sum(loss), sum(weight));
}
}  // namespace

Tensor nll_loss(const Tensor& input, const Tensor& target, const std::optional<Tensor>& weight, int64_t ignore_index,
                std::string_view reduction) {
  check_float(input, "nll_loss");
  KILN_CHECK(input.dim() >= 1, "nll_loss: expected [N, C, d...] or [C], got ", input.meta());
  const Picked p = pick(compute(input), target, weight, ignore_index, "nll_loss");
  const Tensor loss = neg(mul(p.value, p.weight));
  return weighted_reduce(loss, p.weight, reduction, "nll_loss").to(input.dtype());
}

Tensor cross_entropy(const Tensor& input, const Tensor& target, const std::optional<Tensor>& weight, int64_t ignore_index,
                     std::string_view reduction, double label_smoothing) {
  check_float(input, "cross_entropy");
  KILN_CHECK(input.dim() >= 1, "cross_entropy: expected [N, C, d...] or [C], got ", input.meta());
  KILN_CHECK(label_smoothing >= 0 && label_smoothing <= 1, "cross_entropy: label_smoothing must be in [0, 1], got ",
             label_smoothing);
  const int64_t class_dim = input.dim() == 1 ? 0 : 1;
  const int64_t c = input.size(class_dim);
#if KILN_HAVE_CUDA
  // Rows of logits with class indices: one read of each row on CUDA (cuda/loss.h), no host synchronisation (a
  // target out of range is raised at the next one).
  if (input.is_cuda() && input.dim() == 2 && input.is_contiguous() && c > 0 && target.is_cuda() &&
      (target.dtype() == DType::I64 || target.dtype() == DType::I32)) {
    KILN_CHECK(target.dim() == 1 && target.size(0) == input.size(0), "cross_entropy: target ", target.meta(),
               " must be the input ", input.meta(), " without its class dim (dim 1)");
    const DType acc = input.dtype() == DType::F64 ? DType::F64 : DType::F32;
    Tensor w, w_total;
    if (weight) {
      KILN_CHECK(weight->dim() == 1 && weight->size(0) == c && weight->device() == input.device(),
                 "cross_entropy: weight must be [", c, "] on ", input.device().str(), ", got ", weight->meta());
      w = weight->to(acc).contiguous();
      w_total = sum(w).reshape({1});
    }
    const int64_t n = input.size(0);
    Tensor nll = empty({n}, acc, input.device()), wsum = empty({n}, acc, input.device()),
           smooth = empty({n}, acc, input.device());
    cuda::cross_entropy_rows(input, target.contiguous(), w, w_total, ignore_index, nll, wsum, smooth);
    const double a = 1 - label_smoothing, b = label_smoothing / double(c);
    auto mix = [&](const Tensor& l, const Tensor& sm) { return label_smoothing > 0 ? add(mul(l, Scalar(a)), mul(sm, Scalar(b))) : l; };
    if (reduction == "none") return mix(nll, smooth).to(input.dtype());
    if (reduction == "sum") return mix(sum(nll), sum(smooth)).to(input.dtype());
    KILN_CHECK(reduction == "mean", "cross_entropy: reduction must be 'mean', 'sum' or 'none', got '", reduction, "'");
    return div(mix(sum(nll), sum(smooth)), sum(wsum)).to(input.dtype());
  }
#endif
  const Tensor logp = log_softmax(compute(input), class_dim);
  std::optional<Tensor> w;
  if (weight) w = compute(*weight);
  Tensor wb;  // the class weights broadcast along the class dim
  if (w) {
    KILN_CHECK(w->dim() == 1 && w->size(0) == c, "cross_entropy: weight must be [", c, "], got ", weight->meta());
    Shape s(static_cast<size_t>(input.dim()), 1);
    s[static_cast<size_t>(class_dim)] = c;
    wb = w->reshape(s);
  }
  if (is_floating(target.dtype())) {
    // Class probabilities: -sum_c w_c t_c log p_c per element; "mean" divides by the number of elements.
    KILN_CHECK(target.sizes() == input.sizes(), "cross_entropy: probability targets ", target.meta(),
               " must have the input's shape ", input.meta());
    Tensor t = compute(target);
    if (label_smoothing > 0) t = add(mul(t, Scalar(1 - label_smoothing)), Scalar(label_smoothing / double(c)));
    Tensor terms = mul(logp, t);
    if (w) terms = mul(terms, wb);
    const Tensor loss = neg(sum(terms, {class_dim}));
    if (reduction == "mean") return div(sum(loss), Scalar(double(std::max<int64_t>(loss.numel(), 1)))).to(input.dtype());
    return reduce(loss, reduction, "cross_entropy").to(input.dtype());
  }
  const Picked p = pick(logp, target, w, ignore_index, "cross_entropy");
  const Tensor nll = weighted_reduce(neg(mul(p.value, p.weight)), p.weight, reduction, "cross_entropy");
  if (label_smoothing == 0) return nll.to(input.dtype());
  // torch's smoothing term: -sum_c w_c log p_c per element (0 where ignored), normalised as the nll term.
  Tensor smooth = neg(sum(w ? mul(logp, wb) : logp, {class_dim}));
  const Tensor counted = gt(p.weight, Scalar(0.0));
  smooth = where(ne(target.to(DType::I64), Scalar(ignore_index)), smooth, Scalar(0.0));
  Tensor sm;
  if (reduction == "none") sm = smooth;
  else if (reduction == "sum") sm = sum(smooth);
  else sm = w ? div(sum(smooth), sum(p.weight)) : div(sum(smooth), sum(counted).to(smooth.dtype()));
  return add(mul(nll, Scalar(1 - label_smoothing)), mul(sm, Scalar(label_smoothing / double(c)))).to(input.dtype());
}

// ---- Counting ----------------------------------------------------------------------------------------------------

Tensor bincount(const Tensor& x, const std::optional<Tensor>& weights, int64_t minlength) {
  KILN_CHECK(x.dim() == 1 && is_integral(x.dtype(), false), "bincount: expected a 1-d tensor of non-negative integers, got ",
             x.meta());
  KILN_CHECK(minlength >= 0, "bincount: minlength must be >= 0, got ", minlength);
  if (weights) KILN_CHECK(weights->sizes() == x.sizes(), "bincount: weights ", weights->meta(), " must have the input's shape ",
                          x.meta());
  // int32 and int64 indices are read as they are; other integer dtypes widen to int64 first.
  const Tensor idx = (x.dtype() == DType::I32 || x.dtype() == DType::I64 ? x : x.to(DType::I64)).contiguous();
  const DType out = !weights ? DType::I64 : weights->dtype() == DType::F32 ? DType::F32 : DType::F64;
  std::optional<Tensor> w;
  if (weights) {
    KILN_CHECK(weights->device() == x.device(), "bincount: weights ", weights->meta(), " must be on the input's device (",
               x.meta(), ")");
    w = weights->to(out).contiguous();
  }
#if KILN_HAVE_CUDA
  if (x.is_cuda() && idx.numel()) {
    // One read counts the values below a few thousand and finds the range; a second pass only where larger
    // values (or minlength) need more bins than that. The output's length depends on the largest value, so the
    // host reads range: -min(0, min x) and max(0, max x).
    Tensor range = zeros({2}, DType::I64, x.device());
    Tensor counts = zeros({cuda::bincount_one_pass_bins(out)}, out, x.device());
    cuda::bincount_one_pass(idx, w, range, counts);
    const Tensor r = range.cpu();
    const auto neg = static_cast<uint64_t>(r.data<int64_t>()[0]);
    const int64_t hi = r.data<int64_t>()[1];
    KILN_CHECK(neg == 0, "bincount: the input holds a negative value (-", neg, "); only non-negative integers count");
    KILN_CHECK(hi < INT64_MAX, "bincount: the input's largest value ", hi, " leaves no room for its bin");
    const int64_t len = std::max(minlength, hi + 1);
    if (len <= counts.numel()) return counts.narrow(0, 0, len);
    counts = zeros({len}, out, x.device());
    cuda::bincount(idx, w, counts);
    return counts;
  }
#endif
  int64_t len = minlength;
  if (idx.numel()) {
    const int64_t lo = amin(idx).to(DType::I64).item<int64_t>(), hi = amax(idx).to(DType::I64).item<int64_t>();
    KILN_CHECK(lo >= 0, "bincount: the input holds a negative value (", lo, "); only non-negative integers count");
    KILN_CHECK(hi < INT64_MAX, "bincount: the input's largest value ", hi, " leaves no room for its bin");
    len = std::max(minlength, hi + 1);
  }
  Tensor counts = zeros({len}, out, x.device());
  if (!idx.numel()) return counts;
  cpu::bincount(idx, w, counts);
  return counts;
}

Tensor histc(const Tensor& x, int64_t bins, double lo, double hi) {
  check_float(x, "histc");
  KILN_CHECK(bins > 0, "histc: bins must be positive, got ", bins);
  KILN_CHECK(lo <= hi, "histc: max (", hi, ") must not be below min (", lo, ")");
  const Tensor xf = x.reshape({-1}).to(DType::F64);
  if (lo == hi && xf.numel()) {
    lo = amin(xf).item<double>();
    hi = amax(xf).item<double>();
  }
  if (lo == hi) {
    lo -= 1;
    hi += 1;
  }
  KILN_CHECK(std::isfinite(lo) && std::isfinite(hi), "histc: the range [", lo, ", ", hi, "] is not finite");
  // Bin of v: floor((v - lo) * bins / (hi - lo)), the top edge in the last bin; outside [lo, hi] not counted.
  const Tensor inside = logical_and(ge(xf, Scalar(lo)), le(xf, Scalar(hi)));
  Tensor b = floor(mul(sub(xf, Scalar(lo)), Scalar(double(bins) / (hi - lo)))).to(DType::I64);
  b = clamp(b, Scalar(int64_t{0}), Scalar(bins - 1));
  const Tensor w = where(inside, ones_like(xf), Scalar(0.0));
  Tensor counts = zeros({bins}, DType::F64, x.device());
  scatter_add_(counts, 0, b, w);
  return counts.to(x.dtype());
}

}  // namespace kiln
