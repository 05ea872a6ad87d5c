"""Every exposed op against NumPy (float64 references) at torch.testing's tolerances: an OpInfo-style table of
ops x dtypes x shapes (0-d, empty, broadcast, strided views arriving through DLPack, long last dims)."""
import math

import numpy as np
import pytest

import kiln
from conftest import TOLERANCES, assert_close, to_numpy

FLOATS = [kiln.float32, kiln.float16, kiln.bfloat16, kiln.float64]
INTS = [kiln.int32, kiln.int64, kiln.int8, kiln.uint8]
SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 3, 4), (2, 1003)]


def make(rng, shape, dtype, device, low=-3.0, high=3.0, strided=False):
    """A kiln tensor of fresh random values and the float64 NumPy array of the same (rounded) values.

    strided=True builds it as a view with gaps (every other element of a wider NumPy array, through DLPack)."""
    if dtype == kiln.bool:
        a = rng.random(shape) < 0.5
    elif dtype in INTS + [kiln.int16]:
        lo, hi = (0, 100) if dtype == kiln.uint8 else (-60, 60)
        a = rng.integers(lo, hi, size=shape)
    else:
        a = rng.uniform(low, high, size=shape)
    if strided and len(shape) > 0:
        wide = np.zeros(shape[:-1] + (2 * shape[-1],), dtype=a.dtype)
        wide[..., ::2] = a
        base = kiln.from_numpy(np.ascontiguousarray(wide))
        t = base.to(dtype)[..., ::2]
        assert not t.is_contiguous() or t.numel() <= 1
    else:
        t = kiln.tensor(a).to(dtype)
    t = t.to(device)
    return t, to_numpy(t).astype(np.float64) if dtype != kiln.bool else to_numpy(t)


def erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# name, NumPy reference, input range
UNARY = [
    ("exp", np.exp, (-5, 5)), ("exp2", np.exp2, (-5, 5)), ("expm1", np.expm1, (-3, 3)), ("log", np.log, (0.01, 10)),
    ("log2", np.log2, (0.01, 10)), ("log10", np.log10, (0.01, 10)), ("log1p", np.log1p, (-0.9, 5)),
    ("sqrt", np.sqrt, (0, 10)), ("rsqrt", lambda x: 1 / np.sqrt(x), (0.1, 10)),
    ("reciprocal", lambda x: 1 / x, (0.5, 4)), ("square", np.square, (-3, 3)), ("sin", np.sin, (-4, 4)),
    ("cos", np.cos, (-4, 4)), ("tan", np.tan, (-1.2, 1.2)), ("asin", np.arcsin, (-0.99, 0.99)),
    ("acos", np.arccos, (-0.99, 0.99)), ("atan", np.arctan, (-4, 4)), ("sinh", np.sinh, (-3, 3)),
    ("cosh", np.cosh, (-3, 3)), ("tanh", np.tanh, (-4, 4)), ("sigmoid", sigmoid, (-8, 8)),
    ("silu", lambda x: x * sigmoid(x), (-6, 6)), ("relu", lambda x: np.maximum(x, 0), (-3, 3)),
    ("erf", erf, (-3, 3)), ("abs", np.abs, (-3, 3)), ("neg", np.negative, (-3, 3)), ("floor", np.floor, (-9, 9)),
    ("ceil", np.ceil, (-9, 9)), ("trunc", np.trunc, (-9, 9)), ("round", np.round, (-9, 9)), ("sign", np.sign, (-3, 3)),
    ("gelu", lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))), (-4, 4)),
]


@pytest.mark.parametrize("name,ref,domain", UNARY, ids=[u[0] for u in UNARY])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_unary_matches_numpy(rng, device, name, ref, domain, dtype):
    if device == "cuda" and dtype == kiln.float64 and name in ("gelu",):
        pytest.skip("gelu has no float64 CUDA kernel")
    for shape in SHAPES:
        for strided in (False, True):
            t, a = make(rng, shape, dtype, device, *domain, strided=strided)
            out = getattr(kiln, name)(t)
            assert out.dtype == dtype and out.shape == t.shape
            expected = ref(a)
            # a half-precision result rounds once to its dtype: compare with the reference rounded the same way
            rounded = to_numpy(kiln.tensor(expected).to(dtype)).astype(np.float64) if dtype != kiln.float64 else expected
            assert_close(to_numpy(out), rounded if dtype in (kiln.float16, kiln.bfloat16) else expected, dtype,
                         msg=f"{name} {dtype} {shape} strided={strided}")
            m = getattr(t, name)()  # the method is the same function
            assert_close(to_numpy(m), to_numpy(out), dtype, rtol=0, atol=0)


@pytest.mark.parametrize("name,ref", [("isnan", np.isnan), ("isinf", np.isinf), ("isfinite", np.isfinite),
                                      ("signbit", np.signbit), ("logical_not", np.logical_not)])
def test_predicates_on_special_values(device, name, ref):
    a = np.array([0.0, -0.0, 1.5, -2.0, np.inf, -np.inf, np.nan], dtype=np.float32)
    out = getattr(kiln, name)(kiln.tensor(a, device=device))
    assert out.dtype == kiln.bool
    np.testing.assert_array_equal(to_numpy(out), ref(a))


def test_unary_on_integers_follows_torch(device):
    x = kiln.tensor([1, 4, 9], dtype=kiln.int32, device=device)
    assert kiln.sqrt(x).dtype == kiln.float32 and kiln.sqrt(x).tolist() == [1, 2, 3]
    assert kiln.abs(kiln.tensor([-3, 3], device=device)).tolist() == [3, 3]
    assert kiln.bitwise_not(kiln.tensor([0, 5], dtype=kiln.uint8, device=device)).tolist() == [255, 250]
    m, e = kiln.frexp(kiln.tensor([8.0, 0.75, 0.0], device=device))
    assert m.tolist() == [0.5, 0.75, 0.0] and e.tolist() == [4, 0, 0] and e.dtype == kiln.int32


BINARY = [
    ("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("div", np.divide),
    ("maximum", np.maximum), ("minimum", np.minimum), ("atan2", np.arctan2), ("fmod", np.fmod),
    ("remainder", np.remainder), ("pow", np.power),
]
BROADCASTS = [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (4,)), ((), (5,)), ((0, 3), (1, 3)), ((2, 1003), (2, 1003))]


@pytest.mark.parametrize("name,ref", BINARY, ids=[b[0] for b in BINARY])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_binary_matches_numpy_with_broadcasting(rng, device, name, ref, dtype):
    for sa, sb in BROADCASTS:
        for strided in (False, True):
            a, na = make(rng, sa, dtype, device, 0.5 if name == "pow" else -3, 3, strided=strided)
            b, nb_ = make(rng, sb, dtype, device, -2 if name == "pow" else 0.5, 2, strided=False)
            if name in ("fmod", "remainder", "div"):
                nb_ = np.where(np.abs(nb_) < 0.25, 1.0, nb_)
                b = kiln.tensor(nb_).to(dtype).to(device)
            out = getattr(kiln, name)(a, b)
            assert out.dtype == dtype and out.shape == np.broadcast_shapes(sa, sb)
            expected = ref(na, nb_)
            if dtype in (kiln.float16, kiln.bfloat16):
                expected = to_numpy(kiln.tensor(expected).to(dtype)).astype(np.float64)
            rtol, atol = TOLERANCES[dtype]
            if name in ("fmod", "remainder") and dtype != kiln.float64:
                atol = 2e-2 if dtype in (kiln.float16, kiln.bfloat16) else 1e-5  # near-multiples flip by one b
                ok = np.isclose(to_numpy(out), expected, rtol=rtol, atol=atol) | np.isclose(
                    np.abs(to_numpy(out) - expected), np.abs(nb_ * np.ones_like(expected)), rtol=1e-2)
                assert ok.all(), f"{name} {dtype} {sa} {sb}"
                continue
            assert_close(to_numpy(out), expected, dtype, msg=f"{name} {dtype} {sa} {sb} strided={strided}")


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_arithmetic_matches_numpy(rng, device, dtype):
    for sa, sb in BROADCASTS:
        a, na = make(rng, sa, dtype, device)
        b, nb_ = make(rng, sb, dtype, device)
        nb_ = np.where(nb_ == 0, 1, nb_)
        b = kiln.tensor(nb_.astype(np.int64)).to(dtype).to(device)
        npdt = np.dtype(str(dtype).replace("kiln.", ""))
        xa, xb = na.astype(npdt), nb_.astype(npdt)
        with np.errstate(all="ignore"):
            for name, ref in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                              ("floor_divide", np.floor_divide), ("remainder", np.remainder),
                              ("maximum", np.maximum), ("bitwise_and", np.bitwise_and), ("bitwise_xor", np.bitwise_xor)]:
                out = getattr(kiln, name)(a, b)
                assert out.dtype == dtype, name
                np.testing.assert_array_equal(to_numpy(out).astype(npdt), ref(xa, xb), err_msg=f"{name} {dtype} {sa}")
        assert kiln.div(a, b).dtype == kiln.float32


@pytest.mark.parametrize("name,ref", [("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                                      ("gt", np.greater), ("ge", np.greater_equal)])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.bfloat16, kiln.int64, kiln.uint8], ids=str)
def test_comparisons(rng, device, name, ref, dtype):
    a, na = make(rng, (4, 5), dtype, device, -2, 2)
    b, nb_ = make(rng, (1, 5), dtype, device, -2, 2)
    a = kiln.where(kiln.tensor(rng.random((4, 5)) < 0.3, device=device), b.expand(4, 5), a)  # some ties
    na = to_numpy(a).astype(np.float64)
    out = getattr(kiln, name)(a, b)
    assert out.dtype == kiln.bool
    np.testing.assert_array_equal(to_numpy(out), ref(na, nb_))
    np.testing.assert_array_equal(to_numpy(getattr(kiln, name)(a, 1)), ref(na, 1))


def test_logical_where_clamp_masked_fill(rng, device):
    a, na = make(rng, (3, 4), kiln.float32, device)
    m = kiln.tensor(rng.random((3, 4)) < 0.5, device=device)
    nm = to_numpy(m)
    assert_close(to_numpy(kiln.where(m, a, 0.0)), np.where(nm, na, 0), kiln.float32, rtol=0, atol=0)
    assert_close(to_numpy(kiln.where(m, 1.0, a)), np.where(nm, 1.0, na), kiln.float32, rtol=0, atol=0)
    assert_close(to_numpy(kiln.clamp(a, -1, 1)), np.clip(na, -1, 1), kiln.float32, rtol=0, atol=0)
    assert_close(to_numpy(a.clamp(min=0.5)), np.maximum(na, 0.5), kiln.float32, rtol=0, atol=0)
    assert_close(to_numpy(kiln.masked_fill(a, m, -7.0)), np.where(nm, -7.0, na), kiln.float32, rtol=0, atol=0)
    b = a.clone()
    b.masked_fill_(m, 2.0)
    assert_close(to_numpy(b), np.where(nm, 2.0, na), kiln.float32, rtol=0, atol=0)
    np.testing.assert_array_equal(to_numpy(kiln.logical_and(m, ~m)), np.zeros((3, 4), bool))
    np.testing.assert_array_equal(to_numpy(kiln.logical_xor(m, m)), np.zeros((3, 4), bool))


REDUCTIONS = [
    ("sum", np.sum), ("mean", np.mean), ("prod", np.prod), ("amax", np.amax), ("amin", np.amin),
    ("var", lambda a, axis=None, keepdims=False: np.var(a, axis=axis, keepdims=keepdims, ddof=1)),
    ("std", lambda a, axis=None, keepdims=False: np.std(a, axis=axis, keepdims=keepdims, ddof=1)),
    ("logsumexp", lambda a, axis=None, keepdims=False: np.log(np.sum(np.exp(a), axis=axis, keepdims=keepdims))),
    ("norm", lambda a, axis=None, keepdims=False: np.sqrt(np.sum(a * a, axis=axis, keepdims=keepdims))),
]


@pytest.mark.parametrize("name,ref", REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
@pytest.mark.parametrize("dtype", [kiln.float32, kiln.bfloat16, kiln.float64], ids=str)
def test_reductions_match_numpy(rng, device, name, ref, dtype):
    for shape, dims in [((5,), None), ((3, 5), 0), ((3, 5), -1), ((2, 3, 4), (0, 2)), ((2, 3, 4), None),
                        ((4, 2000), 1), ((0, 3), 1)]:
        if name == "logsumexp" and dims is None:
            continue
        if name in ("amax", "amin") and 0 in shape:
            continue
        for keepdim in (False, True):
            t, a = make(rng, shape, dtype, device, 0.5 if name == "prod" else -2, 1.5 if name == "prod" else 2,
                        strided=len(shape) > 1)
            kw = {} if dims is None else {"dim": dims}
            out = getattr(kiln, name)(t, keepdim=keepdim, **kw)
            with np.errstate(all="ignore"):
                expected = ref(a, axis=dims if not isinstance(dims, list) else tuple(dims), keepdims=keepdim)
            expected = np.asarray(expected, dtype=np.float64)
            rtol, atol = TOLERANCES[dtype]
            n = max(1, a.size // max(1, expected.size))
            # Summation order differs from NumPy's pairwise sum: the error bound grows with the count (and
            # a half-precision result also rounds once to its dtype).
            assert_close(to_numpy(out).astype(np.float64), expected, dtype, rtol=rtol * max(1, math.log2(n)),
                         atol=atol * n if name in ("sum", "var", "std") else atol * max(1, math.log2(n)),
                         msg=f"{name} {dtype} {shape} dim={dims} keepdim={keepdim}")


def test_max_min_argmax_all_any(rng, device):
    t, a = make(rng, (4, 6), kiln.float32, device)
    v, i = kiln.max(t, 1)
    np.testing.assert_array_equal(to_numpy(v), a.max(1))
    np.testing.assert_array_equal(to_numpy(i), a.argmax(1))
    v, i = t.min(0, keepdim=True)
    np.testing.assert_array_equal(to_numpy(i), a.argmin(0)[None])
    assert kiln.max(t).item() == a.max() and t.argmax().item() == a.argmax()
    assert kiln.argmin(t, 1).tolist() == a.argmin(1).tolist()
    assert_close(to_numpy(kiln.max(t, kiln.zeros_like(t))), np.maximum(a, 0), kiln.float32, rtol=0, atol=0)
    b = t > 0
    assert kiln.all(b, 1).tolist() == (a > 0).all(1).tolist() and b.any().item() == (a > 0).any()
    assert kiln.sum(kiln.tensor([True, True, False])).dtype == kiln.int64


def test_softmax_and_log_softmax(rng, device):
    for dtype in (kiln.float32, kiln.bfloat16, kiln.float16):
        for shape, dim in [((3, 7), -1), ((3, 7), 0), ((2, 128256), -1), ((4,), 0)]:
            t, a = make(rng, shape, dtype, device, -5, 5)
            e = np.exp(a - a.max(axis=dim, keepdims=True))
            sm = e / e.sum(axis=dim, keepdims=True)
            out = kiln.softmax(t, dim)
            assert out.dtype == dtype
            assert_close(to_numpy(out), sm, dtype, atol=1e-5 if dtype == kiln.float32 else 2e-3,
                         msg=f"softmax {dtype} {shape}")
            assert_close(to_numpy(kiln.log_softmax(t, dim, dtype=kiln.float32)), np.log(sm), kiln.float32,
                         rtol=1e-5, atol=1e-5)
    assert_close(to_numpy(kiln.nn.functional.softmax(kiln.tensor([1.0, 2.0]), dim=0)),
                 np.exp([1, 2]) / np.exp([1, 2]).sum(), kiln.float32)


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.bfloat16, kiln.float16, kiln.float64], ids=str)
def test_matmul_family(rng, device, dtype):
    if device == "cuda" and dtype == kiln.float64:
        pytest.skip("no float64 matrix products on CUDA")
    for sa, sb in [((5, 7), (7, 3)), ((2, 5, 64), (64, 9)), ((3, 4, 8), (3, 8, 2)), ((7,), (7,)), ((0, 4), (4, 3)),
                   ((6, 300), (300, 5))]:
        a, na = make(rng, sa, dtype, device, -1, 1)
        b, nb_ = make(rng, sb, dtype, device, -1, 1)
        out = kiln.matmul(a, b)
        expected = np.matmul(na, nb_)
        # f32 accumulation over K terms of size <= 1: bound the error by K * eps-scale, not per element
        k = sa[-1]
        eps = {kiln.float32: 1.2e-7, kiln.float64: 2.3e-16, kiln.float16: 1e-3, kiln.bfloat16: 8e-3}[dtype]
        assert_close(to_numpy(out), expected, dtype, rtol=TOLERANCES[dtype][0], atol=4 * eps * max(1, k) ** 0.5 * 4,
                     msg=f"matmul {dtype} {sa} {sb}")
    a, na = make(rng, (4, 6), dtype, device, -1, 1)
    b, nb_ = make(rng, (6, 3), dtype, device, -1, 1)
    c, nc = make(rng, (3,), dtype, device, -1, 1)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype in (kiln.float16, kiln.bfloat16) else dict(rtol=1e-5, atol=1e-5)
    assert_close(to_numpy(kiln.mm(a, b)), na @ nb_, dtype, **tol)
    assert_close(to_numpy(kiln.addmm(c, a, b, beta=0.5, alpha=2.0)), 0.5 * nc + 2 * (na @ nb_), dtype, **tol)
    assert_close(to_numpy(kiln.bmm(a[None], b[None])), (na @ nb_)[None], dtype, **tol)
    assert_close(to_numpy(a @ b), na @ nb_, dtype, **tol)


@pytest.mark.parametrize("dtype", [kiln.float32, kiln.bfloat16, kiln.float16], ids=str)
def test_linear_and_nn_ops(rng, device, dtype):
    tol = dict(rtol=2e-2, atol=2e-2) if dtype != kiln.float32 else dict(rtol=1e-5, atol=1e-5)
    for m in (1, 3, 17):
        x, nx = make(rng, (m, 64), dtype, device, -1, 1)
        w, nw = make(rng, (24, 64), dtype, device, -1, 1)
        b, nbias = make(rng, (24,), dtype, device, -1, 1)
        assert_close(to_numpy(kiln.linear(x, w, b)), nx @ nw.T + nbias, dtype, **tol)
        assert_close(to_numpy(kiln.nn.functional.linear(x, w)), nx @ nw.T, dtype, **tol)
    g, ng = make(rng, (5, 32), dtype, device, -2, 2)
    wt, nwt = make(rng, (32,), dtype, device, 0.5, 1.5)
    ref = ng / np.sqrt((ng * ng).mean(-1, keepdims=True) + 1e-6) * nwt
    assert_close(to_numpy(kiln.rms_norm(g, wt, 1e-6)), ref, dtype, **tol)
    assert_close(to_numpy(kiln.nn.functional.rms_norm(g, (32,), wt, 1e-6)), ref, dtype, **tol)
    gu, ngu = make(rng, (3, 16), dtype, device, -3, 3)
    assert_close(to_numpy(kiln.silu_and_mul(gu)), ngu[:, :8] * sigmoid(ngu[:, :8]) * ngu[:, 8:], dtype, **tol)
    v, i = kiln.topk(g, 3)
    np.testing.assert_array_equal(to_numpy(i), np.argsort(-ng, axis=-1, kind="stable")[:, :3])


def test_scaled_dot_product_attention(rng, device):
    q, nq = make(rng, (2, 4, 5, 8), kiln.float32, device, -1, 1)
    k, nk = make(rng, (2, 2, 7, 8), kiln.float32, device, -1, 1)
    v, nv = make(rng, (2, 2, 7, 8), kiln.float32, device, -1, 1)
    out = kiln.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    kk, vv = np.repeat(nk, 2, axis=1), np.repeat(nv, 2, axis=1)
    s = nq @ kk.swapaxes(-1, -2) / math.sqrt(8)
    s = np.where(np.tril(np.ones((5, 7), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    assert_close(to_numpy(out), p @ vv, kiln.float32, rtol=1e-5, atol=1e-5)
    with pytest.raises(kiln.KilnError, match="dropout"):
        kiln.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=0.1, enable_gqa=True)


def test_paged_kv_cache_ops(rng, device):
    # Pools of 6 blocks of 16 positions; two sequences whose caches are blocks (4, 1, 0) and (2, 5, 0).
    nb, S, hkv, hq, d = 6, 16, 2, 4, 64
    kp, nkp = make(rng, (nb, S, hkv, d), kiln.float32, device, -1, 1)
    vp, nvp = make(rng, (nb, S, hkv, d), kiln.float32, device, -1, 1)
    kn, nkn = make(rng, (2, hkv, d), kiln.float32, device, -1, 1)
    vn, nvn = make(rng, (2, hkv, d), kiln.float32, device, -1, 1)
    table = [[4, 1, 0], [2, 5, 0]]
    lengths = [20, 33]
    slots = [table[b][(n - 1) // S] * S + (n - 1) % S for b, n in enumerate(lengths)]  # each one's newest position
    kiln.paged_kv_append_(kp, vp, kn, vn, kiln.tensor(np.array(slots, np.int32), device=device))
    for b, slot in enumerate(slots):
        nkp[slot // S, slot % S], nvp[slot // S, slot % S] = nkn[b], nvn[b]
    assert_close(to_numpy(kp), nkp, kiln.float32, rtol=0, atol=0)
    q, nq = make(rng, (2, hq, 1, d), kiln.float32, device, -1, 1)
    out = kiln.paged_decode_attention(q, kp, vp, kiln.tensor(np.array(table, np.int32), device=device),
                                      kiln.tensor(np.array(lengths, np.int32), device=device))
    for b, n in enumerate(lengths):
        k = np.concatenate([nkp[i] for i in table[b]])[:n]  # [n, Hkv, D]
        v = np.concatenate([nvp[i] for i in table[b]])[:n]
        for h in range(hq):
            s_ = k[:, h // (hq // hkv)] @ nq[b, h, 0] / math.sqrt(d)
            p = np.exp(s_ - s_.max())
            assert_close(to_numpy(out)[b, h, 0], (p / p.sum()) @ v[:, h // (hq // hkv)], kiln.float32,
                         rtol=1e-4, atol=1e-5)
    with pytest.raises(kiln.KilnError, match="block_table|index_select"):  # CUDA: at the next sync
        kiln.paged_decode_attention(q, kp, vp, kiln.tensor(np.array([[0], [6]], np.int32), device=device),
                                    kiln.tensor(np.array([1, 1], np.int32), device=device)).cpu()


def test_indexing_ops(rng, device):
    t, a = make(rng, (4, 5), kiln.float32, device)
    idx = kiln.tensor([3, 0, 3], device=device)
    assert_close(to_numpy(kiln.index_select(t, 0, idx)), a[[3, 0, 3]], kiln.float32, rtol=0, atol=0)
    gi = rng.integers(0, 5, size=(4, 2))
    assert_close(to_numpy(kiln.gather(t, 1, kiln.tensor(gi, device=device))), np.take_along_axis(a, gi, 1),
                 kiln.float32, rtol=0, atol=0)
    assert_close(to_numpy(kiln.take(t, kiln.tensor([0, 19, 7], device=device))), a.reshape(-1)[[0, 19, 7]],
                 kiln.float32, rtol=0, atol=0)
    parts = kiln.split(t, 2, 1)
    assert [p.shape for p in parts] == [(4, 2), (4, 2), (4, 1)]
    assert [p.shape for p in t.split([1, 4], dim=1)] == [(4, 1), (4, 4)]
    assert [c.shape for c in kiln.chunk(t, 2)] == [(2, 5), (2, 5)]
    assert_close(to_numpy(kiln.cat([t, t], 1)), np.concatenate([a, a], 1), kiln.float32, rtol=0, atol=0)
    assert_close(to_numpy(kiln.stack([t, t])), np.stack([a, a]), kiln.float32, rtol=0, atol=0)
    z = kiln.zeros(3, 4, device=device)
    s = kiln.scatter(z, 1, kiln.tensor([[1], [3], [0]], device=device), 5.0)
    assert s.tolist() == [[0, 5, 0, 0], [0, 0, 0, 5], [5, 0, 0, 0]]
    acc = kiln.scatter_add(z, 0, kiln.tensor([[0, 1, 2, 0]], device=device), kiln.ones(1, 4, device=device))
    assert acc.tolist() == [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 1, 0]]


def check_quantised_linear(rng, device, q, deq):
    """linear(x, q) for 1, 5 and 40 rows against x @ deq.T in f64, within the activations' 8-bit quantisation
    (int8 dot products on the CPU; CUDA: the same up to 32 rows, dequantised slices above)."""
    for rows in (1, 5, 40):
        x = rng.standard_normal((rows, deq.shape[1])).astype(np.float32)
        y = to_numpy(kiln.nn.functional.linear(kiln.tensor(x, device=device), q))
        ref = x.astype(np.float64) @ deq.T.astype(np.float64)
        np.testing.assert_allclose(y, ref, rtol=0, atol=0.02 * np.abs(ref).max())


def test_q8_0_weights(rng, device):
    w = rng.standard_normal((48, 96)).astype(np.float32)
    q = kiln.quantize_q8_0(kiln.tensor(w, device=device))
    assert q.values.dtype == kiln.int8 and q.scales.dtype == kiln.float16 and q.scales.shape == (48, 3)
    blocks = w.reshape(48, 3, 32)
    d = np.abs(blocks).max(-1) / 127
    # x times 1 / d, as llama.cpp's reference quantiser (x / d rounds differently on about 1 input in 400)
    ref_q = np.trunc(blocks * (np.float32(1) / d)[..., None] + np.copysign(0.5, blocks)).astype(np.int8).reshape(48, 96)
    assert (to_numpy(q.values) == ref_q).all()
    assert (to_numpy(q.scales) == d.astype(np.float16)).all()
    deq = to_numpy(kiln.dequantize_q8_0(q))
    np.testing.assert_array_equal(deq, (ref_q.reshape(48, 3, 32) * d.astype(np.float16)[..., None].astype(np.float32)).reshape(48, 96))
    for rows in (1, 5, 40):  # int8 dot products (CUDA: dequantised slices above 32 rows)
        x = rng.standard_normal((rows, 96)).astype(np.float32)
        b = rng.standard_normal(48).astype(np.float32)
        y = to_numpy(kiln.nn.functional.linear(kiln.tensor(x, device=device), q, kiln.tensor(b, device=device)))
        ref = x.astype(np.float64) @ deq.T.astype(np.float64) + b
        np.testing.assert_allclose(y, ref, rtol=0, atol=0.02 * np.abs(ref).max())
    with pytest.raises(kiln.KilnError, match="multiple of the block size"):
        kiln.quantize_q8_0(kiln.tensor(w[:, :40], device=device))


def test_q4_0_weights(rng, device):
    w = rng.standard_normal((48, 96)).astype(np.float32)
    q = kiln.quantize_q4_0(kiln.tensor(w, device=device))
    assert q.values.dtype == kiln.uint8 and q.values.shape == (48, 48) and q.scales.shape == (48, 3)
    blocks = w.reshape(48, 3, 32)
    m = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)[..., 0]
    d = m / -8
    codes = np.minimum(15, np.trunc(blocks * (1 / d)[..., None] + np.float32(8.5))).astype(np.uint8)
    packed = (codes[..., :16] | (codes[..., 16:] << 4)).reshape(48, 48)
    assert (to_numpy(q.values) == packed).all()
    assert (to_numpy(q.scales) == d.astype(np.float16)).all()
    deq = to_numpy(kiln.dequantize_q4_0(q))
    ref_deq = ((codes.astype(np.float32) - 8) * d.astype(np.float16)[..., None].astype(np.float32)).reshape(48, 96)
    np.testing.assert_array_equal(deq, ref_deq)
    check_quantised_linear(rng, device, q, deq)


def test_moe_forward_block_experts(rng, device):
    """moe_forward over Q8_0 / Q4_0 experts stacked as GGUF stores them, against the MoE block in NumPy (f64) with
    the experts dequantised: the same routing, within the activations' 8-bit quantisation."""
    T, H, I, E, k = 6, 64, 32, 8, 2
    x = rng.standard_normal((T, H)).astype(np.float32)
    router = rng.uniform(-1, 1, (E, H)).astype(np.float32)
    gu_w = rng.uniform(-0.3, 0.3, (E * 2 * I, H)).astype(np.float32)
    dn_w = rng.uniform(-0.3, 0.3, (E * H, I)).astype(np.float32)
    gu = kiln.quantize_q8_0(kiln.tensor(gu_w, device=device))
    dn = kiln.quantize_q4_0(kiln.tensor(dn_w, device=device))
    experts = kiln.BlockExperts(gu, dn, E)
    assert experts.num_experts == E
    y = to_numpy(kiln.moe_forward(kiln.tensor(x, device=device), kiln.tensor(router, device=device), experts, k, True))
    g = to_numpy(kiln.dequantize_q8_0(gu)).astype(np.float64).reshape(E, 2 * I, H)
    d = to_numpy(kiln.dequantize_q4_0(dn)).astype(np.float64).reshape(E, H, I)
    logits = x.astype(np.float64) @ router.T.astype(np.float64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = np.zeros((T, H))
    for t in range(T):
        top = np.argsort(-p[t], kind="stable")[:k]
        w = p[t, top] / p[t, top].sum()
        for e, we in zip(top, w):
            a = g[e] @ x[t]
            h = a[:I] / (1 + np.exp(-a[:I])) * a[I:]
            ref[t] += we * (d[e] @ h)
    np.testing.assert_allclose(y, ref, rtol=0, atol=0.03 * np.abs(ref).max())
    with pytest.raises(kiln.KilnError, match="num_experts"):
        kiln.moe_forward(kiln.tensor(x, device=device), kiln.tensor(router, device=device),
                         kiln.BlockExperts(gu, dn, 0), k, True)


def test_fp8_quantise_and_products(rng, device):
    x, nx = make(rng, (16, 256), kiln.float32, device, -2, 2)
    for recipe in ("tensorwise", "rowwise", "blockwise"):
        values, scales = kiln.quantize_fp8(x, recipe)
        assert values.dtype == kiln.float8_e4m3fn and scales.dtype == kiln.float32
        back = kiln.dequantize_fp8(values, scales, recipe)
        assert_close(to_numpy(back), nx, kiln.float32, rtol=0.07, atol=0.05, msg=recipe)
    w, nw = make(rng, (128, 256), kiln.float32, device, -1, 1)
    wv, ws = kiln.quantize_fp8(w, "blockwise", activation=False)
    fw = kiln.Fp8Weight(wv, ws, "blockwise")
    exact = nx @ to_numpy(kiln.dequantize_fp8(wv, ws, "blockwise", activation=False)).T
    assert_close(to_numpy(kiln.linear(x, fw)), exact, kiln.float32, rtol=1e-4, atol=1e-4)


def test_q4_k_weights(rng, device):
    # GGUF's Q4_K bytes: numpy's reading of the format (gguf-py's dequantisation, written out) equals kiln's.
    w = (rng.standard_normal((24, 512)) * 0.1).astype(np.float32)
    q = kiln.quantize_q4_k(kiln.tensor(w, device=device))
    assert q.blocks.dtype == kiln.uint8 and q.blocks.shape == (24, 2 * 144)
    b = to_numpy(q.blocks).reshape(24, 2, 144)
    d = b[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    dmin = b[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    sc = b[..., 4:16].astype(np.int32)
    s = np.concatenate([sc[..., 0:4] & 63, (sc[..., 8:12] & 15) | ((sc[..., 0:4] >> 6) << 4)], -1)
    m = np.concatenate([sc[..., 4:8] & 63, (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)], -1)
    qs = b[..., 16:].reshape(24, 2, 4, 32)
    codes = np.stack([qs & 15, qs >> 4], 3).reshape(24, 2, 8, 32).astype(np.float32)
    ref_deq = (d[..., None, None] * s[..., None] * codes - dmin[..., None, None] * m[..., None]).reshape(24, 512)
    deq = to_numpy(kiln.dequantize_q4_k(q))
    np.testing.assert_allclose(deq, ref_deq, rtol=1e-6, atol=1e-7)
    assert np.abs(deq - w).max() < 0.25 * np.abs(w).max()
    check_quantised_linear(rng, device, q, deq)
    with pytest.raises(kiln.KilnError, match="multiple of the super-block size 256"):
        kiln.quantize_q4_k(kiln.tensor(w[:, :96], device=device))


def test_q6_k_weights(rng, device):
    # Random bytes are valid Q6_K blocks (d set small): numpy's reading of the format (ggml's block_q6_K: halves of
    # 128 values from 64 bytes of nibbles and 32 of bit pairs, one int8 scale per 16 values) equals kiln's.
    blocks = rng.integers(0, 256, size=(20, 3, 210), dtype=np.uint8)
    blocks[..., 208:210] = np.full((20, 3, 1), 0.002, np.float16).view(np.uint8)
    q = kiln.Q6KWeight(kiln.tensor(blocks.reshape(20, 630), device=device))
    ql, qh = blocks[..., 0:128].reshape(20, 3, 2, 64), blocks[..., 128:192].reshape(20, 3, 2, 32)
    sc = blocks[..., 192:208].view(np.int8).astype(np.float32)
    d = blocks[..., 208:210].copy().view(np.float16)[..., 0].astype(np.float32)
    lo = np.stack([ql[..., :32] & 15, ql[..., 32:] & 15, ql[..., :32] >> 4, ql[..., 32:] >> 4], 3)  # [.., 2, 4, 32]
    hi = np.stack([(qh >> (2 * k)) & 3 for k in range(4)], 3)
    codes = (lo | (hi << 4)).astype(np.float32).reshape(20, 3, 256) - 32
    ref_deq = ((d[..., None, None] * sc[..., None]).reshape(20, 3, 16, 1) * codes.reshape(20, 3, 16, 16)).reshape(20, 768)
    deq = to_numpy(kiln.dequantize_q6_k(q))
    np.testing.assert_array_equal(deq, ref_deq)
    check_quantised_linear(rng, device, q, deq)
    with pytest.raises(kiln.KilnError, match="expects 768"):
        kiln.nn.functional.linear(kiln.tensor(np.ones((1, 512), np.float32), device=device), q)


@pytest.mark.parametrize("fmt", ["Q5_K", "Q6_K"])
def test_k_quant_blocks_read_as_gguf_py_reads_them(rng, device, fmt):
    # Random bytes are valid Q5_K / Q6_K blocks once their f16 factors are set small: kiln's dequantisation equals
    # llama.cpp's gguf-py's, and linear multiplies those values.
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize
    size = {"Q5_K": 176, "Q6_K": 210}[fmt]
    blocks = rng.integers(0, 256, size=(12, 2, size), dtype=np.uint8)
    factors = np.full((12, 2, 2), 0.002, np.float16).view(np.uint8).reshape(12, 2, 4)
    if fmt == "Q5_K":
        blocks[..., 0:4] = factors
    else:
        blocks[..., 208:210] = factors[..., 0:2]
    raw = blocks.reshape(12, 2 * size)
    ref = dequantize(raw, getattr(gguf.GGMLQuantizationType, fmt)).astype(np.float32)
    cls, deq_fn = (kiln.Q5KWeight, kiln.dequantize_q5_k) if fmt == "Q5_K" else (kiln.Q6KWeight, kiln.dequantize_q6_k)
    q = cls(kiln.tensor(raw, device=device))
    deq = to_numpy(deq_fn(q))
    np.testing.assert_allclose(deq, ref, rtol=1e-6, atol=1e-9)
    check_quantised_linear(rng, device, q, deq)


def test_sampling_probs_is_the_distribution_sample_draws_from(rng, device):
    logits, nl = make(rng, (3, 50), kiln.float32, device, -3, 3)
    # temperature then top_k: softmax(l / T) over the k largest, renormalised
    p = to_numpy(kiln.sampling_probs(logits, temperature=0.7, top_k=5))
    for r in range(3):
        keep = np.argsort(-nl[r])[:5]
        e = np.zeros(50)
        e[keep] = np.exp((nl[r, keep] - nl[r].max()) / 0.7)
        assert_close(p[r], e / e.sum(), kiln.float32, rtol=1e-5, atol=1e-7)
    # min_p drops the tokens below min_p x the top one; temperature 0 is the argmax
    p = to_numpy(kiln.sampling_probs(logits, temperature=1.0, min_p=0.3))
    e = np.exp(nl - nl.max(-1, keepdims=True))
    e[e < 0.3] = 0
    assert_close(p, e / e.sum(-1, keepdims=True), kiln.float32, rtol=1e-5, atol=1e-7)
    g = to_numpy(kiln.sampling_probs(logits, temperature=0.0))
    assert (g.argmax(-1) == nl.argmax(-1)).all() and (g.sum(-1) == 1).all() and (g.max(-1) == 1).all()
    # sample()'s draws land where the probabilities are
    row = kiln.tensor(np.tile(nl[:1], (4000, 1)).astype(np.float32), device=device)
    draws = to_numpy(kiln.sample(row, temperature=1.0, top_k=4, generator=kiln.Generator(3)))
    probs = to_numpy(kiln.sampling_probs(logits, temperature=1.0, top_k=4))[0]
    counts = np.bincount(draws, minlength=50)
    assert set(np.nonzero(counts)[0]) <= set(np.nonzero(probs)[0])
    assert np.abs(counts / 4000 - probs).max() < 0.04
    with pytest.raises(kiln.KilnError, match="top_p must be in"):
        kiln.sampling_probs(logits, top_p=0.0)
