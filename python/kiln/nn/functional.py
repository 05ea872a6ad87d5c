"""torch.nn.functional's names and arguments over kiln's ops."""
from .. import _kiln
from .._kiln.nn.functional import *  # noqa: F401,F403  (linear, relu, silu, gelu, sigmoid, tanh, sdpa, grouped_mm)

softmax = _kiln.softmax
log_softmax = _kiln.log_softmax


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """RMSNorm over the last dim, as torch.nn.functional.rms_norm (normalized_shape: the last dim only)."""
    shape = tuple(normalized_shape) if not isinstance(normalized_shape, int) else (normalized_shape,)
    if len(shape) != 1 or shape[0] != input.shape[-1]:
        raise _kiln.KilnError(f"rms_norm: kiln normalizes the last dim only: normalized_shape must be "
                              f"({input.shape[-1]},), got {shape}")
    if weight is None:
        weight = _kiln.ones(shape[0], dtype=input.dtype, device=input.device)
    if eps is None:
        eps = {_kiln.float16: 0.0009765625, _kiln.bfloat16: 0.0078125,
               _kiln.float64: 2.220446049250313e-16}.get(input.dtype, 1.1920928955078125e-07)
    return _kiln.rms_norm(input, weight, eps)
