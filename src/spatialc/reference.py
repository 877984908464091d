"""The numpy reference of a GEMM program: C = epilogue(A @ B) on whole matrices, no tiles, no engines.

It is what the CLI and the GPU check compare against; the interpreter is checked against it in the tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import epilogue
from .inputs import operand_values
from .ir.nodes import ComputeStage, SpatialProgram
from .ir.ops import Bias, MatmulTiles, Precision


def epilogue_ops(p: SpatialProgram) -> list:
    """The program's compute ops after the matmul, in order."""
    return [s.kind.op for s in p.stages if isinstance(s.kind, ComputeStage) and not isinstance(s.kind.op, MatmulTiles)]


def rounded_operands(p: SpatialProgram, inputs: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """A and B as float64 holding exactly the operand type's values (float64 sums int8 products exactly)."""
    return tuple(
        operand_values(n, inputs[n], p.tensor_named(n).dtype).astype(np.float64)  # type: ignore[return-value]
        for n in ("A", "B")
    )


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
    return x.astype({"int8": np.int8, "int64": np.int64}.get(out.dtype.value, np.float32))
