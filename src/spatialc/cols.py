"""Programs that reduce columns: `col_reduce`, out[0, j] = op over column j of x — torch's x.sum(0), x.amax(0), the
bias gradient dbias = dY.sum(0), a norm's dweight and dbias.

A column reduction (`ColReduce`) folds each column of a tensor into one value, with the same reductions, meant the
same way, as a row reduction (`numerics/reductions.py` defines each once). An item is a band of tile columns the
whole height of x, walked down the rows in pages (`passes/cols.py` plans and schedules it); its accumulator holds
one value a column, packed as a column vector (a page of one tile row) and written into a 1 × n tensor.

    p = spatialc.build(spatialc.col_reduce(4096, 4096, "sum"), "sm_90")   # one value a column: 1 × n
"""

from __future__ import annotations

from .errors import ProgramError
from .ir.nodes import ComputeStage, DType, Engine, SpatialProgram, TensorRole
from .ir.ops import Apply, Arg, ColReduce, Lit, Precision
from .rows import _begin

# `col_reduce`'s: the reductions of numerics/reductions.py and the mean (the sum divided by m once a band)
COL_REDUCTIONS = ("sum", "mean", "max", "min", "absmax", "sumsq")


def col_reduce(
    m: int,
    n: int,
    op: str = "sum",
    precision: str | Precision = "bf16",
    *,
    target: str = "sm_90",
    out: str | None = None,
) -> SpatialProgram:
    """The program out[0, j] = `op` over column j of x (m × n) — torch's x.sum(0), x.amax(0), x.abs().amax(0), the
    mean — into `out`, a 1 × n tensor (float32 unless `out` says otherwise): one pass down each column, its values
    reduced in float32 (`numerics/reductions.py` defines each op, as for a row reduction), the padding rows left
    out; the mean is the sum divided by m once a band."""
    if not isinstance(op, str) or op not in COL_REDUCTIONS:
        raise ProgramError(f"a column reduction is one of {', '.join(COL_REDUCTIONS)}, not {op!r}")
    b, out_dtype = _begin(m, n, precision, out, f"a column {op}")
    x = b.tensor("x", TensorRole.INPUT, (b.m, b.n), DType(b.prec.value))
    y = b.tensor("out", TensorRole.OUTPUT, (1, b.n), out_dtype)
    folded = b.ring(f"col_{op}_ring")
    reduce = ColReduce("sum" if op == "mean" else op, b.m)
    b.stage(f"col_{op}", ComputeStage(reduce), Engine.COMPUTE, ins=(b.read(x, "x0"),), outs=(folded,))
    if op == "mean":
        folded = b.map("mean", Apply("div", (Arg(0), Lit(float(b.m)))), (folded,))
    b.write(folded, y)
    return b.program(f"col_{op}_{b.m}x{b.n}_{b.prec.value}", target)
