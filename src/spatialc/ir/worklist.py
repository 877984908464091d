"""The placement rules, as plain arithmetic: which items each site runs. `passes/place.py` places a program by them,
and the GPU launcher and the printed host programs apply the same rule again at launch, for the sites the device
really has — so a kernel planned for 132 SMs runs right (and fills the device) on any other number of them."""

from __future__ import annotations

RULES = ("contiguous", "round_robin")


def split_items(items: int, sites: int, kind: str) -> list[list[int]]:
    """Items 0..items-1 over `sites` sites: near-equal contiguous runs (the first items % sites sites get one more),
    or item i on site i mod sites."""
    if kind == "round_robin":
        return [list(range(s, items, sites)) for s in range(sites)]
    q, r = divmod(items, sites)
    out, start = [], 0
    for s in range(sites):
        n = q + (1 if s < r else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def work_table(parts: list[list[int]]) -> list[int]:
    """The kernel's work list: each site's offset into the flat item list, then each site's count, then the items
    themselves (docs/kernel-abi.md): `2 · sites + items` ints."""
    offs, at = [], 0
    for items in parts:
        offs.append(at)
        at += len(items)
    return offs + [len(items) for items in parts] + [i for items in parts for i in items]


def launch_sites(items: int, sms: int, per_sm: int) -> int:
    """How many sites a kernel that follows the device runs: every resident block busy, none without an item."""
    return max(1, min(items, sms * per_sm))
