"""Shared fixtures of the Python tests: the devices to run on, fresh random inputs, torch's tolerances."""
import os

import numpy as np
import pytest

import kiln

DEVICES = ["cpu"] + (["cuda"] if kiln.cuda.is_available() else [])
CUDA_SKIP_REASON = "no CUDA device (kiln.cuda.is_available() is False)"

# torch.testing's default tolerances per dtype (rtol, atol).
TOLERANCES = {
    kiln.float16: (1e-3, 1e-5),
    kiln.bfloat16: (1.6e-2, 1e-5),
    kiln.float32: (1.3e-6, 1e-5),
    kiln.float64: (1e-7, 1e-7),
    kiln.complex64: (1.3e-6, 1e-5),
}

DATA = os.environ.get("KILN_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def rng():
    # Fresh inputs on every run; the seed is printed on failure through the test's name.
    return np.random.default_rng()


def to_numpy(t):
    """A kiln tensor's values as a float64/complex128/int64/bool NumPy array (a copy, on the CPU)."""
    t = t.cpu()
    if t.dtype in (kiln.bfloat16, kiln.float16, kiln.float8_e4m3fn, kiln.float8_e5m2):
        t = t.to(kiln.float32)
    return np.array(t.numpy(), copy=True)


def assert_close(actual, expected, dtype, rtol=None, atol=None, msg=""):
    """|actual - expected| <= atol + rtol |expected| elementwise, NaN where expected is NaN."""
    r, a = TOLERANCES.get(dtype, (0, 0))
    rtol = r if rtol is None else rtol
    atol = a if atol is None else atol
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"{msg}: shape {actual.shape} != {expected.shape}"
    if actual.dtype == np.bool_ or expected.dtype == np.bool_ or np.issubdtype(expected.dtype, np.integer):
        np.testing.assert_array_equal(actual, expected, err_msg=msg)
        return
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True, err_msg=msg)
