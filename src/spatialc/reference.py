"""The numpy reference of a GEMM program: C = epilogue(A @ B) on whole matrices, no tiles, no engines (a grouped
GEMM's: C[g] = epilogue(A[g] @ B[g]) on each group's rows below its row count, zeros past it).

It is what the CLI and the GPU check compare against; the interpreter is checked against it in the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import epilogue
from .errors import ProgramError
from .inputs import operand_values, row_limits
from .interp.numerics import output_values
from .ir.nodes import SpatialProgram
from .ir.ops import Bias, Precision


def _declared(p: SpatialProgram):
    """What the program's stages declare (verify's rule 8 reads them the same way: by their rings)."""
    from .ir.index import ProgramIndex
    from .passes.verify.declared import declared

    return declared(ProgramIndex.of(p))


def epilogue_ops(p: SpatialProgram) -> list:
    """The program's compute ops after the matmul, in the order its rings apply them."""
    return [s.kind.op for s in _declared(p).chain]


def rounded_operands(p: SpatialProgram, inputs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A and B — the tensors the matmul stage multiplies, in that order, whatever their names — as float64 holding
    exactly the operand type's values (float64 sums int8 products exactly)."""
    decl = _declared(p)
    if decl.a is None or decl.b is None:
        raise ProgramError(f"program {p.name} declares no tile matmul, so it has no A and B")
    tensors = (p.tensor(decl.a), p.tensor(decl.b))
    return tuple(operand_values(t.name, inputs[t.name], t.dtype).astype(np.float64) for t in tensors)  # type: ignore[return-value]


def reference(p: SpatialProgram, inputs: Mapping[str, Any]) -> np.ndarray:
    """epilogue(A @ B) in the output's element type, from float64 products of the operand-rounded inputs."""
    a, b = rounded_operands(p, inputs)
    return reference_of(p, a, b, inputs)


def reference_of(p: SpatialProgram, a: np.ndarray, b: np.ndarray, inputs: Mapping[str, Any]) -> np.ndarray:
    """`reference` from A and B already rounded by `rounded_operands` (the other inputs, a bias, from `inputs`)."""
    integer = p.precision == Precision.INT8
    ops = epilogue_ops(p)
    x = np.rint(a @ b) if integer else a @ b
    if ops:  # the epilogue works on the accumulator's type: int64, or float32 as the kernel's does
        x = epilogue.start(x, integer)
    for op in ops:
        row = np.asarray(inputs[p.tensor(op.tensor).name]).reshape(-1) if isinstance(op, Bias) else None
        x = epilogue.apply(op, x, integer, row)
    out = p.output_tensor()
    assert out is not None
    if out.groups > 1:  # a grouped GEMM: each group's rows at or past its row count are left zero
        x = np.array(x, copy=True)
        for name in row_limits(p):
            counts = np.asarray(inputs[name]).reshape(-1)
            for g, count in enumerate(counts[: out.groups]):
                x[g, int(count) :] = 0
    return output_values(out.name, x, out.dtype)  # C's element type, rounded as the interpreter rounds it
