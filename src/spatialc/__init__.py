"""spatialc: spatial tensor programs — built, verified, run exactly on the CPU, printed as persistent CUDA kernels."""

# The package spatialc.lower is imported first so that its import binds `spatialc.lower` now, and the function
# imported next rebinds it for good; loaded later (by the first call), the package would replace the function.
from . import ew
from . import lower as _lower_package  # noqa: F401
from .api import build, emulate, evaluate, from_json, gemm, grouped_gemm, lower, run, to_json, verify
from .attention import attention
from .cols import col_reduce
from .errors import DeadlockError, PlanError, ProgramError, SpatialError, VerifyError
from .frontend import activation, bias, col_scale, gate, relu, requant, residual, row_scale, scalar
from .inputs import InexactInputWarning, InputError
from .ir.serde import SerdeError
from .maps import elementwise
from .numerics.tolerance import Tolerance, tolerance
from .numerics.w4 import pack_int4, unpack_int4
from .passes.multicast import MulticastWarning
from .rows import layernorm, log_softmax, rmsnorm, row_reduce, softmax
from .runtime.tilize import tilize_array as tilize
from .runtime.tilize import untilize_array as untilize
from .runtime.tilize import work_list
from .target import SpatialTarget, UnknownTarget, target

__all__ = [
    "attention",
    "DeadlockError",
    "InexactInputWarning",
    "InputError",
    "MulticastWarning",
    "PlanError",
    "ProgramError",
    "SerdeError",
    "SpatialError",
    "SpatialTarget",
    "Tolerance",
    "UnknownTarget",
    "VerifyError",
    "activation",
    "bias",
    "build",
    "col_scale",
    "elementwise",
    "emulate",
    "ew",
    "evaluate",
    "from_json",
    "gate",
    "gemm",
    "pack_int4",
    "unpack_int4",
    "grouped_gemm",
    "layernorm",
    "log_softmax",
    "lower",
    "relu",
    "requant",
    "residual",
    "rmsnorm",
    "row_reduce",
    "col_reduce",
    "row_scale",
    "run",
    "scalar",
    "softmax",
    "target",
    "tilize",
    "to_json",
    "tolerance",
    "untilize",
    "verify",
    "work_list",
]
__version__ = "0.1.0"
