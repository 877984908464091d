"""The numpy reference of a GEMM program: C = epilogue(A @ B) on whole matrices, no tiles, no engines.

It is what the CLI and the GPU check compare against; the interpreter is checked against it in the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import epilogue
from .errors import ProgramError
from .inputs import operand_values
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


def rounded_operands(p: SpatialProgram, inputs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A and B — the tensors the matmul stage multiplies, in that order, whatever their names — as float64 holding
    exactly the operand type's values (float64 sums int8 products exactly)."""
    decl = _declared(p)
    if decl.a is None or decl.b is None:
        raise ProgramError(f"program {p.name} declares no tile matmul, so it has no A and B")
    tensors = (p.tensor(decl.a), p.tensor(decl.b))
    return tuple(operand_values(t.name, inputs[t.name], t.dtype).astype(np.float64) for t in tensors)  # type: ignore[return-value]


def reference(p: SpatialProgram, inputs: dict[str, Any]) -> np.ndarray:
    """epilogue(A @ B) in the output's element type, from float64 products of the operand-rounded inputs."""
    a, b = rounded_operands(p, inputs)
    integer = p.precision == Precision.INT8
    x = epilogue.start(np.rint(a @ b) if integer else a @ b, integer)
    for op in epilogue_ops(p):
        row = np.asarray(inputs[p.tensor(op.tensor).name]).reshape(-1) if isinstance(op, Bias) else None
        x = epilogue.apply(op, x, integer, row)
    out = p.output_tensor()
    assert out is not None
    return x.astype({"int8": np.int8, "int32": np.int32, "int64": np.int64}.get(out.dtype.value, np.float32))
