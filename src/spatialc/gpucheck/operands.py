"""A GPU check row's operands and references on the device: the inputs drawn for each copy (reproducibly, from the
seed and the case), and the float64 product and fused or fp8 reference a row's results are checked against.

`RowOperands` is a base of `device.GpuRunner`, whose CuPy module, seed and waits it uses (annotated below).
"""

from __future__ import annotations

import zlib
from typing import Any

from ..runtime.tilize import bf16_bits, fp8_bits
from . import blockscaled as bs
from . import preflight as pf
from .agreement import values64
from .cases import ELEM_OF, Case, Deadline, blaming
from .cuda import Inputs
from .fp8 import is_fp8
from .fp8 import more_inputs as fp8_more_inputs
from .fp8 import reference as fp8_reference
from .fused import more_inputs
from .fused import reference as fused_reference
from .timing import copies_for


class RowOperands:
    """Draws a row's inputs and computes its references (a base of `GpuRunner`)."""

    cp: Any  # (annotations only: the state and methods are GpuRunner's)
    seed: int
    _l2_bytes: Any
    _sync: Any

    def _copies(self, case: Case) -> int:
        itemsize = 1 if case.precision == "int8" or is_fp8(case.precision) else 2
        residual = case.m * case.n if case.fused else 0  # a fused row's residual is read with A and B
        return copies_for((case.m * case.k + case.k * case.n + residual) * itemsize, self._l2_bytes())

    def _inputs(self, case: Case, copies: int) -> Inputs:
        rs = self.cp.random.RandomState(zlib.crc32(f"{self.seed} {case}".encode()))  # fresh per row, reproducible
        a = [self._random(rs, (case.m, case.k), case.precision) for _ in range(copies)]
        b = [self._random(rs, (case.k, case.n), case.precision) for _ in range(copies)]
        if is_fp8(case.precision):  # the dequant scales, as float32

            def scale(shape: tuple[int, int], lo: float, hi: float) -> Any:
                return rs.uniform(lo, hi, size=shape, dtype=self.cp.float32)

            more = bs.more_inputs if case.blockscaled else fp8_more_inputs
            return Inputs(a, b, [more(case, scale) for _ in a])
        if not case.fused:
            return Inputs(a, b)

        def draw(shape: tuple[int, int], lo: float, hi: float) -> Any:
            return self._random(rs, shape, case.precision, lo, hi)

        return Inputs(a, b, [more_inputs(case, draw) for _ in a])

    def _random(self, rs: Any, shape: tuple[int, int], precision: str, lo: float = -1.0, hi: float = 1.0) -> Any:
        cp = self.cp
        if precision == "int8":
            return rs.randint(-128, 128, size=shape).astype(cp.int8)
        x = rs.uniform(lo, hi, size=shape, dtype=cp.float32)
        if is_fp8(precision):  # rounded once to the kind, its bits in uint8
            return fp8_bits(x, ELEM_OF[precision], cp)
        return x.astype(cp.float16) if precision == "fp16" else bf16_bits(x, cp)

    def _fused_reference(self, inputs: Inputs, case: Case, product: Any, deadline: Deadline) -> Any:
        """A fused or fp8 row's float64 reference: the epilogue in float64 on input set 0's product and tensors (an
        fp8 row's scales are float32)."""
        elem = "float32" if is_fp8(case.precision) else ELEM_OF[case.precision]
        epilogue = fp8_reference if is_fp8(case.precision) else fused_reference

        def made() -> Any:
            more = {name: values64(x, elem, self.cp) for name, x in inputs.more[0].items()}
            if case.blockscaled:  # the sum of each 128 of K's product times its scales, from A and B themselves
                a, b = (values64(x[0], ELEM_OF[case.precision], self.cp) for x in (inputs.a, inputs.b))
                ref = bs.reference(a, b, more, self.cp)
            else:
                ref = epilogue(product, more)
            self._sync(deadline)
            return ref

        return blaming(pf.REFERENCE, made)

    def _reference(self, inputs: Inputs, case: Case, deadline: Deadline) -> Any:
        """The float64 product of input set 0 (the operands are exact in float64), waited for: a loss in it is the
        reference's, not the next kernel's."""
        elem = ELEM_OF[case.precision]

        def made() -> Any:
            ref = self.cp.matmul(values64(inputs.a[0], elem, self.cp), values64(inputs.b[0], elem, self.cp))
            self._sync(deadline)
            return ref

        return blaming(pf.REFERENCE, made)
