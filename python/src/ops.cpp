// kiln/ops.h under torch's names and arguments: creation, random numbers, elementwise math, reductions,
// indexing, matrix products; the Tensor methods and Python operators that call the same functions.
#include "kiln_py.h"

namespace kiln::py {

namespace {

using TensorClass = nb::class_<Tensor>;

// Registers `f` as kiln.<name>(input, ...) and as the method Tensor.<name>(...).
template <class F, class... Extra>
void def_op(nb::module_& m, TensorClass& cls, const char* name, F f, const char* doc, const Extra&... extra) {
  m.def(name, f, nb::arg("input"), extra..., doc, release_gil());
  cls.def(name, f, extra..., doc, release_gil());
}

// s op t for a Python number s: the number as a 0-d tensor of the dtype torch gives the result, so that
// type promotion matches torch's reflected operators.
Tensor lhs_scalar(const Scalar& s, const Tensor& t) {
  return scalar_tensor(s, result_type({t}, {s}), t.device());
}

Shape size_args(const nb::args& args) { return shape_args(args, "size"); }

// The comparisons, as functions (kiln.eq) and as Python operators (__eq__).
struct Comparison {
  const char* name;
  const char* dunder;
  Tensor (*tt)(const Tensor&, const Tensor&);
  Tensor (*ts)(const Tensor&, const Scalar&);
};
const Comparison kComparisons[] = {{"eq", "__eq__", &eq, &eq}, {"ne", "__ne__", &ne, &ne}, {"lt", "__lt__", &lt, &lt},
                                   {"le", "__le__", &le, &le}, {"gt", "__gt__", &gt, &gt}, {"ge", "__ge__", &ge, &ge}};

std::vector<int64_t> dims_or_all(const Dims& d) { return d.all ? std::vector<int64_t>{} : d.dims; }

Generator* gen_ptr(std::optional<Generator*> g) { return g ? *g : nullptr; }

void bind_creation(nb::module_& m) {
  m.def("empty", [](nb::args size, std::optional<DType> dtype, std::optional<Device> device) {
    const Shape s = size_args(size);
    nb::gil_scoped_release r;
    return empty(s, dtype.value_or(kDefaultFloat), device.value_or(kCPU));
  }, nb::arg("size"), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(),
     "An uninitialised tensor: empty(2, 3) or empty((2, 3)).");
  m.def("zeros", [](nb::args size, std::optional<DType> dtype, std::optional<Device> device) {
    const Shape s = size_args(size);
    nb::gil_scoped_release r;
    return zeros(s, dtype.value_or(kDefaultFloat), device.value_or(kCPU));
  }, nb::arg("size"), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none());
  m.def("ones", [](nb::args size, std::optional<DType> dtype, std::optional<Device> device) {
    const Shape s = size_args(size);
    nb::gil_scoped_release r;
    return ones(s, dtype.value_or(kDefaultFloat), device.value_or(kCPU));
  }, nb::arg("size"), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none());
  m.def("full", [](const Shape& size, const Scalar& v, std::optional<DType> dtype, std::optional<Device> device) {
    return full(size, v, dtype, device.value_or(kCPU));
  }, nb::arg("size"), nb::arg("fill_value"), nb::kw_only(), nb::arg("dtype") = nb::none(),
     nb::arg("device") = nb::none(), release_gil());
  // *_like with torch's dtype= / device= overrides.
  m.def("empty_like", [](const Tensor& t, std::optional<DType> dtype, std::optional<Device> device) {
    return (dtype || device) ? empty(t.sizes(), dtype.value_or(t.dtype()), device.value_or(t.device())) : empty_like(t);
  }, nb::arg("input"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(), release_gil());
  m.def("zeros_like", [](const Tensor& t, std::optional<DType> dtype, std::optional<Device> device) {
    return (dtype || device) ? zeros(t.sizes(), dtype.value_or(t.dtype()), device.value_or(t.device())) : zeros_like(t);
  }, nb::arg("input"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(), release_gil());
  m.def("ones_like", [](const Tensor& t, std::optional<DType> dtype, std::optional<Device> device) {
    return (dtype || device) ? ones(t.sizes(), dtype.value_or(t.dtype()), device.value_or(t.device())) : ones_like(t);
  }, nb::arg("input"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(), release_gil());
  m.def("full_like", [](const Tensor& t, const Scalar& v, std::optional<DType> dtype, std::optional<Device> device) {
    return (dtype || device) ? full(t.sizes(), v, dtype.value_or(t.dtype()), device.value_or(t.device()))
                             : full_like(t, v);
  }, nb::arg("input"), nb::arg("fill_value"), nb::kw_only(), nb::arg("dtype") = nb::none(),
     nb::arg("device") = nb::none(), release_gil());
  m.def("scalar_tensor", [](const Scalar& v, std::optional<DType> dtype, std::optional<Device> device) {
    return scalar_tensor(v, dtype, device.value_or(kCPU));
  }, nb::arg("s"), nb::kw_only(), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(), release_gil());
  m.def("arange", [](const Scalar& a, std::optional<Scalar> b, const Scalar& step, std::optional<DType> dtype,
                     std::optional<Device> device) {
    if (!b) return arange(a, dtype, device.value_or(kCPU));
    return arange(a, *b, step, dtype, device.value_or(kCPU));
  }, nb::arg("start"), nb::arg("end") = nb::none(), nb::arg("step") = 1, nb::kw_only(), nb::arg("dtype") = nb::none(),
     nb::arg("device") = nb::none(), release_gil(), "arange(end) or arange(start, end, step=1), as torch.arange.");
  m.def("linspace", [](double a, double b, int64_t steps, std::optional<DType> dtype, std::optional<Device> device) {
    return linspace(a, b, steps, dtype.value_or(kDefaultFloat), device.value_or(kCPU));
  }, nb::arg("start"), nb::arg("end"), nb::arg("steps"), nb::kw_only(), nb::arg("dtype") = nb::none(),
     nb::arg("device") = nb::none(), release_gil());
  m.def("logspace", [](double a, double b, int64_t steps, double base, std::optional<DType> dtype,
                       std::optional<Device> device) {
    return logspace(a, b, steps, base, dtype.value_or(kDefaultFloat), device.value_or(kCPU));
  }, nb::arg("start"), nb::arg("end"), nb::arg("steps"), nb::arg("base") = 10.0, nb::kw_only(),
     nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(), release_gil());
  m.def("eye", [](int64_t n, std::optional<int64_t> mm, std::optional<DType> dtype, std::optional<Device> device) {
    return eye(n, mm, dtype.value_or(kDefaultFloat), device.value_or(kCPU));
  }, nb::arg("n"), nb::arg("m") = nb::none(), nb::kw_only(), nb::arg("dtype") = nb::none(),
     nb::arg("device") = nb::none(), release_gil());
}

void bind_random(nb::module_& m, TensorClass& cls) {
  nb::class_<Generator>(m, "Generator",
                        "A Philox4x32-10 counter-based generator: the same seed gives the same numbers on the CPU "
                        "and CUDA.")
      .def(nb::init<uint64_t>(), nb::arg("seed") = 0x4B494C4EULL)
      .def("manual_seed", [](Generator& g, uint64_t s) -> Generator& {
        g.manual_seed(s);
        return g;
      }, nb::arg("seed"), nb::rv_policy::reference)
      .def("initial_seed", &Generator::seed)
      .def_prop_rw("offset", &Generator::offset, &Generator::set_offset);
  m.def("manual_seed", &manual_seed, nb::arg("seed"), "Seeds the default generator.");
  m.def("default_generator", &default_generator, nb::rv_policy::reference);
  auto rnd = [&](const char* name, auto f) {
    m.def(name, [f](nb::args size, std::optional<DType> dtype, std::optional<Device> device,
                    std::optional<Generator*> gen) {
      const Shape s = size_args(size);
      nb::gil_scoped_release r;
      return f(s, dtype.value_or(kDefaultFloat), device.value_or(kCPU), gen_ptr(gen));
    }, nb::arg("size"), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(),
       nb::arg("generator") = nb::none());
  };
  rnd("rand", [](const Shape& s, DType d, Device dev, Generator* g) { return rand(s, d, dev, g); });
  rnd("randn", [](const Shape& s, DType d, Device dev, Generator* g) { return randn(s, d, dev, g); });
  m.def("randint", [](nb::args args, std::optional<DType> dtype, std::optional<Device> device,
                      std::optional<Generator*> gen) {
    // randint(high, size) or randint(low, high, size), as torch.randint.
    if (args.size() != 2 && args.size() != 3) throw nb::type_error("randint(low=0, high, size)");
    const int64_t low = args.size() == 3 ? int_arg(args[0], "randint: low") : 0;
    const int64_t high = int_arg(args[args.size() - 2], "randint: high");
    const Shape s = shape_args(nb::make_tuple(args[args.size() - 1]), "randint: size");
    nb::gil_scoped_release r;
    return randint(low, high, s, dtype.value_or(DType::I64), device.value_or(kCPU), gen_ptr(gen));
  }, nb::arg("args"), nb::arg("dtype") = nb::none(), nb::arg("device") = nb::none(), nb::arg("generator") = nb::none());
  cls.def("uniform_", [](Tensor& t, double a, double b, std::optional<Generator*> g) -> Tensor& {
    return uniform_(t, a, b, gen_ptr(g));
  }, nb::arg("from") = 0.0, nb::arg("to") = 1.0, nb::kw_only(), nb::arg("generator") = nb::none(),
     nb::rv_policy::none, release_gil());
  cls.def("normal_", [](Tensor& t, double mean, double std, std::optional<Generator*> g) -> Tensor& {
    return normal_(t, mean, std, gen_ptr(g));
  }, nb::arg("mean") = 0.0, nb::arg("std") = 1.0, nb::kw_only(), nb::arg("generator") = nb::none(),
     nb::rv_policy::none, release_gil());
}

void bind_unary(nb::module_& m, TensorClass& cls) {
  struct U {
    const char* name;
    Tensor (*f)(const Tensor&);
  };
  static const U unary[] = {
      {"neg", &neg},         {"negative", &neg},       {"abs", &abs},        {"exp", &exp},
      {"exp2", &exp2},       {"expm1", &expm1},        {"log", &log},        {"log2", &log2},
      {"log10", &log10},     {"log1p", &log1p},        {"sqrt", &sqrt},      {"rsqrt", &rsqrt},
      {"reciprocal", &reciprocal}, {"square", &square}, {"sin", &sin},       {"cos", &cos},
      {"tan", &tan},         {"asin", &asin},          {"arcsin", &asin},    {"acos", &acos},
      {"arccos", &acos},     {"atan", &atan},          {"arctan", &atan},    {"sinh", &sinh},
      {"cosh", &cosh},       {"tanh", &tanh},          {"sigmoid", &sigmoid}, {"erf", &erf},
      {"floor", &floor},     {"ceil", &ceil},          {"trunc", &trunc},    {"sign", &sign},
      {"signbit", &signbit}, {"isnan", &isnan},        {"isinf", &isinf},    {"isfinite", &isfinite},
      {"logical_not", &logical_not}, {"bitwise_not", &bitwise_not}, {"relu", &relu}, {"silu", &silu},
  };
  for (const U& u : unary) def_op(m, cls, u.name, u.f, "Elementwise, as the torch function of the same name.");
  def_op(m, cls, "round", [](const Tensor& x, int64_t decimals) { return round(x, decimals); },
         "Rounds half to even, to `decimals` decimal places.", nb::kw_only(), nb::arg("decimals") = 0);
  def_op(m, cls, "gelu", [](const Tensor& x, std::string_view approximate) { return gelu(x, approximate); },
         "GELU: approximate 'none' (erf) or 'tanh'.", nb::kw_only(), nb::arg("approximate") = "none");
  def_op(m, cls, "frexp", [](const Tensor& x) { return frexp(x); },
         "(mantissa, exponent) with x = mantissa * 2**exponent, |mantissa| in [0.5, 1), exponent int32.");
  struct I {
    const char* name;
    Tensor& (*f)(Tensor&);
  };
  static const I inplace[] = {{"neg_", &neg_},     {"abs_", &abs_},   {"exp_", &exp_},   {"log_", &log_},
                              {"sqrt_", &sqrt_},   {"rsqrt_", &rsqrt_}, {"sigmoid_", &sigmoid_}, {"silu_", &silu_},
                              {"relu_", &relu_},   {"tanh_", &tanh_}, {"floor_", &floor_}, {"ceil_", &ceil_},
                              {"round_", &round_}};
  for (const I& u : inplace) {
    m.def(u.name, u.f, nb::arg("input"), nb::rv_policy::none, release_gil());
    cls.def(u.name, u.f, nb::rv_policy::none, release_gil());
  }
}

void bind_binary(nb::module_& m, TensorClass& cls) {
  // add / sub with alpha and out=.
  auto add_tt = [](const Tensor& a, const Tensor& b, const Scalar& alpha, std::optional<Tensor> out) {
    if (out) return add_out(*out, a, b, alpha);
    return add(a, b, alpha);
  };
  auto sub_tt = [](const Tensor& a, const Tensor& b, const Scalar& alpha, std::optional<Tensor> out) {
    if (out) return sub_out(*out, a, b, alpha);
    return sub(a, b, alpha);
  };
  auto mul_tt = [](const Tensor& a, const Tensor& b, std::optional<Tensor> out) {
    if (out) return mul_out(*out, a, b);
    return mul(a, b);
  };
  auto div_tt = [](const Tensor& a, const Tensor& b, std::optional<std::string_view> mode, std::optional<Tensor> out) {
    if (out) {
      KILN_CHECK(!mode, "div: out= with a rounding_mode is not supported");
      return div_out(*out, a, b);
    }
    return div(a, b, mode);
  };
  for (const char* name : {"add", "sub", "subtract"}) {
    const bool is_add = name[0] == 'a';
    if (is_add) def_op(m, cls, name, add_tt, "input + alpha * other", nb::arg("other"), nb::kw_only(),
                       nb::arg("alpha") = 1, nb::arg("out") = nb::none());
    else def_op(m, cls, name, sub_tt, "input - alpha * other", nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1,
                nb::arg("out") = nb::none());
    def_op(m, cls, name, [is_add](const Tensor& a, const Scalar& b, const Scalar& alpha) {
      return is_add ? add(a, b, alpha) : sub(a, b, alpha);
    }, "input + alpha * other", nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1);
  }
  for (const char* name : {"mul", "multiply"}) {
    def_op(m, cls, name, mul_tt, "input * other", nb::arg("other"), nb::kw_only(), nb::arg("out") = nb::none());
    def_op(m, cls, name, [](const Tensor& a, const Scalar& b) { return mul(a, b); }, "input * other", nb::arg("other"));
  }
  for (const char* name : {"div", "divide", "true_divide"}) {
    def_op(m, cls, name, div_tt, "input / other; rounding_mode None (true division), 'trunc' or 'floor'",
           nb::arg("other"), nb::kw_only(), nb::arg("rounding_mode") = nb::none(), nb::arg("out") = nb::none());
    def_op(m, cls, name, [](const Tensor& a, const Scalar& b, std::optional<std::string_view> mode) {
      return div(a, b, mode);
    }, "input / other", nb::arg("other"), nb::kw_only(), nb::arg("rounding_mode") = nb::none());
  }
  def_op(m, cls, "floor_divide", [](const Tensor& a, const Tensor& b) { return div(a, b, "floor"); },
         "Division rounded down.", nb::arg("other"));
  def_op(m, cls, "floor_divide", [](const Tensor& a, const Scalar& b) { return div(a, b, "floor"); },
         "Division rounded down.", nb::arg("other"));
  def_op(m, cls, "pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, "input ** exponent",
         nb::arg("exponent"));
  def_op(m, cls, "pow", [](const Tensor& a, const Scalar& b) { return pow(a, b); }, "input ** exponent",
         nb::arg("exponent"));
  m.def("pow", [](const Scalar& a, const Tensor& b) { return pow(a, b); }, nb::arg("self"), nb::arg("exponent"),
        release_gil());
  def_op(m, cls, "fmod", [](const Tensor& a, const Tensor& b) { return fmod(a, b); }, "Remainder with the sign of input.",
         nb::arg("other"));
  def_op(m, cls, "fmod", [](const Tensor& a, const Scalar& b) { return fmod(a, b); }, "Remainder with the sign of input.",
         nb::arg("other"));
  def_op(m, cls, "remainder", [](const Tensor& a, const Tensor& b) { return remainder(a, b); },
         "Remainder with the sign of other (Python's %).", nb::arg("other"));
  def_op(m, cls, "remainder", [](const Tensor& a, const Scalar& b) { return remainder(a, b); },
         "Remainder with the sign of other (Python's %).", nb::arg("other"));
  struct B {
    const char* name;
    Tensor (*f)(const Tensor&, const Tensor&);
  };
  static const B binary[] = {{"maximum", &maximum},         {"minimum", &minimum},
                             {"atan2", &atan2},             {"arctan2", &atan2},
                             {"heaviside", &heaviside},     {"bitwise_and", &bitwise_and},
                             {"bitwise_or", &bitwise_or},   {"bitwise_xor", &bitwise_xor},
                             {"bitwise_left_shift", &bitwise_left_shift},
                             {"bitwise_right_shift", &bitwise_right_shift},
                             {"logical_and", &logical_and}, {"logical_or", &logical_or},
                             {"logical_xor", &logical_xor}};
  for (const B& b : binary) def_op(m, cls, b.name, b.f, "Elementwise, as the torch function of the same name.", nb::arg("other"));
  for (const Comparison& c : kComparisons) {
    def_op(m, cls, c.name, c.tt, "Elementwise comparison (bool result).", nb::arg("other"));
    def_op(m, cls, c.name, c.ts, "Elementwise comparison (bool result).", nb::arg("other"));
  }
  m.def("where", [](const Tensor& c, const Tensor& a, const Tensor& b) { return where(c, a, b); }, nb::arg("condition"),
        nb::arg("input"), nb::arg("other"), release_gil());
  m.def("where", [](const Tensor& c, const Tensor& a, const Scalar& b) { return where(c, a, b); }, nb::arg("condition"),
        nb::arg("input"), nb::arg("other"), release_gil());
  m.def("where", [](const Tensor& c, const Scalar& a, const Tensor& b) { return where(logical_not(c), b, a); },
        nb::arg("condition"), nb::arg("input"), nb::arg("other"), release_gil());
  def_op(m, cls, "clamp", [](const Tensor& x, std::optional<Scalar> lo, std::optional<Scalar> hi) {
    return clamp(x, lo, hi);
  }, "Clamps to [min, max]; either may be None.", nb::arg("min") = nb::none(), nb::arg("max") = nb::none());
  def_op(m, cls, "clamp", [](const Tensor& x, std::optional<Tensor> lo, std::optional<Tensor> hi) {
    return clamp(x, lo, hi);
  }, "Clamps to [min, max]; either may be None.", nb::arg("min") = nb::none(), nb::arg("max") = nb::none());
  m.def("clip", [](const Tensor& x, std::optional<Scalar> lo, std::optional<Scalar> hi) { return clamp(x, lo, hi); },
        nb::arg("input"), nb::arg("min") = nb::none(), nb::arg("max") = nb::none(), release_gil());
  // In place.
  cls.def("add_", [](Tensor& s, const Tensor& o, const Scalar& alpha) -> Tensor& { return add_(s, o, alpha); },
          nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1, nb::rv_policy::none, release_gil());
  cls.def("add_", [](Tensor& s, const Scalar& o, const Scalar& alpha) -> Tensor& { return add_(s, o, alpha); },
          nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1, nb::rv_policy::none, release_gil());
  cls.def("sub_", [](Tensor& s, const Tensor& o, const Scalar& alpha) -> Tensor& { return sub_(s, o, alpha); },
          nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1, nb::rv_policy::none, release_gil());
  cls.def("sub_", [](Tensor& s, const Scalar& o, const Scalar& alpha) -> Tensor& {
    return add_(s, o, alpha.is_floating() ? Scalar(-alpha.to_double()) : Scalar(-alpha.to_int64()));
  }, nb::arg("other"), nb::kw_only(), nb::arg("alpha") = 1, nb::rv_policy::none, release_gil());
  cls.def("mul_", [](Tensor& s, const Tensor& o) -> Tensor& { return mul_(s, o); }, nb::arg("other"),
          nb::rv_policy::none, release_gil());
  cls.def("mul_", [](Tensor& s, const Scalar& o) -> Tensor& { return mul_(s, o); }, nb::arg("other"),
          nb::rv_policy::none, release_gil());
  cls.def("div_", [](Tensor& s, const Tensor& o) -> Tensor& { return div_(s, o); }, nb::arg("other"),
          nb::rv_policy::none, release_gil());
  cls.def("div_", [](Tensor& s, const Scalar& o) -> Tensor& { return div_(s, o); }, nb::arg("other"),
          nb::rv_policy::none, release_gil());
  cls.def("clamp_", [](Tensor& s, std::optional<Scalar> lo, std::optional<Scalar> hi) -> Tensor& {
    return clamp_(s, lo, hi);
  }, nb::arg("min") = nb::none(), nb::arg("max") = nb::none(), nb::rv_policy::none, release_gil());
  cls.def("masked_fill_", [](Tensor& s, const Tensor& mask, const Scalar& v) -> Tensor& {
    return masked_fill_(s, mask, v);
  }, nb::arg("mask"), nb::arg("value"), nb::rv_policy::none, release_gil());
  m.def("result_type", [](nb::handle a, nb::handle b) {
    std::vector<Tensor> ts;
    std::vector<Scalar> ss;
    for (nb::handle h : {a, b}) {
      if (nb::isinstance<Tensor>(h)) ts.push_back(nb::cast<Tensor>(h));
      else if (auto s = scalar_from_object(h)) ss.push_back(*s);
      else throw nb::type_error("result_type: expected tensors or numbers");
    }
    return result_type(ts, ss);
  }, nb::arg("tensor1"), nb::arg("tensor2"));
  m.def("promote_types", &promote_types, nb::arg("type1"), nb::arg("type2"));
}

// Python's operators on kiln.Tensor. A failed conversion returns NotImplemented (nb::is_operator), so a
// NumPy array on the left or right gets its own chance.
void bind_operators(TensorClass& cls) {
  auto op = nb::is_operator();
  cls.def("__add__", [](const Tensor& a, const Tensor& b) { return add(a, b); }, op, release_gil())
      .def("__add__", [](const Tensor& a, const Scalar& b) { return add(a, b); }, op, release_gil())
      .def("__radd__", [](const Tensor& a, const Scalar& b) { return add(a, b); }, op, release_gil())
      .def("__sub__", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, op, release_gil())
      .def("__sub__", [](const Tensor& a, const Scalar& b) { return sub(a, b); }, op, release_gil())
      .def("__rsub__", [](const Tensor& a, const Scalar& b) { return sub(lhs_scalar(b, a), a); }, op, release_gil())
      .def("__mul__", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, op, release_gil())
      .def("__mul__", [](const Tensor& a, const Scalar& b) { return mul(a, b); }, op, release_gil())
      .def("__rmul__", [](const Tensor& a, const Scalar& b) { return mul(a, b); }, op, release_gil())
      .def("__truediv__", [](const Tensor& a, const Tensor& b) { return div(a, b); }, op, release_gil())
      .def("__truediv__", [](const Tensor& a, const Scalar& b) { return div(a, b); }, op, release_gil())
      .def("__rtruediv__", [](const Tensor& a, const Scalar& b) { return div(lhs_scalar(b, a), a); }, op, release_gil())
      .def("__floordiv__", [](const Tensor& a, const Tensor& b) { return div(a, b, "floor"); }, op, release_gil())
      .def("__floordiv__", [](const Tensor& a, const Scalar& b) { return div(a, b, "floor"); }, op, release_gil())
      .def("__rfloordiv__", [](const Tensor& a, const Scalar& b) { return div(lhs_scalar(b, a), a, "floor"); }, op,
           release_gil())
      .def("__mod__", [](const Tensor& a, const Tensor& b) { return remainder(a, b); }, op, release_gil())
      .def("__mod__", [](const Tensor& a, const Scalar& b) { return remainder(a, b); }, op, release_gil())
      .def("__rmod__", [](const Tensor& a, const Scalar& b) { return remainder(lhs_scalar(b, a), a); }, op, release_gil())
      .def("__pow__", [](const Tensor& a, const Tensor& b) { return pow(a, b); }, op, release_gil())
      .def("__pow__", [](const Tensor& a, const Scalar& b) { return pow(a, b); }, op, release_gil())
      .def("__rpow__", [](const Tensor& a, const Scalar& b) { return pow(b, a); }, op, release_gil())
      .def("__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); }, op, release_gil())
      .def("__neg__", [](const Tensor& a) { return neg(a); }, release_gil())
      .def("__pos__", [](const Tensor& a) { return a; })
      .def("__abs__", [](const Tensor& a) { return abs(a); }, release_gil())
      .def("__invert__", [](const Tensor& a) { return a.dtype() == DType::Bool ? logical_not(a) : bitwise_not(a); },
           release_gil())
      .def("__and__", [](const Tensor& a, const Tensor& b) { return bitwise_and(a, b); }, op, release_gil())
      .def("__or__", [](const Tensor& a, const Tensor& b) { return bitwise_or(a, b); }, op, release_gil())
      .def("__xor__", [](const Tensor& a, const Tensor& b) { return bitwise_xor(a, b); }, op, release_gil())
      .def("__lshift__", [](const Tensor& a, const Tensor& b) { return bitwise_left_shift(a, b); }, op, release_gil())
      .def("__rshift__", [](const Tensor& a, const Tensor& b) { return bitwise_right_shift(a, b); }, op, release_gil())
      .def("__iadd__", [](Tensor& a, const Tensor& b) -> Tensor& { return add_(a, b); }, op, nb::rv_policy::none, release_gil())
      .def("__iadd__", [](Tensor& a, const Scalar& b) -> Tensor& { return add_(a, b); }, op, nb::rv_policy::none, release_gil())
      .def("__isub__", [](Tensor& a, const Tensor& b) -> Tensor& { return sub_(a, b); }, op, nb::rv_policy::none, release_gil())
      .def("__isub__", [](Tensor& a, const Scalar& b) -> Tensor& { return add_(a, b, -1); }, op, nb::rv_policy::none,
           release_gil())
      .def("__imul__", [](Tensor& a, const Tensor& b) -> Tensor& { return mul_(a, b); }, op, nb::rv_policy::none, release_gil())
      .def("__imul__", [](Tensor& a, const Scalar& b) -> Tensor& { return mul_(a, b); }, op, nb::rv_policy::none, release_gil())
      .def("__itruediv__", [](Tensor& a, const Tensor& b) -> Tensor& { return div_(a, b); }, op, nb::rv_policy::none,
           release_gil())
      .def("__itruediv__", [](Tensor& a, const Scalar& b) -> Tensor& { return div_(a, b); }, op, nb::rv_policy::none,
           release_gil())
      .def("__hash__", [](nb::handle self) { return reinterpret_cast<intptr_t>(self.ptr()); });
  for (const Comparison& c : kComparisons) {
    cls.def(c.dunder, c.tt, op, release_gil());
    cls.def(c.dunder, c.ts, op, release_gil());
  }
}

void bind_reductions(nb::module_& m, TensorClass& cls) {
  def_op(m, cls, "sum", [](const Tensor& x, const Dims& d, bool keepdim, std::optional<DType> dtype) {
    return sum(x, dims_or_all(d), keepdim, dtype);
  }, "Sum over `dim` (all dims when None).", nb::arg("dim") = nb::none(), nb::arg("keepdim") = false, nb::kw_only(),
         nb::arg("dtype") = nb::none());
  def_op(m, cls, "mean", [](const Tensor& x, const Dims& d, bool keepdim, std::optional<DType> dtype) {
    return mean(x, dims_or_all(d), keepdim, dtype);
  }, "Mean over `dim` (all dims when None).", nb::arg("dim") = nb::none(), nb::arg("keepdim") = false, nb::kw_only(),
         nb::arg("dtype") = nb::none());
  def_op(m, cls, "prod", [](const Tensor& x, const Dims& d, bool keepdim, std::optional<DType> dtype) {
    return prod(x, dims_or_all(d), keepdim, dtype);
  }, "Product over `dim` (all dims when None).", nb::arg("dim") = nb::none(), nb::arg("keepdim") = false, nb::kw_only(),
         nb::arg("dtype") = nb::none());
  def_op(m, cls, "amax", [](const Tensor& x, const Dims& d, bool keepdim) { return amax(x, dims_or_all(d), keepdim); },
         "Maximum over `dim` (NaN propagates).", nb::arg("dim") = nb::none(), nb::arg("keepdim") = false);
  def_op(m, cls, "amin", [](const Tensor& x, const Dims& d, bool keepdim) { return amin(x, dims_or_all(d), keepdim); },
         "Minimum over `dim` (NaN propagates).", nb::arg("dim") = nb::none(), nb::arg("keepdim") = false);
  for (const bool is_max : {true, false}) {
    const char* name = is_max ? "max" : "min";
    def_op(m, cls, name, [is_max](const Tensor& x) { return is_max ? max(x) : min(x); }, "Of all elements.");
    def_op(m, cls, name, [is_max](const Tensor& x, int64_t dim, bool keepdim) {
      return is_max ? max(x, dim, keepdim) : min(x, dim, keepdim);
    }, "(values, indices) along `dim`; ties give the first index, NaN wins.", nb::arg("dim"), nb::arg("keepdim") = false);
    def_op(m, cls, name, [is_max](const Tensor& x, const Tensor& other) {
      return is_max ? maximum(x, other) : minimum(x, other);
    }, "Elementwise, as maximum / minimum.", nb::arg("other"));
  }
  def_op(m, cls, "argmax", [](const Tensor& x, std::optional<int64_t> dim, bool keepdim) { return argmax(x, dim, keepdim); },
         "Index of the maximum (of the flattened tensor when dim is None).", nb::arg("dim") = nb::none(),
         nb::arg("keepdim") = false);
  def_op(m, cls, "argmin", [](const Tensor& x, std::optional<int64_t> dim, bool keepdim) { return argmin(x, dim, keepdim); },
         "Index of the minimum (of the flattened tensor when dim is None).", nb::arg("dim") = nb::none(),
         nb::arg("keepdim") = false);
  def_op(m, cls, "all", [](const Tensor& x, const Dims& d, bool keepdim) { return all(x, dims_or_all(d), keepdim); },
         "True where every element is nonzero.", nb::arg("dim") = nb::none(), nb::arg("keepdim") = false);
  def_op(m, cls, "any", [](const Tensor& x, const Dims& d, bool keepdim) { return any(x, dims_or_all(d), keepdim); },
         "True where some element is nonzero.", nb::arg("dim") = nb::none(), nb::arg("keepdim") = false);
  def_op(m, cls, "var", [](const Tensor& x, const Dims& d, std::optional<bool> unbiased, std::optional<double> correction,
                           bool keepdim) {
    const double c = correction ? *correction : unbiased ? (*unbiased ? 1.0 : 0.0) : 1.0;
    return kiln::var(x, dims_or_all(d), c, keepdim);
  }, "Variance; correction=1 (Bessel) by default.", nb::arg("dim") = nb::none(), nb::arg("unbiased") = nb::none(),
         nb::kw_only(), nb::arg("correction") = nb::none(), nb::arg("keepdim") = false);
  def_op(m, cls, "std", [](const Tensor& x, const Dims& d, std::optional<bool> unbiased, std::optional<double> correction,
                           bool keepdim) {
    const double c = correction ? *correction : unbiased ? (*unbiased ? 1.0 : 0.0) : 1.0;
    return kiln::std(x, dims_or_all(d), c, keepdim);
  }, "Standard deviation; correction=1 (Bessel) by default.", nb::arg("dim") = nb::none(),
         nb::arg("unbiased") = nb::none(), nb::kw_only(), nb::arg("correction") = nb::none(), nb::arg("keepdim") = false);
  def_op(m, cls, "norm", [](const Tensor& x, double p, const Dims& d, bool keepdim) {
    return norm(x, p, dims_or_all(d), keepdim);
  }, "Vector p-norm over `dim` (all dims when None).", nb::arg("p") = 2.0, nb::arg("dim") = nb::none(),
         nb::arg("keepdim") = false);
  def_op(m, cls, "logsumexp", [](const Tensor& x, const Dims& d, bool keepdim) {
    return logsumexp(x, dims_or_all(d), keepdim);
  }, "log(sum(exp(x))) over `dim`, computed stably.", nb::arg("dim"), nb::arg("keepdim") = false);
}

void bind_indexing(nb::module_& m, TensorClass& cls) {
  for (const char* name : {"cat", "concat", "concatenate"})
    m.def(name, &cat, nb::arg("tensors"), nb::arg("dim") = 0, release_gil());
  m.def("stack", &stack, nb::arg("tensors"), nb::arg("dim") = 0, release_gil());
  def_op(m, cls, "split", [](const Tensor& x, int64_t size, int64_t dim) { return split(x, size, dim); },
         "Views of `split_size` along `dim` (the last may be smaller).", nb::arg("split_size_or_sections"),
         nb::arg("dim") = 0);
  def_op(m, cls, "split", [](const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
    return split_with_sizes(x, sizes, dim);
  }, "Views of the given sizes along `dim`.", nb::arg("split_size_or_sections"), nb::arg("dim") = 0);
  def_op(m, cls, "chunk", &chunk, "`chunks` views along `dim`.", nb::arg("chunks"), nb::arg("dim") = 0);
  def_op(m, cls, "index_select", &index_select, "Entries at `index` (1-d) along `dim`.", nb::arg("dim"), nb::arg("index"));
  def_op(m, cls, "gather", &gather, "out[i][j] = input[index[i][j]][j] for dim 0, and so on.", nb::arg("dim"),
         nb::arg("index"));
  def_op(m, cls, "scatter", [](const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src) {
    return scatter(x, dim, index, src);
  }, "A copy of input with src written at index along dim.", nb::arg("dim"), nb::arg("index"), nb::arg("src"));
  def_op(m, cls, "scatter", [](const Tensor& x, int64_t dim, const Tensor& index, const Scalar& value) {
    return scatter(x, dim, index, value);
  }, "A copy of input with value written at index along dim.", nb::arg("dim"), nb::arg("index"), nb::arg("value"));
  def_op(m, cls, "scatter_add", &scatter_add, "A copy of input with src added at index along dim.", nb::arg("dim"),
         nb::arg("index"), nb::arg("src"));
  cls.def("scatter_", [](Tensor& s, int64_t dim, const Tensor& i, const Tensor& src) -> Tensor& {
    return scatter_(s, dim, i, src);
  }, nb::arg("dim"), nb::arg("index"), nb::arg("src"), nb::rv_policy::none, release_gil());
  cls.def("scatter_add_", [](Tensor& s, int64_t dim, const Tensor& i, const Tensor& src) -> Tensor& {
    return scatter_add_(s, dim, i, src);
  }, nb::arg("dim"), nb::arg("index"), nb::arg("src"), nb::rv_policy::none, release_gil());
  def_op(m, cls, "take", &take, "Elements of the flattened input at `index`.", nb::arg("index"));
  def_op(m, cls, "masked_fill", &masked_fill, "A copy of input with `value` where mask is true.", nb::arg("mask"),
         nb::arg("value"));
}

void bind_matmul(nb::module_& m, TensorClass& cls) {
  def_op(m, cls, "mm", &mm, "[n, k] @ [k, m].", nb::arg("mat2"));
  def_op(m, cls, "bmm", &bmm, "[B, n, k] @ [B, k, m].", nb::arg("mat2"));
  def_op(m, cls, "matmul", &matmul, "NumPy's matmul: batch dims broadcast.", nb::arg("other"));
  def_op(m, cls, "addmm", [](const Tensor& input, const Tensor& a, const Tensor& b, const Scalar& beta,
                             const Scalar& alpha) { return addmm(input, a, b, beta, alpha); },
         "beta * input + alpha * (mat1 @ mat2).", nb::arg("mat1"), nb::arg("mat2"), nb::kw_only(), nb::arg("beta") = 1,
         nb::arg("alpha") = 1);
}

}  // namespace

void bind_ops(nb::module_& m) {
  auto cls = nb::borrow<TensorClass>(tensor_type());
  bind_creation(m);
  bind_random(m, cls);
  bind_unary(m, cls);
  bind_binary(m, cls);
  bind_operators(cls);
  bind_reductions(m, cls);
  bind_indexing(m, cls);
  bind_matmul(m, cls);
}

}  // namespace kiln::py
