"""The split tail against the general form's own plan, in the planner's cost model: where a last, short wave of items
leaves SMs idle, what splitting its items over them could buy. No GPU: a prediction's arithmetic (bench/README.md,
"Prediction for the split tail"; issue 36, section 2 item 4).

For each GEMM and form (sm90a, general): the form's plan as the planner picks it (`spatialc.build(..., form=...)`),
its waves items / sites and the cost model's time (`passes.tile.plan_cost`, which prices whole waves); then the plan
a split tail takes (`placement="split_tail"`: the plan whose last wave splits that the model prices least, with
split-K's rings in the general form, none in the sm_90a form), its whole waves W, its tail T split S ways, and its
time in the same model with the waves `split.tail_waves` gives: W + 1/S + FIXUP·(S − 1) — each owner adds S − 1
partial blocks after its split (a read of h·w accumulator tiles from L2 and an add, against an item's K loop).

Usage: python bench/split_tail.py [M,N,K ...] [--precision bf16]  (default: shapes around and between whole waves)
"""

from __future__ import annotations

import sys

import spatialc
from spatialc.errors import SpatialError
from spatialc.passes.footprint import ring_stages, sites_per_unit
from spatialc.passes.split import FIXUP, extra_ring_stages, tail_waves
from spatialc.passes.tile import plan_cost

SHAPES = [(3072, 3072, 3072), (2560, 2560, 4096), (4096, 4096, 4096), (5120, 5120, 4096), (1536, 6144, 4096),
          (2304, 2304, 8192), (8192, 8192, 8192)]  # fmt: skip


def cost(p, form: str, waves: float | None = None, extra: int = 0) -> float:
    """The model's time of `p`'s plan for `form`, its whole waves replaced by `waves` where given."""
    plan, target = p.plan, spatialc.target(p.target)
    per_unit = sites_per_unit(target, plan, p.precision, form, ring_stages(p, form, extra))
    m_t, n_t = (t.tiles for t in p.tensors if t.name in ("A", "B"))
    whole = plan_cost(target, plan, m_t[0], n_t[1], m_t[1], p.precision, per_unit)
    sites = target.units * per_unit
    return whole if waves is None else whole / -(-plan.items // sites) * waves


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
    waves = tail_waves(plan.items, n, plan.k_steps)
    assert waves is not None
    ratio = cost(tail, form, waves, extra_ring_stages(form)) / cost(own, form)
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
