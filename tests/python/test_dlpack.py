"""DLPack both ways without copies: NumPy, kiln itself, PyTorch (CPU and CUDA) where installed."""
import gc
import sys

import numpy as np
import pytest

import kiln
from conftest import DEVICES, to_numpy

try:
    import torch
except ImportError:  # the GPU machine has torch; the CPU CI does not
    torch = None

NUMPY_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
                np.float16, np.float32, np.float64, np.complex64]


def random_array(rng, shape, dtype):
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    if np.issubdtype(dtype, np.complexfloating):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


class Producer:
    """Something that only speaks DLPack (no NumPy or kiln type), wrapping a kiln tensor."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kw):
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


@pytest.mark.parametrize("dtype", NUMPY_DTYPES, ids=lambda d: np.dtype(d).name)
def test_numpy_round_trip_keeps_the_memory(rng, dtype):
    a = random_array(rng, (3, 5), dtype)
    t = kiln.from_dlpack(a)
    assert t.shape == (3, 5) and t.data_ptr() == a.ctypes.data
    assert t.dtype == np.dtype(dtype).name or (dtype == np.bool_ and t.dtype == kiln.bool)
    b = np.from_dlpack(t)
    assert b.ctypes.data == a.ctypes.data and b.dtype == a.dtype
    np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("dtype", [kiln.bfloat16, kiln.float8_e4m3fn, kiln.float8_e5m2, kiln.float16, kiln.int16])
def test_every_kiln_dtype_round_trips_through_dlpack(dtype, device):
    t = kiln.randn(4, 6, device=device).to(dtype)
    u = kiln.from_dlpack(Producer(t))
    assert u.dtype == dtype and u.data_ptr() == t.data_ptr() and u.device == t.device
    assert (u.to(kiln.float32) == t.to(kiln.float32)).all().item()


def test_strides_and_offsets_map_both_ways(rng):
    a = random_array(rng, (6, 8), np.float32)
    v = a[1:5, 1::3]
    t = kiln.from_dlpack(v)
    assert t.shape == v.shape and t.stride() == (8, 3) and t.data_ptr() == v.ctypes.data
    np.testing.assert_array_equal(to_numpy(t), v)
    w = np.from_dlpack(kiln.from_numpy(a).T[2:, 1:4])
    np.testing.assert_array_equal(w, a.T[2:, 1:4])
    assert np.shares_memory(w, a)
    z = np.zeros((0, 3), np.float32)
    assert kiln.from_dlpack(z).shape == (0, 3)
    s = np.array(2.5)
    assert kiln.from_dlpack(s).shape == () and kiln.from_dlpack(s).item() == 2.5


def test_negative_strides_are_refused_with_the_reason(rng):
    a = random_array(rng, (5,), np.float32)
    with pytest.raises(kiln.KilnError, match="negative stride"):
        kiln.from_dlpack(a[::-1])


def test_read_only_arrays_are_copied(rng):
    a = random_array(rng, (4,), np.float32)
    a.setflags(write=False)
    t = kiln.from_dlpack(a)
    assert t.data_ptr() != a.ctypes.data
    np.testing.assert_array_equal(to_numpy(t), a)
    with pytest.raises(BufferError):
        kiln.from_dlpack(a, copy=False)


def test_the_producer_lives_as_long_as_the_consumer(rng):
    a = random_array(rng, (1000,), np.float64)
    expected = a.copy()
    before = sys.getrefcount(a)
    t = kiln.from_dlpack(a)
    assert sys.getrefcount(a) > before
    del a
    gc.collect()
    np.testing.assert_array_equal(to_numpy(t), expected)
    u = t[10:20]  # a view keeps it too
    del t
    gc.collect()
    np.testing.assert_array_equal(to_numpy(u), expected[10:20])


def test_a_consumer_keeps_a_kiln_tensor_alive():
    t = kiln.arange(1000, dtype=kiln.float32) * 2
    b = np.from_dlpack(t)
    del t
    gc.collect()
    assert b[999] == 1998.0
    cap = kiln.ones(3).__dlpack__()  # never consumed: freed with the capsule
    del cap
    cap = kiln.ones(3).__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(cap)
    del cap


def test_protocol_arguments():
    t = kiln.ones(2, 2)
    assert t.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError):
        t.__dlpack__(stream=5)  # a CPU tensor takes no stream
    with pytest.raises(BufferError):
        t.__dlpack__(dl_device=(2, 0))
    c = np.from_dlpack(Producer(t)) if hasattr(np, "from_dlpack") else None
    assert c is not None and c.shape == (2, 2)
    copied = kiln.from_dlpack(t, copy=True)
    assert copied.data_ptr() != t.data_ptr()
    assert kiln.from_dlpack(t) is not None
    with pytest.raises(TypeError, match="__dlpack__"):
        kiln.from_dlpack([1, 2, 3])


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("dev", DEVICES)
def test_torch_round_trip_without_copies(dev):
    for tdt, kdt in [(torch.float32, kiln.float32), (torch.bfloat16, kiln.bfloat16), (torch.int64, kiln.int64),
                     (torch.bool, kiln.bool), (torch.float16, kiln.float16), (torch.uint8, kiln.uint8),
                     (torch.complex64, kiln.complex64)]:
        x = (torch.randn(3, 7, device=dev) * 5).to(tdt)
        v = x[:, 1::2]
        t = kiln.from_dlpack(v)
        assert t.dtype == kdt and t.data_ptr() == v.data_ptr() and t.stride() == v.stride()
        back = torch.from_dlpack(t)
        assert back.data_ptr() == v.data_ptr() and torch.equal(back, v)
    for tdt, kdt in [(getattr(torch, "float8_e4m3fn", None), kiln.float8_e4m3fn),
                     (getattr(torch, "float8_e5m2", None), kiln.float8_e5m2)]:
        if tdt is None:
            continue
        x = torch.randn(4, 4, device=dev).to(tdt)
        try:
            t = kiln.from_dlpack(x)
        except (BufferError, RuntimeError, TypeError) as e:  # this torch cannot export float8
            pytest.skip(f"torch does not export {tdt} through DLPack: {e}")
        assert t.dtype == kdt and t.data_ptr() == x.data_ptr()


@pytest.mark.skipif(torch is None or not kiln.cuda.is_available(), reason="needs torch and a CUDA device")
def test_cuda_stream_handoff_orders_work_without_a_host_sync():
    # kiln writes on its own stream; torch reads on another: the DLPack stream argument makes torch's stream
    # wait on the device for kiln's work.
    s = kiln.cuda.Stream()
    with kiln.cuda.stream(s):
        big = kiln.randn(4096, 4096, device="cuda")
        for _ in range(20):
            big = kiln.tanh(big @ big) * 0.01
        out = big.sum()
    ts = torch.cuda.Stream()
    with torch.cuda.stream(ts):
        x = torch.from_dlpack(out)
        y = x * 1
    ts.synchronize()
    s.synchronize()
    assert torch.allclose(y.cpu(), torch.tensor(out.cpu().item()))
