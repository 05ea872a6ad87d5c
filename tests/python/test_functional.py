"""torch.nn.functional's normalisation, dropout, embedding, losses and pad, and bincount / histc, against
NumPy references (and against torch itself where it is installed)."""
import numpy as np
import pytest

import kiln
from conftest import to_numpy

F = kiln.nn.functional

try:
    import torch
    import torch.nn.functional as TF
except ImportError:
    torch = None


def t(a, device, dtype=None):
    x = kiln.tensor(np.ascontiguousarray(a), device=device)
    return x.to(dtype) if dtype is not None else x


def close(actual, expected, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(to_numpy(actual), expected, rtol=rtol, atol=atol)


def test_layer_and_group_norm(rng, device):
    x = rng.standard_normal((4, 6, 5))
    w, b = rng.standard_normal(5), rng.standard_normal(5)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    close(F.layer_norm(t(x, device), [5], t(w, device), t(b, device)), (x - mu) / np.sqrt(var + 1e-5) * w + b)
    mu2, var2 = x.mean((-2, -1), keepdims=True), x.var((-2, -1), keepdims=True)
    close(F.layer_norm(t(x, device), (6, 5), eps=1e-3), (x - mu2) / np.sqrt(var2 + 1e-3))
    g = x.reshape(4, 3, 10)
    ref = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(4, 6, 5)
    wc, bc = rng.standard_normal(6), rng.standard_normal(6)
    close(F.group_norm(t(x, device), 3, t(wc, device), t(bc, device)), ref * wc[None, :, None] + bc[None, :, None])
    hb = F.layer_norm(t(x, device, kiln.bfloat16), [5])
    assert hb.dtype == kiln.bfloat16
    close(hb, (x - mu) / np.sqrt(var + 1e-5), rtol=2e-2, atol=2e-2)
    with pytest.raises(kiln.KilnError, match="num_groups"):
        F.group_norm(t(x, device), 4)
    with pytest.raises(kiln.KilnError, match="trailing dims"):
        F.layer_norm(t(x, device), [6])


def test_batch_norm_training_updates_running_statistics(rng, device):
    x = rng.standard_normal((8, 3, 4, 4)) * 2 + 1
    rm, rv = rng.standard_normal(3), rng.random(3) + 0.5
    RM, RV = t(rm, device), t(rv, device)
    y = F.batch_norm(t(x, device), RM, RV, training=True, momentum=0.2)
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    close(y, (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + 1e-5))
    n = 8 * 4 * 4
    close(RM, 0.8 * rm + 0.2 * mean)
    close(RV, 0.8 * rv + 0.2 * var * n / (n - 1))
    w, b = rng.standard_normal(3), rng.standard_normal(3)
    ye = F.batch_norm(t(x, device), RM, RV, t(w, device), t(b, device), training=False)
    rm2, rv2 = to_numpy(RM), to_numpy(RV)
    close(ye, (x - rm2[None, :, None, None]) / np.sqrt(rv2[None, :, None, None] + 1e-5) * w[None, :, None, None]
          + b[None, :, None, None])
    with pytest.raises(kiln.KilnError, match="running_mean and running_var"):
        F.batch_norm(t(x, device), None, None)
    xi = rng.standard_normal((2, 3, 7))
    close(F.instance_norm(t(xi, device)),
          (xi - xi.mean(-1, keepdims=True)) / np.sqrt(xi.var(-1, keepdims=True) + 1e-5))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_norms_of_large_and_odd_shapes_against_float64(rng, device, dtype):
    # On CUDA these take the native statistics (split over many blocks, merged by Chan's formula) and the one-pass
    # normalisation, vectorised where a row or plane is a multiple of 16 bytes and scalar otherwise. Values around
    # 100 with a spread of 3 make a naive sum of squares cancel; the reference sees the input as rounded to dtype.
    kd = getattr(kiln, dtype)
    tol = {"float32": 1e-4, "bfloat16": 4e-2, "float16": 4e-3}[dtype]

    def inp(shape):
        x = t((rng.standard_normal(shape) * 3 + 100).astype(np.float32), device, kd)
        return x, to_numpy(x)

    def check(actual, expected):
        assert actual.dtype == kd
        close(actual, expected, rtol=tol, atol=tol)

    for shape in [(64, 4096), (5, 1003), (3, 16384)]:
        x, xn = inp(shape)
        w, b = rng.standard_normal(shape[-1]), rng.standard_normal(shape[-1])
        mu, var = xn.mean(-1, keepdims=True), xn.var(-1, keepdims=True)
        check(F.layer_norm(x, [shape[-1]], t(w, device), t(b, device)), (xn - mu) / np.sqrt(var + 1e-5) * w + b)
    for shape, groups in [((2, 64, 33, 31), 8), ((1, 128, 64, 64), 32), ((2, 32, 4, 16, 16), 8)]:
        x, xn = inp(shape)
        g = xn.reshape(shape[0], groups, -1)
        ref = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(shape)
        check(F.group_norm(x, groups), ref)
        wc, bc = rng.standard_normal(shape[1]), rng.standard_normal(shape[1])
        cv = (1, shape[1]) + (1,) * (len(shape) - 2)
        check(F.group_norm(x, groups, t(wc, device), t(bc, device)), ref * wc.reshape(cv) + bc.reshape(cv))
    for shape in [(8, 16, 25, 25), (16, 32, 32, 32)]:
        x, xn = inp(shape)
        c, axes, cv = shape[1], (0, 2, 3), (1, shape[1], 1, 1)
        rm, rv = rng.standard_normal(c).astype(np.float32), (rng.random(c) + 0.5).astype(np.float32)
        RM, RV = t(rm, device), t(rv, device)
        w, b = rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)
        y = F.batch_norm(x, RM, RV, t(w, device), t(b, device), training=True, momentum=0.25)
        mean, var = xn.mean(axes), xn.var(axes)
        check(y, (xn - mean.reshape(cv)) / np.sqrt(var.reshape(cv) + 1e-5) * w.reshape(cv) + b.reshape(cv))
        n = xn.size // c
        close(RM, 0.75 * rm + 0.25 * mean, rtol=1e-5, atol=1e-4)
        close(RV, 0.75 * rv + 0.25 * var * n / (n - 1), rtol=1e-4, atol=1e-4)
        rm2, rv2 = to_numpy(RM), to_numpy(RV)
        ye = F.batch_norm(x, RM, RV, t(w, device), t(b, device), training=False)
        check(ye, (xn - rm2.reshape(cv)) / np.sqrt(rv2.reshape(cv) + 1e-5) * w.reshape(cv) + b.reshape(cv))
    # A non-contiguous input (composed of kiln's ops on every device) agrees with the contiguous one (native).
    x, xn = inp((6, 40, 9))
    xt = x.transpose(0, 2)
    close(F.layer_norm(xt, [6]), to_numpy(F.layer_norm(xt.contiguous(), [6])), rtol=tol, atol=tol)
    x4 = t(np.ascontiguousarray((rng.standard_normal((5, 8, 4, 6)) * 3 + 100).astype(np.float32).transpose(0, 1, 3, 2)),
           device, kd).transpose(2, 3)  # [5, 8, 4, 6] whose last two dims are swapped in memory
    wc, bc = t(rng.standard_normal(8), device), t(rng.standard_normal(8), device)
    close(F.group_norm(x4, 4, wc, bc), to_numpy(F.group_norm(x4.contiguous(), 4, wc, bc)), rtol=tol, atol=tol)
    rm, rv = t(np.zeros(8, np.float32), device), t(np.ones(8, np.float32), device)
    rm2, rv2 = t(np.zeros(8, np.float32), device), t(np.ones(8, np.float32), device)
    close(F.batch_norm(x4, rm, rv, training=True), to_numpy(F.batch_norm(x4.contiguous(), rm2, rv2, training=True)),
          rtol=tol, atol=tol)
    close(rm, to_numpy(rm2), rtol=1e-5, atol=1e-4)
    close(rv, to_numpy(rv2), rtol=1e-4, atol=1e-4)


def test_dropout_statistics_and_reproducibility(device):
    x = kiln.ones(200_000, device=device)
    for p in (0.1, 0.5, 0.9):
        y = F.dropout(x, p, generator=kiln.Generator(7))
        a = to_numpy(y)
        kept = a != 0
        n = a.size
        # The kept fraction within 4 sigma of 1 - p; kept values are exactly 1 / (1 - p).
        assert abs(kept.mean() - (1 - p)) < 4 * np.sqrt(p * (1 - p) / n)
        np.testing.assert_allclose(a[kept], 1 / (1 - p), rtol=1e-6)
        same = F.dropout(x, p, generator=kiln.Generator(7))
        assert (to_numpy(same) == a).all()
    assert F.dropout(x, 0.3, training=False).data_ptr() == x.data_ptr()
    assert F.dropout(x, 0.0).data_ptr() == x.data_ptr()
    assert to_numpy(F.dropout(x, 1.0)).max() == 0
    z = kiln.ones(1000, device=device)
    F.dropout(z, 0.5, inplace=True, generator=kiln.Generator(3))
    assert (to_numpy(z) == to_numpy(F.dropout(kiln.ones(1000, device=device), 0.5, generator=kiln.Generator(3)))).all()
    with pytest.raises(kiln.KilnError, match=r"\[0, 1\]"):
        F.dropout(x, 1.5)
    s = kiln.randn(400_000, device=device, generator=kiln.Generator(1))
    a = to_numpy(F.alpha_dropout(s, 0.2, training=True, generator=kiln.Generator(2)))
    assert abs(a.mean()) < 0.01 and abs(a.std() - 1) < 0.01  # SELU's fixed point kept


def philox4x32_10(counter, seed):
    """The four words of Philox4x32-10 (src/core/philox.h) for 64-bit counters (offset 0) and a 64-bit seed, in NumPy."""
    m = np.uint64(0xFFFFFFFF)
    c = [counter & m, counter >> np.uint64(32), np.zeros_like(counter), np.zeros_like(counter)]
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64(seed >> 32)
    for r in range(10):
        if r > 0:
            k0, k1 = (k0 + np.uint64(0x9E3779B9)) & m, (k1 + np.uint64(0xBB67AE85)) & m
        p0, p1 = np.uint64(0xD2511F53) * c[0], np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & m, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & m]
    return c


def test_dropout_is_one_pass_over_the_generators_stream(rng, device):
    # The reference Philox reproduces rand() (element i: word 0 of the block at counter i), and dropout's mask:
    # element i takes word i % 4 of the block at counter i // 4 and is kept where that draw, as f32, is >= p.
    n = 64 * 300
    words = philox4x32_10(np.arange(n, dtype=np.uint64), 11)
    u_rand = (words[0] >> np.uint64(8)).astype(np.float32) * np.float32(2.0 ** -24)
    np.testing.assert_array_equal(to_numpy(kiln.rand(64, 300, device=device, generator=kiln.Generator(11))).ravel(),
                                  u_rand)
    blocks = philox4x32_10(np.arange((n + 3) // 4, dtype=np.uint64), 11)
    w = np.stack(blocks, 1).ravel()[:n]
    u = ((w >> np.uint64(8)).astype(np.float32) * np.float32(2.0 ** -24)).reshape(64, 300)
    x = t(rng.standard_normal((64, 300)).astype(np.float32), device)
    for p in (0.1, 0.7):
        got = to_numpy(F.dropout(x, p, generator=kiln.Generator(11)))
        expected = np.where(u >= np.float32(p), to_numpy(x).astype(np.float32) * np.float32(1 / (1 - p)), 0)
        np.testing.assert_array_equal(got, expected)
    # A length that is not a multiple of four: the last block's first words.
    x1 = t(rng.standard_normal(1001).astype(np.float32), device)
    got = to_numpy(F.dropout(x1, 0.5, generator=kiln.Generator(11)))
    np.testing.assert_array_equal(got, np.where(u.ravel()[:1001] >= np.float32(0.5), to_numpy(x1) * 2, 0))
    # The same numbers on every device, for every float dtype, whatever the input's layout.
    for dt in (kiln.float32, kiln.bfloat16, kiln.float16, kiln.float64):
        xv = t(rng.standard_normal((50, 40)), device, dt).transpose(0, 1)
        cpu = to_numpy(F.dropout(xv.cpu(), 0.25, generator=kiln.Generator(5)))
        np.testing.assert_array_equal(to_numpy(F.dropout(xv, 0.25, generator=kiln.Generator(5))), cpu)
        a_cpu = to_numpy(F.alpha_dropout(xv.cpu(), 0.25, training=True, generator=kiln.Generator(6)))
        np.testing.assert_array_equal(to_numpy(F.alpha_dropout(xv, 0.25, training=True, generator=kiln.Generator(6))), a_cpu)
    with pytest.raises(kiln.KilnError, match="floating"):
        F.dropout(t(np.arange(6), device), 0.5)


def test_embedding(rng, device):
    w = rng.standard_normal((10, 4))
    idx = np.array([[1, 9], [0, 1]])
    close(F.embedding(t(idx, device), t(w, device)), w[idx], 0, 0)
    # On CUDA the kernel finds the bad index: the error is raised at the next synchronisation (reading the result).
    with pytest.raises(kiln.KilnError, match="out of (range|bounds)"):
        to_numpy(F.embedding(t(np.array([10]), device), t(w, device)))


def test_regression_losses(rng, device):
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((5, 7))
    d = a - b
    close(F.mse_loss(t(a, device), t(b, device)), (d * d).mean())
    close(F.mse_loss(t(a, device), t(b, device), reduction="sum"), (d * d).sum())
    close(F.l1_loss(t(a, device), t(b, device), reduction="none"), np.abs(d))
    for beta in (1.0, 0.5, 0.0):
        ad = np.abs(d)
        ref = np.where(ad < beta, 0.5 * ad * ad / beta, ad - 0.5 * beta) if beta else ad
        close(F.smooth_l1_loss(t(a, device), t(b, device), beta=beta), ref.mean())
    with pytest.raises(kiln.KilnError, match="reduction"):
        F.mse_loss(t(a, device), t(b, device), reduction="avg")


def log_softmax(x, axis):
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def ce_reference(x, target, weight, ignore, reduction, eps):
    """torch's cross_entropy with class indices (label smoothing as aten's cross_entropy_loss_label_smoothing)."""
    c = x.shape[1]
    logp = log_softmax(x, 1)
    w = np.ones(c) if weight is None else weight
    mask = target != ignore
    safe = np.where(mask, target, 0)
    picked = np.take_along_axis(logp, safe[:, None], 1)[:, 0]
    wt = np.where(mask, w[safe], 0.0)
    nll = -picked * wt
    smooth = np.where(mask, -(logp * w[None, :]).sum(1), 0.0)
    if reduction == "none":
        return (1 - eps) * nll + eps / c * smooth
    if reduction == "sum":
        return (1 - eps) * nll.sum() + eps / c * smooth.sum()
    denom = wt.sum()
    return (1 - eps) * nll.sum() / denom + eps / c * (smooth.sum() / (denom if weight is not None else mask.sum()))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_and_nll(rng, device, reduction):
    x = rng.standard_normal((9, 6)) * 3
    target = rng.integers(0, 6, 9)
    target[2] = -100
    weight = rng.random(6) + 0.5
    for w in (None, weight):
        for eps in (0.0, 0.1):
            got = F.cross_entropy(t(x, device), t(target, device), None if w is None else t(w, device),
                                  reduction=reduction, label_smoothing=eps)
            close(got, ce_reference(x, target, w, -100, reduction, eps))
            if torch is not None:
                ref = TF.cross_entropy(torch.tensor(x), torch.tensor(target), None if w is None else torch.tensor(w),
                                       reduction=reduction, label_smoothing=eps)
                close(got, ref.numpy())
    logp = log_softmax(x, 1)
    close(F.nll_loss(t(logp, device), t(target, device), reduction=reduction), ce_reference(x, target, None, -100, reduction, 0))
    # Probabilities as targets; a spatial dim after the class dim.
    probs = rng.random((4, 6))
    probs /= probs.sum(1, keepdims=True)
    xs = rng.standard_normal((4, 6))
    ref = -(log_softmax(xs, 1) * probs).sum(1)
    close(F.cross_entropy(t(xs, device), t(probs, device), reduction=reduction),
          ref if reduction == "none" else ref.sum() if reduction == "sum" else ref.mean())
    x3, t3 = rng.standard_normal((2, 5, 3)), rng.integers(0, 5, (2, 3))
    l3 = -np.take_along_axis(log_softmax(x3, 1), t3[:, None, :], 1)[:, 0, :]
    close(F.cross_entropy(t(x3, device), t(t3, device), reduction="none"), l3)
    # A target out of range: an error at once on the CPU, at the next synchronisation on CUDA (no host round trip
    # per call there); the rows out of range read nothing.
    with pytest.raises(kiln.KilnError, match="out of bounds|out of range"):
        to_numpy(F.cross_entropy(t(x, device), t(np.array([6] * 9), device)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cross_entropy_of_language_model_rows(rng, device, dtype):
    # A vocabulary-sized row per token (CUDA: one block per row, vectorised when C is a multiple of 16 bytes),
    # int32 and int64 targets, against float64 on the values as rounded to dtype.
    kd = getattr(kiln, dtype)
    for n, c in [(37, 50000), (5, 1001)]:
        x = t((rng.standard_normal((n, c)) * 4).astype(np.float32), device, kd)
        xn = to_numpy(x)
        target = rng.integers(0, c, n)
        target[3] = -100
        weight = rng.random(c) + 0.5
        for tdt in (np.int64, np.int32):
            for w, eps in ((None, 0.0), (weight, 0.1)):
                got = F.cross_entropy(x, t(target.astype(tdt), device), None if w is None else t(w.astype(np.float32), device),
                                      label_smoothing=eps)
                assert got.dtype == kd
                tol = 1e-5 if dtype == "float32" else 2e-2
                close(got, ce_reference(xn, target, w, -100, "mean", eps), rtol=tol, atol=tol)
        close(F.cross_entropy(x, t(target, device), reduction="none"), ce_reference(xn, target, None, -100, "none", 0),
              rtol=1e-4 if dtype == "float32" else 2e-2, atol=1e-4 if dtype == "float32" else 5e-2)


@pytest.mark.parametrize("mode,np_mode", [("constant", "constant"), ("reflect", "reflect"), ("replicate", "edge"),
                                          ("circular", "wrap")])
def test_pad_matches_numpy(rng, device, mode, np_mode):
    x = rng.standard_normal((2, 3, 5, 6))
    for pads in [(1, 2), (2, 0, 1, 3), (1, 1, 2, 2, 0, 1), (0, 0, 4, 4)]:
        k = len(pads) // 2
        width = [(0, 0)] * (4 - k) + [(pads[2 * i], pads[2 * i + 1]) for i in reversed(range(k))]
        kw = {"constant_values": 2.5} if mode == "constant" else {}
        got = F.pad(t(x, device), list(pads), mode=mode, value=2.5 if mode == "constant" else None)
        close(got, np.pad(x, width, mode=np_mode, **kw), 0, 0)
    # Negative padding crops.
    close(F.pad(t(x, device), [-1, 2], mode=mode, value=0.0 if mode == "constant" else None),
          np.pad(x, [(0, 0)] * 3 + [(0, 2)], mode=np_mode)[..., 1:], 0, 0)
    if mode == "reflect":
        with pytest.raises(kiln.KilnError, match="smaller than"):
            F.pad(t(x, device), [6, 0], mode="reflect")


@pytest.mark.parametrize("mode,np_mode", [("constant", "constant"), ("reflect", "reflect"), ("replicate", "edge"),
                                          ("circular", "wrap")])
def test_pad_layouts_dtypes_and_sizes(rng, device, mode, np_mode):
    kw = {"constant_values": 3} if mode == "constant" else {}
    value = 3.0 if mode == "constant" else None
    # A 5-D video-shaped tensor padded in its last 3 dims (the VAE's causal pads: time on one side only).
    x = rng.standard_normal((1, 4, 3, 9, 7)).astype(np.float32)
    pads = (1, 1, 2, 1, 2, 0)
    width = [(0, 0), (0, 0), (2, 0), (2, 1), (1, 1)]
    close(F.pad(t(x, device), list(pads), mode=mode, value=value), np.pad(x, width, mode=np_mode, **kw), 0, 0)
    # Non-contiguous input (a transposed and a sliced view) and an outer dim that is not one flat block.
    v = t(x, device).transpose(3, 4)
    close(F.pad(v, [1, 2], mode=mode, value=value), np.pad(x.swapaxes(3, 4), [(0, 0)] * 4 + [(1, 2)], mode=np_mode, **kw), 0, 0)
    s = t(x, device)[:, ::2, 1:]
    close(F.pad(s, [2, 1, 1, 1], mode=mode, value=value),
          np.pad(x[:, ::2, 1:], [(0, 0)] * 3 + [(1, 1), (2, 1)], mode=np_mode, **kw), 0, 0)
    # Integer, half and bool elements move as bytes.
    xi = rng.integers(-100, 100, (3, 4, 5))
    got = F.pad(t(xi, device, kiln.int32), [2, 2], mode=mode, value=value)
    assert got.dtype == kiln.int32 and to_numpy(got).tolist() == np.pad(xi, [(0, 0), (0, 0), (2, 2)], mode=np_mode, **kw).tolist()
    close(F.pad(t(x, device, kiln.bfloat16), list(pads), mode=mode, value=value),
          np.pad(to_numpy(t(x, device, kiln.bfloat16)), width, mode=np_mode, **kw), 0, 0)
    xb = rng.random((2, 6)) < 0.5
    got = F.pad(t(xb, device), [1, 1], mode=mode, value=1.0 if mode == "constant" else None)
    assert to_numpy(got).astype(bool).tolist() == np.pad(xb, [(0, 0), (1, 1)], mode=np_mode,
                                                          **({"constant_values": True} if mode == "constant" else {})).tolist()
    # Rows shorter than one thread's run of elements (CUDA: 16-byte stores spanning rows) and a total that is
    # not a whole number of runs, for 1- and 8-byte elements.
    xu = rng.integers(0, 255, (37, 3)).astype(np.uint8)
    got = F.pad(t(xu, device), [1, 1], mode=mode, value=value)
    assert to_numpy(got).tolist() == np.pad(xu, [(0, 0), (1, 1)], mode=np_mode, **kw).tolist()
    xd = rng.standard_normal((5, 2, 1))
    close(F.pad(t(xd, device), [0, 0, 1, 1], mode=mode, value=value),
          np.pad(xd, [(0, 0), (1, 1), (0, 0)], mode=np_mode, **kw), 0, 0)
    # Rows that are whole 16-byte chunks (CUDA: staged with 16-byte loads), in groups that do not divide the
    # rows, a crop on the last dim, 1- and 8-byte elements; rows longer than 32 KB (CUDA: one warp a row).
    xa = rng.standard_normal((1, 3, 5, 11, 64)).astype(np.float32)
    xab = to_numpy(t(xa, device, kiln.bfloat16))
    close(F.pad(t(xa, device, kiln.bfloat16), [1, 1, 1, 1, 1, 1], mode=mode, value=value),
          np.pad(xab, [(0, 0), (0, 0), (1, 1), (1, 1), (1, 1)], mode=np_mode, **kw), 0, 0)
    close(F.pad(t(xa, device, kiln.bfloat16), [-3, 2, 0, 1], mode=mode, value=value),
          np.pad(xab, [(0, 0)] * 3 + [(0, 1), (0, 2)], mode=np_mode, **kw)[..., 3:], 0, 0)
    xa8 = rng.integers(0, 255, (70, 32)).astype(np.uint8)
    assert to_numpy(F.pad(t(xa8, device), [3, 2, 1, 0], mode=mode, value=value)).tolist() == \
        np.pad(xa8, [(1, 0), (3, 2)], mode=np_mode, **kw).tolist()
    xa64 = rng.integers(-1000, 1000, (9, 7, 2))
    assert to_numpy(F.pad(t(xa64, device), [1, 1, 2, 2], mode=mode, value=value)).tolist() == \
        np.pad(xa64, [(0, 0), (2, 2), (1, 1)], mode=np_mode, **kw).tolist()
    long = rng.standard_normal((3, 9000)).astype(np.float32)
    close(F.pad(t(long, device), [5, 4, 1, 1], mode=mode, value=value),
          np.pad(long, [(1, 1), (5, 4)], mode=np_mode, **kw), 0, 0)
    # A zero-size batch, and a plane of more than 65536 elements.
    assert F.pad(t(np.zeros((0, 3, 4)), device), [1, 1], mode=mode, value=value).shape == (0, 3, 6)
    big = rng.standard_normal((1, 2, 300, 260)).astype(np.float32)
    close(F.pad(t(big, device), [1, 1, 1, 1], mode=mode, value=value),
          np.pad(big, [(0, 0), (0, 0), (1, 1), (1, 1)], mode=np_mode, **kw), 0, 0)


def test_bincount_and_histc(rng, device):
    v = rng.integers(0, 50, 10_000)
    w = rng.random(10_000).astype(np.float32)
    assert kiln.bincount(t(v, device)).tolist() == np.bincount(v).tolist()
    got = kiln.bincount(t(v, device), t(w, device), minlength=60)
    assert got.dtype == kiln.float32 and got.shape == (60,)
    close(got, np.bincount(v, w, minlength=60), rtol=1e-4)
    assert kiln.bincount(t(np.array([], np.int64), device), minlength=3).tolist() == [0, 0, 0]
    assert kiln.bincount(t(v, device), t(v, device)).dtype == kiln.float64
    with pytest.raises(kiln.KilnError, match="negative"):
        kiln.bincount(t(np.array([1, -2]), device))
    # Every index dtype; many values (the CPU's per-thread histograms) into few and into many bins (CUDA's
    # shared-memory and global paths); f64 weights.
    big = rng.integers(0, 1000, 300_000)
    for dt in (np.int32, np.int64, np.uint8, np.int16):
        v8 = (big % 200).astype(dt)
        assert kiln.bincount(t(v8, device)).tolist() == np.bincount(v8).tolist()
    many = rng.integers(0, 40_000, 200_000)
    assert kiln.bincount(t(many, device)).tolist() == np.bincount(many).tolist()
    w64 = rng.random(200_000)
    close(kiln.bincount(t(many, device), t(w64, device)), np.bincount(many, w64), rtol=1e-12, atol=1e-12)
    w32 = rng.random(300_000).astype(np.float32)
    close(kiln.bincount(t(big, device), t(w32, device)), np.bincount(big, w32), rtol=1e-4)
    # Around CUDA's one-pass limit (8192 bins for counts and f32 weights, 4096 for f64): values just below and at
    # it, and minlength beyond it with small values; the most negative int64 is still negative.
    for top, wdt in ((8192, None), (4096, np.float64), (8192, np.float32)):
        for hi in (top - 1, top):
            vals = np.concatenate([rng.integers(0, 30, 5000), [hi]])
            ww = None if wdt is None else rng.random(vals.size).astype(wdt)
            got = kiln.bincount(t(vals, device), None if ww is None else t(ww, device))
            assert got.shape == (hi + 1,)
            close(got, np.bincount(vals, ww), rtol=1e-5, atol=0)
    assert kiln.bincount(t(v, device), minlength=10_000).tolist() == np.bincount(v, minlength=10_000).tolist()
    with pytest.raises(kiln.KilnError, match="negative"):
        kiln.bincount(t(np.array([5, np.iinfo(np.int64).min]), device))
    x = rng.standard_normal(5000).astype(np.float32)
    h = kiln.histc(t(x, device), bins=20, min=-2, max=2)
    ref, _ = np.histogram(x, bins=20, range=(-2, 2))
    assert to_numpy(h).astype(int).tolist() == ref.tolist()
    auto = kiln.histc(t(x, device), bins=10)
    assert int(to_numpy(auto).sum()) == 5000
