"""Programs edited the way an attacker (or a careless hand) edits a saved schedule, and the judge of each edit.

An edit works on the program's JSON document, as a user editing a saved file would; the stages and tensors — what
the program declares it computes — are never touched, so the numpy reference of the original is the truth for
every edit. The document keeps its claim `"verified": true`, so `spatialc.from_json` must verify it again: an
edit is *refused* when that fails (or the document is no longer ours), *harmless* when it verifies and the
interpreter still equals the reference, and a *hole* when it verifies and then computes something else or fails at
run time. The suite in test_mutations.py, and bench/mutations.py at a larger size, count each and want no holes.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import spatialc
from spatialc import ew
from spatialc.frontend import bias, relu, requant, scalar
from spatialc.ir.ids import LV_ITEM_Y, LV_K
from spatialc.ir.nodes import Engine, SpatialProgram, WriteStage
from spatialc.ir.ops import (
    Apply,
    Compute,
    Lit,
    Loop,
    Map,
    Pop,
    ReadTiles,
    RowArg,
    RowReduce,
    TileAddr,
    Wait,
    WriteTiles,
    walk,
)
from spatialc.numerics.reference import reference

from .rewrite import replace

Doc = dict[str, Any]
Path = tuple[Any, ...]

# The programs edited: several shapes, precisions, epilogues, plans and placements, each small enough that a run of
# the interpreter takes milliseconds.
PROGRAMS: dict[str, Callable[[], SpatialProgram]] = {
    "int8 items-loop": lambda: spatialc.build(spatialc.gemm(100, 70, 50, "int8"), "sm_86", block=(1, 1, 1), sites=5),
    "int8 epilogue": lambda: spatialc.build(
        spatialc.gemm(64, 48, 40, "int8", epilogue=[bias(), relu(), requant(0.01, 3)]), "sm_86", sites=3
    ),
    "fp16 sub-blocks round-robin": lambda: spatialc.build(
        spatialc.gemm(48, 80, 64, "fp16"), "sm_90", block=(2, 2, 2), sub_blocks=(1, 2), placement="round_robin", sites=2
    ),
    "bf16 one item a site": lambda: spatialc.build(
        spatialc.gemm(40, 40, 100, "bf16", epilogue=[relu(), scalar("mul", 0.5)]), "sm_80"
    ),
    "int8 depth 1 scalar": lambda: spatialc.build(
        spatialc.gemm(33, 17, 200, "int8", epilogue=[scalar("add", 7)]), "sm_90", depth=1, sites=2
    ),
    "int8 empty sites": lambda: spatialc.build(spatialc.gemm(32, 32, 48, "int8"), "sm_86", block=(1, 1, 1), sites=7),
    # Programs with no matmul (issue 31): a map of three inputs, and an int8 one with a column vector.
    "fp16 map of three": lambda: spatialc.build(
        spatialc.elementwise(ew.where(ew.x(0) > ew.x(1), ew.x(0) - ew.x(2), ew.x(1) * 2.0), 40, 70, "fp16"),
        "sm_90",
        block=(1, 2, 1),
        sites=4,
    ),
    "int8 map with a bias": lambda: spatialc.build(
        spatialc.elementwise(ew.clamp(ew.x(0) * ew.x(1) + ew.col("bias"), lo=-500, hi=20000), 33, 50, "int8"),
        "sm_86",
        sites=3,
    ),
    # Programs that reduce rows (issue 31): a softmax over ragged rows on an ITEM loop, and an RMS norm.
    "bf16 softmax": lambda: spatialc.build(spatialc.softmax(40, 70, "bf16"), "sm_90", block=(1, 2, 1), sites=2),
    "fp16 rmsnorm": lambda: spatialc.build(spatialc.rmsnorm(33, 50, "fp16"), "sm_90", block=(2, 1, 1)),
    # The online softmax: its max and sum of exp kept running in one pass (ScaleAcc), checked by its own rule 8 run.
    "bf16 softmax online": lambda: spatialc.build(
        spatialc.softmax(40, 70, "bf16", online=True), "sm_90", block=(1, 2, 1), sites=2
    ),
    # Several outputs: a layer norm's out, mean and rstd, three bands on two sites, three pages a row.
    "bf16 layernorm": lambda: layernorm_program(),
    # A GEMM epilogue reading a row scale, a column scale and a residual (issue 31): ITEM loops over 2x2-tile items.
    "bf16 scales and residual": lambda: spatialc.build(
        spatialc.gemm(
            50, 40, 30, "bf16", epilogue=[spatialc.row_scale(), spatialc.col_scale(), spatialc.residual(), relu()]
        ),
        "sm_80",
        block=(2, 2, 1),
        sites=2,
    ),
    # Two outputs of pages stored in one last pass (fused add + RMSNorm: out, residual_out); a row vector alone.
    "bf16 fused add rmsnorm": lambda: fused_add_rmsnorm_program(),
    "bf16 row absmax": lambda: row_reduce_program("absmax"),
    # A split tail: 12 items on 5 sites, two whole a site, the last 2 split 2 ways (ITEM loops from a later item).
    "int8 split tail": lambda: spatialc.build(
        spatialc.gemm(48, 64, 128, "int8"), "sm_86", placement="split_tail", sites=5, block=(1, 1, 1), sub_blocks=(1, 1)
    ),
}


SCHEDULED_TRUTH = frozenset({"bf16 softmax online"})  # programs whose unedited run is the truth for their edits


def layernorm_program() -> SpatialProgram:
    """LayerNorm over 40 rows of 70 values (5 tiles a row, read 2 a page: 3 pages, the last one tile of padding);
    bands of one tile row, three of them on two sites (an ITEM loop)."""
    return spatialc.build(spatialc.layernorm(40, 70, "bf16"), "sm_90", block=(1, 2, 1), sites=2)


# ---- named edits of a program of several outputs (LayerNorm's out, mean, rstd) -----------------------------------


def _tensor(p: SpatialProgram, name: str):
    return next(t.id for t in p.tensors if t.name == name)


def _ring(p: SpatialProgram, name: str):
    return next(b.id for b in p.buffers if b.name == name)


def outputs_exchanged(p: SpatialProgram) -> SpatialProgram:
    """The writer stores the mean vector into rstd and rstd's into mean."""
    mean, rstd = _tensor(p, "mean"), _tensor(p, "rstd")
    swap = {mean: rstd, rstd: mean}

    def f(op):
        if isinstance(op, WriteTiles) and op.tensor in swap:
            return (dataclasses.replace(op, tensor=swap[op.tensor]),)
        return None

    return replace(p, Engine.WRITER, f)


def broadcast_swapped(p: SpatialProgram) -> SpatialProgram:
    """The output's map is handed its row vectors the other way round: it subtracts rstd and scales by the mean."""
    mean, rstd = _ring(p, "mean_ring"), _ring(p, "rstd_ring")

    def f(op):
        if isinstance(op, Compute) and op.ins[1:] == (mean, rstd):
            return (dataclasses.replace(op, ins=(op.ins[0], rstd, mean)),)
        return None

    return replace(p, Engine.COMPUTE, f)


def reduction_skips_a_page(p: SpatialProgram) -> SpatialProgram:
    """The row sum's pass stops a page short, in the reader and the reduction alike: the rings still balance."""
    ring = _ring(p, "x0_ring")

    def holds(op) -> bool:
        return (
            isinstance(op, Loop)
            and op.var == LV_K
            and any(
                (isinstance(x, ReadTiles) and x.into == ring) or (isinstance(x, Compute) and x.ins == (ring,))
                for x in walk(op.body)
            )
        )

    def f(op):
        if holds(op):
            return (dataclasses.replace(op, count=dataclasses.replace(op.count, n=op.count.n - 1)),)
        return None

    return replace(replace(p, Engine.READER, f), Engine.COMPUTE, f)


def output_written_twice(p: SpatialProgram) -> SpatialProgram:
    """The mean vector stored twice into its rows (the same values: harmless here, and still refused)."""
    mean = _tensor(p, "mean")
    return replace(p, Engine.WRITER, lambda op: (op, op) if isinstance(op, WriteTiles) and op.tensor == mean else None)


def output_never_written(p: SpatialProgram) -> SpatialProgram:
    """rstd's vector is waited for and popped, never stored."""
    rstd = _tensor(p, "rstd")
    return replace(p, Engine.WRITER, lambda op: () if isinstance(op, WriteTiles) and op.tensor == rstd else None)


# name → (edit, words rule 8's refusal must hold; an earlier rule may refuse the edit first, as rule 3 does two
# outputs exchanged: each ring is written to its own stage's tensor)
LAYERNORM_EDITS: dict[str, tuple[Callable[[SpatialProgram], SpatialProgram], tuple[str, ...]]] = {
    "the mean and rstd outputs exchanged": (
        outputs_exchanged,
        ("WriteTiles rstd_out_ring -> mean", "its data goes through rstd_out_ring, but the stages send it through"),
    ),
    "the output's map reads the mean where rstd is meant": (
        broadcast_swapped,
        ("it reads x2_ring, rstd_ring, mean_ring into normalise_ring", "stage normalise reads x2_ring, mean_ring"),
    ),
    "the row sum skips a page": (
        reduction_skips_a_page,
        ("row sum reduces tile columns 0..3 (4 tiles) of the row", "need tile columns 0..4 each exactly once"),
    ),
    "an output written twice": (output_written_twice, ("mean is written by more than one op",)),
    "an output never written": (output_never_written, ("rstd tile (0, 0) is never written",)),
}


# ---- named edits of a program of two outputs of pages (fused add + RMSNorm) and of one of a row vector alone -------


def fused_add_rmsnorm_program() -> SpatialProgram:
    """Fused add + RMSNorm over 40 rows of 70 values, out and residual_out (= x + residual) stored a page of each at
    a time in the band's last pass; pages of 2 tiles, three bands on two sites (an ITEM loop)."""
    return spatialc.build(spatialc.rmsnorm(40, 70, "bf16", residual=True), "sm_90", block=(1, 2, 1), sites=2)


def row_reduce_program(op: str) -> SpatialProgram:
    """A row `op` (absmax, mean, …) of 40 rows of 70 values into a 40 x 1 vector: no pass of pages of output, each
    band's vector stored once, three bands on two sites."""
    return spatialc.build(spatialc.row_reduce(40, 70, op, "bf16"), "sm_90", block=(1, 2, 1), sites=2)


def _writes(p: SpatialProgram, f: Callable[[SpatialProgram, WriteTiles], tuple | None]) -> SpatialProgram:
    return replace(p, Engine.WRITER, lambda op: f(p, op) if isinstance(op, WriteTiles) else None)


def _pages_exchanged(p: SpatialProgram) -> SpatialProgram:
    """out's pages stored into residual_out, and residual_out's into out."""
    out, res = _tensor(p, "out"), _tensor(p, "residual_out")
    return _writes(p, lambda p, op: (dataclasses.replace(op, tensor={out: res, res: out}[op.tensor]),))


def _pages_exchanged_in_the_stages(p: SpatialProgram) -> SpatialProgram:
    """The write stages exchanged instead: the stages declare out = x + residual and residual_out the scaled rows,
    the schedule stores as before."""
    out, res = _tensor(p, "out"), _tensor(p, "residual_out")
    stages = tuple(
        dataclasses.replace(s, kind=WriteStage({out: res, res: out}[s.kind.tensor]))
        if isinstance(s.kind, WriteStage)
        else s
        for s in p.stages
    )
    return p.evolve(stages=stages)


def _residual_from_the_scaled_ring(p: SpatialProgram) -> SpatialProgram:
    """residual_out stored from the scaled map's page (both pages held while out's and residual_out's are stored):
    the writer's rings still balance."""
    scaled, h = _ring(p, "scale_ring"), _ring(p, "residual_copy_ring")
    out, res = _tensor(p, "out"), _tensor(p, "residual_out")

    def f(op):
        if isinstance(op, Loop) and op.var == LV_K:
            stores = {x.tensor: x for x in op.body if isinstance(x, WriteTiles)}
            wrong = dataclasses.replace(stores[res], src=scaled)
            return (dataclasses.replace(op, body=(Wait(scaled), Wait(h), stores[out], wrong, Pop(scaled), Pop(h))),)
        return None

    return replace(p, Engine.WRITER, f)


def _stored_twice(p: SpatialProgram) -> SpatialProgram:
    """Each page of residual_out stored twice (the same values)."""
    res = _tensor(p, "residual_out")
    return _writes(p, lambda p, op: (op, op) if op.tensor == res else None)


def _pages_at_the_bands_first(p: SpatialProgram) -> SpatialProgram:
    """residual_out's page address loses its step along the row: every page stored over the band's first, the rest
    of the row never."""
    res = _tensor(p, "residual_out")

    def f(p, op):
        if op.tensor != res:
            return None
        return (dataclasses.replace(op, at=TileAddr(op.at.base, tuple(s for s in op.at.steps if s[0] != LV_K))),)

    return _writes(p, f)


def _a_tile_a_page_skipped(p: SpatialProgram) -> SpatialProgram:
    """out's pages stored one tile wide, where they are two: every second tile of the row never written."""
    out = _tensor(p, "out")
    return _writes(p, lambda p, op: (dataclasses.replace(op, block_w=1),) if op.tensor == out else None)


def _add_of_x_and_x(i: int) -> Callable[[SpatialProgram], SpatialProgram]:
    """Pass i's add map handed x's page twice, x + x where x + residual is declared (residual's page waited and
    popped unread)."""

    def change(p: SpatialProgram) -> SpatialProgram:
        x, r = _ring(p, f"x{i}_ring"), _ring(p, f"residual{i}_ring")
        return replace(
            p,
            Engine.COMPUTE,
            lambda op: (dataclasses.replace(op, ins=(x, x)),) if isinstance(op, Compute) and op.ins == (x, r) else None,
        )

    return change


def _reduced_by(op_name: str) -> Callable[[SpatialProgram], SpatialProgram]:
    """The schedule's row reduction replaced by `op_name` (absmax's by max: the same on rows whose largest magnitude
    is positive)."""
    return lambda p: replace(
        p,
        Engine.COMPUTE,
        lambda op: (
            (dataclasses.replace(op, op=dataclasses.replace(op.op, op=op_name)),)
            if isinstance(op, Compute) and isinstance(op.op, RowReduce)
            else None
        ),
    )


def _mean_divided_by(n: float) -> Callable[[SpatialProgram], SpatialProgram]:
    """The mean's map divides the row sum by `n` where the rows hold 70 values."""
    wrong = Map(Apply("div", (RowArg(0), Lit(n))))
    return lambda p: replace(
        p,
        Engine.COMPUTE,
        lambda op: (dataclasses.replace(op, op=wrong),) if isinstance(op, Compute) and isinstance(op.op, Map) else None,
    )


def _vector_at(at: TileAddr) -> Callable[[SpatialProgram], SpatialProgram]:
    """The band's m x 1 vector stored at `at` (its tile row), not at its own band's."""
    return lambda p: _writes(p, lambda p, op: (dataclasses.replace(op, at=at),))


# name → (the program edited, the edit, words rule 8's refusal must hold; rule 3 refuses the first three before it:
# each ring is stored to its own write stage's tensor)
ROW_OUTPUT_EDITS: dict[
    str, tuple[Callable[[], SpatialProgram], Callable[[SpatialProgram], SpatialProgram], tuple[str, ...]]
] = {
    "out and residual_out exchanged in the schedule": (
        fused_add_rmsnorm_program,
        _pages_exchanged,
        (
            "WriteTiles residual_copy_ring -> out",
            "its data goes through residual_copy_ring, but the stages send it through scale_ring",
        ),
    ),
    "out and residual_out exchanged in the stages": (
        fused_add_rmsnorm_program,
        _pages_exchanged_in_the_stages,
        (
            "WriteTiles scale_ring -> out",
            "its data goes through scale_ring, but the stages send it through residual_copy_ring",
        ),
    ),
    "residual_out stored from the scaled map's ring": (
        fused_add_rmsnorm_program,
        _residual_from_the_scaled_ring,
        ("WriteTiles scale_ring -> residual_out", "the stages send it through residual_copy_ring"),
    ),
    "each page of residual_out stored twice": (
        fused_add_rmsnorm_program,
        _stored_twice,
        ("residual_out is written by more than one op",),
    ),
    "residual_out's pages all stored over the band's first": (
        fused_add_rmsnorm_program,
        _pages_at_the_bands_first,
        ("residual_out tile (0, 0) is written 3 times by item 0 (y 0, x 0)",),
    ),
    "a tile of each page of out never stored": (
        fused_add_rmsnorm_program,
        _a_tile_a_page_skipped,
        ("out tile (0, 1) is never written",),
    ),
    "the sum of squares' add map reads x + x": (
        fused_add_rmsnorm_program,
        _add_of_x_and_x(0),
        ("Compute (x0 + x1) (x0_ring, x0_ring) -> add0_ring", "stage add0 reads x0_ring, residual0_ring"),
    ),
    "the last pass's add map, shared by both outputs, reads x + x": (
        fused_add_rmsnorm_program,
        _add_of_x_and_x(1),
        ("Compute (x0 + x1) (x1_ring, x1_ring) -> add1_ring", "stage add1 reads x1_ring, residual1_ring"),
    ),
    "absmax reduced as a max in the schedule": (
        lambda: row_reduce_program("absmax"),
        _reduced_by("max"),
        ("schedule op row max of 70 columns at 2*k width 2 where stage row_absmax declares row absmax of 70 columns",),
    ),
    "the mean divided by 64": (
        lambda: row_reduce_program("mean"),
        _mean_divided_by(64.0),
        ("schedule op (x0[row] / 64) where stage mean declares (x0[row] / 70)",),
    ),
    "the row vectors stored in the bands reversed": (
        lambda: row_reduce_program("sum"),
        _vector_at(TileAddr(2, ((LV_ITEM_Y, -1),))),
        ("item 0 (y 0, x 0) writes out tile (2, 0), outside its block of tile rows 0..0",),
    ),
    "every band's row vector stored at the first band": (
        lambda: row_reduce_program("max"),
        _vector_at(TileAddr(0)),
        ("item 1 (y 1, x 0) writes out tile (0, 0), outside its block of tile rows 1..1",),
    ),
}


def inputs_for(p: SpatialProgram, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs whose products and sums are exact in every precision (small integers for fp16 and bf16), so a
    harmless edit must give the reference bit for bit."""
    rng = np.random.default_rng(seed)
    integer = p.precision.value == "int8"
    out = {}
    for t in p.tensors:
        if t.role.value == "input":
            out[t.name] = rng.integers(-128, 128, t.elems) if integer else rng.integers(-3, 4, t.elems)
            out[t.name] = out[t.name].astype(np.int8 if integer else np.float32)
        elif t.role.value == "parameter":  # a bias's n values, a row scale's m
            out[t.name] = rng.integers(-1000, 1000, t.elems[0] * t.elems[1]).astype(np.int32 if integer else np.float32)
    return out


# ---- edits ------------------------------------------------------------------------------------------------------

EDITABLE = ("schedule", "placement", "plans", "buffers", "semaphores")


def _paths(node: Any, path: Path = ()) -> list[tuple[Path, Any]]:
    """Every (path, value) below `node`, in pre-order (a node, then its entries in order)."""
    out: list[tuple[Path, Any]] = []
    stack: list[tuple[Path, Any]] = [(path, node)]
    while stack:
        here, v = stack.pop()
        out.append((here, v))
        if type(v) is dict:
            stack.extend([((*here, k), w) for k, w in v.items()][::-1])
        elif type(v) is list:
            stack.extend([((*here, i), w) for i, w in enumerate(v)][::-1])
    return out


def _copy(doc: Any) -> Any:
    """A deep copy of a JSON document (dicts, lists and scalars, nothing shared): copy.deepcopy's result, faster."""
    if type(doc) is dict:
        return {k: _copy(v) if type(v) is dict or type(v) is list else v for k, v in doc.items()}
    if type(doc) is list:
        return [_copy(v) if type(v) is dict or type(v) is list else v for v in doc]
    return doc


def _get(doc: Any, path: Path) -> Any:
    for k in path:
        doc = doc[k]
    return doc


def _set(doc: Any, path: Path, value: Any) -> None:
    _get(doc, path[:-1])[path[-1]] = value


def _editable(doc: Doc) -> list[tuple[Path, Any]]:
    prog = doc["program"]
    return [(("program", key, *p), v) for key in EDITABLE for p, v in _paths(prog.get(key), ())]


# The integers and the op lists of the last document edited: an edit changes a copy, never the document it is given,
# so a run's hundreds of edits of one document walk it once (the walk, not the edit, was most of an edit's time).
_LAST: list[Any] = [None, [], []]


def _walked(doc: Doc) -> tuple[list[tuple[Path, Any]], list[Path]]:
    """(every integer, every op list's path) of the document's editable parts, in _editable's order."""
    if _LAST[0] is not doc:
        editable = _editable(doc)
        ints = [(p, v) for p, v in editable if isinstance(v, int) and not isinstance(v, bool)]
        lists = [p for p, v in editable if p[-1] in ("ops", "body") and isinstance(v, list)]
        _LAST[:] = [doc, ints, lists]
    return _LAST[1], _LAST[2]


def _everywhere(doc: Doc, path: Path, rng: random.Random) -> list[Path]:
    """`path` — or, half the time when it lies in an engine program, the same place in every program of that
    engine (an edit of the schedule's template, which the lowering can print as one kernel)."""
    if path[:3] != ("program", "schedule", "programs") or rng.random() < 0.5:
        return [path]
    progs = doc["program"]["schedule"]["programs"]
    engine = progs[path[3]]["engine"]
    out = []
    for j, prog in enumerate(progs):
        twin = (*path[:3], j, *path[4:])
        if prog["engine"] == engine and _has(doc, twin):
            out.append(twin)
    return out


def _has(doc: Any, path: Path) -> bool:
    for k in path:
        if isinstance(doc, dict) and k in doc or isinstance(doc, list) and isinstance(k, int) and 0 <= k < len(doc):
            doc = doc[k]
        else:
            return False
    return True


def number_edit(doc: Doc, rng: random.Random) -> tuple[Doc, str] | None:
    """One integer of the schedule, placement, plan or buffers changed: ±1, 0, doubled, negated, or any small one."""
    ints = _walked(doc)[0]
    if not ints:
        return None
    path, old = rng.choice(ints)
    change = rng.choice(["+1", "-1", "0", "x2", "neg", "any", "edge"])
    pick = rng.randint(-2, 2 * abs(old) + 3)
    edge = rng.choice(NUMBER_EDGES)
    fns = {"+1": lambda v: v + 1, "-1": lambda v: v - 1, "0": lambda v: 0, "x2": lambda v: 2 * v}
    fns |= {"neg": lambda v: -v, "any": lambda v: pick, "edge": lambda v: edge}
    fn = fns[change]
    if fn(old) == old:
        return None
    out = _copy(doc)
    where = _everywhere(doc, path, rng)
    for p in where:
        value = _get(out, p)
        if isinstance(value, int) and not isinstance(value, bool):
            _set(out, p, fn(value))
    scope = f" in {len(where)} programs" if len(where) > 1 else ""
    return out, f"number {'.'.join(map(str, path[1:]))}: {old} -> {fn(old)}{scope}"


# Where a C int, an unsigned counter, a 64-bit field or a ring's bound ends: a count there verifies or is refused,
# never wraps into a wrong answer.
NUMBER_EDGES = (2**31 - 1, 2**31, 2**32, 2**32 + 1, 2**53 + 1, 2**62, 2**63 - 1, -(2**63), 1024, 1025)
# Names as a saved file might carry them: code and paths for every kind of sink, and names of the operand files.
HOSTILE_NAMES = (
    "A\n__import__('os').system('touch pwned')\n#",
    'x");\n#include "/etc/passwd"\n//',
    "x\\",
    "../../escape",
    "/tmp/escape",
    "%s%n",
    "",
    "x" * 65,
    "1x",
    "a b",
    "\u2028",
)
NAMED = ("tensors", "stages", "buffers", "semaphores")


def name_edit(doc: Doc, rng: random.Random) -> tuple[Doc, str] | None:
    """A name changed: to a hostile one (code, a path, too long), to another name of its kind (two of one name), or
    — for what inputs are not bound by — to a fresh identifier, which must change nothing."""
    prog = doc["program"]
    kinds = [k for k in NAMED if prog[k]] + ["program", "placement"]
    kind = rng.choice(kinds)
    out = _copy(doc)
    if kind == "program":
        where, field_ = out["program"], "name"
    elif kind == "placement":
        where, field_ = out["program"]["placement"], "kind"
    else:
        where, field_ = rng.choice(out["program"][kind]), "name"
    old = where[field_]
    others = [x["name"] for x in prog[kind] if x["name"] != old] if kind in NAMED else []
    choices = [*HOSTILE_NAMES, *others, "a", "b", "p3"]
    if kind != "tensors" and kind != "placement":  # inputs are bound by a tensor's name; the placement's kind is a rule
        choices.append(f"renamed_{rng.randint(0, 99)}")
    new = rng.choice(choices)
    if new == old:
        return None
    where[field_] = new
    return out, f"name of {kind} {old!r} -> {new!r}"


def _op_lists(doc: Doc) -> list[Path]:
    """Paths of every op list: engine programs' ops and loop bodies."""
    return _walked(doc)[1]


def list_edit(doc: Doc, rng: random.Random) -> tuple[Doc, str] | None:
    """One op list changed: an op dropped, repeated or swapped with its neighbour; a loop unwrapped; an op moved."""
    lists = [p for p in _op_lists(doc) if _get(doc, p)]
    if not lists:
        return None
    path = rng.choice(lists)
    i = rng.randrange(len(_get(doc, path)))
    kind = rng.choice(["drop", "repeat", "swap", "unwrap", "hoist"])
    out = _copy(doc)
    where = _everywhere(doc, path, rng)
    changed = sum(_list_change(out, p, i, kind) for p in where)
    if not changed:
        return None
    scope = f" in {changed} programs" if changed > 1 else ""
    return out, f"list {kind} at {'.'.join(map(str, path[1:]))}[{i}]{scope}"


def _list_change(doc: Doc, path: Path, i: int, kind: str) -> bool:
    ops = _get(doc, path)
    if i >= len(ops):
        return False
    if kind == "drop":
        del ops[i]
    elif kind == "repeat":
        ops.insert(i, _copy(ops[i]))
    elif kind == "swap" and len(ops) > 1:
        j = i + 1 if i + 1 < len(ops) else i - 1
        ops[i], ops[j] = ops[j], ops[i]
    elif kind == "unwrap" and ops[i].get("type") == "Loop":
        ops[i : i + 1] = ops[i]["body"]
    elif kind == "hoist" and path[-1] == "body":  # an op of a loop body moved to just before the loop
        _get(doc, path[:-2]).insert(path[-2], ops.pop(i))
    else:
        return False
    return True


def placement_edit(doc: Doc, rng: random.Random) -> tuple[Doc, str] | None:
    """An item moved to another site, dropped, or listed twice."""
    sites = doc["program"]["placement"]["items_of_site"]
    held = [s for s in sites if s[1]]
    if not held or len(sites) < 2:
        return None
    out = _copy(doc)
    sites = out["program"]["placement"]["items_of_site"]
    src = rng.choice([s for s in sites if s[1]])
    item = rng.choice(src[1])
    kind = rng.choice(["move", "drop", "twice"])
    if kind != "twice":
        src[1].remove(item)
    if kind != "drop":
        rng.choice(sites)[1].append(item)
    return out, f"placement {kind} item {item}"


EDITS = (number_edit, number_edit, list_edit, placement_edit, name_edit)


# ---- judging ----------------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """Counts of outcomes, and the holes found (with what the edit was)."""

    counts: Counter[str] = field(default_factory=Counter)
    holes: list[str] = field(default_factory=list)
    accepted: list[tuple[str, str, SpatialProgram]] = field(default_factory=list)  # (base, edit, program)

    def line(self) -> str:
        c = self.counts
        total = sum(c.values())
        return (
            f"{total} edits: {c['refused']} refused by verify, {c['same']} accepted and still exact,"
            f" {c['hole']} accepted and wrong"
        )


def judge(
    base: str, p: SpatialProgram, text: str, what: str, inputs: dict[str, np.ndarray], ref: Any, tally: Tally
) -> None:
    """One edited document through from_json → evaluate, counted."""
    try:
        q = spatialc.from_json(text)
    except spatialc.SpatialError:
        tally.counts["refused"] += 1
        return
    if not q.verified:
        tally.counts["refused"] += 1
        return
    if len(q.tensors) == len(p.tensors):  # a tensor renamed: its input goes by its new name (a name edit)
        inputs = {t.name: inputs[old.name] for t, old in zip(q.tensors, p.tensors, strict=True) if old.name in inputs}
        if isinstance(ref, dict):  # and so does an output of several (the result is a dict by name)
            ref = {t.name: ref[old.name] for t, old in zip(q.tensors, p.tensors, strict=True) if old.name in ref}
    try:
        c = spatialc.evaluate(q, inputs)
    except Exception as e:  # noqa: BLE001 — any failure of a verified program is a hole, whatever its type
        tally.counts["hole"] += 1
        tally.holes.append(f"{base}: {what}: verified, then evaluate raised {type(e).__name__}: {e}")
        return
    if _same(c, ref):
        tally.counts["same"] += 1
        if q != p:
            tally.accepted.append((base, what, q))
        return
    tally.counts["hole"] += 1
    tally.holes.append(f"{base}: {what}: verified, and C differs from the reference")


def _same(c: Any, ref: Any) -> bool:
    """The result equals the reference: one array, or each output of several (a dict by name)."""
    if isinstance(ref, dict):
        return isinstance(c, dict) and set(c) == set(ref) and all(_same(c[k], ref[k]) for k in ref)
    return not isinstance(c, dict) and c.shape == ref.shape and bool(np.array_equal(c, ref))


def run(edits_per_program: int, seed: int, programs: dict[str, Callable[[], SpatialProgram]] = PROGRAMS) -> Tally:
    """`edits_per_program` random edits of each program, judged."""
    tally = Tally()
    for name, make in programs.items():
        p = make()
        inputs = inputs_for(p)
        # The online softmax rescales its running sum, so its result is not the reference's bit for bit (it lies within
        # the tolerance of it: tests/passes/test_online_softmax.py); a harmless edit must leave its own bits.
        ref = spatialc.evaluate(p, inputs) if name in SCHEDULED_TRUTH else reference(p, inputs)
        doc = json.loads(spatialc.to_json(p))
        rng = random.Random(f"{seed}:{name}")
        done = 0
        while done < edits_per_program:
            edited = rng.choice(EDITS)(doc, rng)
            if edited is None:
                continue
            out, what = edited
            judge(name, p, json.dumps(out), what, inputs, ref, tally)
            done += 1
    return tally
