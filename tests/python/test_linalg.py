"""kiln.linalg against numpy.linalg (float64 references): results that are unique compared directly,
factorisations through their reconstructions; torch.linalg's conventions (named tuples, 1-based pivots)."""
import numpy as np
import pytest

import kiln
from conftest import to_numpy

DTYPES = [(kiln.float32, np.float32, 2e-5), (kiln.float64, np.float64, 1e-12), (kiln.complex64, np.complex64, 2e-5)]


def rand(rng, shape, npdt):
    a = rng.standard_normal(shape)
    if np.issubdtype(npdt, np.complexfloating):
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(npdt)


def close(actual, expected, tol, scale=None):
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    s = scale if scale is not None else max(np.abs(expected).max(initial=0), 1e-30)
    assert np.abs(actual - expected).max(initial=0) <= tol * s, np.abs(actual - expected).max(initial=0) / s


@pytest.mark.parametrize("kdt,npdt,tol", DTYPES, ids=lambda x: str(x))
def test_unique_results_match_numpy(rng, device, kdt, npdt, tol):
    for shape in [(4, 4), (3, 5, 5), (1, 1), (2, 17, 17)]:
        a = rand(rng, shape, npdt) + 2 * shape[-1] * np.eye(shape[-1], dtype=npdt)  # well conditioned
        b = rand(rng, shape[:-1] + (3,), npdt)
        A, B = kiln.tensor(a, device=device), kiln.tensor(b, device=device)
        a64, b64 = a.astype(np.complex128 if kdt == kiln.complex64 else np.float64), b.astype(np.complex128 if kdt == kiln.complex64 else np.float64)
        n = shape[-1]
        close(to_numpy(kiln.linalg.solve(A, B)), np.linalg.solve(a64, b64), tol * n)
        close(to_numpy(kiln.linalg.inv(A)), np.linalg.inv(a64), tol * n)
        close(to_numpy(kiln.linalg.det(A)), np.linalg.det(a64), tol * n)
        sign, logabs = kiln.linalg.slogdet(A)
        s_ref, l_ref = np.linalg.slogdet(a64)
        close(to_numpy(sign), s_ref, tol * n, 1)
        close(to_numpy(logabs), l_ref, tol * n, 1)
        close(to_numpy(kiln.linalg.svdvals(A)), np.linalg.svd(a64, compute_uv=False), tol * n)
        h = a64 + np.conj(np.swapaxes(a64, -1, -2))
        H = kiln.tensor(h.astype(npdt), device=device)
        close(to_numpy(kiln.linalg.eigvalsh(H)), np.linalg.eigvalsh(h), tol * n)
        spd = a64 @ np.conj(np.swapaxes(a64, -1, -2)) + n * np.eye(n)
        close(to_numpy(kiln.linalg.cholesky(kiln.tensor(spd.astype(npdt), device=device))), np.linalg.cholesky(spd), tol * n)
        close(to_numpy(kiln.linalg.pinv(A)), np.linalg.pinv(a64), tol * n * 10)
        assert kiln.linalg.matrix_rank(A).tolist() == np.linalg.matrix_rank(a64).tolist()
        for ord in ["fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf]:
            close(to_numpy(kiln.linalg.matrix_norm(A, ord)), np.linalg.norm(a64, ord, axis=(-2, -1)), tol * n)
        close(to_numpy(kiln.linalg.cond(A)), np.linalg.cond(a64), tol * n * 10)
        close(to_numpy(kiln.linalg.vector_norm(A, 3, dim=-1)), np.linalg.norm(a64, 3, axis=-1), tol * n)


@pytest.mark.parametrize("kdt,npdt,tol", DTYPES, ids=lambda x: str(x))
def test_factorisations_reconstruct(rng, device, kdt, npdt, tol):
    for shape in [(5, 5), (6, 4), (4, 6), (2, 3, 8, 8)]:
        a = rand(rng, shape, npdt)
        A = kiln.tensor(a, device=device)
        m, n = shape[-2:]
        P, L, U = kiln.linalg.lu(A)
        close(to_numpy(P) @ to_numpy(L) @ to_numpy(U), a, tol * n)
        if m == n:
            aw = a + 2 * n * np.eye(n, dtype=npdt)  # well conditioned: the residual's bound is then ~ |b|
            LU, piv = kiln.linalg.lu_factor(kiln.tensor(aw, device=device))
            assert piv.dtype == kiln.int32 and 1 <= piv.min().item() and piv.max().item() <= m
            b = rand(rng, shape[:-1] + (2,), npdt)
            x = to_numpy(kiln.linalg.lu_solve(LU, piv, kiln.tensor(b, device=device)))
            close(aw @ x, b, tol * n * 10)
        Q, R = kiln.linalg.qr(A)
        close(to_numpy(Q) @ to_numpy(R), a, tol * n)
        Qc, Rc = kiln.linalg.qr(A, mode="complete")
        assert Qc.shape[-1] == m and Rc.shape[-2] == m
        close(to_numpy(Qc) @ to_numpy(Rc), a, tol * n)
        U, S, Vh = kiln.linalg.svd(A, full_matrices=False)
        close(to_numpy(U) * to_numpy(S)[..., None, :] @ to_numpy(Vh), a, tol * n)
        r = kiln.linalg.svd(A)
        assert r.U.shape[-1] == m and r.Vh.shape[-2] == n  # a named tuple, full matrices


def test_triangular_solve_and_hermitian_eigh(rng, device):
    a = np.triu(rand(rng, (6, 6), np.float64)) + 4 * np.eye(6)
    b = rand(rng, (6, 3), np.float64)
    x = to_numpy(kiln.linalg.solve_triangular(kiln.tensor(a, device=device), kiln.tensor(b, device=device), upper=True))
    close(a @ x, b, 1e-12)
    h = rand(rng, (5, 5), np.complex64)
    h = h + h.conj().T
    w, v = kiln.linalg.eigh(kiln.tensor(h, device=device))
    close(h @ to_numpy(v), to_numpy(v) * to_numpy(w)[None, :], 1e-4)


def test_errors_name_the_batch_element(device):
    a = np.stack([np.eye(3), np.zeros((3, 3)), np.eye(3)])
    A = kiln.tensor(a, device=device)
    with pytest.raises(kiln.KilnError, match="batch element 1.*singular"):
        kiln.linalg.inv(A)
    inv, info = kiln.linalg.inv_ex(A)
    assert info.tolist() == [0, 1, 0]
    with pytest.raises(kiln.KilnError, match="non-finite"):
        kiln.linalg.svd(kiln.tensor([[float("nan"), 1.0], [0.0, 1.0]]))
    with pytest.raises(kiln.KilnError, match="square"):
        kiln.linalg.inv(kiln.ones(2, 3))
    with pytest.raises(kiln.KilnError, match="float32, float64 or complex64"):
        kiln.linalg.det(kiln.ones(2, 2, dtype=kiln.int64))


def test_complex_helpers():
    z = kiln.tensor([1 + 2j, 3 - 4j])
    assert z.real.tolist() == [1, 3] and z.imag.tolist() == [2, -4] and kiln.conj(z).imag.tolist() == [-2, 4]
    assert kiln.view_as_real(z).shape == (2, 2)
    assert kiln.triu(kiln.ones(3, 3)).tolist() == np.triu(np.ones((3, 3))).tolist()
    assert kiln.ones(3, 3).tril(-1).tolist() == np.tril(np.ones((3, 3)), -1).tolist()
