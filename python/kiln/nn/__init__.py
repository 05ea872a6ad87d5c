"""Neural-network ops under torch.nn's layout (kiln.nn.functional)."""
from . import functional  # noqa: F401
