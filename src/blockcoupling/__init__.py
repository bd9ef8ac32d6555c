"""blockcoupling: transformer block coupling, trajectory and spectral metrics."""

from blockcoupling.errors import BlockCouplingError

__version__ = "0.1.0"

__all__ = ["BlockCouplingError", "__version__"]
