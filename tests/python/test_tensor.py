"""kiln.Tensor from Python: creation, properties, views and indexing against NumPy, conversions."""
import numpy as np
import pytest

import kiln
from conftest import assert_close, to_numpy


def test_tensor_from_nested_lists_infers_dtype_like_torch():
    assert kiln.tensor([1, 2, 3]).dtype == kiln.int64
    assert kiln.tensor([1, 2.5]).dtype == kiln.float32
    assert kiln.tensor([True, False]).dtype == kiln.bool
    assert kiln.tensor([1 + 2j]).dtype == kiln.complex64
    assert kiln.tensor([[1, 2], [3, 4]], dtype=kiln.float16).dtype == kiln.float16
    assert kiln.tensor(7).shape == ()
    assert kiln.tensor([[1, 2], [3, 4]]).tolist() == [[1, 2], [3, 4]]
    assert kiln.tensor([2**62, -(2**62)]).tolist() == [2**62, -(2**62)]  # 64-bit integers stay exact
    assert kiln.tensor([[]]).shape == (1, 0)


def test_ragged_and_bad_nested_input_are_errors():
    with pytest.raises(ValueError, match="ragged"):
        kiln.tensor([[1, 2], [3]])
    with pytest.raises(TypeError):
        kiln.tensor([1, "a"])
    with pytest.raises(TypeError):
        kiln.tensor([1, None])


def test_properties(device):
    t = kiln.zeros(2, 3, 4, dtype=kiln.bfloat16, device=device)
    assert t.shape == (2, 3, 4) and t.size() == (2, 3, 4) and t.size(1) == 3 and t.size(-1) == 4
    assert t.stride() == (12, 4, 1) and t.stride(0) == 12
    assert t.dim() == 3 and t.ndim == 3 and t.numel() == 24 and len(t) == 2
    assert t.dtype == kiln.bfloat16 and t.dtype == "bfloat16" and t.itemsize == 2 and t.nbytes == 48
    assert str(t.device) == ("cpu" if device == "cpu" else "cuda:0")
    assert t.device == device and t.is_contiguous()
    assert repr(kiln.tensor([1.5, 2.0])) == "tensor([1.5000, 2.0000])"
    assert repr(kiln.float8_e4m3fn) == "kiln.float8_e4m3fn"
    assert kiln.float32.is_floating_point and not kiln.int8.is_floating_point and kiln.complex64.is_complex
    assert kiln.dtype is type(kiln.float32)


def test_item_tolist_and_python_numbers():
    t = kiln.tensor([[1.5, -2.0], [3.25, 0.0]])
    assert t.tolist() == [[1.5, -2.0], [3.25, 0.0]]
    assert t[1, 0].item() == 3.25 and float(t[0, 0]) == 1.5 and int(t[1, 0]) == 3
    assert kiln.tensor(True).item() is True and kiln.tensor(5).item() == 5
    assert kiln.tensor([1 + 2j]).tolist() == [1 + 2j]
    assert kiln.tensor([2**64 - 1], dtype=kiln.uint64).tolist() == [2**64 - 1]
    with pytest.raises(ValueError):
        t.item()
    with pytest.raises(ValueError):
        bool(t)
    assert [r.tolist() for r in kiln.tensor([[1, 2], [3, 4]])] == [[1, 2], [3, 4]]


@pytest.mark.parametrize("key", [
    0, -1, 2, (1, 2), (slice(None), 1), slice(1, None), slice(None, None, 2), (slice(1, 4, 2), slice(None, -1)),
    (Ellipsis, 0), (None, 1), (0, None, slice(2, 5)), (Ellipsis, None), (slice(-3, -1), Ellipsis, slice(0, 1)),
    slice(10, 20), slice(3, 1),
])
def test_basic_indexing_matches_numpy_and_is_a_view(device, rng, key):
    a = rng.standard_normal((4, 5, 6)).astype(np.float32)
    t = kiln.tensor(a, device=device)
    v = t[key]
    assert_close(to_numpy(v), a[key], kiln.float32, rtol=0, atol=0, msg=str(key))
    if v.numel():
        v.fill_(7.0)  # a view: the write shows in t
        b = a.copy()
        b[key] = 7.0
        assert_close(to_numpy(t), b, kiln.float32, rtol=0, atol=0, msg=str(key))


def test_index_errors_and_tensor_indices(device):
    t = kiln.arange(12, device=device).reshape(3, 4)
    with pytest.raises(IndexError):
        t[3]
    with pytest.raises(IndexError):
        t[0, 0, 0]
    with pytest.raises(ValueError):
        t[::-1]
    with pytest.raises(TypeError):
        t["a"]
    idx = kiln.tensor([2, 0], device=device)
    assert t[idx].tolist() == [[8, 9, 10, 11], [0, 1, 2, 3]]
    assert t[:, idx].tolist() == [[2, 0], [6, 4], [10, 8]]
    with pytest.raises(TypeError):
        t[idx] = 0  # a tensor index selects a copy: assignment through it is refused


def test_setitem_from_tensors_numbers_and_arrays(device):
    t = kiln.zeros(3, 4, device=device)
    t[0] = 1.0
    t[1, 1:3] = kiln.tensor([2.0, 3.0], device=device)
    t[2] = np.arange(4, dtype=np.float32)
    t[:, 3] = [9, 9, 9]
    assert t.tolist() == [[1, 1, 1, 9], [0, 2, 3, 9], [0, 1, 2, 9]]


def test_views_share_memory_and_match_numpy(device, rng):
    a = rng.standard_normal((2, 3, 4)).astype(np.float32)
    t = kiln.tensor(a, device=device)
    cases = [
        (t.view(6, 4), a.reshape(6, 4)), (t.view((4, 6)), a.reshape(4, 6)), (t.reshape(-1), a.reshape(-1)),
        (t.permute(2, 0, 1), a.transpose(2, 0, 1)), (t.transpose(0, 2), a.swapaxes(0, 2)), (t.T, a.T),
        (t.mT, a.swapaxes(-1, -2)), (t.flatten(1), a.reshape(2, 12)), (t.narrow(2, 1, 2), a[:, :, 1:3]),
        (t.select(1, 2), a[:, 2]), (t.unsqueeze(1), a[:, None]), (t[:, :1].squeeze(1), a[:, 0]),
        (t[:1].expand(3, 3, 4), np.broadcast_to(a[:1], (3, 3, 4))),
    ]
    for v, ref in cases:
        assert_close(to_numpy(v), ref, kiln.float32, rtol=0, atol=0)
    assert t.permute(2, 0, 1).data_ptr() == t.data_ptr()
    assert not t.T.is_contiguous() and t.T.contiguous().is_contiguous()
    assert t.view(kiln.int32).dtype == kiln.int32  # the same bytes, another dtype


def test_to_and_conversions(device):
    t = kiln.tensor([1.7, -2.2, 3.5])
    assert t.to(kiln.int32).tolist() == [1, -2, 3]
    assert t.to("float16").dtype == kiln.float16
    u = t.to(device)
    assert str(u.device).startswith(device)
    assert u.to(dtype=kiln.float64, device="cpu").dtype == kiln.float64
    assert t.to(t) is not None and t.to(kiln.float32).data_ptr() == t.data_ptr()
    assert t.to(kiln.float32, copy=True).data_ptr() != t.data_ptr()
    assert t.half().dtype == kiln.float16 and t.bfloat16().dtype == kiln.bfloat16 and t.long().dtype == kiln.int64
    assert t.clone().data_ptr() != t.data_ptr()
    with pytest.raises(TypeError):
        t.to(3.5)


def test_numpy_is_zero_copy_for_cpu_tensors(rng):
    t = kiln.randn(3, 4)
    a = t.numpy()
    assert a.ctypes.data == t.data_ptr() and a.dtype == np.float32
    a[0, 0] = 42.0
    assert t[0, 0].item() == 42.0
    s = t.T  # strided
    assert np.shares_memory(s.numpy(), a) and s.numpy().strides == (4, 16)
    with pytest.raises(kiln.KilnError, match="bfloat16"):
        t.bfloat16().numpy()
    assert np.asarray(t).shape == (3, 4)


def test_from_numpy_views_the_array(rng):
    a = rng.standard_normal((5, 6))
    t = kiln.from_numpy(a)
    assert t.dtype == kiln.float64 and t.data_ptr() == a.ctypes.data
    t.fill_(1.0)
    assert (a == 1.0).all()


def test_creation_ops(device):
    assert kiln.zeros(2, 3, device=device).tolist() == [[0.0] * 3] * 2
    assert kiln.ones((2,), dtype=kiln.int8, device=device).tolist() == [1, 1]
    assert kiln.full((2, 2), 7, device=device).dtype == kiln.int64
    assert kiln.full((1,), 2.5, dtype=kiln.float16, device=device).tolist() == [2.5]
    assert kiln.arange(5, device=device).tolist() == [0, 1, 2, 3, 4]
    assert kiln.arange(1, 2, 0.25).tolist() == [1.0, 1.25, 1.5, 1.75]
    assert_close(to_numpy(kiln.linspace(0, 1, 5, device=device)), np.linspace(0, 1, 5), kiln.float32)
    assert_close(to_numpy(kiln.logspace(0, 2, 3, device=device)), [1, 10, 100], kiln.float32)
    assert kiln.eye(2, 3, device=device).tolist() == [[1, 0, 0], [0, 1, 0]]
    x = kiln.ones(2, 3, dtype=kiln.float16, device=device)
    assert kiln.zeros_like(x).dtype == kiln.float16 and kiln.full_like(x, 3).tolist() == [[3.0] * 3] * 2
    assert kiln.empty_like(x, dtype=kiln.float32).dtype == kiln.float32
    assert kiln.scalar_tensor(3.0).shape == ()


def test_random_is_reproducible_across_devices(device):
    g = kiln.Generator(123)
    a = kiln.randn(4, 5, generator=g, device=device)
    b = kiln.randn(4, 5, generator=kiln.Generator(123))
    assert_close(to_numpy(a), to_numpy(b), kiln.float32, rtol=0, atol=0)
    kiln.manual_seed(7)
    c = kiln.rand(1000)
    assert 0 <= c.min().item() and c.max().item() < 1 and abs(c.mean().item() - 0.5) < 0.05
    r = kiln.randint(3, 9, (1000,), device=device)
    assert r.dtype == kiln.int64 and r.min().item() >= 3 and r.max().item() <= 8
    t = kiln.empty(100, device=device).normal_(2.0, 0.5, generator=kiln.Generator(1))
    assert abs(t.mean().item() - 2.0) < 0.2


def test_python_operators_follow_torch(device):
    a = kiln.tensor([[1.0, 2.0], [3.0, 4.0]], device=device)
    b = kiln.tensor([10.0, 20.0], device=device)
    assert (a + b).tolist() == [[11, 22], [13, 24]]
    assert (2 - a).tolist() == [[1, 0], [-1, -2]] and (a - 1).tolist() == [[0, 1], [2, 3]]
    assert (a * 3).tolist() == [[3, 6], [9, 12]] and (3 * a).tolist() == (a * 3).tolist()
    assert (1 / a)[0].tolist() == [1.0, 0.5] and (a / 2)[0].tolist() == [0.5, 1.0]
    assert (a ** 2).tolist() == [[1, 4], [9, 16]] and (2 ** a)[0].tolist() == [2, 4]
    assert (a @ a).tolist() == [[7, 10], [15, 22]]
    assert (-a)[0].tolist() == [-1, -2] and abs(-a).tolist() == a.tolist()
    assert (a > 2).tolist() == [[False, False], [True, True]] and (a == a).all().item()
    i = kiln.tensor([7, -7], device=device)
    assert (i // 2).tolist() == [3, -4] and (i % 3).tolist() == [1, 2] and (-7 % kiln.tensor([3])).tolist() == [2]
    assert (i / 2).dtype == kiln.float32  # true division of integers
    assert (~kiln.tensor([True, False])).tolist() == [False, True] and (~kiln.tensor([0], dtype=kiln.int8)).tolist() == [-1]
    assert (kiln.tensor([6]) & kiln.tensor([3])).tolist() == [2]
    c = a.clone()
    c += 1
    c *= 2
    c -= kiln.ones_like(c)
    c /= 2
    assert c.tolist() == [[1.5, 2.5], [3.5, 4.5]]
    x = kiln.tensor([1, 2], dtype=kiln.int32)
    assert (x + 1).dtype == kiln.int32 and (x + 1.5).dtype == kiln.float32 and (1.5 * x).dtype == kiln.float32
    assert (x - 1).dtype == kiln.int32 and (1 - x).dtype == kiln.int32 and (x * True).dtype == kiln.int32
    assert {a: 1}[a] == 1  # hashable by identity, as torch.Tensor
