"""Which CUDA form prints a program: the persistent tile kernel where it can hold the program, the general form
otherwise — or the one asked for. A program planned for the sm_90a form (its operand pages in swizzled panels,
which no other form reads) is printed by that form: the general form's engines with a TMA producer and wgmma
consumers (`sm90a/kernel.py`).

The persistent form serialises a site's engines onto one instruction stream and proves that order safe before
printing, which buys a software-pipelined K loop and an epilogue fused into the store; it refuses what it cannot
serialise (`NeedsGeneral`). The general form runs every engine on warps of its own, handing pages over at run time,
and takes what the persistent form refuses as far as it prints it. A persistent artifact carries the same program
in general form in `artifact.general`, so that the two can be run on the same inputs and compared (an sm_90a one
does not: its pages are panels). A program without a tile matmul (a map program, a row program) is printed by both
the general and the persistent form; auto picks the general one (`PAGES_NOTE` says why). Attention is printed by the
general form and, planned for it, the sm_90a form (`ATTENTION_NOTE`); the persistent form refuses it. A W4A16 GEMM
is printed by the general and the persistent form (its dequant in registers in both); auto picks the general one
(`W4_NOTE` says why).
"""

from __future__ import annotations

import dataclasses

from ...ir.nodes import SpatialProgram
from ...passes.attention import is_attention_program
from ...passes.cols import is_col_program
from ...passes.footprint import in_panels
from ...passes.maps import is_map_program
from ...passes.rows import is_row_program
from ...target import SpatialTarget
from ..artifact import CudaArtifact
from ..errors import LowerError, NeedsGeneral, TooBig, Unsupported
from .common.dequant import has_dequant
from .common.program import ATTENTION_PROGRAM, COL_PROGRAM, MAP_PROGRAM, ROW_PROGRAM, W4_PROGRAM
from .general import kernel as general
from .persistent import kernel as persistent
from .sm90a import kernel as sm90a
from .sm90a.plan import SWIZZLED

FORMS = ("auto", "persistent", "general", "sm90a")
# Why auto prints a program without a tile matmul in the general form. Such a kernel is memory-bound: what counts is
# that its loads are in flight all the time. The general form runs the reader on a warp of its own, which fills the
# next pages while the compute warps map or fold this one and the writer stores the last; the persistent form runs
# the engines one after another on the whole block, so an item's loads wait for the last item's stores (only a
# reduction's pass over a row is pipelined). The persistent form is the second, independently printed form the host
# emulation checks these programs in.
PAGES_NOTE = (
    "the general form: {what} is memory-bound, and the general form's reader warp keeps its loads in flight while"
    " the other warps map and store; the persistent form (form='persistent') serialises its engines on one block"
)

# Why auto prints attention in the general form: a program not planned for the sm_90a form (its Q, K and V pages not
# in panels: a target other than sm_90a, or the sm_90a form's refusal of its plan).
ATTENTION_NOTE = (
    f"the general form: {ATTENTION_PROGRAM} planned for the other forms — the persistent form refuses it by name, and"
    " the sm_90a form prints only a plan made for it (on sm_90a, auto plans for it where it prints; form='sm90a'"
    " plans for it, or says why it cannot)"
)


# Why auto prints a W4A16 GEMM in the general form: `build` plans it for that form (split-K where its items are few,
# which the persistent form cannot print), and which of the two runs a decode shape faster is a prediction not yet
# measured (bench/README.md, "W4A16: persistent against general").
W4_NOTE = (
    f"the general form: {W4_PROGRAM} is planned for it; the persistent form prints it too (build and lower with"
    " form='persistent'), and on sm_90a the sm_90a form (build it with form='sm90a'); which is fastest is not yet"
    " measured"
)


class UnknownForm(LowerError, ValueError):
    """A form that is not one of FORMS."""

    def __init__(self, form: object):
        super().__init__(f"unknown CUDA form {form!r}; use one of {', '.join(FORMS)}")
        self.form = form


def lower(
    program: SpatialProgram,
    target: SpatialTarget,
    form: str = "auto",
    epilogue: str | None = None,
    schedule: str | None = None,
) -> CudaArtifact:
    """The CUDA artifact of a verified program in `form` (auto: sm_90a on a Hopper target where it can, else
    persistent where it can, else general). `epilogue` (the sm_90a form's alone: `sm90a.plan.EPILOGUES`) picks how
    its fused store's staged boxes go out; `schedule` (its attention's alone: `sm90a.overlap.SCHEDULES`) its KV
    loop."""
    if form not in FORMS:
        raise UnknownForm(form)
    if schedule is not None:
        if form == "sm90a" or (form == "auto" and in_panels(program)):
            return sm90a.lower(program, target, epilogue or SWIZZLED, schedule)
        raise Unsupported(
            f"schedule={schedule!r} in the {form} form",
            "only the sm_90a form's attention takes one: build and lower with form='sm90a'",
        )
    if epilogue is not None:
        if form == "sm90a" or (form == "auto" and in_panels(program)):
            return sm90a.lower(program, target, epilogue)
        raise Unsupported(
            f"epilogue={epilogue!r} in the {form} form",
            "only the sm_90a form's staged store takes one: build and lower with form='sm90a'",
        )
    if form == "general":
        return general.lower(program, target)
    if is_attention_program(program):
        # Only the general form prints it; the others' refusals say so (`persistent` before any other check, so
        # that an unverified program is still refused as such).
        if form == "persistent":
            return persistent.lower(program, target)
        if form == "sm90a" or in_panels(program):
            return sm90a.lower(program, target)
        art = general.lower(program, target)
        return dataclasses.replace(art, notes=(*art.notes, ATTENTION_NOTE))
    if form == "auto" and (is_map_program(program) or is_row_program(program) or is_col_program(program)):
        # No matmul: nothing for sm_90a's tensor cores to do, and the persistent form serialises what the general
        # form overlaps (`PAGES_NOTE`).
        what = COL_PROGRAM if is_col_program(program) else ROW_PROGRAM if is_row_program(program) else MAP_PROGRAM
        art = general.lower(program, target)
        return dataclasses.replace(art, notes=(*art.notes, PAGES_NOTE.format(what=what)))
    if form == "sm90a" or (form == "auto" and in_panels(program)):
        # Pages in panels: only the sm_90a form reads them, so its refusal is the answer and no general form
        # rides along.
        return sm90a.lower(program, target)
    if form == "auto" and has_dequant(program):
        art = general.lower(program, target)
        return dataclasses.replace(art, notes=(*art.notes, W4_NOTE))
    passed_over: tuple[str, ...] = ()
    if form == "auto" and target.hopper:
        try:
            sm90a.refuse(program, target)
            passed_over = (
                "not the sm_90a form: the program was planned for the others (build it with form='sm90a' to plan"
                " for that form, or to see why it does not print it)",
            )
        except LowerError as why:
            passed_over = (f"not the sm_90a form: {why}",)
    try:
        art = persistent.lower(program, target)
    except NeedsGeneral as why:
        if form == "persistent":
            raise
        art = general.lower(program, target)
        return dataclasses.replace(
            art, notes=(*art.notes, *passed_over, f"the general form, as the persistent kernel refuses: {why}")
        )
    except TooBig as why:  # a correct program too big for the persistent kernel's serialised order: auto tries on
        if form == "persistent":
            raise
        try:
            art = general.lower(program, target)
        except LowerError:
            raise why from None  # neither form prints it: the first form's reason is the answer
        note = f"the general form, as the persistent kernel cannot hold the program: {why}"
        return dataclasses.replace(art, notes=(*art.notes, *passed_over, note))
    art = _with_general(art, program, target)
    return dataclasses.replace(art, notes=(*art.notes, *passed_over))


def _with_general(art: CudaArtifact, program: SpatialProgram, target: SpatialTarget) -> CudaArtifact:
    """`art` carrying the same program in general form, to run beside it (or a note why there is none)."""
    try:
        return dataclasses.replace(art, general=general.lower(program, target))
    except LowerError as e:
        return dataclasses.replace(art, notes=(*art.notes, f"no general form: {e}"))
