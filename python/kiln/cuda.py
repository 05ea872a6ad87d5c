"""CUDA devices, streams, events and the three memory figures (allocated, reserved, driver_used)."""
import contextlib

from ._kiln.cuda import *  # noqa: F401,F403
from ._kiln.cuda import current_stream, set_stream


@contextlib.contextmanager
def stream(s):
    """Makes `s` the current stream of its device inside the block, as torch.cuda.stream."""
    if s is None:
        yield
        return
    previous = current_stream(s.device)
    set_stream(s)
    try:
        yield s
    finally:
        set_stream(previous)
