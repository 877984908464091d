"""The plan sweep (`sweep:SIZE` rows): the persistent kernel and the sm_90a form, each at the plan its planner chose
and at the plans one step from it, timed kernel only in the same run beside cuBLAS.

The planners' costs (`passes/tile.py`'s `plan_cost` for the persistent kernel, `lower/cuda/sm90a/plan.py`'s for the
sm_90a form) are built on guessed rates — stage depth, K step, item shape — and the GPU is lent for minutes at a
time. One sweep row times, for each form, the plan its planner chose and the plans one change away: a stage fewer
and more, K steps halved (with twice the stages: the same bytes in flight; the persistent kernel's also with the
stages its planner gives that block) and doubled, items half as wide, items visited in row-major waves instead of
bands of rows or (the sm_90a form, where a wave's band outgrows the L2) along a Hilbert curve. Each plan's line says
what the planner's own cost predicted for it (its speed against the planner's choice) beside what it measured, so a
single run says which guesses to fit and whether the planner's choice was the best of its neighbours. A neighbour
outside its planner's range (the persistent kernel's K steps of 16 tiles, which
its planner never offers) is built where it fits, its cost extrapolated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ir.printer import plural
from ..lower.cuda.sm90a import plan as sm90a_plan
from .builds import Built, Form, describe_plan, form_built, plan_facts
from .cases import HOPPER_FORM, PLANNERS_PLAN, TIMED_AGAIN, kernel_arch

SWEPT_FORMS = ("persistent", HOPPER_FORM)  # in the report's order (cases.FORMS)
UNSPLIT = {"split_k": 1}  # neither form's kernel splits K: a long-K shape is swept unsplit, not left out


@dataclass(frozen=True, slots=True)
class Neighbour:
    """One plan next to the planner's: what changes, and the `spatialc.build` options that make it (None: the
    planner chooses)."""

    change: str
    block: tuple[int, int, int] | None = None
    sub_blocks: tuple[int, int] | None = None
    depth: int | None = None
    placement: str | None = None
    why_not: str = ""  # why the planner's plan has no such neighbour (listed all the same)
    epilogue: str | None = None  # the sm_90a form's fused store (`spatialc.lower`'s option; None: its default)

    def options(self) -> dict[str, Any]:
        chosen = {"block": self.block, "sub_blocks": self.sub_blocks, "depth": self.depth, "placement": self.placement}
        return {key: value for key, value in chosen.items() if value is not None}

    def lowering(self) -> dict[str, Any]:
        """The `spatialc.lower` options that make it (the plan unchanged)."""
        return {"epilogue": self.epilogue} if self.epilogue is not None else {}


PAIRED = "items of 64 rows, two blocks an SM"
HALVED_PLANNERS = "K steps halved, the planner's stages"
ALONE = "items of 128 rows, a block an SM"
# The sm_90a form's first epilogue: each warp stores its 16 rows a 16 × 16 box a tile from unswizzled staging, where
# the default stores a warpgroup's 64 rows a box from swizzled staging (lower/cuda/sm90a/staging.py; issue 36).
TILE_EPILOGUE = "the first epilogue: a warp's TMA store a tile"
HILBERT = "hilbert order"  # the items along a Hilbert curve, not in bands of rows (ir/worklist.py)
SPLIT_TAIL = "a split tail: the last wave's items split"  # placement="split_tail" (passes/split.py)


def _other_pairing(osh: int, osw: int, ibw: int, kind: str) -> Neighbour:
    """The sm_90a form's other block: paired blocks of 64-row items (one consumer warpgroup each, two blocks an SM,
    at most 8 tiles wide) for a plan of 128-row items, and the reverse; the planner chooses the depth."""
    if osh == 8:
        return Neighbour(PAIRED, (4, min(osw, 8), ibw), (1, 1), placement=kind)
    return Neighbour(ALONE, (8, osw, ibw), (1, 1), placement=kind)


def neighbours(program: Any, form: str) -> list[Neighbour]:
    """The plans one step from `program`'s (built for `form`): its stage depth ±1, its K step halved (where the
    form's MMA still takes it) with twice the stages — the persistent kernel's also with the stages its planner gives
    the halved block — and doubled, its items half as wide (the sm_90a form: a narrower block; the persistent
    kernel: half the sub-blocks across, or a narrower block where there is one across), the sm_90a form's other
    pairing (items of 64 rows, two blocks an SM, for 128-row ones, and the reverse), and — where the planner visits
    items in bands of rows — row-major waves and (the sm_90a form, where a wave's band outgrows the L2) Hilbert
    order, and (the sm_90a form, where its last wave is at most half full) a split tail. Each keeps the planner's
    item order but those; where the depth is
    not named the planner chooses it, as a user forcing that block would get it."""
    plan = program.plan
    b, depth, sub, kind = plan.block, plan.depth, plan.sub_blocks, program.placement.kind
    block = (b.osh, b.osw, b.ibw)
    # An int8 wgmma takes K in pairs of tiles (k32); the persistent kernel's k16 path takes one.
    least_k = 2 if form == HOPPER_FORM and program.precision.value == "int8" else 1
    out = [Neighbour("a stage fewer", block, sub, depth - 1, kind)]
    if depth <= 2:
        out[0] = Neighbour("a stage fewer", why_not=f"the planner's {depth} stages are the fewest that overlap a load")
    out.append(Neighbour("a stage more", block, sub, depth + 1, kind))
    halved = "K steps halved, twice the stages"
    if b.ibw % 2 == 0 and b.ibw // 2 >= least_k:
        out.append(Neighbour(halved, (b.osh, b.osw, b.ibw // 2), sub, 2 * depth, kind))
        if form != HOPPER_FORM:  # the stages its planner gives that block: at 4096³ and 8192³ its choice before
            # K steps of 8 tiles were offered (4×8×4, 3 stages), timed beside the one that replaced it
            out.append(Neighbour(HALVED_PLANNERS, (b.osh, b.osw, b.ibw // 2), sub, placement=kind))
    else:
        out.append(Neighbour(halved, why_not=f"the form's MMA takes K steps of {least_k} tiles or more, whole"))
    # The planner lowers the depth to fit the doubled step.
    out.append(Neighbour("K steps doubled", (b.osh, b.osw, b.ibw * 2), sub, placement=kind))
    narrower = "items half as wide"
    if form != HOPPER_FORM and sub[1] % 2 == 0:
        out.append(Neighbour(narrower, block, (sub[0], sub[1] // 2), placement=kind))
    elif b.osw % 2 == 0:
        out.append(Neighbour(narrower, (b.osh, b.osw // 2, b.ibw), sub, placement=kind))
    else:
        wide = b.osw * sub[1]
        out.append(Neighbour(narrower, why_not=f"the planner's items are {plural(wide, 'tile')} wide: no half"))
    if form == HOPPER_FORM:
        out.append(_other_pairing(b.osh, b.osw, b.ibw, kind))
    waves = "row-major waves, not bands"
    if kind == "grouped":
        out.append(Neighbour(waves, block, sub, depth, "round_robin"))
    else:
        out.append(Neighbour(waves, why_not=f"the planner's item order is {kind}, not bands of rows"))
    if form == HOPPER_FORM:  # the same plan, its fused store the first epilogue's
        out.append(Neighbour(TILE_EPILOGUE, block, sub, depth, kind, epilogue=sm90a_plan.TILES))
    if form == HOPPER_FORM:
        out.append(_hilbert(program, block, sub, depth))
        out.append(_split_tail(program, block, sub, depth))
    return out


def _split_tail(program: Any, block: tuple[int, int, int], sub: tuple[int, int], depth: int) -> Neighbour:
    """The same plan with the items of its last wave split over the sites that wave leaves idle (`placement=
    "split_tail"`) — where that wave is at most half full, the case the split tail was built for (bench/README.md,
    "Prediction for the split tail"); the sm_90a form's only (the persistent kernel's blocks never wait)."""
    from ..passes.split import tail_split

    plan, sites = program.plan, len(program.placement.items_of_site)
    found = tail_split(plan.items, sites, plan.k_steps)
    if isinstance(found, str):
        return Neighbour(SPLIT_TAIL, why_not=f"the planner's plan: {found}")
    return Neighbour(SPLIT_TAIL, block, sub, depth, "split_tail")


def _hilbert(program: Any, block: tuple[int, int, int], sub: tuple[int, int], depth: int) -> Neighbour:
    """The same plan with its items dealt along a Hilbert curve (the same kernel: only the work list differs, so
    the check compiles it once) — where the planner's grouped band reads more A and B strips a wave than the L2
    holds, the case Hilbert order was proposed for (issue 36; bench/README.md, "Prediction for Hilbert order")."""
    from ..passes.place import wave_bytes

    placement = program.placement
    if placement.kind != "grouped":
        return Neighbour(HILBERT, why_not=f"the planner's item order is {placement.kind}, not bands of rows")
    sites, l2 = len(placement.items_of_site), sm90a_plan.L2_BYTES
    band = wave_bytes(program.plan, program.precision, sites, "grouped", placement.band)
    if band <= l2:
        why = f"a wave of the planner's bands reads {band / 2**20:.1f} MiB of strips, within the L2's {l2 >> 20} MiB"
        return Neighbour(HILBERT, why_not=why)
    return Neighbour(HILBERT, block, sub, depth, "hilbert")


def variant_name(program: Any, planner: Any, epilogue: str | None = None) -> str:
    """A sweep plan's name in its contestant: block (sub-blocks where there are several), depth, and the item order
    where it is not the planner's."""
    plan = program.plan
    b = plan.block
    name = f"{b.osh}×{b.osw}×{b.ibw}"
    if plan.sub_blocks != (1, 1):
        name += f" sub {plan.sub_blocks[0]}×{plan.sub_blocks[1]}"
    name += f" d{plan.depth}"
    if program.placement.kind != planner.placement.kind:
        name += f" {program.placement.kind}"
    if epilogue is not None:
        name += f" {epilogue} epilogue"
    return name


def sweep_case(built: Built, gemm: Any, target: str) -> Built:
    """A sweep row's kernels, form by form: the form at its planner's plan (timed both ways, as in any row) and at
    each neighbour (kernel only), each with its planner's cost prediction; a neighbour the form or the machine cannot
    take stays in the list as absent, with the reason. Only on a Hopper (target sm_90)."""
    if target != "sm_90":
        built.skip = (
            f"a sweep runs on a Hopper's own target, sm_90 (the persistent kernel's; the sm_90a form's plans are built "
            f"for sm_90a beside it), not {target}"
        )
        return built
    for form in SWEPT_FORMS:
        planner, chosen = form_built(gemm, form, dict(UNSPLIT))
        if planner is None:  # in the sweep table all the same, with the reason
            chosen.facts["sweep"] = {"form": form, "change": PLANNERS_PLAN, "predicted": None}
            built.forms.append(chosen)
            continue
        if not built.plan:  # the row's plan: the persistent kernel's, as in any row; each kernel names its own
            built.plan = describe_plan(planner)
            built.kernel.update(plan_facts(planner))
        built.forms += _swept(gemm, form, planner, chosen)
    return built


def _swept(gemm: Any, form: str, planner: Any, chosen: Form) -> list[Form]:
    """One form's kernels of a sweep: the planner's plan, then each neighbour once."""
    cost = _cost(gemm, form, planner)
    chosen.facts["sweep"] = {"form": form, "change": PLANNERS_PLAN, "predicted": 1.0}
    forms = [chosen]
    seen = {_key(planner)}
    for n in neighbours(planner, form):
        if n.why_not:
            program, variant = None, Form(form, absent=n.why_not)
        else:
            unsplit = {} if n.placement == "split_tail" else UNSPLIT  # (a split tail splits its last wave itself)
            program, variant = form_built(gemm, form, {**n.options(), **unsplit}, n.lowering())
        if program is not None:
            if _key(program, n.epilogue) in seen:
                continue  # the planner made the change back into a plan already in the list
            seen.add(_key(program, n.epilogue))
            variant.variant = variant_name(program, planner, n.epilogue)
            predicted = round(cost / _cost(gemm, form, program), 3)
        else:
            variant.variant, predicted = f"({n.change})", None
        variant.facts["sweep"] = {"form": form, "change": n.change, "predicted": predicted}
        variant.kernel_only = True
        forms.append(variant)
    # The planner's kernel timed once more after its neighbours: every measured ratio of the form divides by its
    # time, so the report takes the mean of both and shows how far apart they were (the clock's drift, the noise).
    again = Form(form, chosen.artifact, facts={**chosen.facts}, variant="(the planner's, again)", kernel_only=True)
    again.facts["sweep"] = {"form": form, "change": TIMED_AGAIN, "predicted": 1.0}
    return [*forms, again]


def _cost(gemm: Any, form: str, program: Any) -> float:
    """The planner's own estimate of `program`'s plan in `form` (the cost it ranked its candidates by)."""
    from ..passes.split import tail_priced
    from ..passes.tile import candidates
    from ..target import target

    plan = program.plan
    block = (plan.block.osh, plan.block.osw, plan.block.ibw)
    found = candidates(gemm, target(kernel_arch(form, "sm_90")), block, plan.sub_blocks, plan.depth, form)
    if program.placement.kind != "split_tail":
        return found[0].cost
    sites = len(program.placement.items_of_site)  # its whole waves and its split, where the cost prices whole ones
    priced = tail_priced(found[0].cost, plan.items, sites, plan.k_steps)
    assert priced is not None
    return priced


def _key(program: Any, epilogue: str | None = None) -> tuple[Any, ...]:
    return (program.plan, program.placement.kind, epilogue)
