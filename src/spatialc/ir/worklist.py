"""The placement rules, as plain arithmetic: which items each site runs. `passes/place.py` places a program by them,
and the GPU launcher and the printed host programs apply the same rule again at launch, for the sites the device
really has — so a kernel planned for 132 SMs runs right (and fills the device) on any other number of them."""

from __future__ import annotations

RULES = ("contiguous", "round_robin", "grouped", "hilbert")
GRID_RULES = ("grouped", "hilbert")  # the rules that order the item grid (ny, nx) before dealing it round-robin
MAX_SITES = 1 << 16  # far more sites than any device has multiprocessors (the work list follows the device)


def grouped_order(grid: tuple[int, int], band: int) -> list[int]:
    """The items of a `grid` (ny, nx) in bands of `band` rows, each band column by column: consecutive items then
    make a compact `band` × k patch of the grid, whose A and B strips a wave of sites shares in L2."""
    ny, nx = grid
    out = []
    for top in range(0, ny, band):
        rows = min(band, ny - top)
        out += [(top + r) * nx + x for x in range(nx) for r in range(rows)]
    return out


def hilbert_order(grid: tuple[int, int]) -> list[int]:
    """The items of a `grid` (ny, nx) along a generalized Hilbert curve (the "gilbert" construction, for any sizes):
    each item a grid neighbour of the one before, and any run of consecutive items a compact patch, however long —
    where `grouped_order`'s runs are `band` rows tall and long runs cross from one band into the next.

    The curve starts at item 0 and runs along its major side, the longer one — unless that side is odd and the
    other even: a path over an even number of cells ends on a cell of the other colour of the checkerboard, so it
    cannot end at the far corner of an odd side; the major side is then the even one."""
    ny, nx = grid
    out: list[int] = []
    if ny < 1 or nx < 1:
        return out
    major_y = ny > nx
    if (ny if major_y else nx) % 2 == 1 and (nx if major_y else ny) % 2 == 0:
        major_y = not major_y
    if major_y:
        _gilbert(out, nx, (0, 0), (0, ny), (nx, 0))
    else:
        _gilbert(out, nx, (0, 0), (nx, 0), (0, ny))
    return out


def _sign(v: int) -> int:
    return (v > 0) - (v < 0)


def _gilbert(out: list[int], nx: int, at: tuple[int, int], a: tuple[int, int], b: tuple[int, int]) -> None:
    """Appends the cells of the rectangle at `at` spanned by `a` (its major side, a vector along x or y) and `b`:
    the curve enters at `at` and leaves at the far end of `a`. Halves of odd length would force a diagonal step at
    the seam, so a half is made even by one cell where it can be."""
    (x, y), (ax, ay), (bx, by) = at, a, b
    w, h = abs(ax + ay), abs(bx + by)
    da, db = (_sign(ax), _sign(ay)), (_sign(bx), _sign(by))
    if h == 1 or w == 1:  # one row or one column: walk it
        step, n = (da, w) if h == 1 else (db, h)
        out += [(y + i * step[1]) * nx + x + i * step[0] for i in range(n)]
        return
    ax2, ay2, bx2, by2 = ax // 2, ay // 2, bx // 2, by // 2
    if 2 * w > 3 * h:  # long: two halves side by side along `a`
        if abs(ax2 + ay2) % 2 and w > 2:
            ax2, ay2 = ax2 + da[0], ay2 + da[1]
        _gilbert(out, nx, (x, y), (ax2, ay2), b)
        _gilbert(out, nx, (x + ax2, y + ay2), (ax - ax2, ay - ay2), b)
        return
    if abs(bx2 + by2) % 2 and h > 2:  # standard: up the first half of `b`, along `a`, back down
        bx2, by2 = bx2 + db[0], by2 + db[1]
    _gilbert(out, nx, (x, y), (bx2, by2), (ax2, ay2))
    _gilbert(out, nx, (x + bx2, y + by2), a, (bx - bx2, by - by2))
    end = (x + (ax - da[0]) + (bx2 - db[0]), y + (ay - da[1]) + (by2 - db[1]))
    _gilbert(out, nx, end, (-bx2, -by2), (-(ax - ax2), -(ay - ay2)))


def grid_order(kind: str, grid: tuple[int, int], band: int = 0) -> list[int]:
    """The order in which a grid rule (`GRID_RULES`) deals the items of `grid` out round-robin."""
    return grouped_order(grid, band) if kind == "grouped" else hilbert_order(grid)


def split_items(
    items: int, sites: int, kind: str, grid: tuple[int, int] | None = None, band: int = 0
) -> list[list[int]]:
    """Items 0..items-1 over `sites` sites: near-equal contiguous runs (the first items % sites sites get one more),
    item i on site i mod sites, or (grouped, hilbert) the `grouped_order` / `hilbert_order` of the item `grid` dealt
    round-robin, so the sites work on one patch of it at a time. Another `kind` is no rule: a ValueError."""
    if kind not in RULES:
        raise ValueError(f"{kind!r} is no placement rule; the rules are {', '.join(RULES)}")
    if kind == "round_robin":
        return [list(range(s, items, sites)) for s in range(sites)]
    if kind == "grouped" and (grid is None or grid[0] * grid[1] != items or band < 1):
        raise ValueError(f"a grouped placement needs the item grid and a band of ≥ 1 rows, not {grid}, {band}")
    if kind == "hilbert" and (grid is None or grid[0] * grid[1] != items or band != 0):
        why = f"a hilbert placement needs the item grid of its {items} items and no band, not {grid}, {band}"
        raise ValueError(why)
    if kind in GRID_RULES:
        assert grid is not None
        order = grid_order(kind, grid, band)
        return [order[s::sites] for s in range(sites)]
    q, r = divmod(items, sites)
    out, start = [], 0
    for s in range(sites):
        n = q + (1 if s < r else 0)
        out.append(list(range(start, start + n)))
        start += n
    return out


def wave_strips(order: list[int], nx: int, sites: int) -> list[tuple[int, int]]:
    """Each wave of `sites` consecutive items of `order` (items of a grid `nx` wide, as the sites run them at one
    time when dealt round-robin): how many rows and columns of the grid it touches — the A row strips and B column
    strips its sites read together, which the L2 holds for them."""
    waves = [order[t : t + sites] for t in range(0, len(order), max(1, sites))]
    return [(len({i // nx for i in w}), len({i % nx for i in w})) for w in waves]


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
