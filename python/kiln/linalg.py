"""Linear algebra under torch.linalg's names, arguments and results (named tuples included)."""
from collections import namedtuple

from ._kiln import linalg as _L
from ._kiln.linalg import (cholesky, cond, det, eigvalsh, inv, lu_solve, matrix_norm, matrix_rank,  # noqa: F401
                           pinv, solve, solve_triangular, svdvals, vector_norm)

LUFactor = namedtuple("LUFactor", "LU pivots")
LUFactorEx = namedtuple("LUFactorEx", "LU pivots info")
PLU = namedtuple("PLU", "P L U")
SolveEx = namedtuple("SolveEx", "result info")
InvEx = namedtuple("InvEx", "inverse info")
SlogDet = namedtuple("SlogDet", "sign logabsdet")
CholeskyEx = namedtuple("CholeskyEx", "L info")
QR = namedtuple("QR", "Q R")
SVD = namedtuple("SVD", "U S Vh")
Eigh = namedtuple("Eigh", "eigenvalues eigenvectors")


def lu_factor(A, *, pivot=True):
    return LUFactor(*_L.lu_factor(A, pivot=pivot))


def lu_factor_ex(A, *, pivot=True, check_errors=False):
    return LUFactorEx(*_L.lu_factor_ex(A, pivot=pivot, check_errors=check_errors))


def lu(A, *, pivot=True):
    return PLU(*_L.lu(A, pivot=pivot))


def solve_ex(A, B, *, left=True, check_errors=False):
    return SolveEx(*_L.solve_ex(A, B, left=left, check_errors=check_errors))


def inv_ex(A, *, check_errors=False):
    return InvEx(*_L.inv_ex(A, check_errors=check_errors))


def slogdet(A):
    return SlogDet(*_L.slogdet(A))


def cholesky_ex(A, *, upper=False, check_errors=False):
    return CholeskyEx(*_L.cholesky_ex(A, upper=upper, check_errors=check_errors))


def qr(A, mode="reduced"):
    return QR(*_L.qr(A, mode))


def svd(A, full_matrices=True):
    return SVD(*_L.svd(A, full_matrices))


def eigh(A, UPLO="L"):
    return Eigh(*_L.eigh(A, UPLO))
