"""What every program family's constructor reads of its arguments — `gemm` and `grouped_gemm` (frontend.py),
`elementwise` (maps.py), the row programs (rows.py), `attention`, the language and the CLI: the precisions' names,
sizes, the output types a program may ask for, and the Maps a program may take."""

from __future__ import annotations

import contextlib
import math
import numbers
from typing import Any

import numpy as np

from .errors import ProgramError
from .ir import ops
from .ir.nodes import Tile
from .ir.ops import Apply, Lit, Map, Precision
from .numerics.narrow import FLOAT32_MAX

TILE = Tile(16, 16)

# The output types each kind of program may ask for with `out`.
OUTPUT_CHOICES = {"int8": ("int32", "int64"), "float": ("float32", "fp16", "bf16")}


# The most elements one tensor may have: 2^34, a 131072 x 131072 matrix. That is past the GEMMs GPUs run: a C of
# 2^34 elements takes 64 GiB as float32 and 128 GiB as int64 (and the interpreter's float64 copy 128 GiB), about
# all of the largest GPU's memory before A and B. Beyond it a request is a typo (an extra zero or three), and the
# tile and place passes would spend minutes and gigabytes on its item lists before anything could refuse it.
MAX_TENSOR_ELEMS = 2**34


DEFAULT_PRECISION = "int8"  # of gemm, grouped_gemm, lang.program and the CLI alike: exact, so checked exactly


def _check_map(stage: Map, prec: Precision, inputs: int = 1) -> None:
    """A Map a program can take: of its `inputs` pages (an epilogue's: the one before it), the table's ops,
    constants the precision holds."""
    from .numerics.elementwise import ElementwiseError, op_named

    expr = stage.expr
    too_large = ops.expr_size_fault(expr)  # before anything below walks it by recursion
    if too_large is not None:
        raise ProgramError(f"an epilogue stage is {too_large}")
    if inputs == 1 and ops.arg_indices(expr) not in ((0,), ()):
        raise ProgramError(f"an epilogue stage maps the one page before it (x0), not {ops.arg_indices(expr)}")
    for node in _nodes(expr):
        if isinstance(node, Apply):
            try:
                op = op_named(node.op)
            except ElementwiseError as e:
                raise ProgramError(str(e)) from None
            if prec == Precision.INT8 and not op.integer:
                what = f"activation {node.op}" if node.op in ops.ACTIVATION_NAMES else node.op
                raise ProgramError(
                    f"{what} is float arithmetic; an int8 program's epilogue is integer (use fp16 or bf16)"
                )
        if (
            isinstance(node, Lit)
            and prec == Precision.INT8
            and (node.value != int(node.value) or not -(2**31) <= node.value < 2**31)
        ):
            raise ProgramError(
                f"an int8 program's epilogue is integer arithmetic: a constant needs a whole number within int32,"
                f" not {node.value!r}"
            )
        if isinstance(node, Lit) and prec != Precision.INT8 and abs(node.value) > FLOAT32_MAX:
            raise ProgramError(
                f"a {prec.value} program's epilogue is float32: the constant {node.value!r} is beyond float32"
            )


def _nodes(expr: ops.Expr):
    yield expr
    if isinstance(expr, Apply):
        for a in expr.args:
            yield from _nodes(a)


# What users call the precisions: spatialc's names, numpy's, ml_dtypes' and torch's dtype names, and "half".
PRECISION_SPELLINGS = {
    "int8": Precision.INT8,
    "fp16": Precision.FP16,
    "float16": Precision.FP16,
    "half": Precision.FP16,
    "bf16": Precision.BF16,
    "bfloat16": Precision.BF16,
    "e4m3": Precision.E4M3,
    "fp8_e4m3": Precision.E4M3,
    "float8_e4m3fn": Precision.E4M3,
    "e5m2": Precision.E5M2,
    "fp8_e5m2": Precision.E5M2,
    "float8_e5m2": Precision.E5M2,
    "fp32": Precision.FP32,
    "float32": Precision.FP32,
    "float": Precision.FP32,  # torch.float
}
PRECISIONS_ACCEPTED = (
    "int8, fp16 (float16, half), bf16 (bfloat16), e4m3 (float8_e4m3fn), e5m2 (float8_e5m2) or, for programs with"
    " no matmul, fp32 (float32), as a name or a numpy, ml_dtypes or torch dtype"
)


def precision_named(name: object) -> Precision | None:
    """The Precision `name` spells — a Precision, a name of PRECISION_SPELLINGS in any case, a numpy or ml_dtypes
    dtype (or scalar type), a torch dtype — or None."""
    if isinstance(name, Precision):
        return name
    if name is None or isinstance(name, bool | int | float):  # np.dtype(None) is float64, not what anyone meant
        return None
    return PRECISION_SPELLINGS.get(_spelling(name))


def _spelling(kind: object) -> str:
    """The name `kind` spells a type by, in lower case: a string as it is, a torch dtype without `torch.` (torch is
    never imported here), a numpy or ml_dtypes dtype or scalar type by numpy's name (np.float16, np.dtype("int8"),
    ml_dtypes.bfloat16)."""
    if isinstance(kind, str):
        return kind.lower()
    text = str(kind).removeprefix("torch.")
    with contextlib.suppress(TypeError, ValueError):
        text = np.dtype(kind).name  # type: ignore[call-overload]
    return text.lower()


# What users call the output types, as `precision` takes its spellings: numpy's, ml_dtypes' and torch's names too.
OUT_SPELLINGS = {"float32": "float32", "fp32": "float32", "float": "float32", "fp16": "fp16", "float16": "fp16"}
OUT_SPELLINGS |= {"half": "fp16", "bf16": "bf16", "bfloat16": "bf16", "int32": "int32", "int64": "int64"}
OUT_SPELLINGS |= {"int8": "int8"}  # (a requant's)


def out_named(out: Any) -> Any:
    """`out` as the name OUTPUT_CHOICES spells it, where it is another spelling of one (float16, torch.float32,
    np.int64, …); anything else as given, for the caller to refuse by name."""
    if out is None or isinstance(out, bool | int | float):
        return out
    return OUT_SPELLINGS.get(_spelling(out), out)


def precision_of(name: object) -> Precision:
    """`int8`, `fp16`, `bf16`, `e4m3`, `e5m2` or `fp32` (or another spelling `precision_named` reads) as a
    Precision."""
    prec = precision_named(name)
    if prec is None:
        raise ProgramError(f"unknown precision {name!r}; use {PRECISIONS_ACCEPTED}")
    return prec


def refuse_float32(name: object, what: str) -> None:
    """ProgramError saying the fix (ops.NO_FP32_MATMUL) where `name` spells float32 and `what` (gemm, attention,
    spatialc.torch's gemm_op) multiplies its operands by a matmul."""
    if precision_named(name) == Precision.FP32:
        raise ProgramError(f"{what}: {ops.NO_FP32_MATMUL}")


def matmul_precision_of(name: object, what: str) -> Precision:
    """`precision_of(name)` for a program with a matmul (`what`), float32 refused (`refuse_float32`)."""
    refuse_float32(name, what)
    return precision_of(name)


def finite_number(x: Any) -> float | None:
    """`x` as a finite float, or None where it is no number or none a float holds (an int past 1.8e308 included).
    numpy's numbers count (np.float32(0.5), np.int64(2)), bools do not."""
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        return None
    try:
        number = float(x)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def shown_number(x: Any) -> str:
    """`x` for a message: an integer past float by its size (repr of one of 5,000 digits is itself refused)."""
    if isinstance(x, int) and not isinstance(x, bool) and finite_number(x) is None:
        return f"an integer of {x.bit_length()} bits (past float's range)"
    return repr(x)[:60]


def plain_ints(v: Any) -> Any:
    """`v` with numpy's integers (np.int64(2), as a sweep over np.arange gives) as ints, itself or in a tuple or list:
    build's counts and shapes, which the passes check as ints. Anything else is left for their checks to refuse."""
    if isinstance(v, tuple | list):
        return type(v)(plain_ints(x) for x in v)
    if isinstance(v, numbers.Integral) and not isinstance(v, bool | int):
        return int(v)
    return v


def _dim(name: str, v: object) -> int:
    """A size: any integral number ≥ 1 (an int, numpy's integers), as an int."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ProgramError(f"{name} must be a whole number ≥ 1, not {v!r}")
    return int(v)


def _check_size(m: int, n: int, k: int, groups: int = 1) -> None:
    """A GEMM's A (m × k), B (k × n) and C (m × n) each within `check_elems`."""
    for name, rows, cols in (("A", m, k), ("B", k, n), ("C", m, n)):
        check_elems(name, rows, cols, groups)


def check_elems(name: str, rows: int, cols: int, groups: int = 1) -> None:
    """ProgramError, naming tensor `name` and its shape, where it would hold more than MAX_TENSOR_ELEMS elements."""
    if groups * rows * cols > MAX_TENSOR_ELEMS:
        shape = f"{groups}x{rows}x{cols}" if groups > 1 else f"{rows}x{cols}"
        raise ProgramError(
            f"{name} would be {shape} = {groups * rows * cols} elements; spatialc takes tensors of at most"
            f" 2^34 = {MAX_TENSOR_ELEMS} elements (beyond what any GPU holds)"
        )
