"""spatialc: spatial tensor programs — built, verified, run exactly on the CPU, printed as persistent CUDA kernels."""

# The package spatialc.lower is imported first so that its import binds `spatialc.lower` now, and the function
# imported next rebinds it for good; loaded later (by the first call), the package would replace the function.
from . import lower as _lower_package  # noqa: F401
from .api import build, emulate, evaluate, gemm, lower, run
from .errors import PlanError, ProgramError, SpatialError
from .ir.serde import SerdeError, from_json, to_json
from .target import SpatialTarget, UnknownTarget, target

__all__ = [
    "PlanError",
    "ProgramError",
    "SerdeError",
    "SpatialError",
    "SpatialTarget",
    "UnknownTarget",
    "build",
    "emulate",
    "evaluate",
    "from_json",
    "gemm",
    "lower",
    "run",
    "target",
    "to_json",
]
__version__ = "0.1.0"
