"""How much of a program the commands compute with the reference interpreter and check against numpy (`--check`),
and the memory that takes, estimated before any input is made.

- `full`: the interpreter computes all of C, and numpy all of the reference.
- `sampled`: every op of the program still runs (its flow, addresses and handshakes as in a full run), but only
  SAMPLE_TILE_ROWS tile rows of C are computed — the first, the last and the others drawn from --seed (in each group
  of a grouped GEMM) — from just those rows of A, which is all those rows depend on; numpy computes the same rows.
- `none`: neither runs.

The default is `full` up to FULL_CHECK_MACS multiply-adds where it fits the memory limit, else `sampled`, else (no
check fits) `none`, with the check's line saying what a sampled check would take; a mode asked for that does not fit
is refused with one line that says what it takes and which mode or size would do.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..interp.errors import TooLarge
from ..interp.evaluate import Sample, gib, memory_ledger, memory_limit, memory_refusal
from ..interp.values import CHUNK_ELEMS
from ..ir.ids import TensorId
from ..ir.nodes import SpatialProgram, TensorRole
from ..runtime.emu_run import duration_text

FULL_CHECK_MACS = 2**30  # 1024³: the interpreter and numpy take about a second each at most
# An attention's default check is full up to 2^33 multiply-adds (Q·Kᵀ and P·V): about 10 s of the interpreter and
# numpy together. Past that no sample follows its rows (a row of O reads every key of its head), so the default is
# none, saying what --check full would take at CHECK_MACS_PER_S (1 × 16 × 4096² × 128: 6.9e10 in 61 s of CPU on the
# 2-core VM of 2026-12-07, the interpreter's 2/3 of it).
ATTENTION_FULL_CHECK_MACS = 2**33
CHECK_MACS_PER_S = 1.1e9
SAMPLE_TILE_ROWS = 4
CHECK_ARRAYS = 10  # float64 arrays of C's (checked) size the numpy check holds at once: reference, bound, errors
INPUT_BYTES = {"int8": 1, "fp16": 2}  # the random inputs: int8 as int8, fp16 as float16, bf16 values as float32


@dataclass(frozen=True, slots=True)
class CheckPlan:
    """What `--check` does for one program: its mode, the sample (sampled), and why that mode."""

    mode: str
    sample: Sample | None = None
    why: str = ""

    @property
    def rows(self) -> tuple[int, ...] | None:
        return self.sample.rows if self.sample is not None else None


def plan_check(p: SpatialProgram, asked: str | None, seed: int, *, full_inputs: bool) -> CheckPlan:
    """The check for `p` (`asked`: the --check given, or None for the default); TooLarge where the mode asked, or
    every mode the default would take, needs more memory than the interpreter may take. `full_inputs`: the kernel
    runs too, so the inputs are made whole whatever is checked."""
    if asked == "none":
        return CheckPlan("none")
    macs = multiply_adds(p)
    sample = sample_of(p, seed)
    if asked is None and macs > ATTENTION_FULL_CHECK_MACS and _is_attention(p):
        return CheckPlan(
            "none",
            why=f"the default for an attention above {ATTENTION_FULL_CHECK_MACS:.3g} multiply-adds, whose rows no"
            f" sample follows: --check full computes all {macs:.3g} with the interpreter and numpy, about"
            f" {duration_text(macs / CHECK_MACS_PER_S)} on one core",
        )
    if asked == "full" or (asked is None and (macs <= FULL_CHECK_MACS or sample is None)):
        refused = _refused(p, None, full_inputs)
        if refused is None:
            return CheckPlan("full")
        if asked is None and sample is None:  # no sample follows it, and the full check does not fit
            return _none_by_default(refused)
        if asked == "full":
            way = "--check sampled (4 tile rows of C) or --check none" if sample else "--check none"
            raise TooLarge(f"{refused}: check a smaller size, or use {way}")
    if sample is None:
        raise TooLarge(
            f"{p.name} is not one tile matmul of two tensors, whose rows of A a sample follows: --check full or none"
        )
    refused = _refused(p, sample, full_inputs)
    if refused is not None and asked is None:
        return _none_by_default(refused)
    if refused is not None:
        raise TooLarge(f"{refused}: check a smaller size, or use --check none")
    if asked:
        why = ""
    elif macs > FULL_CHECK_MACS:
        why = f"; the default above {FULL_CHECK_MACS:.3g} multiply-adds"
    else:
        why = "; the default where a full check does not fit in memory"
    return CheckPlan("sampled", sample, why)


def _is_attention(p: SpatialProgram) -> bool:
    from ..passes.attention import is_attention_program

    return is_attention_program(p)


def _none_by_default(refused: str) -> CheckPlan:
    """The default where no check fits: none, and the check line says what the check would take."""
    return CheckPlan("none", why=f"the default where no check fits: {refused}")


def multiply_adds(p: SpatialProgram) -> int:
    """M·N·K (times the groups) of the program's one matmul; for several, K the widest input's columns; an
    attention's two products, Q·Kᵀ and P·V, of seq_q × seq_kv × head_dim a head each."""
    from ..api import row_operand
    from ..errors import ProgramError
    from ..passes.attention import attention_shape, is_attention_program

    if is_attention_program(p):
        q, k = (p.tensor(TensorId(tid)) for tid, _ in attention_shape(p).reads[:2])
        return 2 * q.groups * q.elems[0] * k.elems[0] * q.elems[1]
    out = p.output_tensor()
    assert out is not None
    try:
        name = row_operand(p)
        k = next(t.elems[1] for t in p.tensors if t.name == name)
    except ProgramError:
        k = max(t.elems[1] for t in p.tensors if t.role == TensorRole.INPUT)
    return out.groups * out.elems[0] * out.elems[1] * k


def sample_of(p: SpatialProgram, seed: int) -> Sample | None:
    """SAMPLE_TILE_ROWS tile rows of C (the first, the last, the others drawn from `seed`), as rows; None for a
    program whose rows a sample cannot follow (several matmuls, an attention)."""
    from ..api import row_operand
    from ..errors import ProgramError
    from ..passes.attention import is_attention_program

    if is_attention_program(p):
        return None
    try:
        name = row_operand(p)
    except ProgramError:
        return None
    out = p.output_tensor()
    assert out is not None
    rows, tr = out.elems[0], p.tile.rows
    tile_rows = -(-rows // tr)
    middle = np.arange(1, max(tile_rows - 1, 1))
    drawn = np.random.default_rng(seed).choice(middle, size=min(SAMPLE_TILE_ROWS - 2, middle.size), replace=False)
    picked = sorted({0, tile_rows - 1, *map(int, drawn)})
    return Sample(tuple(r for t in picked for r in range(t * tr, min((t + 1) * tr, rows))), (name,))


def _refused(p: SpatialProgram, sample: Sample | None, full_inputs: bool) -> str | None:
    """Why checking `p` this way does not fit (the interpreter's run, the random inputs, numpy's check), or None."""
    need = memory_ledger(p, sample, inputs=_like_inputs(p))
    per = INPUT_BYTES.get(p.precision.value, 4)
    for t in p.tensors:
        if t.role in (TensorRole.INPUT, TensorRole.PARAMETER):
            rows = len(sample.rows) if sample is not None and t.name in sample.given and not full_inputs else None
            need[f"random {t.name}"] = t.groups * (rows or t.elems[0]) * t.elems[1] * per
    # the check's working arrays for the largest output, and each other output's reference and result beside them
    outs = sorted(
        (t for t in p.tensors if t.role == TensorRole.OUTPUT), key=lambda t: t.groups * t.elems[1] * t.elems[0]
    )
    arrays = [CHECK_ARRAYS] * (len(outs) > 0) + [2] * (len(outs) - 1)
    need["numpy's check"] = 3 * CHUNK_ELEMS * 8 + sum(
        k * t.groups * (len(sample.rows) if sample is not None else t.elems[0]) * t.elems[1] * 8
        for k, t in zip(arrays, reversed(outs), strict=True)
    )
    if p.precision.value != "int8":  # |A| @ |B| for the bound, a K panel at a time (an int8 check is exact)
        need["numpy's |A|, |B|"] = 3 * CHUNK_ELEMS * 8
    return memory_refusal(p, need, memory_limit(None), "checking")


def _like_inputs(p: SpatialProgram) -> dict:
    """Stand-ins that say the random inputs' types (int8 as int8, fp16 as float16, bf16 as float32), shapes and C order
    to the ledger (which then counts no store for an input the interpreter reads in place): views of one element
    with the arrays' strides, never read."""
    dtype = np.dtype({"int8": np.int8, "fp16": np.float16}.get(p.precision.value, np.float32))
    like = {}
    for t in p.tensors:
        if t.role == TensorRole.INPUT:
            shape = (t.groups, *t.elems) if t.groups > 1 else tuple(t.elems)
            strides = tuple(int(np.prod(shape[i + 1 :])) * dtype.itemsize for i in range(len(shape)))
            like[t.name] = np.lib.stride_tricks.as_strided(np.empty(1, dtype), shape, strides, writeable=False)
    return like


def sample_text(plan: CheckPlan) -> str:
    """The sampled rows in words: `rows 0..15, 48..63 of C`."""
    rows = plan.rows or ()
    runs: list[list[int]] = []
    for r in rows:
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in runs)


__all__ = ["CheckPlan", "gib", "multiply_adds", "plan_check", "sample_of", "sample_text"]
