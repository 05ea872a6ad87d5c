"""Convolution, transposed convolution, pooling and interpolation against NumPy references written from the
definitions (and against torch over a wider grid where torch is installed)."""
import itertools

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import kiln
from conftest import to_numpy

F = kiln.nn.functional

try:
    import torch
    import torch.nn.functional as TF
except ImportError:
    torch = None


def conv_ref(x, w, b, stride, pad, dil, groups):
    """y[n, o, i] = b[o] + sum over c in o's group and k of x_padded[n, c, i * s + k * d] w[o, c, k] (any nd)."""
    nsp = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pad, pad)] * nsp)
    k = w.shape[2:]
    span = [dil * (kk - 1) + 1 for kk in k]
    win = sliding_window_view(xp, span, axis=tuple(range(2, 2 + nsp)))
    win = win[(...,) + tuple(slice(None, None, dil) for _ in range(nsp))]  # the dilated taps
    win = win[(slice(None), slice(None)) + tuple(slice(None, None, stride) for _ in range(nsp))]
    cg, og = x.shape[1] // groups, w.shape[0] // groups
    outs = []
    for g in range(groups):
        wg = w[g * og:(g + 1) * og]
        xg = win[:, g * cg:(g + 1) * cg]
        # contract the channel and kernel axes: [n, *o, c_out]
        outs.append(np.tensordot(xg, wg, axes=([1] + list(range(2 + nsp, 2 + 2 * nsp)), [1] + list(range(2, 2 + nsp)))))
    y = np.concatenate(outs, axis=-1)  # [n, *o, c_out]
    y = np.moveaxis(y, -1, 1)
    return y + b.reshape((1, -1) + (1,) * nsp)


def conv_transpose_ref(x, w, b, stride, pad, out_pad, groups, dil):
    """Scatter definition: y[n, o, i s - p + k d] += x[n, c, i] w[c, o, k]."""
    nsp = x.ndim - 2
    n, c = x.shape[:2]
    cg, og = c // groups, w.shape[1]
    k = w.shape[2:]
    out = [(x.shape[2 + i] - 1) * stride - 2 * pad + dil * (k[i] - 1) + out_pad + 1 for i in range(nsp)]
    full = [(x.shape[2 + i] - 1) * stride + dil * (k[i] - 1) + 1 + out_pad for i in range(nsp)]
    y = np.zeros((n, og * groups) + tuple(full))
    for ci in range(c):
        g = ci // cg
        for idx in itertools.product(*[range(s) for s in x.shape[2:]]):
            for kk in itertools.product(*[range(s) for s in k]):
                pos = tuple(idx[i] * stride + kk[i] * dil for i in range(nsp))
                y[(slice(None), slice(g * og, (g + 1) * og)) + pos] += x[(slice(None), ci) + idx][:, None] * w[(ci, slice(None)) + kk]
    y = y[(slice(None), slice(None)) + tuple(slice(pad, pad + out[i]) for i in range(nsp))]
    return y + b.reshape((1, -1) + (1,) * nsp)


@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_conv_matches_the_definition(rng, device, nsp):
    for (c, o, g), k, s, p, d in [((4, 6, 1), 3, 1, 1, 1), ((4, 6, 2), 3, 2, 0, 1), ((4, 4, 4), 2, 1, 1, 2), ((3, 5, 1), 1, 1, 0, 1)]:
        x = rng.standard_normal((2, c) + (6,) * nsp)
        w = rng.standard_normal((o, c // g) + (k,) * nsp)
        b = rng.standard_normal(o)
        kf = getattr(F, f"conv{nsp}d")
        got = kf(kiln.tensor(x, device=device), kiln.tensor(w, device=device), kiln.tensor(b, device=device), s, p, d, g)
        np.testing.assert_allclose(to_numpy(got), conv_ref(x, w, b, s, p, d, g), rtol=1e-10, atol=1e-10)
    # float32 and bfloat16 with f32 accumulation; 'same' and 'valid'; unbatched input.
    x = rng.standard_normal((2, 4) + (8,) * nsp)
    w = rng.standard_normal((3, 4) + (3,) * nsp)
    ref = conv_ref(x, w, np.zeros(3), 1, 1, 1, 1)
    for dt, tol in [(kiln.float32, 1e-5), (kiln.bfloat16, 3e-2)]:
        got = getattr(F, f"conv{nsp}d")(kiln.tensor(x, device=device).to(dt), kiln.tensor(w, device=device).to(dt), padding="same")
        assert got.dtype == dt
        np.testing.assert_allclose(to_numpy(got), ref, rtol=tol, atol=tol * 10)
    valid = getattr(F, f"conv{nsp}d")(kiln.tensor(x, device=device), kiln.tensor(w, device=device), padding="valid")
    assert valid.shape == (2, 3) + (6,) * nsp
    single = getattr(F, f"conv{nsp}d")(kiln.tensor(x[0], device=device), kiln.tensor(w, device=device), padding=1)
    np.testing.assert_allclose(to_numpy(single), ref[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("nsp", [1, 2])
def test_conv_transpose_matches_the_scatter_definition(rng, device, nsp):
    for (c, o, g), k, s, p, op, d in [((2, 3, 1), 3, 2, 1, 1, 1), ((4, 2, 2), 2, 1, 0, 0, 2), ((2, 2, 1), 3, 3, 2, 2, 1)]:
        x = rng.standard_normal((2, c) + (4,) * nsp)
        w = rng.standard_normal((c, o) + (k,) * nsp)
        b = rng.standard_normal(o * g)
        got = getattr(F, f"conv_transpose{nsp}d")(kiln.tensor(x, device=device), kiln.tensor(w, device=device),
                                                   kiln.tensor(b, device=device), s, p, op, g, d)
        np.testing.assert_allclose(to_numpy(got), conv_transpose_ref(x, w, b, s, p, op, g, d), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("nsp", [1, 2, 3])
def test_convolutions_in_16_and_32_bits(rng, device, nsp):
    # The dtypes cuDNN takes on CUDA and oneDNN on the CPU (f32 without TF32: 1e-5), over strides, dilations,
    # groups (depthwise too), asymmetric 'same' padding, transposed convolutions with output_padding, and a
    # non-contiguous input; against float64 on the CPU from the same rounded inputs.
    cases = [((4, 6, 1), 3, 1, 1, 1), ((4, 6, 2), 3, 2, 0, 1), ((8, 8, 8), 3, 1, 1, 2), ((6, 4, 1), 1, 2, 0, 1)]
    for dt, tol in [(kiln.float32, 1e-5), (kiln.float16, 4e-3), (kiln.bfloat16, 3e-2)]:
        for (c, o, g), k, s, p, d in cases:
            x = rng.standard_normal((3, c) + (7,) * nsp).astype(np.float32)
            w = (rng.standard_normal((o, c // g) + (k,) * nsp) / np.sqrt(c // g * k ** nsp)).astype(np.float32)
            b = rng.standard_normal(o).astype(np.float32)
            xq, wq, bq = (kiln.tensor(v, device=device).to(dt) for v in (x, w, b))
            ref = conv_ref(*(to_numpy(t) for t in (xq, wq, bq)), s, p, d, g)
            got = getattr(F, f"conv{nsp}d")(xq, wq, bq, s, p, d, g)
            assert got.dtype == dt and got.device.type == device
            np.testing.assert_allclose(to_numpy(got), ref, rtol=tol, atol=tol)
        # 'same' with an even kernel: one more pad after than before.
        x = rng.standard_normal((2, 3) + (6,) * nsp).astype(np.float32)
        w = (rng.standard_normal((5, 3) + (4,) * nsp) / 8).astype(np.float32)
        got = getattr(F, f"conv{nsp}d")(kiln.tensor(x, device=device).to(dt), kiln.tensor(w, device=device).to(dt),
                                        padding="same")
        cpu = getattr(F, f"conv{nsp}d")(kiln.tensor(x).to(dt).to(kiln.float64), kiln.tensor(w).to(dt).to(kiln.float64),
                                        padding="same")
        np.testing.assert_allclose(to_numpy(got), to_numpy(cpu), rtol=tol, atol=tol)
        # A transposed convolution with stride, output_padding, groups and dilation.
        for (c, o, g), k, s, p, op, d in [((4, 3, 1), 3, 2, 1, 1, 1), ((4, 2, 2), 2, 1, 0, 0, 2), ((2, 2, 1), 4, 2, 1, 0, 1),
                                          ((2, 3, 1), 3, 2, 0, 1, 1)]:
            x = rng.standard_normal((2, c) + (5,) * nsp).astype(np.float32)
            w = (rng.standard_normal((c, o) + (k,) * nsp) / np.sqrt(c * k ** nsp)).astype(np.float32)
            b = rng.standard_normal(o * g).astype(np.float32)
            xq, wq, bq = (kiln.tensor(v, device=device).to(dt) for v in (x, w, b))
            got = getattr(F, f"conv_transpose{nsp}d")(xq, wq, bq, s, p, op, g, d)
            cpu = getattr(F, f"conv_transpose{nsp}d")(*(t.cpu().to(kiln.float64) for t in (xq, wq, bq)), s, p, op, g, d)
            assert got.dtype == dt and got.shape == cpu.shape
            np.testing.assert_allclose(to_numpy(got), to_numpy(cpu), rtol=tol, atol=tol)
    # A non-contiguous input (channels and the last dim swapped in memory) and an unbatched one.
    x = kiln.tensor(rng.standard_normal((2, 5, 4) + (5,) * (nsp - 1)).astype(np.float32), device=device).transpose(1, 2)
    w = kiln.tensor(rng.standard_normal((3, 4) + (3,) * nsp).astype(np.float32), device=device)
    ref = getattr(F, f"conv{nsp}d")(x.cpu(), w.cpu(), padding=1)
    np.testing.assert_allclose(to_numpy(getattr(F, f"conv{nsp}d")(x, w, padding=1)), to_numpy(ref), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy(getattr(F, f"conv{nsp}d")(x[0], w, padding=1)), to_numpy(ref)[0], rtol=1e-5,
                               atol=1e-5)


def test_pools_and_interpolation(rng, device):
    x = rng.standard_normal((2, 3, 9, 8))
    X = kiln.tensor(x, device=device)
    win = sliding_window_view(np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)], constant_values=-np.inf), (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    np.testing.assert_array_equal(to_numpy(F.max_pool2d(X, 3, 2, 1)), win.max(axis=(-2, -1)))
    win = sliding_window_view(np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)]), (3, 3), axis=(2, 3))[:, :, ::2, ::2]
    # f64 sums in another order: an absolute floor for means near zero.
    np.testing.assert_allclose(to_numpy(F.avg_pool2d(X, 3, 2, 1)), win.mean(axis=(-2, -1)), rtol=1e-12, atol=1e-14)
    ones = sliding_window_view(np.pad(np.ones((9, 8)), 1), (3, 3))[::2, ::2].sum(axis=(-2, -1))
    np.testing.assert_allclose(to_numpy(F.avg_pool2d(X, 3, 2, 1, count_include_pad=False)),
                               win.sum(axis=(-2, -1)) / ones, rtol=1e-12, atol=1e-14)
    # adaptive: output cell i averages [floor(i in / out), ceil((i + 1) in / out)) per dim
    got = to_numpy(F.adaptive_avg_pool2d(X, (4, 3)))
    for i in range(4):
        for j in range(3):
            r0, r1 = (i * 9) // 4, -(-((i + 1) * 9) // 4)
            c0, c1 = (j * 8) // 3, -(-((j + 1) * 8) // 3)
            np.testing.assert_allclose(got[:, :, i, j], x[:, :, r0:r1, c0:c1].mean(axis=(-2, -1)), rtol=1e-12,
                                       atol=1e-14)
    # nearest: floor(o * in / out); bilinear with half-pixel centres, separable
    near = to_numpy(F.interpolate(X, size=(5, 16)))
    ri = np.minimum(np.floor(np.arange(5, dtype=np.float32) * np.float32(9 / 5)).astype(int), 8)
    ci = np.minimum(np.floor(np.arange(16, dtype=np.float32) * np.float32(8 / 16)).astype(int), 7)
    np.testing.assert_array_equal(near, x[:, :, ri][:, :, :, ci])

    def lin(a, axis, out):
        n = a.shape[axis]
        src = np.maximum((np.arange(out) + 0.5) * n / out - 0.5, 0)
        lo = np.minimum(np.floor(src).astype(int), n - 1)
        hi = np.minimum(lo + 1, n - 1)
        f = (src - lo).reshape([-1 if i == axis else 1 for i in range(a.ndim)])
        return np.take(a, lo, axis) * (1 - f) + np.take(a, hi, axis) * f

    # Sums of two products: elements that cancel are compared against the scale of the data, not their own.
    np.testing.assert_allclose(to_numpy(F.interpolate(X, size=(13, 5), mode="bilinear")), lin(lin(x, 2, 13), 3, 5),
                               rtol=1e-12, atol=1e-13 * np.abs(x).max())
    assert F.interpolate(X, scale_factor=2.0).shape == (2, 3, 18, 16)
    with pytest.raises(kiln.KilnError, match="exactly one"):
        F.interpolate(X)


def test_bad_arguments(device):
    x = kiln.ones(1, 4, 5, 5, device=device)
    with pytest.raises(kiln.KilnError, match="groups"):
        F.conv2d(x, kiln.ones(6, 2, 3, 3, device=device), groups=3)
    with pytest.raises(kiln.KilnError, match="input channels"):
        F.conv2d(x, kiln.ones(6, 3, 3, 3, device=device))
    with pytest.raises(kiln.KilnError, match="stride 1"):
        F.conv2d(x, kiln.ones(6, 4, 3, 3, device=device), stride=2, padding="same")
    with pytest.raises(kiln.KilnError, match="spans"):
        F.conv2d(x, kiln.ones(6, 4, 7, 7, device=device))
    with pytest.raises(kiln.KilnError, match="half the kernel"):
        F.max_pool2d(x, 2, padding=2)
    with pytest.raises(kiln.KilnError, match="dtype"):
        F.conv2d(x, kiln.ones(6, 4, 3, 3, dtype=kiln.float64, device=device))


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_against_torch_over_a_grid(rng):
    for nsp in (1, 2, 3):
        for (c, o, g), k, s, p, d in itertools.product([(4, 6, 1), (4, 6, 2), (4, 4, 4)], (1, 3), (1, 2), (0, 1), (1, 2)):
            x = rng.standard_normal((2, c) + (7,) * nsp).astype(np.float32)
            w = rng.standard_normal((o, c // g) + (k,) * nsp).astype(np.float32)
            ref = getattr(TF, f"conv{nsp}d")(torch.tensor(x), torch.tensor(w), None, s, p, d, g).numpy()
            got = to_numpy(getattr(F, f"conv{nsp}d")(kiln.tensor(x), kiln.tensor(w), None, s, p, d, g))
            np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
        x = rng.standard_normal((2, 3) + (9,) * nsp).astype(np.float32)
        for cm in (False, True):
            ref = getattr(TF, f"max_pool{nsp}d")(torch.tensor(x), 3, 2, 1, 1, cm).numpy()
            np.testing.assert_array_equal(to_numpy(getattr(F, f"max_pool{nsp}d")(kiln.tensor(x), 3, 2, 1, 1, cm)), ref)
        mode = {1: "linear", 2: "bilinear", 3: "trilinear"}[nsp]
        for ac in (False, True):
            ref = TF.interpolate(torch.tensor(x), size=13, mode=mode, align_corners=ac).numpy()
            np.testing.assert_allclose(to_numpy(F.interpolate(kiln.tensor(x), size=13, mode=mode, align_corners=ac)), ref,
                                       rtol=1e-5, atol=1e-5)
