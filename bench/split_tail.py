"""The split tail against each form's own plan, in the planner's cost model: where a last, short wave of items
leaves SMs idle, what splitting its items over them could buy. No GPU: a prediction's arithmetic (bench/README.md,
"Prediction for the split tail"; issue 36, section 2 item 4).

For each GEMM and form (sm90a, general): the form's plan as the planner picks it (`spatialc.build(..., form=...)`),
its waves items / sites and the form's planner's price of it (`passes.tile.candidates`' cost: the sm_90a form's own
model for that form, the persistent one's for the general form; each prices whole waves); then the plan
a split tail takes (`placement="split_tail"`: the plan whose last wave splits that the model prices least, with
split-K's rings in the general form, none in the sm_90a form), its whole waves W, its tail T split S ways, and its
price with the waves `split.tail_waves` gives (`split.tail_priced`): W + 1/S + FIXUP·(S − 1) — each owner adds S − 1
partial blocks after its split (a read of h·w accumulator tiles from L2 and an add, against an item's K loop).

Usage: python bench/split_tail.py [M,N,K ...] [--precision bf16]  (default: shapes around and between whole waves)
"""

from __future__ import annotations

import sys

import spatialc
from spatialc.errors import SpatialError
from spatialc.passes.split import FIXUP, extra_ring_stages, tail_priced
from spatialc.passes.tile import candidates

SHAPES = [(3072, 3072, 3072), (2560, 2560, 4096), (4096, 4096, 4096), (5120, 5120, 4096), (1536, 6144, 4096),
          (2304, 2304, 8192), (8192, 8192, 8192)]  # fmt: skip


def cost(gemm, p, form: str, extra: int = 0) -> float:
    """The form's planner's own price of `p`'s plan (the cost it ranks its candidates by: the sm_90a form's model
    for that form), its waves counted whole."""
    plan = p.plan
    block = (plan.block.osh, plan.block.osw, plan.block.ibw)
    found = candidates(gemm, spatialc.target("sm_90a"), block, plan.sub_blocks, plan.depth, form, extra)
    return found[0].cost


def row(shape: tuple[int, int, int], precision: str, form: str) -> str:
    gemm = spatialc.gemm(*shape, precision)
    own = spatialc.build(gemm, "sm_90a", form=form)
    sites = len(own.placement.items_of_site)
    own_waves = own.plan.items / sites
    head = f"| {'x'.join(map(str, shape))} {precision} | {form} |"
    text = f"{head} {own.plan.item_tiles} × {own.plan.items}: {own_waves:.2f} waves |"
    try:
        tail = spatialc.build(gemm, "sm_90a", placement="split_tail", form=form)
    except SpatialError as e:
        return text + f" — ({str(e).split(' — ')[-1]}) | — |"
    pl, plan = tail.placement, tail.plan
    n = len(pl.items_of_site)
    waves = (plan.items - pl.tail) // n + 1 / pl.splits + FIXUP * (pl.splits - 1)  # (`split.tail_waves`)
    priced = tail_priced(cost(gemm, tail, form, extra_ring_stages(form)), plan.items, n, plan.k_steps)
    assert priced is not None
    ratio = priced / cost(gemm, own, form)
    text += f" {plan.item_tiles} × {plan.items} on {n}: W {(plan.items - pl.tail) // n}, T {pl.tail} split"
    return text + f" {pl.splits} → {waves:.2f} | {ratio:.2f} |"


def main(argv: list[str]) -> None:
    precision = "bf16"
    if "--precision" in argv:
        at = argv.index("--precision")
        precision = argv[at + 1]
        argv = argv[:at] + argv[at + 2 :]
    shapes = [tuple(int(x) for x in a.split(",")) for a in argv] or SHAPES
    print(f"FIXUP {FIXUP} of an item's time an owner's add")
    head = "| GEMM | form | its own plan: items, waves | the split tail's plan: whole waves, tail, waves |"
    print(head + " time, split tail / own (model) |")
    print("|---|---|---|---|---|")
    for shape in shapes:
        for form in ("sm90a", "general"):
            print(row(shape, precision, form))  # type: ignore[arg-type]


if __name__ == "__main__":
    main(sys.argv[1:])
