"""kiln: a tensor runtime for fast local inference on NVIDIA GPUs and the CPU.

Tensors with PyTorch's semantics (dtypes, type promotion, broadcasting, views) on the CPU and CUDA, kiln's
specialised decode kernels, and an LLM engine that loads Hugging Face checkpoints. DLPack moves tensors to
and from NumPy and PyTorch without copies::

    import kiln, torch
    x = kiln.randn(4, 8, device="cuda")
    y = kiln.softmax(x @ x.T, dim=-1)
    t = torch.from_dlpack(y)          # the same memory, no copy
    z = kiln.from_dlpack(t * 2)       # and back
"""
import importlib as _importlib

from . import _kiln
from ._kiln import *  # noqa: F401,F403  (the ops, Tensor, dtypes, Model, Tokenizer)
from ._kiln import KilnError, OutOfMemoryError, Tensor, __version__  # noqa: F401

# The Python subpackages, not the native submodules of the same names that the star import brought.
cuda = _importlib.import_module(".cuda", __name__)
nn = _importlib.import_module(".nn", __name__)
linalg = _importlib.import_module(".linalg", __name__)


def _numpy(self):
    """This CPU tensor's memory as a NumPy array (no copy), as torch.Tensor.numpy."""
    import numpy

    if self.device.type != "cpu":
        raise KilnError(f"numpy(): the tensor is on {self.device}; call .cpu() first")
    if self.dtype in (_kiln.bfloat16, _kiln.float8_e4m3fn, _kiln.float8_e5m2):
        raise KilnError(f"numpy(): NumPy has no {self.dtype}; convert first, e.g. .to(kiln.float32)")
    return numpy.from_dlpack(self)


def _array(self, dtype=None, copy=None):
    a = self.numpy()
    return a.astype(dtype) if dtype is not None else a


Tensor.numpy = _numpy
Tensor.__array__ = _array
