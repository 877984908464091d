"""Why a backend refuses a program. Each error names what it is about and why, so the user can change the program."""

from __future__ import annotations

from ..errors import SpatialError
from ..ir import ops


class LowerError(SpatialError):
    """Base of every refusal a backend makes."""


class Unverified(LowerError):
    """The program has not passed `verify`: lowering relies on what the verifier proves and checks none of it."""

    def __init__(self, program: str):
        super().__init__(
            f"program {program!r} is not verified; verify it first: spatialc.verify(program) (spatialc.build"
            " ends with it)"
        )
        self.program = program


class Unsupported(LowerError):
    """Something this backend cannot print: `what` it is and `why` the backend cannot hold it."""

    def __init__(self, what: str, why: str):
        super().__init__(f"cannot lower {what}: {why}")
        self.what = what
        self.why = why


# What the forms that do not read e8m0 scales call an MX program when they send it to the mma.sync forms.
MX_PROGRAM = "an MXFP8 GEMM's e8m0 block scales (one per 32 of K)"

# The refusals whose program auto prints in another form than the general one: what then prints it.
PRINTED_ELSEWHERE = {
    f"{MX_PROGRAM} in the sm_90a form": "auto prints it in the persistent form (spatialc.lower(p), or"
    " form='persistent'), or in the general form where the persistent kernel cannot hold it (form='general')",
}


class NeedsGeneral(Unsupported):
    """A program the persistent (or the sm_90a) form cannot hold: `spatialc.lower` prints it in the general form
    instead (or, refused by the sm_90a form, where `PRINTED_ELSEWHERE` says)."""

    def __init__(self, what: str, why: str = "the persistent tile kernel cannot hold it"):
        prints = PRINTED_ELSEWHERE.get(what, "the general form prints it (spatialc.lower(p, form='general'))")
        super().__init__(what, f"{why}; {prints}")


class TooBig(LowerError):
    """A resource the program needs more of than the machine has: `need` against `have`."""

    def __init__(self, what: str, need: int, have: int, fix: str = ""):
        super().__init__(f"{what}: needs {need}, has {have}" + (f"; {fix}" if fix else ""))
        self.what = what
        self.need = need
        self.have = have


class UnsupportedPrecision(LowerError):
    """An operand precision (or element type) the tensor cores' MMA fragments do not offer."""

    def __init__(self, precision: object, why: str):
        kind = "precision" if str(precision) in {p.value for p in ops.Precision} else "element type"
        super().__init__(f"{kind} {precision!s} cannot be lowered: {why}")
        self.precision = precision
        self.why = why


# The name it had first; it shadowed the IR's `Precision` enum wherever both were imported.
Precision = UnsupportedPrecision


class GroupSpansSites(LowerError):
    """A multicast group of several sites: one block per site cannot share pages with another block."""

    def __init__(self, group: int, sites: tuple[int, ...]):
        super().__init__(
            f"group {group} spans sites {list(sites)}: the blocks of a persistent kernel share no shared"
            " memory, so a page multicast between sites cannot be printed; place without groups"
        )
        self.group = group
        self.sites = sites


class InternalError(LowerError):
    """A bug in spatialc, caught by a self-check (e.g. the census) before a wrong kernel could be handed out."""

    def __init__(self, what: str):
        super().__init__(f"internal error in the CUDA lowering (please report it): {what}")


class BarrierClash(LowerError):
    """Two uses of one named barrier (bar.sync / bar.arrive id) in a kernel, or an id a CTA does not have (1 to 15;
    0 is __syncthreads'): their arrivals would count in each other's phases, or the instruction is undefined."""

    def __init__(self, barrier: int, users: tuple[str, ...]):
        why = (
            f"named barrier {barrier} is used by {users[0]} and by {users[1]}"
            if len(users) > 1
            else f"{users[0]} uses barrier {barrier}, and a CTA's named barriers are 1 to 15 (0 is __syncthreads')"
        )
        super().__init__(f"cannot lower a kernel whose named barriers clash: {why}")
        self.barrier = barrier
        self.users = users
