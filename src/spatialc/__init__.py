"""spatialc: spatial tensor programs — built, verified, run exactly on the CPU, printed as persistent CUDA kernels."""

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
