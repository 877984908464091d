"""Which CUDA form prints a program: the persistent tile kernel where it can hold the program, the general form
otherwise — or the one asked for.

The persistent form serialises a site's engines onto one instruction stream and proves that order safe before
printing, which buys a software-pipelined K loop and an epilogue fused into the store; it refuses what it cannot
serialise (`NeedsGeneral`). The general form runs every engine on warps of its own, handing pages over at run time,
and takes what the persistent form refuses as far as it prints it. A persistent artifact carries the same program
in general form in `artifact.general`, so that the two can be run on the same inputs and compared.
"""

from __future__ import annotations

import dataclasses

from ...ir.nodes import SpatialProgram
from ...target import SpatialTarget
from ..artifact import CudaArtifact
from ..errors import LowerError, NeedsGeneral
from . import general, persistent

FORMS = ("auto", "persistent", "general")


class UnknownForm(LowerError, ValueError):
    """A form that is not one of FORMS."""

    def __init__(self, form: object):
        super().__init__(f"unknown CUDA form {form!r}; use one of {', '.join(FORMS)}")
        self.form = form


def lower(program: SpatialProgram, target: SpatialTarget, form: str = "auto") -> CudaArtifact:
    """The CUDA artifact of a verified program in `form` (auto: persistent where it can, else general)."""
    if form not in FORMS:
        raise UnknownForm(form)
    if form == "general":
        return general.lower(program, target)
    try:
        art = persistent.lower(program, target)
    except NeedsGeneral as why:
        if form == "persistent":
            raise
        art = general.lower(program, target)
        return dataclasses.replace(
            art, notes=(*art.notes, f"the general form, as the persistent kernel refuses: {why}")
        )
    try:
        return dataclasses.replace(art, general=general.lower(program, target))
    except LowerError as e:
        return dataclasses.replace(art, notes=(*art.notes, f"no general form: {e}"))
