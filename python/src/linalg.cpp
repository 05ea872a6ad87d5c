// kiln.linalg (kiln/linalg.h) under torch.linalg's names; results come back as tuples, which
// python/kiln/linalg.py names as torch's named tuples (LU, pivots; U, S, Vh; ...).
#include <limits>
#include <variant>

#include "kiln/linalg.h"
#include "kiln_py.h"

namespace kiln::py {

namespace {
// ord / p arguments: a number (inf included) or "fro" / "nuc".
using Ord = std::variant<double, std::string>;
}  // namespace

void bind_linalg(nb::module_& m, nb::module_& L) {
  using namespace kiln::linalg;
  auto cls = nb::borrow<nb::class_<Tensor>>(tensor_type());
  // Complex views, conj and the triangles (kiln/ops.h), as functions and methods.
  for (auto* mod : {&m}) {
    mod->def("view_as_real", &view_as_real, nb::arg("input"), "complex64 [...] as float32 [..., 2] (a view).");
    mod->def("real", &real, nb::arg("input"), "The real parts (a view).");
    mod->def("imag", &imag, nb::arg("input"), "The imaginary parts (a view).");
    mod->def("conj", &conj, nb::arg("input"), release_gil(), "The complex conjugate (the tensor itself when real).");
    mod->def("triu", &triu, nb::arg("input"), nb::arg("diagonal") = 0, release_gil());
    mod->def("tril", &tril, nb::arg("input"), nb::arg("diagonal") = 0, release_gil());
  }
  cls.def("conj", &conj, release_gil());
  cls.def("triu", &triu, nb::arg("diagonal") = 0, release_gil());
  cls.def("tril", &tril, nb::arg("diagonal") = 0, release_gil());
  cls.def_prop_ro("real", &real);
  cls.def_prop_ro("imag", &imag);

  L.def("lu_factor", [](const Tensor& A, bool pivot) {
    LUFactor r = lu_factor(A, pivot);
    return std::make_tuple(r.LU, r.pivots);
  }, nb::arg("A"), nb::kw_only(), nb::arg("pivot") = true, release_gil());
  L.def("lu_factor_ex", [](const Tensor& A, bool pivot, bool check_errors) {
    LUFactorEx r = lu_factor_ex(A, pivot, check_errors);
    return std::make_tuple(r.LU, r.pivots, r.info);
  }, nb::arg("A"), nb::kw_only(), nb::arg("pivot") = true, nb::arg("check_errors") = false, release_gil());
  L.def("lu", [](const Tensor& A, bool pivot) {
    PLU r = lu(A, pivot);
    return std::make_tuple(r.P, r.L, r.U);
  }, nb::arg("A"), nb::kw_only(), nb::arg("pivot") = true, release_gil());
  L.def("lu_solve", &lu_solve, nb::arg("LU"), nb::arg("pivots"), nb::arg("B"), nb::kw_only(), nb::arg("left") = true,
        nb::arg("adjoint") = false, release_gil());
  L.def("solve_triangular", &solve_triangular, nb::arg("A"), nb::arg("B"), nb::kw_only(), nb::arg("upper"),
        nb::arg("left") = true, nb::arg("unitriangular") = false, release_gil());
  L.def("solve", &solve, nb::arg("A"), nb::arg("B"), nb::kw_only(), nb::arg("left") = true, release_gil());
  L.def("solve_ex", [](const Tensor& A, const Tensor& B, bool left, bool check_errors) {
    SolveEx r = solve_ex(A, B, left, check_errors);
    return std::make_tuple(r.result, r.info);
  }, nb::arg("A"), nb::arg("B"), nb::kw_only(), nb::arg("left") = true, nb::arg("check_errors") = false, release_gil());
  L.def("inv", &inv, nb::arg("A"), release_gil());
  L.def("inv_ex", [](const Tensor& A, bool check_errors) {
    InvEx r = inv_ex(A, check_errors);
    return std::make_tuple(r.inverse, r.info);
  }, nb::arg("A"), nb::kw_only(), nb::arg("check_errors") = false, release_gil());
  L.def("det", &det, nb::arg("A"), release_gil());
  L.def("slogdet", [](const Tensor& A) {
    SlogDet r = slogdet(A);
    return std::make_tuple(r.sign, r.logabsdet);
  }, nb::arg("A"), release_gil());
  L.def("cholesky", &cholesky, nb::arg("A"), nb::kw_only(), nb::arg("upper") = false, release_gil());
  L.def("cholesky_ex", [](const Tensor& A, bool upper, bool check_errors) {
    CholeskyEx r = cholesky_ex(A, upper, check_errors);
    return std::make_tuple(r.L, r.info);
  }, nb::arg("A"), nb::kw_only(), nb::arg("upper") = false, nb::arg("check_errors") = false, release_gil());
  L.def("qr", [](const Tensor& A, std::string_view mode) {
    QR r = qr(A, mode);
    return std::make_tuple(r.Q, r.R);
  }, nb::arg("A"), nb::arg("mode") = "reduced", release_gil());
  L.def("svd", [](const Tensor& A, bool full) {
    SVD r = svd(A, full);
    return std::make_tuple(r.U, r.S, r.Vh);
  }, nb::arg("A"), nb::arg("full_matrices") = true, release_gil());
  L.def("svdvals", &svdvals, nb::arg("A"), release_gil());
  L.def("eigh", [](const Tensor& A, std::string_view uplo) {
    Eigh r = eigh(A, uplo);
    return std::make_tuple(r.eigenvalues, r.eigenvectors);
  }, nb::arg("A"), nb::arg("UPLO") = "L", release_gil());
  L.def("eigvalsh", &eigvalsh, nb::arg("A"), nb::arg("UPLO") = "L", release_gil());
  L.def("pinv", &pinv, nb::arg("A"), nb::kw_only(), nb::arg("atol") = nb::none(), nb::arg("rtol") = nb::none(),
        nb::arg("hermitian") = false, release_gil());
  L.def("matrix_rank", &matrix_rank, nb::arg("A"), nb::kw_only(), nb::arg("atol") = nb::none(),
        nb::arg("rtol") = nb::none(), nb::arg("hermitian") = false, release_gil());
  L.def("matrix_norm", [](const Tensor& A, const Ord& ord, std::optional<std::pair<int64_t, int64_t>> dim, bool keepdim) {
    if (dim && !((dim->first == -2 || dim->first == A.dim() - 2) && (dim->second == -1 || dim->second == A.dim() - 1)))
      throw Error("linalg.matrix_norm: kiln takes the norm over the last two dims (dim=(-2, -1))");
    if (const auto* s = std::get_if<std::string>(&ord)) return matrix_norm(A, *s, keepdim);
    return matrix_norm(A, std::get<double>(ord), keepdim);
  }, nb::arg("A"), nb::arg("ord") = "fro", nb::arg("dim") = nb::none(), nb::arg("keepdim") = false, release_gil());
  L.def("vector_norm", [](const Tensor& x, double ord, const Dims& d, bool keepdim) {
    return vector_norm(x, ord, d.all ? std::vector<int64_t>{} : d.dims, keepdim);
  }, nb::arg("x"), nb::arg("ord") = 2.0, nb::arg("dim") = nb::none(), nb::arg("keepdim") = false, release_gil());
  L.def("cond", [](const Tensor& A, std::optional<Ord> p) {
    if (!p) return cond(A, std::nullopt);
    if (const auto* s = std::get_if<std::string>(&*p)) return cond(A, std::string_view(*s));
    return cond(A, std::get<double>(*p));
  }, nb::arg("A"), nb::arg("p") = nb::none(), release_gil());
}

}  // namespace kiln::py
