"""How close a result must be to the reference: the one statement of spatialc's numerics (README, "Numerics").

- **Inputs** are converted once into the operand type with round-to-nearest-even: fp16, bf16, e4m3 and e5m2
  straight from the given values (no double rounding through float32; an e4m3 input past ±448 is refused, an e5m2
  one becomes ±inf); int8 must already hold whole numbers in -128..127.
- **Products** of two fp16, two bf16, two e4m3 or two e5m2 values are exact in float32 (11 + 11, 8 + 8, 4 + 4 and
  3 + 3 significant bits fit 24, and the least, 2^-18 and 2^-32, are float32 normals), and int8 products are exact
  integers. So the 8-bit floats' bound is bf16's: the same float32 sums, the same ulps.
- **Sums**: int8 accumulates exactly (int64 in the interpreter, int32 in the kernel, which the lowering proves
  cannot overflow), so int8 results are *exact*. fp16 / bf16 accumulate in float32 on the GPU (and in its host
  emulation), in an order the hardware chooses; the interpreter sums in float64 and rounds once. A K-term float32
  sum is within K·u·Σ|a·b| of the exact sum (u = 2^-24, the classical bound), so a kernel's C is within (K + 4)
  float32 units of |A|@|B| of the float64 reference, and the interpreter's within 4. The exception is Hopper's 8-bit
  float wgmma (the sm_90a form's e4m3 / e5m2 kernel): the tensor core keeps its float32 accumulators' sums to about
  13 fraction bits, truncated (DeepSeek-V3's report, arXiv 2412.19437 §3.3.2: "around 14 bits", nearly 2% relative
  error at K = 4096; Khattak and Mikaitis, arXiv 2512.07004, model H100's 8-bit sums bit for bit). The kernel does
  not promote partial sums to float32 registers (DeepGEMM's remedy), so its bound adds 2^-12 of |A|@|B| for each
  k32 wgmma step — twice the truncation's 2^-13 (`FP8_WGMMA_STEP`; 3.2% at K = 4096, where DeepSeek measured about
  2%): fitted to published measurements, not proven for every input, and not yet checked on a GPU here. Its
  block-scaled kernel does promote (each 128 of K), so there the loss is four such steps of each group, whatever K
  (`numerics.blockscale`); an MXFP8 kernel promotes each 32 (every k32 MMA: `blockscale.promotion_k`).
- **Epilogues** (elementwise ops, `numerics.elementwise`) compute each op in float64 from float32 operands and round
  once to float32, in the interpreter, the kernel and the emulation alike; an op that calls a library function
  (exp, log, tanh, erf, pow) may land one float32 ulp from the interpreter's, gelu's 2^-50·|x| in its cancelling
  tail. An error already in an operand is carried through each op exactly by intervals: the op's value over the
  box of its operands' bounds (its corners, and its turning points inside), plus its own rounding. int8 programs'
  epilogues are exact integers (requant is TFLite's fixed point, bit-exact).
- **Computed operands** (a matmul of an earlier matmul's result, as in an MLP) are rounded from float32 to the
  operand type, nearest even, as the kernel stores them. Where the earlier result may differ from the reference's,
  the two roundings may land on neighbouring values: the bound carries each stage's error through, plus one
  rounding step (2^-8 bf16, 2^-11 fp16, 2^-4 e4m3, 2^-3 e5m2, relative) wherever that error is not zero.

`tolerance(program)` turns this into a bound per element of C, for the inputs at hand.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ProgramError
from ..ir.nodes import DType, SpatialProgram, TensorRole
from ..ir.ops import FP8_PRECISIONS, ColReduce, Map, Precision
from . import blockscale, intervals

F32_MAX = float(np.finfo(np.float32).max)  # 3.4e38: a float32 sum at or past it is ±inf (or NaN)
EPS32 = float(np.finfo(np.float32).eps)  # 2^-23: one float32 ulp at 1.0, twice the rounding unit u
OUT_EPS = {DType.FLOAT32: EPS32, DType.FP16: 2.0**-10, DType.BF16: 2.0**-7}  # one ulp at 1.0 of C's type
OUT_NAMES = {eps: d.value for d, eps in OUT_EPS.items()}
# The least step of each output type (its smallest subnormal). A value within its bound before it is rounded to C's
# type comes out up to one such step from the reference's rounding, however small the value: below 6.1e-5 fp16 holds
# steps of 2^-24, more than 2 ulps of |C| (a relative bound alone refused a kernel's exp one float32 ulp off there).
OUT_STEP = {DType.FLOAT32: 2.0**-149, DType.FP16: 2.0**-24, DType.BF16: 2.0**-133}
_STEP_OF_EPS = {OUT_EPS[d]: step for d, step in OUT_STEP.items()}
# The magnitude from which a value rounds to ±inf in C's type (its largest finite value and half an ulp more: ties
# go to the even "next power of two", which is inf), by the type's ulp at 1.0 as OUT_EPS gives it.
OVERFLOW_AT = {EPS32: (2 - 2.0**-24) * 2.0**127, 2.0**-10: 65520.0, 2.0**-7: (2 - 2.0**-8) * 2.0**127}
# What each k32 wgmma step of the sm_90a form's 8-bit float kernel may lose of |A|@|B|, in float32 ulps at 1.0:
# 2^-12, twice the 2^-13 of a sum truncated to 13 fraction bits (the module docstring says where that comes from).
FP8_WGMMA_STEP = 2**11
FP8_WGMMA_K = 32  # K elements of one 8-bit wgmma


class RangeWarning(UserWarning):
    """Inputs past the range a kernel's bound holds in: |A|@|B| reaching float32's largest value (3.4e38), where the
    kernel's float32 sum may overflow to ±inf (or NaN) while the float64 reference does not. bf16 shares float32's
    exponent range, so two bf16 values of 2^64 already multiply to 2^128. A block-scaled kernel's float32 product of
    two scales, sa · sb, leaving float32's normal range is one too (`blockscale.scale_products_past`), and so is a
    row program's row sum whose magnitude reaches it (`reductions.past_range`: ±3e38 in turn sum to 0 exactly, and
    to NaN in a kernel's float32 order)."""


@dataclass(frozen=True, slots=True)
class Tolerance:
    """The error allowed in each element of C against the float64 reference of the same operand-rounded inputs.

    `exact`: int8 programs, compared with `==`. Otherwise |C − ref| ≤ e + 2 · eps · |ref| + the smallest normal
    float32, where e is ulps · 2^-23 · (|A| @ |B|) carried through the epilogue's ops (`epilogue`; each op's
    `numerics.intervals.bounded`), and eps one ulp at 1.0 of C's type (float32, fp16 or bf16); where C overflowed
    its type, measured from the magnitude it overflows at (`_bound`)."""

    program: SpatialProgram = field(repr=False, compare=False)
    exact: bool
    ulps: int
    out_eps: float = EPS32
    epilogue: bool = False  # elementwise ops after the matmul: the bound is carried through each
    chained: bool = False  # a matmul of computed operands: the bound is carried stage by stage (`_chained`)
    mapped: bool = False  # no matmul: one map of exact inputs, its bound each op's own (`intervals.bounded`)
    rows: bool = False  # mapped, and it reduces rows: each reduction's bound too (`reductions.reduce_bound`)
    attention: bool = False  # an attention program: O and LSE, each its own bound (`numerics.attention`)
    kernel: bool = False  # a kernel's bound: it holds where |A|@|B| stays within float32's range
    wgmma_fp8: bool = False  # the sm_90a form's 8-bit float kernel: its sums' reduced precision is in `ulps`
    strict: bool = False  # inputs past that range are refused (InputError) rather than warned about
    block_scaled: bool = False  # a block-scaled 8-bit float GEMM: ulps of M = Σ_g |sa·sb|·|A_g|@|B_g|

    @property
    def text(self) -> str:
        """The bound in words, as the CLI prints it."""
        if self.exact:
            return "exact"
        if self.attention:
            u = "2^-11 (fp16)" if self.program.precision == Precision.FP16 else "2^-8 (bf16)"
            summed = "; a kernel's float32 sums of S, P·V and l their own K + 4 ulps" if self.kernel else ""
            return (
                f"O within ({u} + 2ρ)·softmax(S)·|V| (P rounded to the operand type before P·V; ρ the float32"
                f" roundings of the recurrence{summed}), LSE within ρ and a few float32 ulps, plus 2 ulps of each"
                " output in its type"
            )
        if self.mapped:  # a float map, or a program that reduces rows
            out = OUT_NAMES.get(self.out_eps, "float32")
            line = _line(self.program)
            sums = f"each {line} sum's float32 rounding (n + 2 ulps of its magnitude), " if self.rows else ""
            if self.rows and _online(self.program):
                sums += "the online sum's rescalings (2·max|x| + 4 ulps a page), "
            outs = [t for t in self.program.tensors if t.role == TensorRole.OUTPUT]
            of = f"2 {out} ulps of |C|"
            if len(outs) > 1:  # each output in its own type's ulps (LayerNorm's mean and rstd: float32)
                of = "2 ulps of each output in its type (" + ", ".join(f"{t.name} {t.dtype.value}" for t in outs) + ")"
            return f"{sums}each elementwise op's rounding and its ulps, carried through the map, plus {of}"
        if self.chained:
            out = OUT_NAMES.get(self.out_eps, "float32")
            return (
                f"carried through each matmul ({'K + 4' if self.ulps else '4'} float32 ulps of its |A|@|B|), each"
                f" epilogue op and each computed operand's rounding, plus 2 {out} ulps of |C|"
            )
        carried = ", carried through each epilogue op" if self.epilogue else ""
        out = OUT_NAMES.get(self.out_eps, "float32")
        why = " (Hopper's 8-bit float wgmma sums: 2^-12 a k32 step)" if self.wgmma_fp8 else ""
        if self.wgmma_fp8 and self.block_scaled:
            why = " (Hopper's 8-bit float wgmma sums: 2^-12 a k32 step, four a group)"
        every = blockscale.promotion_k(self.program) if self.block_scaled else 0  # 128, or MX's 32
        of = f"Σ_g |sa·sb|·|A_g|@|B_g| (block-scaled, promoted every {every} of K)" if every else "|A|@|B|"
        return f"{self.ulps} float32 ulps of {of}{why}{carried}, plus 2 {out} ulps of |C|"

    def bound(self, inputs: Mapping[str, Any]) -> np.ndarray:
        """The allowed |C − ref| of each element for these inputs (zeros for an exact program); a program of
        several outputs, each's by name."""
        return self._against(inputs)[1]

    def _against(self, inputs: Mapping[str, Any], rows: Any = None) -> tuple[np.ndarray, np.ndarray]:
        inputs = self._given(inputs, rows)
        with np.errstate(over="ignore", invalid="ignore"):  # NaN / ±inf inputs: said once, by check_inputs
            return self._reference_and_bound(inputs, rows)

    def _given(self, inputs: Mapping[str, Any], rows: Any) -> Mapping[str, Any]:
        """The inputs `evaluate` takes, and no others, each in its tensor's shape (a vector may come plain): a tensor
        missing was a KeyError, a vector given transposed a reference broadcast to another shape. A sample's A holds
        just its rows: its names are checked, not its shapes."""
        from ..inputs import W4_TYPES, check_inputs, match_names, shaped, specs_of

        p, specs = self.program, specs_of(self.program)
        if rows is not None:
            match_names(p.name, specs, inputs)
            return inputs
        check_inputs(p.name, specs, inputs)
        return {s.name: v if s.dtype in W4_TYPES else shaped(s, v) for s, v in match_names(p.name, specs, inputs)}

    def _reference_and_bound(self, inputs: Mapping[str, Any], rows: Any) -> tuple[np.ndarray, np.ndarray]:
        """The reference and the bound of each element, from the operands rounded once (A, and so C, only the
        sampled `rows` where given)."""
        from ..interp.values import matmul
        from .reference import (
            column_values,
            epilogue_chain,
            finished,
            product,
            reference,
            rounded_operands,
            stage_pages,
        )

        if self.attention:
            from .attention import attention_bound, attention_reference

            self._scores_in_range(inputs)
            return attention_reference(self.program, inputs), attention_bound(self.program, inputs, self.kernel)  # type: ignore[return-value]
        if self.mapped:
            return self._mapped(inputs)
        if self.chained:
            if rows is not None:
                raise ProgramError(f"program {self.program.name} multiplies a computed operand: check it whole")
            ref = reference(self.program, inputs)
            return ref, _bound(ref, *_chained(self.program, inputs, bool(self.ulps)), self.out_eps)
        p = self.program
        a, b = rounded_operands(p, inputs)
        if blockscale.program_scales(p) is not None:  # the promoted sum, and M = Σ_g |sa·sb|·|A_g|@|B_g|
            x, magnitude = blockscale.program_sum(p, a, b, inputs, matmul, rows)
            self._in_range(magnitude, blockscale.scale_products_past(p, a, b, inputs, rows))
        else:
            x, magnitude = product(p, a, b), None
        ref = finished(p, x, inputs, rows)
        if self.exact:
            return ref, np.zeros(ref.shape)
        if magnitude is None:
            magnitude = _abs_product(a, b, matmul)  # float operands (an exact int8 program returned above)
            self._in_range(magnitude)
        err = self.ulps * EPS32 * magnitude
        x = x.astype(np.float32).astype(np.float64) if self.epilogue else x  # the float32 the epilogue starts from
        for stage in epilogue_chain(p) if self.epilogue else ():
            op = stage.kind.op
            assert isinstance(op, Map)  # a float program's epilogue: requant is an int8 op
            more = [(np.asarray(v, np.float64), np.zeros(1)) for v in stage_pages(p, stage, inputs, rows)]
            pages = [(x, err + EPS32 * np.abs(x)), *more]  # a residual's page: exact operand values
            x, err = intervals.bounded(op.expr, pages, _row(column_values(p, inputs, rows)))
        return ref, _bound(ref, x, err, self.out_eps)

    def _mapped(self, inputs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """A map program's reference and bound: its exact inputs through each op's interval bound."""
        from .reference import _declared, declared_outputs, map_values, mapped, row_stages
        from .rounding import output_values

        p = self.program
        decl = _declared(p)
        if decl.rows:
            each, done = {}, {}  # (done: the stages the outputs share, computed once)
            for d in declared_outputs(p):  # each output its own bound, in its own type's ulps
                value, err = row_stages(p, d, inputs, bounds=True, done=done)
                ref = output_values(d.out.name, value, d.out.dtype)
                eps = OUT_EPS.get(d.out.dtype, EPS32)
                each[d.out.name] = (ref, _bound(ref, value, err, eps))
            self._rows_in_range(done)
            if len(each) > 1:
                return {k: v[0] for k, v in each.items()}, {k: v[1] for k, v in each.items()}  # type: ignore[return-value]
            return each[decl.out.name]
        outs, done = {}, {}  # each output of a map program its own bound, in its own type's ulps
        for d in declared_outputs(p):
            ref = mapped(p, d, inputs)
            if self.exact:
                outs[d.out.name] = (ref, np.zeros(ref.shape))
                continue
            x, err = map_values(p, d, inputs, bounds=True, done=done)
            outs[d.out.name] = (ref, _bound(ref, x, err, OUT_EPS.get(d.out.dtype, EPS32)))
        if len(outs) > 1:
            return {k: v[0] for k, v in outs.items()}, {k: v[1] for k, v in outs.items()}  # type: ignore[return-value]
        return outs[decl.out.name]

    def past_range(self, magnitude: np.ndarray, scales: np.ndarray | None = None) -> np.ndarray:
        """Where a kernel's float32 sum of finite inputs may overflow: |A|@|B|, with the sum's own rounding, at
        float32's largest value or past it (nowhere for the interpreter's bound: it sums in float64); and a
        block-scaled kernel's, where its float32 sa · sb is not one rounding of the exact product (`scales`,
        `blockscale.scale_products_past`)."""
        if not self.kernel:
            return np.zeros(magnitude.shape, dtype=bool)
        with np.errstate(over="ignore"):  # an infinite |A|@|B| is a non-finite input's, said already
            past = np.isfinite(magnitude) & (magnitude * (1 + self.ulps * EPS32) >= F32_MAX)
        return past if scales is None else past | scales

    def _in_range(self, magnitude: np.ndarray, scales: np.ndarray | None = None) -> None:
        """Say once (RangeWarning), or refuse under `strict` (InputError), where inputs leave the bound's range."""
        past = self.past_range(magnitude, scales)
        if not past.any():
            return
        at = tuple(int(i) for i in np.argwhere(past)[0])
        what = (
            f"{int(past.sum())} of C's {past.size} elements have |A|@|B| at or past float32's largest value"
            f" ({F32_MAX:.3g}; {float(magnitude[at]):.3g} at C{list(at)}): a kernel's float32 sum may overflow"
            " there (to ±inf, or NaN) where the float64 reference does not, so the kernel's bound holds only below it"
        )
        if scales is not None and scales[at]:
            what = (
                f"{int(past.sum())} of C's {past.size} elements have a step whose sa·sb leaves float32's normal"
                f" range (at C{list(at)}): a kernel's float32 product of the two scales is ±inf past {F32_MAX:.3g}"
                f" and keeps fewer bits below {_TINY:.3g}, where the float64 reference's is exact, so the"
                " kernel's bound holds only where each sa·sb lies in float32's normal range"
            )
        self._say_past(what)

    def _rows_in_range(self, done: dict) -> None:
        """`_in_range` of a program that reduces rows: its rows where a kernel's float32 row sum may overflow."""
        rows = self._past_rows(done)
        if not rows.any():
            return
        line = _line(self.program)
        self._say_past(
            f"{int(rows.sum())} of the {rows.size} {line}s have a {line} sum whose magnitude (Σ|x|, or Σx²) reaches"
            f" float32's largest value ({F32_MAX:.3g}; first at {line} {int(np.argmax(rows))}): a kernel's float32 sum"
            " may overflow there (to ±inf, or NaN where partial sums of both signs do) where the exact reference"
            " does not, so the kernel's bound holds only below it"
        )

    def _past_rows(self, done: dict) -> np.ndarray:
        """The rows (a column) where a kernel's float32 sum of any of the program's row reductions may overflow
        (`reductions.past_range`), each of the values and bounds `row_stages` left in `done` (ring → both); none for
        the interpreter's, which sums exactly and rounds once."""
        from ..ir.index import ProgramIndex
        from ..ir.nodes import ComputeStage
        from ..ir.ops import RowReduce
        from . import reductions

        if not self.kernel:
            return np.zeros((1, 1), dtype=bool)
        index = ProgramIndex.of(self.program)
        past = [
            reductions.past_range(s.kind.op.op, *done[index.ring(s.ins[0])])
            for s in self.program.stages
            if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, RowReduce) and index.ring(s.ins[0]) in done
        ]
        past += [  # a column program's: its columns (a row), as its output lies
            reductions.past_range_cols(s.kind.op.op, *done[index.ring(s.ins[0])])
            for s in self.program.stages
            if isinstance(s.kind, ComputeStage) and isinstance(s.kind.op, ColReduce) and index.ring(s.ins[0]) in done
        ]
        return np.logical_or.reduce(past) if past else np.zeros((1, 1), dtype=bool)

    def _scores_in_range(self, inputs: Mapping[str, Any]) -> None:
        """`_in_range` of an attention program: its rows whose scores may leave float32's range (the interpreter's
        too: it holds S in float32, as a kernel does)."""
        past = self._past(inputs)
        if not past.any():
            return
        at = [int(i) for i in np.argwhere(past)[0][:-1]]
        self._say_past(
            f"{int(past.sum())} of the {past.size} query rows have |Q|·|K|ᵀ, or |scale| times it, at or past"
            f" float32's largest value ({F32_MAX:.3g}; first at LSE{at}): the recurrence holds S and scale · S in"
            " float32, the interpreter's as a kernel's, so O and LSE may be ±inf or NaN there where the float64"
            " reference is not, and the bound holds only below it"
        )

    def _say_past(self, what: str) -> None:
        """Say once (RangeWarning), or refuse under `strict` (InputError), that inputs leave the bound's range."""
        if self.strict:
            from ..inputs import InputError

            raise InputError(f"{what} (strict: scale the inputs down)")
        if not _RANGE_WARNED:
            _RANGE_WARNED.append(True)
            from ..inputs import _outside_spatialc

            warnings.warn(f"{what}; said once per process", RangeWarning, stacklevel=_outside_spatialc())

    def atol(self, inputs: Mapping[str, Any]) -> float:
        """One absolute tolerance for `np.allclose(c, ref, rtol=0, atol=...)`: the largest element's bound."""
        bound = self.bound(inputs)
        parts = bound.values() if isinstance(bound, dict) else (bound,)  # several outputs: the largest of all
        return max((float(np.max(b, initial=0.0)) for b in parts), default=0.0)

    def check(self, c: np.ndarray, inputs: Mapping[str, Any], rows: Any = None) -> tuple[bool, str]:
        """Whether C is within the bound of the reference, and a one-line account of how close it is. With `rows`,
        `inputs` gives A as just those rows (in each group) and C is those rows of the result (a sample)."""
        ref, bound = self._against(inputs, rows)
        if isinstance(ref, dict):  # several outputs (LayerNorm's out, mean, rstd): each within its own bound
            if not isinstance(c, Mapping) or set(c) != set(ref):
                return False, f"the outputs are {', '.join(ref)}; the result given holds {_names(c)}"
            told = [(name, *self._within(c[name], ref[name], bound[name], inputs, name=name)) for name in ref]
            each = "; ".join(f"{name}: {how.replace(f' (bound: {self.text})', '')}" for name, _, how in told)  # once
            return all(ok for _, ok, _ in told), f"{each} (bound: {self.text})"
        return self._within(c, ref, bound, inputs, rows)

    def against(self, inputs: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """The reference and each element's bound for these inputs, made once where several results of one program
        and the same inputs are checked (`check_against`: the GPU check's kernels of one row, each form's C)."""
        return self._against(inputs)

    def check_against(self, c: Any, ref: np.ndarray, bound: np.ndarray, inputs: Mapping[str, Any]) -> tuple[bool, str]:
        """`check` of one output against the reference and bound `against(inputs)` made."""
        return self._within(c, ref, bound, inputs)

    def _within(
        self,
        c: Any,
        ref: np.ndarray,
        bound: np.ndarray,
        inputs: Mapping[str, Any],
        rows: Any = None,
        name: str | None = None,
    ) -> tuple[bool, str]:
        """Whether one output `c` (the output `name`, or the program's one) is within `bound` of `ref`, and how close
        it is (C's sampled `rows`, if given)."""
        if np.shape(c) != ref.shape:
            return False, f"C has shape {np.shape(c)}, the reference {ref.shape}"
        if self.exact:
            bad = int(np.count_nonzero(np.asarray(c) != ref))
            return bad == 0, "exact" if bad == 0 else f"{bad} of {ref.size} elements differ"
        c64, r64 = np.asarray(c, dtype=np.float64), ref.astype(np.float64)
        # Equal values pass, infinities and NaNs included (inf − inf is NaN, and NaN is within no bound).
        same = (c64 == r64) | (np.isnan(c64) & np.isnan(r64))
        # ±inf is measured from the magnitude C's type overflows at, where the values that round to it begin
        # (`_bound`): a finite value short of it, or inf where the reference just misses it, may be a correct sum's
        # rounding; any other value is not (the bound was 2 ulps of inf there, and let any value pass).
        if np.isinf(c64).any() or np.isinf(r64).any():
            top = OVERFLOW_AT[OUT_EPS.get(self._output(name).dtype, EPS32)]
            c64, r64 = (np.where(np.isinf(v), np.sign(v) * top, v) for v in (c64, r64))
        with np.errstate(invalid="ignore"):
            err = np.where(same, 0.0, np.abs(c64 - r64))
        # An infinite bound is an epilogue op's pole or domain edge inside the box its operand may lie in
        # (`intervals.bounded`): any value may come there, NaN too — sqrt of a sum the kernel rounds below 0.
        good = same | (err <= bound) | np.isinf(bound)
        ok = bool(np.all(good))
        how = f"max |error| {float(np.nanmax(err, initial=0.0)):.3g}"
        lost = np.isnan(err) & ~good  # (errors the max leaves out: NaN on one side alone)
        for n, where in ((np.isnan(c64) & lost, "NaN where the reference is not"), (np.isnan(r64) & lost, "not NaN")):
            how += f"; {np.count_nonzero(n)} of {err.size} elements {where}" if n.any() else ""
        how += f" (bound: {self.text})"
        # (a map sums nothing: no such range; attention's S is a sum, and a row program's row sums)
        summed = not (self.chained or self.mapped) or self.rows
        if not ok and (self.kernel or self.attention) and summed:
            past = int(np.count_nonzero(~good & self._past(inputs, rows)))
            if past:
                how += f"; {past} of the elements outside it lie past float32's range, where it does not hold"
        return ok, how

    def _output(self, name: str | None) -> Any:
        """The output tensor `name`, or the program's one."""
        out = self.program.output_tensor() if name is None else self.program.tensor_named(name)
        assert out is not None
        return out

    def _past(self, inputs: Mapping[str, Any], rows: Any = None) -> np.ndarray:
        """`past_range` of these inputs' |A|@|B| (a block-scaled program's M and its scales' products; A's sampled
        `rows`, if given; an attention program's: each query row's, `attention.past_range`)."""
        from ..interp.values import matmul
        from .reference import rounded_operands

        p = self.program
        if self.attention:
            from . import attention

            return attention.past_range(p, inputs, self.kernel)
        if self.rows:  # each row where a row sum may overflow, for each of the row's elements
            from .reference import declared_outputs, row_stages

            given = self._given(inputs, rows)
            done: dict = {}  # (ring → the values and bounds `row_stages` computed)
            with np.errstate(over="ignore", invalid="ignore"):
                for d in declared_outputs(p):
                    row_stages(p, d, given, bounds=True, done=done)
            return self._past_rows(done)
        a, b = rounded_operands(p, inputs)
        if blockscale.program_scales(p) is not None:
            magnitude = blockscale.program_sum(p, a, b, inputs, matmul, rows)[1]
            return self.past_range(magnitude, blockscale.scale_products_past(p, a, b, inputs, rows))
        return self.past_range(_abs_product(a, b, matmul))


def _line(p: SpatialProgram) -> str:
    """What a program's reductions reduce: "column" in a column program (`spatialc.col_reduce`), else "row"."""
    return "column" if any(isinstance(getattr(s.kind, "op", None), ColReduce) for s in p.stages) else "row"


def tolerance(program: SpatialProgram, *, kernel: bool = False, strict: bool = False) -> Tolerance:
    """The bound a result of `program` meets: the interpreter's (a float64 sum rounded once: 4 ulps), or with
    `kernel` a GPU kernel's or its emulation's (a float32 sum of K terms: K + 4 ulps; the sm_90a form's 8-bit float
    kernel, planned in panels, FP8_WGMMA_STEP more for each of its ⌈K / 32⌉ wgmma steps). int8 is exact either way.

    A kernel's bound holds while |A|@|B| stays below float32's largest value (3.4e38): past it the float32 sum may
    overflow. Inputs past it are said once (RangeWarning), or with `strict` refused (InputError)."""
    from ..api import expect_program

    expect_program("tolerance", program, "from spatialc.gemm or build")
    from ..passes.footprint import in_panels
    from .reference import _declared, is_attention

    if is_attention(program):  # O's ulps and LSE's, each in its own type (`numerics.attention.attention_bound`)
        out = program.output_tensor()
        eps = OUT_EPS.get(out.dtype, EPS32) if out is not None else EPS32
        return Tolerance(program, False, int(kernel), eps, attention=True, kernel=kernel, strict=strict)
    decl = _declared(program)
    if program.precision == Precision.INT8:
        return Tolerance(program, True, 0, mapped=decl.matmul is None)
    out = program.output_tensor()
    eps = OUT_EPS.get(out.dtype, EPS32) if out is not None else EPS32
    if decl.matmul is None:  # a map: exact inputs, each op's own bound (and each row reduction's)
        return Tolerance(program, False, 0, eps, True, mapped=True, rows=decl.rows, kernel=kernel, strict=strict)
    if len(decl.matmuls) > 1:  # ulps: 1 marks the kernel's bound (K + 4 per matmul, each its own K)
        return Tolerance(program, False, int(kernel), eps, chained=True, kernel=kernel, strict=strict)
    k = program.tensor(decl.a).elems[1]  # type: ignore[arg-type]  # A: the matmul stage's first operand
    if blockscale.program_scales(program) is not None:  # each 128 of K promoted (numerics/blockscale.py)
        wgmma = kernel and in_panels(program)  # the sm_90a form's: each group's wgmma sums in reduced precision
        step = FP8_WGMMA_STEP if wgmma else 0
        ulps = blockscale.kernel_ulps(k, step, FP8_WGMMA_K, blockscale.promotion_k(program)) if kernel else 4
        how = {"kernel": kernel, "wgmma_fp8": wgmma, "strict": strict, "block_scaled": True}
        return Tolerance(program, False, ulps, eps, bool(decl.chain), **how)
    if kernel and program.precision in FP8_PRECISIONS and in_panels(program):  # Hopper's fp8 wgmma: reduced sums
        ulps = k + 4 + -(-k // FP8_WGMMA_K) * FP8_WGMMA_STEP
        return Tolerance(program, False, ulps, eps, bool(decl.chain), kernel=True, wgmma_fp8=True, strict=strict)
    return Tolerance(program, False, k + 4 if kernel else 4, eps, bool(decl.chain), kernel=kernel, strict=strict)


_TINY = float(np.finfo(np.float32).tiny)


def out_rounding(eps: float, ref: Any, xp: Any = np) -> Any:
    """What rounding each output to C's type (of one ulp `eps` at 1.0) adds to its bound at the reference `ref`: 2
    ulps of |ref|, and at least the type's least step (`least_step`). On `xp`'s arrays (numpy, or CuPy on the GPU
    check's device)."""
    return 2 * eps * xp.abs(ref) + least_step(eps)


def least_step(eps: float) -> float:
    """The least step of C's type of one ulp `eps` at 1.0 (OUT_STEP), or float32's smallest normal where that is
    larger: the floor of every output's bound."""
    return max(_TINY, _STEP_OF_EPS.get(eps, 0.0))


def _bound(ref: np.ndarray, x: np.ndarray, err: np.ndarray, eps: float) -> np.ndarray:
    """The bound of each element of C: `err`, that of `x` (C before its rounding to C's type, `eps` its ulp at 1.0),
    and the rounding, 2 ulps of the type and its least step (`least_step`). Where `x` is finite but rounded to ±inf,
    C's type overflowed: `_within` measures a value there from the magnitude the type overflows at, and a value
    short of it is a correct result only where x may lie within err below it (plus the half ulp the rounding adds);
    else only ±inf is (2 ulps of that magnitude would pass the largest finite value: a kernel that saturates)."""
    size = np.abs(ref.astype(np.float64))
    infinite = np.isinf(size)
    if not infinite.any():  # (C's size in float64 arrays: as few as the check can hold at once)
        return err + out_rounding(eps, size)
    top = OVERFLOW_AT[eps]
    reach = np.abs(x) - err  # the least magnitude a correct sum may have before it is rounded
    with np.errstate(invalid="ignore"):  # an infinite x and err (inputs past their range): inf − inf
        short = np.where(reach < top, top - reach + eps * top / 4, 0.0)
    rounding = err + 2 * eps * np.where(infinite, 0.0, size)
    return np.where(infinite & np.isfinite(x), short, rounding) + least_step(eps)


def _names(c: Any) -> str:
    """What a result holds, for a message: its outputs' names, or one array's shape."""
    return ", ".join(map(str, c)) if isinstance(c, Mapping) else f"one array of shape {np.shape(c)}"


_RANGE_WARNED: list[bool] = []  # whether a RangeWarning was given in this process
# An operand type's unit roundoff
_ROUNDING = {Precision.BF16: 2.0**-8, Precision.FP16: 2.0**-11, Precision.E4M3: 2.0**-4, Precision.E5M2: 2.0**-3}


def _chained(p: SpatialProgram, inputs: Mapping[str, Any], kernel: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each element of C before its rounding to C's type, and its error bound, carried from the inputs through each
    matmul, each elementwise op and each computed operand's rounding (see the module docstring)."""
    from ..interp.values import matmul as product
    from .reference import _declared, column_values, stage_pages, tensor_operand
    from .rounding import computed_operand

    decl = _declared(p)

    def matmul(mm: Any) -> tuple[np.ndarray, np.ndarray]:
        values, errors = [], []
        for tensor, source, chain in zip(mm.operands, mm.sources, mm.chains, strict=True):
            if tensor is not None:
                values.append(tensor_operand(p, tensor, inputs))
                errors.append(np.zeros(1))
                continue
            x, e = through(*matmul(decl.matmuls[source]), list(chain))
            u = _ROUNDING[p.precision]
            values.append(computed_operand(x, p.precision.value))
            errors.append(np.where(e > 0, e + u * (2 * np.abs(x) + e), 0.0))
        (a, b), (ea, eb) = values, errors
        magnitude = _abs_product(a, b, product)
        ulps = mm.k_elems + 4 if kernel else 4
        err = (
            ulps * EPS32 * magnitude + (ea @ np.abs(b) if ea.ndim == 2 else 0) + (np.abs(a) @ eb if eb.ndim == 2 else 0)
        )
        if ea.ndim == 2 and eb.ndim == 2:
            err = err + ea @ eb
        return product(a, b) if a.ndim == 2 else a @ b, err

    def through(x: np.ndarray, e: np.ndarray, chain: list) -> tuple[np.ndarray, np.ndarray]:
        if chain:  # the float32 the epilogue starts from, one rounding off the sum
            x, e = x.astype(np.float32).astype(np.float64), e + EPS32 * np.abs(x)
        for stage in chain:
            op = stage.kind.op
            assert isinstance(op, Map)  # a float program's epilogue: requant is an int8 op
            more = [(np.asarray(v, np.float64), np.zeros(1)) for v in stage_pages(p, stage, inputs)]
            x, e = intervals.bounded(op.expr, [(x, e), *more], _row(column_values(p, inputs)))
        return x, e

    assert decl.matmul is not None
    return through(*matmul(decl.matmuls[decl.matmul.id]), list(decl.chain))


def _online(p: SpatialProgram) -> bool:
    """Whether a row max reads a ring a map reads too: an online softmax's one pass (`numerics.reference`)."""
    from ..ir.nodes import ComputeStage
    from ..ir.ops import Map, RowReduce

    ops = [(s.kind.op, s.ins) for s in p.stages if isinstance(s.kind, ComputeStage)]
    maxed = {b for op, ins in ops if isinstance(op, RowReduce) and op.op == "max" for b in ins}
    return any(isinstance(op, Map) and maxed & set(ins) for op, ins in ops)


def _row(values: Any) -> Any:
    """Column vectors' values as rows that broadcast over C's rows, row vectors' as columns that broadcast over its
    columns."""
    from ..ir.ops import VecAxis

    return lambda c: np.asarray(values(c), np.float32).reshape((-1, 1) if c.axis == VecAxis.ROW else (1, -1))


def _abs_product(a: np.ndarray, b: np.ndarray, matmul: Any) -> np.ndarray:
    """|A| @ |B| in float64 (each group's own for a grouped GEMM's operands), a panel of K at a time: |B| is never
    held whole (at 16384² it would take a GiB)."""
    if a.ndim == 3:  # a grouped GEMM's (G, rows, K) @ (G, K, N): each group's own, in float64 like the rest
        return np.stack([_abs_product(a[g], b[g] if b.ndim == 3 else b, matmul) for g in range(a.shape[0])])
    from ..interp.values import CHUNK_ELEMS

    out = np.zeros((a.shape[0], b.shape[1]))
    ks = max(1, CHUNK_ELEMS // max(a.shape[0], b.shape[1], 1))
    for k0 in range(0, a.shape[1], ks):
        out += matmul(np.abs(a[:, k0 : k0 + ks]), np.abs(b[k0 : k0 + ks]))
    return out
