"""The public entry points. Heavy parts (lowering, emulation, GPU launch) are imported when first used."""

from __future__ import annotations

import dataclasses
from typing import Any

from .arguments import plain_ints
from .attention import attention
from .cols import col_reduce
from .errors import ProgramError, SpatialError
from .frontend import gemm, grouped_gemm
from .ir import serde
from .ir.nodes import SpatialProgram
from .maps import elementwise
from .rows import layernorm, log_softmax, rmsnorm, row_reduce, softmax
from .target import SpatialTarget
from .target import target as get_target

__all__ = [
    "attention",
    "build",
    "elementwise",
    "emulate",
    "evaluate",
    "from_json",
    "gemm",
    "grouped_gemm",
    "lower",
    "run",
    "to_json",
    "verify",
]


def build(
    program: SpatialProgram,
    target: str | SpatialTarget | None = None,
    *,
    block: tuple[int, int, int] | None = None,
    sub_blocks: tuple[int, int] | None = None,
    depth: int | None = None,
    sites: int | None = None,
    placement: str | None = None,
    form: str = "auto",
    split_k: int | None = None,
    multicast: tuple[int, int] | None = None,
) -> SpatialProgram:
    """tile → place → schedule → verify; returns the verified program, built for `target` (by default the one the
    program names: `spatialc.gemm(..., target=...)`, "sm_90" unless given). The plan is chosen for the CUDA kernel of
    `form` ("auto" and "persistent": the persistent kernel; "general": the general form, whose rings include the
    output's and each epilogue stage's). `split_k=S` reduces each item's K on S sites whose partial sums meet in a
    workspace tensor (general form); by default the planner splits a GEMM with too few items to fill the machine
    and a long K (docs/design.md, "Split-K"). `multicast=(gy, gx)` gives each gy × gx block of items a group of
    sites that read each shared A and B page once and multicast it to the others (docs/design.md, "Multicast")."""
    from .passes.pipeline import build as run_passes

    expect_program("build", program, "from spatialc.gemm")
    return run_passes(
        program,
        get_target(program.target if target is None else target),
        block=plain_ints(block),
        sub_blocks=plain_ints(sub_blocks),
        depth=plain_ints(depth),
        sites=plain_ints(sites),
        placement=placement,
        form=form,
        split_k=plain_ints(split_k),
        multicast=plain_ints(multicast),
    )


def verify(program: SpatialProgram, target: str | SpatialTarget | None = None) -> SpatialProgram:
    """The program marked verified, or the first broken rule's error (docs/verification.md lists the eight rules).

    `build` ends with it; call it on a program you built or edited by hand. `target` only matters for a program
    that names a target spatialc does not list."""
    from .passes.verify import verify as check

    expect_program("verify", program, "from spatialc.build or spatialc.from_json")
    return check(program, None if target is None else get_target(target))


def evaluate(program: SpatialProgram, inputs: dict[str, Any], *, rows: Any = None, **kwargs: Any):
    """The exact result of `program` on `inputs` (name → numpy array), from the reference interpreter: C, or for a
    program of several outputs (LayerNorm's out, mean and rstd) a dict name → array.

    `rows` (row indices of C, within each group of a grouped GEMM) evaluates a sample: A comes as just those rows,
    in that order, and so does C. `max_bytes` bounds the memory the run may take (2 GiB unless told; TooLarge,
    before anything is allocated, past it); `trace=True` also returns the run's Trace."""
    from .interp.evaluate import Sample
    from .interp.evaluate import evaluate as run_interpreter

    expect_program("evaluate", program, "from spatialc.build")
    if rows is not None:
        kwargs["sample"] = Sample(sampled_rows(rows), (row_operand(program),))
    return run_interpreter(program, inputs, **kwargs)


def sampled_rows(rows: Any) -> tuple[int, ...]:
    """`rows` as a tuple of whole numbers, or ProgramError."""
    import numpy as np

    arr = np.asarray(rows)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ProgramError(f"rows is a list of whole numbers (row indices of C), not {_kind(rows)}")
    return tuple(int(r) for r in arr)


def row_operand(program: SpatialProgram) -> str:
    """The name of the input whose rows are C's rows (the matmul's A), or ProgramError."""
    from .numerics.reference import _declared, is_attention

    if is_attention(program):  # a row of O depends on its query row alone, but rows of LSE and O are not C's
        raise ProgramError(f"rows samples a program of one tile matmul of two tensors; {program.name} is attention")
    decl = _declared(program)
    if decl.a is None or len(decl.matmuls) != 1:
        raise ProgramError(f"rows samples a program of one tile matmul of two tensors; {program.name} is not one")
    return program.tensor(decl.a).name


def lower(
    program: SpatialProgram,
    target: str | SpatialTarget | None = None,
    form: str = "auto",
    epilogue: str | None = None,
    schedule: str | None = None,
):
    """The CUDA artifact of a verified program (target defaults to the one it was built for).

    `form` chooses the kernel: "auto" (on a Hopper target the sm_90a form where the program was planned for it;
    else the persistent tile kernel where it can hold the program, the general form otherwise), "persistent",
    "general" or "sm90a". A persistent artifact carries the general form in `artifact.general` (an sm_90a one does
    not: its swizzled panels are read by no other form).
    The `verified` mark is checked again here, not trusted: a program changed after verify (by
    `dataclasses.replace`, or a hand-edited file) is verified anew, and refused if it no longer passes.
    `epilogue` ("swizzled", the default, or "tiles") picks how the sm_90a form's fused store goes out (that form's
    alone; docs/kernel-abi.md, "The sm_90a form"); `schedule` ("overlapped", the default where its registers fit,
    "serial", or "pingpong", the default for two consumer warpgroups) the sm_90a form's attention KV loop: each
    block's softmax overlapping the next block's S, each matmul waited for before the op after it, or two consumer
    warpgroups issuing their matmuls in turns (FlashAttention-3's ping-pong)."""
    from .lower.cuda.forms import lower as lower_cuda
    from .passes.verify import verify

    expect_program("lower", program, "from spatialc.build")
    _printed_by_a_form(program, form)
    t = get_target(target or program.target)
    _printed_precision(program, t)
    if program.verified:
        verify(program, t if t.name == program.target else None)
    art = lower_cuda(program, t, form, epilogue, schedule)
    if t.name == program.target:
        return art
    other = f"lowered for {t.name}, a program built for {program.target}: its plan was chosen for {program.target}"
    return dataclasses.replace(art, notes=(other, *art.notes))  # said, never silent (build for t to plan for it)


def _printed_by_a_form(program: SpatialProgram, form: str) -> None:
    """UnknownForm for a form that is none, before anything else is checked. (Attention is printed by the general form
    alone; the persistent and sm_90a forms refuse it by name, `lower.cuda.forms`.)"""
    from .lower.cuda.forms import FORMS, UnknownForm

    if form not in FORMS:
        raise UnknownForm(form)


def _printed_precision(program: SpatialProgram, target: SpatialTarget) -> None:
    """Unsupported, in one line, for a program that multiplies 8-bit floats for a target without 8-bit float MMAs
    (sm_80, sm_86); every form prints the others where it prints their int8 twin (the sm_90a form on sm_90a only, as
    for any precision), and a map or row program of 8-bit float inputs, which multiplies nothing, anywhere."""
    from .ir.ops import FP8_PRECISIONS
    from .lower.errors import Unsupported
    from .passes.cols import is_col_program
    from .passes.footprint import FP8_NO_MMA
    from .passes.maps import is_map_program
    from .passes.rows import is_row_program

    if program.precision not in FP8_PRECISIONS:
        return
    what = f"program {program.name} ({program.precision.value} operands)"
    if not target.fp8_mma and not (is_map_program(program) or is_row_program(program) or is_col_program(program)):
        raise Unsupported(f"{what} for {target.name}", FP8_NO_MMA)


def to_json(program: SpatialProgram, indent: int | None = None) -> str:
    """The program as a JSON document."""
    expect_program("to_json", program, "")
    return serde.to_json(program, indent)


def from_json(text: str) -> SpatialProgram:
    """Read a spatialc document. A document that claims its program is verified is verified again: the mark only
    stands if verify agrees (a hand-edited file keeps no stale claim; it comes back unverified)."""
    from .errors import VerifyError
    from .passes.verify import verify

    p = serde.from_json(text, _upgrade)
    if not p.verified:
        return p
    try:
        return verify(p.evolve())
    except VerifyError:
        return p.evolve(verified=False)


def _upgrade(p: SpatialProgram, version: int) -> SpatialProgram:
    """A program saved by an older spatialc with its operand rings laid out as the tile pass lays them out now, and
    its tensors stored to match; its verified mark is kept for from_json to check again. Version 1 had no page
    layouts; version 5 laid out a program built for sm_90a with A's tiles by column (`swizzled_cols`, `row_cols`),
    which the sm_90a form now reads as swizzled panels."""
    from .ir.nodes import PageLayout
    from .passes.tile import lay_out_operands

    if p.plan is None:
        return p
    by_column = (PageLayout.SWIZZLED_COLS, PageLayout.ROW_COLS)
    if version == 5 and any(getattr(b.kind, "layout", None) in by_column for b in p.buffers):
        form = "sm90a"
    elif version == 1:
        form = "persistent"
    else:
        return p
    try:
        return lay_out_operands(p, form).evolve(verified=p.verified)
    except (SpatialError, KeyError, AttributeError, ValueError):
        return p  # not a program the tile pass lays out (verify or lower will say why)


def emulate(artifact, inputs: dict[str, Any], mode: str = "late", **kwargs: Any):
    """Run the artifact's `program_cu` on the CPU through the host emulation; returns C (a program of several
    outputs, LayerNorm's out, mean and rstd: a dict name → array, as `evaluate` gives them)."""
    from .runtime.emulate import emulate as run_emulation

    _artifact("emulate", artifact)
    return run_emulation(artifact, inputs, mode=mode, **kwargs)


def run(artifact, *operands: Any, **params: Any):
    """Run the artifact's kernel on a GPU: its inputs by position (A, B — or an MLP's X, W1, W2, a map's x0, x1, …) or
    by name, its parameters by name; numpy, torch or CuPy arrays in, the same library out. The output buffer
    is poisoned first (NaN, or the most negative integer), so an element the kernel never writes shows: a grouped
    GEMM's rows at or past their group's count come back so (the interpreter and the emulation return zeros). A
    program of several outputs (LayerNorm's out, mean and rstd) gives a dict name → array, as `evaluate` does."""
    from .runtime.launch import run as run_gpu

    _artifact("run", artifact)
    return run_gpu(artifact, *operands, **params)


attention = attention
gemm = gemm
grouped_gemm = grouped_gemm
softmax = softmax
log_softmax = log_softmax
rmsnorm = rmsnorm
layernorm = layernorm
row_reduce = row_reduce
col_reduce = col_reduce


def expect_program(name: str, program: object, whence: str) -> None:
    """ProgramError unless `program` is a SpatialProgram: a wrong argument is one clear line, not an AttributeError
    from deep inside a pass."""
    if not isinstance(program, SpatialProgram):
        whence = f" ({whence})" if whence else ""
        raise ProgramError(f"{name} takes a SpatialProgram{whence}, not {_kind(program)}")


def _artifact(name: str, artifact: object) -> None:
    """ProgramError unless `artifact` is what spatialc.lower returns."""
    from .lower.artifact import CudaArtifact

    if not isinstance(artifact, CudaArtifact):
        raise ProgramError(f"{name} takes the artifact of spatialc.lower(program), not {_kind(artifact)}")


def _kind(value: object) -> str:
    return "None" if value is None else f"a {type(value).__name__}"
